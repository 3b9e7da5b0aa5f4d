// Package testenv is the one place tests learn what this host can do and
// what CI demands of them. The rule: a test that needs a capability the
// host lacks (root, nft, a real kube-apiserver) skips loudly on a
// developer's machine, and fails under CI (the CI environment variable set
// to a true value), so CI can never pass by skipping.
package testenv

import (
	"os"
	"os/exec"
	"strconv"
	"testing"
)

// InCI reports whether the CI environment variable holds a true value
// ("true", "1", ...), as CI systems and .ci/run set it.
func InCI() bool {
	ci, _ := strconv.ParseBool(os.Getenv("CI"))
	return ci
}

// Require ends the test when missing is not empty: a failure under CI, a
// loud skip elsewhere. missing says what the host lacks, for example
// "root" or "the nft binary (apt-get install nftables)".
func Require(t testing.TB, missing string) {
	t.Helper()
	if missing == "" {
		return
	}
	if InCI() {
		t.Fatalf("this test needs %s, and CI requires it to run", missing)
	}
	t.Skipf("SKIPPED: this test needs %s", missing)
}

// Missing names the first of root, nft and ip (iproute2) that the host
// lacks, "" when it has them all: what tests with network namespaces and
// nftables need.
func Missing() string {
	if os.Geteuid() != 0 {
		return "root"
	}
	if _, err := exec.LookPath("nft"); err != nil {
		return "the nft binary (apt-get install nftables)"
	}
	if _, err := exec.LookPath("ip"); err != nil {
		return "the ip binary (apt-get install iproute2)"
	}
	return ""
}

// RequirePrivileged ends the test unless the host has root, nft and ip.
func RequirePrivileged(t testing.TB) {
	t.Helper()
	Require(t, Missing())
}
