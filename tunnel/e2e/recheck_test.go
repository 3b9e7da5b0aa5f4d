package e2e

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"math/big"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/metadata"

	testpki "github.com/moat-net/moat/internal/testenv/pki"
	"github.com/moat-net/moat/tunnel/agent"
	"github.com/moat-net/moat/tunnel/proto"
	"github.com/moat-net/moat/tunnel/server"
)

// errNoAnswer is an API server that does not answer (server.Unavailable).
type errNoAnswer struct{}

func (errNoAnswer) Error() string     { return "no answer from the API server" }
func (errNoAnswer) Unavailable() bool { return true }

// changingCluster is an Authenticator and NodeLookup whose answers a test
// changes while agents are connected: token "node-X" is bound to node-X
// until revoked, Nodes list the addresses set last, and down makes both
// unavailable.
type changingCluster struct {
	mu      sync.Mutex
	revoked map[string]bool
	nodes   map[string]string // node -> its one IP address
	down    bool
}

func (c *changingCluster) Authenticate(_ context.Context, token string) (string, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	switch {
	case c.down:
		return "", errNoAnswer{}
	case c.revoked[token]:
		return "", errors.New("token review: service account token has been invalidated")
	}
	return token, nil
}

func (c *changingCluster) NodeAddresses(_ context.Context, node string) ([]netip.Addr, []string, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.down {
		return nil, nil, errNoAnswer{}
	}
	ip, ok := c.nodes[node]
	if !ok {
		return nil, nil, errors.New("nodes \"" + node + "\" not found")
	}
	return []netip.Addr{netip.MustParseAddr(ip)}, nil, nil
}

func (c *changingCluster) set(f func()) {
	c.mu.Lock()
	defer c.mu.Unlock()
	f()
}

// TestRecheckClosesStaleTunnels: a connected agent's token and claims are
// checked again every RecheckInterval, and its tunnel ends once they no
// longer hold: its Node's address moved to another node, its token was
// revoked. Before, both were checked only at connect and the tunnel kept
// its claim, and a share of the address's new owner's connections, for as
// long as it lived. An API server that does not answer keeps tunnels up.
func TestRecheckClosesStaleTunnels(t *testing.T) {
	p := newPKI(t)
	cl := &changingCluster{revoked: map[string]bool{}, nodes: map[string]string{"node-a": "127.0.0.1", "node-b": "127.0.0.3"}}
	ps := startServer(t, p, serverOpts{cfg: server.Config{Auth: cl, Nodes: cl, IdentityBinding: server.BindRequired,
		Strategies: []server.Strategy{server.StrategyDestHost}, RecheckInterval: 200 * time.Millisecond}})
	tokenFile := func(tok string) string {
		f := filepath.Join(t.TempDir(), "token")
		if err := os.WriteFile(f, []byte(tok), 0o600); err != nil {
			t.Fatal(err)
		}
		return f
	}
	a := startAgent(t, p, ps.agentAddr, func(c *agent.Config) {
		c.TokenPath, c.AgentID, c.Identifiers = tokenFile("node-a"), "node-a", "ipv4=127.0.0.1"
	})
	b := startAgent(t, p, ps.agentAddr, func(c *agent.Config) {
		c.TokenPath, c.AgentID, c.Identifiers = tokenFile("node-b"), "node-b", "ipv4=127.0.0.3"
	})
	eventually(t, "both agents", func() bool { return ps.srv.Backends() == 2 })

	// The API server does not answer for several re-checks: the tunnels stay.
	cl.set(func() { cl.down = true })
	time.Sleep(time.Second)
	if n := ps.srv.Backends(); n != 2 || !a.a.Ready() || !b.a.Ready() {
		t.Fatalf("API server unavailable: %d tunnels (node-a %v, node-b %v), want both kept", n, a.a.Ready(), b.a.Ready())
	}
	cl.set(func() { cl.down = false })

	// node-a's Node no longer lists 127.0.0.1: its agent's claim is stale.
	cl.set(func() { cl.nodes["node-a"] = "127.0.0.2" })
	eventually(t, "node-a's stale tunnel closed", func() bool { return !a.a.Ready() && ps.srv.Backends() == 1 })
	// Its reconnects claim the old address and are refused, so its
	// connections are refused too, not given to node-b's agent.
	time.Sleep(500 * time.Millisecond)
	if a.a.Ready() {
		t.Fatal("node-a's agent reconnected with a claim its Node no longer vouches for")
	}
	hs := httpBackend(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if c, err := grpcDial(ctx, t, p, ps.frontAddr, hs.Listener.Addr().String()); err == nil {
		c.Close()
		t.Errorf("dial to node-a's old address with no agent claiming it: connected, want refused")
	}

	// node-b's token is revoked.
	cl.set(func() { cl.revoked["node-b"] = true })
	eventually(t, "node-b's revoked tunnel closed", func() bool { return !b.a.Ready() && ps.srv.Backends() == 0 })
}

// TestExpiredCertificateClosesTunnel: a tunnel ends when the client
// certificate it was opened with expires, as a new handshake with it would
// be refused. Before, the tunnel (and its claims) outlived the certificate.
func TestExpiredCertificateClosesTunnel(t *testing.T) {
	p := newPKI(t)
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(4242), Subject: pkix.Name{CommonName: "system:node:node-a"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(3 * time.Second),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
		IPAddresses: []net.IP{net.ParseIP("127.0.0.1")}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, p.ca.Cert, &key.PublicKey, p.ca.Key)
	if err != nil {
		t.Fatal(err)
	}
	issued, err := x509.ParseCertificate(der) // NotAfter in whole seconds
	if err != nil {
		t.Fatal(err)
	}
	kder, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	leaf := &testpki.Leaf{CertFile: filepath.Join(dir, "a.crt"), KeyFile: filepath.Join(dir, "a.key")}
	if err := os.WriteFile(leaf.CertFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(leaf.KeyFile, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: kder}), 0o600); err != nil {
		t.Fatal(err)
	}
	ps := startServer(t, p, serverOpts{cfg: server.Config{IdentityBinding: server.BindRequired,
		Strategies: []server.Strategy{server.StrategyDestHost}}})
	a := startAgent(t, p, ps.agentAddr, func(c *agent.Config) {
		c.Creds, c.AgentID, c.Identifiers = agentCreds(t, p, leaf), "node-a", "ipv4=127.0.0.1"
	})
	eventually(t, "node-a's agent", a.a.Ready)
	eventually(t, "the tunnel closed at the certificate's expiry", func() bool { return ps.srv.Backends() == 0 && !a.a.Ready() })
	if time.Now().Before(issued.NotAfter) {
		t.Fatalf("tunnel closed before the certificate expired")
	}
	if err := tryConnect(t, ps.agentAddr, agentCreds(t, p, leaf), metadata.Pairs(proto.MetaAgentID, "node-a")); err == nil {
		t.Fatal("expired certificate accepted on a fresh handshake")
	}
}
