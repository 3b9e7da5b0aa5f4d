package app

import (
	"bytes"
	"context"
	"strings"
	"testing"

	logsapi "k8s.io/component-base/logs/api/v1"
)

func execute(t *testing.T, args ...string) (string, error) {
	t.Helper()
	// Logging configuration is process-wide and may be applied once.
	if err := logsapi.ResetForTest(nil); err != nil {
		t.Fatal(err)
	}
	cmd, err := NewCommand()
	if err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	cmd.SetOut(&out)
	cmd.SetErr(&out)
	cmd.SetArgs(args)
	err = cmd.ExecuteContext(context.Background())
	return out.String(), err
}

// TestHelpDocumentsEveryFlag: every flag the issue and the DaemonSet use is
// in --help with a description, and the feature gate is explained.
func TestHelpDocumentsEveryFlag(t *testing.T) {
	out, err := execute(t, "--help")
	if err != nil {
		t.Fatal(err)
	}
	for _, flag := range []string{
		"--node-name", "--kubeconfig", "--metrics-bind-address", "--health-bind-address",
		"--allow-node-local", "--cut-denied-established", "--feature-gates", "--resync",
		"--leader-elect", "--leader-election-namespace", "--netns", "--v", "--logging-format", "--context", "--profiling", "--cleanup", "--leader-elect-lease-duration", "--leader-elect-renew-deadline", "--leader-elect-retry-period",
		"--leader-elect-candidates", "--metrics-secure", "--tls-cert-file", "--tls-private-key-file", "--lock-file",
	} {
		i := strings.Index(out, flag+" ")
		if i < 0 {
			t.Errorf("--help does not list %s", flag)
			continue
		}
		line := out[i:]
		if j := strings.IndexByte(line, '\n'); j >= 0 {
			line = line[:j]
		}
		if len(strings.Fields(line)) < 4 {
			t.Errorf("%s has no description: %q", flag, line)
		}
	}
	for _, want := range []string{"IngressNetworksAndNodes=true|false (ALPHA - default=false)", "fail-closed", "Accepted=False", `default ":9470"`, `default ":9471"`, "default 5m0s",
		"Agent flags:", "Dataplane flags:", "Leader election flags:", "Logging flags:"} {
		if !strings.Contains(out, want) {
			t.Errorf("--help lacks %q", want)
		}
	}
}

func TestBadFlags(t *testing.T) {
	t.Setenv("NODE_NAME", "")
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--kubeconfig=/nonexistent"}, "--node-name is empty"},
		{[]string{"--node-name=n1", "--resync=-1s"}, "--resync=-1s"},
		{[]string{"--node-name=n1", "--feature-gates=NoSuchGate=true"}, "NoSuchGate"},
		{[]string{"--node-name=n1", "--kubeconfig=/nonexistent/kubeconfig", "--metrics-bind-address=", "--health-bind-address="}, "/nonexistent/kubeconfig"},
		{[]string{"--node-name=n1", "--metrics-bind-address=9470"}, "--metrics-bind-address=9470: want host:port"},
		{[]string{"--node-name=n1", "--logging-format=xml"}, "xml"},
		{[]string{"--node-name=n1", "--leader-elect-retry-period=30s"}, "want 0 < retry period < renew deadline < lease duration"},
		{[]string{"extra"}, "unknown command"},
	} {
		t.Run(strings.Join(tc.args, " "), func(t *testing.T) {
			_, err := execute(t, tc.args...)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error = %v, want one mentioning %q", err, tc.want)
			}
		})
	}
}

// --feature-gates lists the gates moat's does (features.PolicyGates), not
// every gate the agent's registry holds: AllAlpha, AllBeta, the logging
// gates and the tunnel's change nothing the agent enforces.
func TestHelpListsPolicyGates(t *testing.T) {
	out, err := execute(t, "--help")
	if err != nil {
		t.Fatal(err)
	}
	i := strings.Index(out, "--feature-gates ")
	if i < 0 {
		t.Fatal("--help does not list --feature-gates")
	}
	usage := out[i:]
	if j := strings.Index(usage, "\n      --"); j >= 0 {
		usage = usage[:j] // up to the next flag
	}
	if !strings.Contains(usage, "IngressNetworksAndNodes=true|false") {
		t.Errorf("--feature-gates does not list IngressNetworksAndNodes: %q", usage)
	}
	for _, gate := range []string{"AllAlpha", "AllBeta", "ContextualLogging", "LoggingAlphaOptions", "LoggingBetaOptions", "EnableClusterToMasterTraffic"} {
		if strings.Contains(usage, gate) {
			t.Errorf("--feature-gates lists %s: %q", gate, usage)
		}
	}
}
