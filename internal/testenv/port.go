package testenv

import (
	"net"
	"testing"
)

// FreePort returns a TCP port on 127.0.0.1 that was free a moment ago, for
// a server under test to bind. Another process may take it in between:
// good enough for tests on a developer's machine or a CI runner, where
// the kernel does not hand the same ephemeral port out again at once.
func FreePort(t testing.TB) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}
