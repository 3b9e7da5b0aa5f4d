package kubetest

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"encoding/pem"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"

	"github.com/moat-net/moat/internal/testenv/pki"
)

// apiServerPKI holds the files kube-apiserver needs for TLS and
// service-account tokens, generated fresh for every environment so
// nothing secret is committed and the client verifies the server for real.
// The CA and the serving certificate come from the tests' one PKI builder
// (internal/testenv/pki).
type apiServerPKI struct {
	caPEM          []byte // trust anchor for clients
	servingCert    string // path of the serving certificate (PEM)
	servingKey     string // path of its private key
	serviceAccount string // path of the service-account signing key (PEM, private)
}

// servingNames are the names the serving certificate is valid for: loopback
// plus the in-cluster names an agent would use.
var servingNames = []string{"localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc", "kubernetes.default.svc.cluster.local"}

// writePKI generates a CA, a serving certificate signed by it for loopback
// and the bind address, and a service-account key, and writes them under dir.
func writePKI(dir string, bind netip.Addr) (*apiServerPKI, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("create pki dir: %w", err)
	}
	ca, err := pki.NewCA(dir, "moat-kubetest")
	if err != nil {
		return nil, fmt.Errorf("kube-apiserver CA: %w", err)
	}
	hosts := append([]string{"127.0.0.1", "::1", bind.String()}, servingNames...)
	leaf, err := ca.Issue("kube-apiserver", hosts...)
	if err != nil {
		return nil, fmt.Errorf("kube-apiserver serving certificate: %w", err)
	}
	caPEM, err := os.ReadFile(ca.CertFile)
	if err != nil {
		return nil, fmt.Errorf("read CA certificate: %w", err)
	}
	saKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("generate service-account key: %w", err)
	}
	p := &apiServerPKI{
		caPEM:          caPEM,
		servingCert:    leaf.CertFile,
		servingKey:     leaf.KeyFile,
		serviceAccount: filepath.Join(dir, "sa.key"),
	}
	if err := writeECKey(p.serviceAccount, saKey); err != nil {
		return nil, err
	}
	return p, nil
}

func writeECKey(path string, key *ecdsa.PrivateKey) error {
	der, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return fmt.Errorf("encode key %s: %w", path, err)
	}
	if err := os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: der}), 0o600); err != nil {
		return fmt.Errorf("write key %s: %w", path, err)
	}
	return nil
}
