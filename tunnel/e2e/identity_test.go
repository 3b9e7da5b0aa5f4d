package e2e

import (
	"bufio"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	kclient "sigs.k8s.io/apiserver-network-proxy/konnectivity-client/pkg/client"

	agentoptions "github.com/moat-net/moat/cmd/moat-proxy-agent/app/options"
	serveroptions "github.com/moat-net/moat/cmd/moat-proxy-server/app/options"
	testpki "github.com/moat-net/moat/internal/testenv/pki"
	"github.com/moat-net/moat/tunnel/agent"
	"github.com/moat-net/moat/tunnel/proto"
	"github.com/moat-net/moat/tunnel/server"
)

// tryConnect opens an agent stream to addr over a real TLS handshake with
// creds and the given metadata, and returns the server's answer: nil when
// it sent its response header (the tunnel was accepted; the stream is then
// closed again), else the gRPC status error.
func tryConnect(t *testing.T, addr string, creds credentials.TransportCredentials, md metadata.MD) error {
	t.Helper()
	cc, err := grpc.NewClient(addr, grpc.WithTransportCredentials(creds))
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	ctx, cancel := context.WithCancel(metadata.NewOutgoingContext(context.Background(), md))
	defer cancel()
	st, err := proto.Connect(ctx, cc)
	if err != nil {
		return err
	}
	h, err := st.Header()
	if err == nil && len(h.Get(proto.HeaderServerID)) == 0 {
		// A refusal is a trailers-only answer: no header, the status
		// comes with the end of the stream.
		_, err = st.Recv()
	}
	return err
}

// issue signs a leaf certificate with the test CA.
func issue(t *testing.T, p *pki, cn string, sans ...string) *testpki.Leaf {
	t.Helper()
	l, err := p.ca.Issue(cn, sans...)
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// TestIdentityBindingCertificates: with the default binding, an agent whose
// client certificate names a node (CN system:node:<name>) must use that
// name as its agentID and may claim only identifiers the certificate
// vouches for, so one node's certificate cannot pull another node's
// kube-apiserver connections; a certificate shared by every
// node names none and is trusted as upstream; "required" refuses it, "off"
// trusts every claim. Each case is a real TLS handshake with certificates
// made here.
func TestIdentityBindingCertificates(t *testing.T) {
	p := newPKI(t)
	nodeA := agentCreds(t, p, issue(t, p, "system:node:node-a", "node-a.example", "127.0.0.1"))
	shared := agentCreds(t, p, p.agent) // CN proxy-agent: names no node
	md := func(id, idents string) metadata.MD {
		m := metadata.Pairs(proto.MetaAgentID, id)
		if idents != "" {
			m.Set(proto.MetaAgentIdentifiers, idents)
		}
		return m
	}
	type tc struct {
		name    string
		creds   credentials.TransportCredentials
		md      metadata.MD
		wantErr string // "" accepted; else in the PermissionDenied message
	}
	for _, mode := range []struct {
		binding server.IdentityBinding
		cases   []tc
	}{
		{"", []tc{ // the default: auto
			{"own name and vouched identifiers", nodeA, md("node-a", "host=node-a&host=NODE-A.example&ipv4=127.0.0.1&default-route=true"), ""},
			{"no identifiers", nodeA, md("node-a", ""), ""},
			{"another node's ID", nodeA, md("node-b", ""), `names node "node-a": run the agent with --agent-id=node-a`},
			{"address not in the certificate", nodeA, md("node-a", "ipv4=127.0.0.2"), "identifier 127.0.0.2 is not an IP address of its certificate"},
			{"another node's name", nodeA, md("node-a", "host=node-b"), "identifier host=node-b"},
			{"a CIDR", nodeA, md("node-a", "cidr=0.0.0.0/0"), "cidr=0.0.0.0/0 claims many nodes' addresses"},
			{"shared certificate", shared, md("anything", "cidr=0.0.0.0/0"), ""},
		}},
		{server.BindRequired, []tc{
			{"node certificate", nodeA, md("node-a", "ipv4=127.0.0.1"), ""},
			{"another node's ID", nodeA, md("node-b", ""), `names node "node-a"`},
			{"shared certificate", shared, md("anything", ""), "credentials name no node"},
		}},
		{server.BindOff, []tc{
			{"another node's ID and a CIDR", nodeA, md("node-b", "cidr=0.0.0.0/0"), ""},
			{"shared certificate", shared, md("anything", ""), ""},
		}},
	} {
		ps := startServer(t, p, serverOpts{cfg: server.Config{IdentityBinding: mode.binding}})
		for _, c := range mode.cases {
			err := tryConnect(t, ps.agentAddr, c.creds, c.md)
			switch {
			case c.wantErr == "" && err != nil:
				t.Errorf("binding %q, %s: refused: %v", mode.binding, c.name, err)
			case c.wantErr != "" && (status.Code(err) != codes.PermissionDenied || !strings.Contains(err.Error(), c.wantErr)):
				t.Errorf("binding %q, %s: got %v, want PermissionDenied with %q", mode.binding, c.name, err, c.wantErr)
			}
		}
		ps.stop()
	}
}

// TestIdentityBindingRouting: with per-node
// certificates, node-a's agent announces its address for the destHost
// strategy; an agent holding node-b's certificate that claims node-a's
// address (or every address) gets no tunnel, so every connection to node-a
// goes through node-a's own agent.
func TestIdentityBindingRouting(t *testing.T) {
	p := newPKI(t)
	ps := startServer(t, p, serverOpts{cfg: server.Config{Strategies: []server.Strategy{server.StrategyDestHost}}})
	hs := httpBackend(t)
	a := startAgent(t, p, ps.agentAddr, func(c *agent.Config) {
		c.Creds = agentCreds(t, p, issue(t, p, "system:node:node-a", "127.0.0.1"))
		c.AgentID, c.Identifiers = "node-a", "ipv4=127.0.0.1"
	})
	eventually(t, "node-a's tunnel", a.a.Ready)
	nodeB := agentCreds(t, p, issue(t, p, "system:node:node-b", "127.0.0.2"))
	for _, idents := range []string{"ipv4=127.0.0.1", "cidr=0.0.0.0/0"} {
		for _, id := range []string{"node-b", "node-a"} {
			if err := tryConnect(t, ps.agentAddr, nodeB, metadata.Pairs(proto.MetaAgentID, id, proto.MetaAgentIdentifiers, idents)); status.Code(err) != codes.PermissionDenied {
				t.Fatalf("node-b's certificate as %s with %s: got %v, want PermissionDenied", id, idents, err)
			}
		}
	}
	if n := ps.srv.Backends(); n != 1 {
		t.Fatalf("%d tunnels, want node-a's only", n)
	}
	for range 10 {
		if got := httpGetVia(t, func(ctx context.Context, addr string) (net.Conn, error) {
			return grpcDial(ctx, t, p, ps.frontAddr, addr)
		}, hs.URL+"/x"); got != "hello /x" {
			t.Fatalf("got %q", got)
		}
	}
}

// boundTokens authenticates token "node-X" as bound to node node-X and
// "unbound" as bound to none, as a TokenReview of pod- or Node-bound tokens
// does.
type boundTokens struct{}

func (boundTokens) Authenticate(_ context.Context, token string) (string, error) {
	if token == "unbound" {
		return "", nil
	}
	if strings.HasPrefix(token, "node-") {
		return token, nil
	}
	return "", errors.New("invalid bearer token")
}

// nodeTable is a NodeLookup over fixed Node addresses; a node it does not
// hold is an API error, as a failed read is.
type nodeTable map[string][]string

func (n nodeTable) NodeAddresses(_ context.Context, node string) ([]netip.Addr, []string, error) {
	list, ok := n[node]
	if !ok {
		return nil, nil, fmt.Errorf("nodes %q not found", node)
	}
	var addrs []netip.Addr
	var hosts []string
	for _, s := range list {
		if a, err := netip.ParseAddr(s); err == nil {
			addrs = append(addrs, a)
		} else {
			hosts = append(hosts, s)
		}
	}
	return addrs, hosts, nil
}

// TestIdentityBindingTokenNodeAddresses: an agent whose token is bound to a
// node may claim the addresses and DNS names of that node's
// status.addresses (read through Config.Nodes), so destHost routing by IP
// works with per-pod tokens as it does with per-node certificates; another
// node's address, or a claim the Node cannot be read to check, gets no
// tunnel. Before, a token-bound agent could claim no ipv4=/ipv6= at all.
func TestIdentityBindingTokenNodeAddresses(t *testing.T) {
	p := newPKI(t)
	shared := agentCreds(t, p, p.agent) // names no node: the token decides
	nodeA := agentCreds(t, p, issue(t, p, "system:node:node-a", "10.1.0.9"))
	ps := startServer(t, p, serverOpts{cfg: server.Config{Auth: boundTokens{}, Nodes: nodeTable{
		"node-a": {"10.1.0.1", "fd00:1::1", "node-a.internal"},
		"node-b": {"10.1.0.2"},
	}}})
	md := func(token, id, idents string) metadata.MD {
		m := metadata.Pairs(proto.MetaAgentID, id, proto.MetaAuthorization, "Bearer "+token)
		if idents != "" {
			m.Set(proto.MetaAgentIdentifiers, idents)
		}
		return m
	}
	for _, c := range []struct {
		name     string
		creds    credentials.TransportCredentials
		md       metadata.MD
		wantCode codes.Code
		wantErr  string
	}{
		{"its node's addresses and names", shared, md("node-a", "node-a", "ipv4=10.1.0.1&ipv6=fd00:1::1&host=node-a&host=Node-A.internal&default-route=true"), codes.OK, ""},
		{"IPv4-mapped spelling of its address", shared, md("node-a", "node-a", "ipv6=::ffff:10.1.0.1"), codes.OK, ""},
		{"certificate SAN and Node address together", nodeA, md("node-a", "node-a", "ipv4=10.1.0.9&ipv4=10.1.0.1"), codes.OK, ""},
		{"another node's address", shared, md("node-a", "node-a", "ipv4=10.1.0.2"), codes.PermissionDenied,
			`identifier 10.1.0.2 is not an IP address of Node "node-a"'s status.addresses`},
		{"a name the Node does not list", shared, md("node-a", "node-a", "host=node-b"), codes.PermissionDenied, "identifier host=node-b"},
		{"another node's ID", shared, md("node-a", "node-b", "ipv4=10.1.0.2"), codes.PermissionDenied, `names node "node-a"`},
		{"a CIDR", shared, md("node-a", "node-a", "cidr=10.1.0.0/24"), codes.PermissionDenied, "claims many nodes' addresses"},
		{"a Node that cannot be read", shared, md("node-c", "node-c", "ipv4=10.1.0.3"), codes.Unavailable, `nodes "node-c" not found`},
		{"unbound token, trusted as upstream", shared, md("unbound", "anything", "ipv4=10.1.0.2"), codes.OK, ""},
	} {
		err := tryConnect(t, ps.agentAddr, c.creds, c.md)
		switch {
		case c.wantCode == codes.OK && err != nil:
			t.Errorf("%s: refused: %v", c.name, err)
		case c.wantCode != codes.OK && (status.Code(err) != c.wantCode || !strings.Contains(err.Error(), c.wantErr)):
			t.Errorf("%s: got %v, want %s with %q", c.name, err, c.wantCode, c.wantErr)
		}
	}

	// Without a NodeLookup (a library user that reads no Node objects)
	// the token vouches only for its node's name, and the error says so.
	ps2 := startServer(t, p, serverOpts{cfg: server.Config{Auth: boundTokens{}}})
	err := tryConnect(t, ps2.agentAddr, shared, md("node-a", "node-a", "ipv4=10.1.0.1"))
	if status.Code(err) != codes.PermissionDenied || !strings.Contains(err.Error(), "does not read Node objects") {
		t.Errorf("without Nodes: got %v, want PermissionDenied saying the server reads no Node objects", err)
	}
}

// TestShippedManifestsKeepNodesApart: with the shipped server and agent
// flags (deploy/tunnel's static pods: destHost,default, binding required,
// agents given only default-route=true) and per-node certificates, each
// node's kube-apiserver connections go to that node's agent only. Before,
// no agent claimed an address, destHost never matched, and the default
// strategy handed node-a's connections to node-b's agent as often as to
// its own; and with node-a's agent away they all went to node-b's. Now the
// agents claim their certificates' SANs, and a destination a bound agent
// has claimed is refused while its agent is away. Destinations that are no
// node's (webhooks, aggregated APIs) still go to any agent.
func TestShippedManifestsKeepNodesApart(t *testing.T) {
	p := newPKI(t)
	so, err := serveroptions.New()
	if err != nil {
		t.Fatal(err)
	}
	manifestArgs(t, "../../deploy/tunnel/moat-proxy-server.yaml", so)
	ao, err := agentoptions.New()
	if err != nil {
		t.Fatal(err)
	}
	manifestArgs(t, "../../deploy/tunnel/moat-proxy-agent.yaml", ao)
	cfg := so.Config()
	ps := startServer(t, p, serverOpts{cfg: server.Config{IdentityBinding: cfg.IdentityBinding, Strategies: cfg.Strategies, NodeCIDRs: cfg.NodeCIDRs}})
	hs := httpBackend(t) // node-a's kubelet, at node-a's address 127.0.0.1
	nodeAddr := hs.Listener.Addr().String()
	_, port, _ := net.SplitHostPort(nodeAddr)
	agents := map[string]*proxyAgent{}
	for _, n := range []struct{ name, ip string }{{"node-a", "127.0.0.1"}, {"node-b", "127.0.0.2"}} {
		// As issue-agent-cert.sh issues them: the node's name and address.
		leaf := issue(t, p, "system:node:"+n.name, n.name, n.ip)
		cert, err := x509.ParseCertificate(leaf.TLS.Certificate[0])
		if err != nil {
			t.Fatal(err)
		}
		agents[n.name] = startAgent(t, p, ps.agentAddr, func(c *agent.Config) {
			c.Creds, c.AgentID, c.Identifiers = agentCreds(t, p, leaf), ao.AgentIDFor(cert), ao.IdentifiersFor(cert)
		})
	}
	eventually(t, "both agents", func() bool { return ps.srv.Backends() == 2 })
	hold := func(addr string, n int) []net.Conn {
		var conns []net.Conn
		for range n {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			c, err := grpcDial(ctx, t, p, ps.frontAddr, addr)
			cancel()
			if err != nil {
				t.Fatalf("dial %s: %v", addr, err)
			}
			conns = append(conns, c)
		}
		return conns
	}
	closeAll := func(conns []net.Conn) {
		for _, c := range conns {
			c.Close()
		}
		eventually(t, "connections closed", func() bool { return agents["node-a"].a.Active() == 0 && agents["node-b"].a.Active() == 0 })
	}
	conns := hold(nodeAddr, 20)
	if a, b := agents["node-a"].a.Active(), agents["node-b"].a.Active(); a != 20 || b != 0 {
		t.Errorf("20 connections to node-a's address: node-a's agent carries %d, node-b's %d; want all on node-a's", a, b)
	}
	closeAll(conns)
	// A destination that is no node's goes to any agent, as before.
	conns = hold(net.JoinHostPort("localhost", port), 20)
	if a, b := agents["node-a"].a.Active(), agents["node-b"].a.Active(); a+b != 20 {
		t.Errorf("20 connections to localhost: node-a's agent carries %d, node-b's %d", a, b)
	}
	closeAll(conns)

	// node-a's agent goes away (a restart, an upgrade): its address and
	// name are refused, not handed to node-b's agent.
	agents["node-a"].stop()
	eventually(t, "node-a's tunnel gone", func() bool { return ps.srv.Backends() == 1 })
	for _, addr := range []string{nodeAddr, net.JoinHostPort("node-a", port), net.JoinHostPort("NODE-A.", port)} {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		c, err := grpcDial(ctx, t, p, ps.frontAddr, addr)
		cancel()
		if err == nil {
			c.Close()
			t.Errorf("dial %s with node-a's agent away: connected (node-b's agent carries %d), want refused", addr, agents["node-b"].a.Active())
		} else if !strings.Contains(err.Error(), `node "node-a"`) {
			t.Errorf("dial %s with node-a's agent away: %v, want an error naming node-a", addr, err)
		}
	}
	if got := httpGetVia(t, func(ctx context.Context, addr string) (net.Conn, error) {
		return grpcDial(ctx, t, p, ps.frontAddr, addr)
	}, "http://"+net.JoinHostPort("localhost", port)+"/webhook"); got != "hello /webhook" {
		t.Errorf("a destination that is no node's, node-a's agent away: %q", got)
	}
}

// TestNodeAddressCIDRs: with --node-address-cidrs a node's address is
// refused while no agent claiming it is connected, also before that
// node's agent has ever connected to this server (a server restarted
// while node-a's agent is down): without it, destHost,default handed
// node-a's connections to node-b's agent, whose certificate is node-b's.
func TestNodeAddressCIDRs(t *testing.T) {
	p := newPKI(t)
	hs := httpBackend(t) // node-a's kubelet at 127.0.0.1; node-a's agent is down
	_, port, _ := net.SplitHostPort(hs.Listener.Addr().String())
	for _, c := range []struct {
		cidrs   []netip.Prefix
		refused bool
	}{{nil, false}, {[]netip.Prefix{netip.MustParsePrefix("127.0.0.0/30")}, true}} {
		ps := startServer(t, p, serverOpts{cfg: server.Config{IdentityBinding: server.BindRequired, NodeCIDRs: c.cidrs,
			Strategies: []server.Strategy{server.StrategyDestHost, server.StrategyDefault}}})
		b := startAgent(t, p, ps.agentAddr, func(ac *agent.Config) {
			ac.Creds = agentCreds(t, p, issue(t, p, "system:node:node-b", "127.0.0.2"))
			ac.AgentID, ac.Identifiers = "node-b", "ipv4=127.0.0.2"
		})
		eventually(t, "node-b's agent", b.a.Ready)
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		conn, err := grpcDial(ctx, t, p, ps.frontAddr, hs.Listener.Addr().String())
		cancel()
		switch {
		case c.refused && err == nil:
			conn.Close()
			t.Errorf("--node-address-cidrs %v: node-a's address went through node-b's agent, want refused", c.cidrs)
		case c.refused && !strings.Contains(err.Error(), "--node-address-cidrs 127.0.0.0/30"):
			t.Errorf("--node-address-cidrs %v: %v, want an error naming the flag", c.cidrs, err)
		case !c.refused && err != nil:
			t.Errorf("no --node-address-cidrs: %v, want upstream's default fallback", err)
		case !c.refused:
			conn.Close()
		}
		// A destination outside the ranges still goes to any agent.
		if got := httpGetVia(t, func(ctx context.Context, addr string) (net.Conn, error) {
			return grpcDial(ctx, t, p, ps.frontAddr, addr)
		}, "http://"+net.JoinHostPort("localhost", port)+"/webhook"); got != "hello /webhook" {
			t.Errorf("--node-address-cidrs %v, localhost: %q", c.cidrs, got)
		}
		b.stop()
		ps.stop()
	}
}

// TestFrontendRefusesNodeCertificates: kube-apiserver's TCP frontend
// refuses a client certificate that names a node (an agent's, a kubelet's),
// in both modes, even where --server-ca-cert signs it (this harness uses
// one CA for both hops, as a set-up with the cluster CA for both does).
// Before, node-b's agent certificate opened a konnectivity-client tunnel
// and reached node-a's destination through node-a's agent.
// kube-apiserver's own certificate still works.
func TestFrontendRefusesNodeCertificates(t *testing.T) {
	p := newPKI(t)
	hs := httpBackend(t)
	nodeB := issue(t, p, "system:node:node-b", "127.0.0.2")
	nodeTLS := &tls.Config{RootCAs: p.ca.Pool, Certificates: []tls.Certificate{nodeB.TLS}, ServerName: "localhost", MinVersion: tls.VersionTLS12}
	for _, mode := range []string{serveroptions.ModeGRPC, serveroptions.ModeHTTPConnect} {
		ps := startServer(t, p, serverOpts{mode: mode, cfg: server.Config{IdentityBinding: server.BindRequired,
			Strategies: []server.Strategy{server.StrategyDestHost}}})
		a := startAgent(t, p, ps.agentAddr, func(c *agent.Config) {
			c.Creds = agentCreds(t, p, issue(t, p, "system:node:node-a", "127.0.0.1"))
			c.AgentID, c.Identifiers = "node-a", "ipv4=127.0.0.1"
		})
		eventually(t, "node-a's agent", a.a.Ready)
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		var err error
		if mode == serveroptions.ModeGRPC {
			var tun kclient.Tunnel
			tun, err = kclient.CreateSingleUseGrpcTunnelWithContext(ctx, context.Background(), ps.frontAddr, grpc.WithTransportCredentials(credentials.NewTLS(nodeTLS)))
			if err == nil {
				var c net.Conn
				if c, err = tun.DialContext(ctx, "tcp", hs.Listener.Addr().String()); err == nil {
					c.Close()
				}
			}
		} else {
			d := tls.Dialer{Config: nodeTLS}
			var nc net.Conn
			if nc, err = d.DialContext(ctx, "tcp", ps.frontAddr); err == nil {
				fmt.Fprintf(nc, "CONNECT %s HTTP/1.1\r\nHost: %[1]s\r\n\r\n", hs.Listener.Addr().String())
				var resp *http.Response
				if resp, err = http.ReadResponse(bufio.NewReader(nc), &http.Request{Method: http.MethodConnect}); err == nil && resp.StatusCode == http.StatusOK {
					err = nil
				} else if err == nil {
					err = errors.New(resp.Status)
				}
				nc.Close()
			}
		}
		cancel()
		if err == nil {
			t.Errorf("%s: node-b's certificate dialled node-a's destination through the frontend (node-a's agent carried it), want refused", mode)
		}
		dial := func(ctx context.Context, addr string) (net.Conn, error) {
			return grpcDial(ctx, t, p, ps.frontAddr, addr)
		}
		if mode == serveroptions.ModeHTTPConnect {
			dial = func(ctx context.Context, addr string) (net.Conn, error) {
				c, _, err := connectDial(ctx, t, p, ps.frontAddr, addr)
				return c, err
			}
		}
		if got := httpGetVia(t, dial, hs.URL+"/kubelet"); got != "hello /kubelet" {
			t.Errorf("%s: kube-apiserver's certificate: %q", mode, got)
		}
		a.stop()
		ps.stop()
	}
}

// TestUnclaimedCertificateSANsStayTheNodes: an agent whose node
// certificate lists the node's address but that does not announce it (a
// stock agent, or --identifiers-from-cert=false with the shipped
// --agent-identifiers=default-route=true) still receives that node's
// connections alone: the server takes a bound node's certificate SANs as
// that node's destinations whether claimed or not. Before, destHost never
// matched and the default strategy gave node-b's agent a share of them.
func TestUnclaimedCertificateSANsStayTheNodes(t *testing.T) {
	p := newPKI(t)
	ps := startServer(t, p, serverOpts{cfg: server.Config{IdentityBinding: server.BindRequired,
		Strategies: []server.Strategy{server.StrategyDestHost, server.StrategyDefault}}})
	hs := httpBackend(t) // node-a's kubelet at 127.0.0.1
	agents := map[string]*proxyAgent{}
	for _, n := range []struct{ name, ip string }{{"node-a", "127.0.0.1"}, {"node-b", "127.0.0.2"}} {
		agents[n.name] = startAgent(t, p, ps.agentAddr, func(c *agent.Config) {
			c.Creds = agentCreds(t, p, issue(t, p, "system:node:"+n.name, n.name, n.ip))
			c.AgentID, c.Identifiers = n.name, "default-route=true"
		})
	}
	eventually(t, "both agents", func() bool { return ps.srv.Backends() == 2 })
	for range 20 {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		c, err := grpcDial(ctx, t, p, ps.frontAddr, hs.Listener.Addr().String())
		cancel()
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
	}
	if a, b := agents["node-a"].a.Active(), agents["node-b"].a.Active(); a != 20 || b != 0 {
		t.Errorf("20 connections to node-a's address: node-a's agent carries %d, node-b's %d; want all on node-a's", a, b)
	}
}
