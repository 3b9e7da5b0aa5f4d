package main

import (
	"strings"
	"testing"

	"github.com/spf13/cobra"

	"github.com/moat-net/moat/internal/testenv"
)

// lab run without -f reads the embedded example as moat matrix does, with
// the peers of its matrix.args: the same six endpoints, the peer
// 203.0.113.10 among them (the lab had five). lab up reads
// it the same way (labFlags.compile) but starts responders by running
// this binary as moat, which a test binary is not.
func TestLabDefaultsToExampleArgs(t *testing.T) {
	testenv.RequirePrivileged(t)
	const said = "ports and peers: the example's matrix.args (--peer 203.0.113.10)"
	out, errOut, code := run(t, "", "lab", "run")
	if code != 0 || !strings.Contains(errOut, said) || !strings.Contains(out, "6 203.0.113.10") {
		t.Errorf("lab run: code %d, stderr %q, out:\n%s", code, errOut, out)
	}
	// --port or --peer replaces the example's arguments, as in matrix.
	out, errOut, code = run(t, "", "lab", "run", "--port", "80")
	if code != 0 || strings.Contains(errOut, said) || strings.Contains(out, "203.0.113.10") {
		t.Errorf("lab run --port 80: code %d, stderr %q, out:\n%s", code, errOut, out)
	}
}

// A usage line shows -f bare only where it is required: explain, matrix
// and lab run and up read the embedded example without it, check and nft
// take -f or --live (in parentheses). explain, lab run and
// lab up said "-f FILE..." as if required.
func TestUsageMarksOptionalFiles(t *testing.T) {
	var walk func(c *cobra.Command)
	walk = func(c *cobra.Command) {
		for _, s := range c.Commands() {
			walk(s)
		}
		if i := strings.Index(c.Use, "-f "); i > 0 && c.Use[i-1] != '[' && c.Use[i-1] != '(' {
			t.Errorf("%s: usage %q shows -f as required", c.CommandPath(), c.Use)
		}
	}
	walk(newRootCommand(false))
}

// lab up and apply refuse a live cluster, so their --help does not offer
// --live, --kubeconfig or --context; given anyway, --live
// is refused with the reason, not as an unknown flag.
func TestLabUpApplyHideLiveFlags(t *testing.T) {
	for _, sub := range []string{"up", "apply"} {
		out, _, code := run(t, "", "lab", sub, "--help")
		if code != 0 || !strings.Contains(out, "--filename") {
			t.Fatalf("lab %s --help: code %d, out %q", sub, code, out)
		}
		for _, flag := range []string{"--live", "--kubeconfig", "--context"} {
			if strings.Contains(out, flag) {
				t.Errorf("lab %s --help offers %s", sub, flag)
			}
		}
		if _, errOut, code := run(t, "", "lab", sub, "--live"); code != 1 || !strings.Contains(errOut, "works for files only") {
			t.Errorf("lab %s --live: code %d, stderr %q", sub, code, errOut)
		}
	}
}
