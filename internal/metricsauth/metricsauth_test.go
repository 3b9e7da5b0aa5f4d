package metricsauth

import (
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// writePair writes a new self-signed pair for name as PEM files.
func writePair(t *testing.T, dir, name string) (certFile, keyFile string) {
	t.Helper()
	pair, err := selfSigned([]string{name})
	if err != nil {
		t.Fatal(err)
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(pair.PrivateKey)
	if err != nil {
		t.Fatal(err)
	}
	certFile, keyFile = filepath.Join(dir, "tls.crt"), filepath.Join(dir, "tls.key")
	if err := os.WriteFile(certFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: pair.Certificate[0]}), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(keyFile, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER}), 0o600); err != nil {
		t.Fatal(err)
	}
	return certFile, keyFile
}

func servedName(t *testing.T, cfg *tls.Config) string {
	t.Helper()
	c, err := cfg.GetCertificate(&tls.ClientHelloInfo{})
	if err != nil {
		t.Fatal(err)
	}
	leaf, err := x509.ParseCertificate(c.Certificate[0])
	if err != nil {
		t.Fatal(err)
	}
	return leaf.DNSNames[0]
}

// TestTLSConfigReloadsRotatedFiles: a certificate replaced on disk is
// served from the next handshake, without a restart.
func TestTLSConfigReloadsRotatedFiles(t *testing.T) {
	dir := t.TempDir()
	certFile, keyFile := writePair(t, dir, "first")
	cfg, err := TLSConfig(certFile, keyFile)
	if err != nil {
		t.Fatal(err)
	}
	if got := servedName(t, cfg); got != "first" {
		t.Fatalf("served %q, want first", got)
	}
	writePair(t, dir, "second")
	// A modification time one second on, whatever the file system's
	// timestamp granularity.
	later := time.Now().Add(time.Second)
	for _, f := range []string{certFile, keyFile} {
		if err := os.Chtimes(f, later, later); err != nil {
			t.Fatal(err)
		}
	}
	if got := servedName(t, cfg); got != "second" {
		t.Errorf("after rotation served %q, want second", got)
	}
	if _, err := TLSConfig(certFile, ""); err == nil {
		t.Error("a certificate without a key was accepted")
	}
	self, err := TLSConfig("", "", "n1")
	if err != nil || len(self.Certificates) != 1 {
		t.Fatalf("self-signed: %v", err)
	}
}

// TestWrapNeedsABearerToken: without a token nothing reaches the API
// server or the handler.
func TestWrapNeedsABearerToken(t *testing.T) {
	g := New(Config{}) // a review would panic on the nil client
	h := g.Wrap(http.HandlerFunc(func(http.ResponseWriter, *http.Request) { t.Error("handler reached") }))
	for _, auth := range []string{"", "Basic dXNlcjpwdw==", "Bearer ", "Bearer"} {
		rec := httptest.NewRecorder()
		r := httptest.NewRequest(http.MethodGet, "/metrics", nil)
		if auth != "" {
			r.Header.Set("Authorization", auth)
		}
		h.ServeHTTP(rec, r)
		if rec.Code != http.StatusUnauthorized {
			t.Errorf("Authorization %q: HTTP %d, want 401", auth, rec.Code)
		}
	}
}
