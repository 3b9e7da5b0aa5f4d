package pki

import (
	"crypto/x509"
	"testing"
)

// A leaf verifies against its CA for the names and addresses it was issued
// for, as server and as client, and not against another CA.
func TestIssue(t *testing.T) {
	dir := t.TempDir()
	ca, err := NewCA(dir, "cluster")
	if err != nil {
		t.Fatal(err)
	}
	other, err := NewCA(dir, "other")
	if err != nil {
		t.Fatal(err)
	}
	leaf, err := ca.Issue("proxy-server", "localhost", "127.0.0.1", "::1")
	if err != nil {
		t.Fatal(err)
	}
	cert := leaf.TLS.Leaf
	if cert == nil {
		if cert, err = x509.ParseCertificate(leaf.TLS.Certificate[0]); err != nil {
			t.Fatal(err)
		}
	}
	for _, c := range []struct {
		name  string
		roots *x509.CertPool
		usage x509.ExtKeyUsage
		ok    bool
	}{
		{"localhost", ca.Pool, x509.ExtKeyUsageServerAuth, true},
		{"127.0.0.1", ca.Pool, x509.ExtKeyUsageServerAuth, true},
		{"::1", ca.Pool, x509.ExtKeyUsageClientAuth, true},
		{"example.com", ca.Pool, x509.ExtKeyUsageServerAuth, false},
		{"localhost", other.Pool, x509.ExtKeyUsageServerAuth, false},
	} {
		opts := x509.VerifyOptions{Roots: c.roots, KeyUsages: []x509.ExtKeyUsage{c.usage}}
		_, err := cert.Verify(opts)
		if err == nil {
			err = cert.VerifyHostname(c.name) // IP literals are checked against the IP SANs
		}
		if (err == nil) != c.ok {
			t.Errorf("%s with %v: err %v, want ok=%v", c.name, c.usage, err, c.ok)
		}
	}
}
