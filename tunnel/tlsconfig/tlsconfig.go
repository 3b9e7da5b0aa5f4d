// Package tlsconfig builds the TLS configurations of the tunnel's hops from
// the PEM files named by flags.
package tlsconfig

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"os"

	certutil "k8s.io/client-go/util/cert"
)

// Server loads a serving certificate; if caFile is set, clients must present
// a certificate signed by it (mTLS). flag names the flag prefix for errors.
func Server(certFile, keyFile, caFile, flag string) (*tls.Config, error) {
	if certFile == "" || keyFile == "" {
		return nil, fmt.Errorf("--%s-cert and --%s-key are required", flag, flag)
	}
	cert, err := tls.LoadX509KeyPair(certFile, keyFile)
	if err != nil {
		return nil, fmt.Errorf("--%s-cert/--%s-key: %w", flag, flag, err)
	}
	cfg := &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12, NextProtos: []string{"h2", "http/1.1"}}
	if caFile != "" {
		pool, err := Pool(caFile)
		if err != nil {
			return nil, fmt.Errorf("--%s-ca-cert: %w", flag, err)
		}
		cfg.ClientCAs = pool
		cfg.ClientAuth = tls.RequireAndVerifyClientCert
	}
	return cfg, nil
}

// Client builds an agent's or client's configuration: caFile verifies the
// server (required), certFile/keyFile are the optional client certificate.
func Client(caFile, certFile, keyFile, serverName string) (*tls.Config, error) {
	if caFile == "" {
		return nil, fmt.Errorf("--ca-cert is required")
	}
	pool, err := Pool(caFile)
	if err != nil {
		return nil, fmt.Errorf("--ca-cert: %w", err)
	}
	cfg := &tls.Config{RootCAs: pool, ServerName: serverName, MinVersion: tls.VersionTLS12}
	if (certFile == "") != (keyFile == "") {
		return nil, fmt.Errorf("--agent-cert and --agent-key must be set together")
	}
	if certFile != "" {
		cert, err := tls.LoadX509KeyPair(certFile, keyFile)
		if err != nil {
			return nil, fmt.Errorf("--agent-cert/--agent-key: %w", err)
		}
		cfg.Certificates = []tls.Certificate{cert}
	}
	return cfg, nil
}

// SharedCA returns a CA certificate that the PEM bundles fileA and fileB
// both hold (the same certificate, byte for byte), nil if none.
func SharedCA(fileA, fileB string) (*x509.Certificate, error) {
	a, err := certutil.CertsFromFile(fileA)
	if err != nil {
		return nil, err
	}
	b, err := certutil.CertsFromFile(fileB)
	if err != nil {
		return nil, err
	}
	for _, ca := range a {
		for _, cb := range b {
			if ca.Equal(cb) {
				return ca, nil
			}
		}
	}
	return nil, nil
}

// Pool reads a PEM bundle of CA certificates.
func Pool(file string) (*x509.CertPool, error) {
	b, err := os.ReadFile(file)
	if err != nil {
		return nil, err
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(b) {
		return nil, fmt.Errorf("%s: no PEM certificates", file)
	}
	return pool, nil
}
