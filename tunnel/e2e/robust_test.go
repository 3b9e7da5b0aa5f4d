package e2e

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	authv1 "k8s.io/api/authentication/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/apiserver-network-proxy/konnectivity-client/proto/client"

	"github.com/moat-net/moat/cmd/moat-proxy-server/app/options"
	"github.com/moat-net/moat/internal/testenv"
	"github.com/moat-net/moat/tunnel/agent"
	"github.com/moat-net/moat/tunnel/auth"
	"github.com/moat-net/moat/tunnel/dest"
	"github.com/moat-net/moat/tunnel/proto"
	"github.com/moat-net/moat/tunnel/server"
)

func metricValue(t testing.TB, g prometheus.Gatherer, name string, labels map[string]string) float64 {
	t.Helper()
	mfs, err := g.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var sum float64
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	next:
		for _, m := range mf.GetMetric() {
			for k, v := range labels {
				found := false
				for _, lp := range m.GetLabel() {
					if lp.GetName() == k && lp.GetValue() == v {
						found = true
					}
				}
				if !found {
					continue next
				}
			}
			if m.Counter != nil {
				sum += m.GetCounter().GetValue()
			} else if m.Gauge != nil {
				sum += m.GetGauge().GetValue()
			}
		}
	}
	return sum
}

// TestBothDirectionsOneStream runs control-plane and node connections at the
// same time on one agent tunnel. Both sides number their connections from 1,
// so without the origin marker their data would cross and the hashes fail.
func TestBothDirectionsOneStream(t *testing.T) {
	p := newPKI(t)
	be := startBackend(t, "tcp", "127.0.0.1:0")
	allowed, err := dest.NewAllowList([]string{be.Addr().String()})
	if err != nil {
		t.Fatal(err)
	}
	ps := startServer(t, p, serverOpts{cfg: server.Config{NodeToControlPlane: true, Allowed: allowed}})
	port := testenv.FreePort(t)
	tg, _ := dest.ParseTarget(fmt.Sprintf("%d:%s", port, be.Addr().String()))
	startAgent(t, p, ps.agentAddr, func(c *agent.Config) {
		c.NodeToControlPlane = true
		c.BindAddress = net.ParseIP("127.0.0.1")
		c.Targets = []dest.Target{tg}
	})
	eventually(t, "agent tunnel", ps.srv.Ready)
	ctx := context.Background()
	var wg sync.WaitGroup
	errs := make(chan error, 40)
	for i := range 10 {
		wg.Add(2)
		go func() {
			defer wg.Done()
			c, err := grpcDial(ctx, t, p, ps.frontAddr, be.Addr().String())
			if err != nil {
				errs <- err
				return
			}
			defer c.Close()
			if err := upload(c, 2<<20, uint64(100+i)); err != nil {
				errs <- fmt.Errorf("control plane %d: %w", i, err)
			}
		}()
		go func() {
			defer wg.Done()
			c, err := net.Dial("tcp", fmt.Sprintf("127.0.0.1:%d", port))
			if err != nil {
				errs <- err
				return
			}
			defer c.Close()
			c.SetDeadline(time.Now().Add(60 * time.Second))
			if err := download(c, 2<<20, uint64(200+i)); err != nil {
				errs <- fmt.Errorf("node %d: %w", i, err)
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}

// stockServer accepts agents like an upstream server: it sends serverID and
// serverCount, and silently ignores DIAL_REQ from the agent.
type stockServer struct{ got chan *client.Packet }

func (s *stockServer) Connect(st proto.AgentService_ConnectServer) error {
	st.SendHeader(metadata.Pairs("serverid", "stock", "servercount", "1"))
	for {
		p, err := st.Recv()
		if err != nil {
			return nil
		}
		select {
		case s.got <- p:
		default:
		}
	}
}

// TestStockServerTimeout: a node client is closed after the agent's own
// dial timeout when the server never answers.
func TestStockServerTimeout(t *testing.T) {
	p := newPKI(t)
	srvTLS, err := tlsconfigServer(p)
	if err != nil {
		t.Fatal(err)
	}
	g := grpc.NewServer(grpc.Creds(srvTLS))
	ss := &stockServer{got: make(chan *client.Packet, 10)}
	proto.RegisterAgentServiceServer(g, ss)
	ln, _ := net.Listen("tcp", "127.0.0.1:0")
	go g.Serve(ln)
	defer g.Stop()
	port := testenv.FreePort(t)
	tg, _ := dest.ParseTarget(fmt.Sprintf("%d:localhost:6443", port))
	pa := startAgent(t, p, ln.Addr().String(), func(c *agent.Config) {
		c.NodeToControlPlane = true
		c.BindAddress = net.ParseIP("127.0.0.1")
		c.Targets = []dest.Target{tg}
		c.DialTimeout = 500 * time.Millisecond
	})
	eventually(t, "agent tunnel", pa.a.Ready)
	c, err := net.Dial("tcp", fmt.Sprintf("127.0.0.1:%d", port))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetReadDeadline(time.Now().Add(20 * time.Second))
	n, err := c.Read(make([]byte, 1))
	if n != 0 || errors.Is(err, os.ErrDeadlineExceeded) || err == nil {
		t.Fatalf("want the client closed after the agent's timeout, got n=%d err=%v", n, err)
	}
	select {
	case pk := <-ss.got:
		if pk.Type != client.PacketType_DIAL_REQ {
			t.Fatalf("stock server got %s", pk.Type)
		}
	default:
		t.Fatal("stock server never saw the DIAL_REQ")
	}
}

// rogue opens a raw agent stream with valid credentials.
func rogue(t *testing.T, p *pki, addr string) proto.AgentService_ConnectClient {
	cc, err := grpc.NewClient(addr, grpc.WithTransportCredentials(agentCreds(t, p, p.agent)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close() })
	ctx, cancel := context.WithCancel(metadata.AppendToOutgoingContext(context.Background(), "agentID", "rogue", proto.MetaFeatures, "origin"))
	t.Cleanup(cancel)
	st, err := proto.Connect(ctx, cc)
	if err != nil {
		t.Fatal(err)
	}
	return st
}

// TestBadInput sends malformed and hostile packets on an agent stream. Each
// is counted and answered or dropped; a good agent's traffic is unaffected;
// an oversize frame ends only the offending stream.
func TestBadInput(t *testing.T) {
	p := newPKI(t)
	reg := prometheus.NewRegistry()
	ps := startServer(t, p, serverOpts{cfg: server.Config{Registry: reg, NodeToControlPlane: true, DialTimeout: 2 * time.Second, Strategies: []server.Strategy{server.StrategyDestHost}}})
	hs := httpBackend(t)
	startAgent(t, p, ps.agentAddr, func(c *agent.Config) { c.Identifiers = "ipv4=127.0.0.1" })
	eventually(t, "agent tunnel", ps.srv.Ready)
	st := rogue(t, p, ps.agentAddr)
	eventually(t, "rogue tunnel", func() bool { return ps.srv.Backends() == 2 })

	recv := func() *client.Packet {
		t.Helper()
		pc := make(chan *client.Packet, 1)
		go func() { p, _ := st.Recv(); pc <- p }()
		select {
		case p := <-pc:
			return p
		case <-time.After(10 * time.Second):
			t.Fatal("no reply")
			return nil
		}
	}
	send := func(pk *client.Packet) {
		t.Helper()
		if err := st.Send(pk); err != nil {
			t.Fatal(err)
		}
	}
	send(&client.Packet{Type: 42})                               // unknown type
	send(&client.Packet{Type: client.PacketType_DATA})           // no payload
	send(&client.Packet{Type: client.PacketType_DIAL_REQ})       // no payload
	send(proto.Data(proto.OriginControlPlane, 999, []byte("x"))) // unknown connection
	if r := recv(); r.Type != client.PacketType_CLOSE_REQ || r.GetCloseRequest().ConnectID != 999 {
		t.Fatalf("data for unknown ID: got %v", r)
	}
	bad := proto.Data(proto.OriginControlPlane, 5, nil)
	bad.ProtoReflect().SetUnknown([]byte{0x4a, 0x01, 0x00}) // field 9 as bytes: wrong wire type
	send(bad)
	// A node dial without the origin marker, then one for a forbidden destination.
	dr := proto.DialReq(proto.OriginControlPlane, "127.0.0.1:6443", 7)
	send(dr)
	if r := recv(); r.Type != client.PacketType_DIAL_RSP || !strings.Contains(r.GetDialResponse().Error, "origin") {
		t.Fatalf("unmarked dial: got %v", r)
	}
	send(proto.DialReq(proto.OriginNode, "127.0.0.1:22", 8))
	if r := recv(); r.Type != client.PacketType_DIAL_RSP || !strings.Contains(r.GetDialResponse().Error, "not allowed") {
		t.Fatalf("forbidden dial: got %v", r)
	}
	for reason, want := range map[string]float64{"unknown_type": 1, "malformed_DATA": 1, "malformed_DIAL_REQ": 1, "unknown_connection": 1, "bad_extension": 1} {
		if got := metricValue(t, reg, "moat_tunnel_bad_packets_total", map[string]string{"reason": reason}); got != want {
			t.Errorf("bad_packets{reason=%s} = %v, want %v", reason, got, want)
		}
	}
	if got := metricValue(t, reg, "moat_tunnel_refused_destinations_total", nil); got != 1 {
		t.Errorf("refused = %v, want 1", got)
	}
	// Oversize frame: only the rogue stream ends.
	send(proto.Data(proto.OriginControlPlane, 1, make([]byte, server.MaxFrame+1)))
	_, err := st.Recv()
	if status.Code(err) != codes.ResourceExhausted {
		t.Fatalf("oversize frame: want ResourceExhausted, got %v", err)
	}
	eventually(t, "rogue removed", func() bool { return ps.srv.Backends() == 1 })
	// The good agent (destHost picks it for 127.0.0.1) still works.
	got := httpGetVia(t, func(ctx context.Context, addr string) (net.Conn, error) {
		return grpcDial(ctx, t, p, ps.frontAddr, addr)
	}, hs.URL+"/still")
	if got != "hello /still" {
		t.Fatalf("good agent after bad input: %q", got)
	}
	// A frontend client that opens a stream and says nothing is cut off.
	silent, err := grpc.NewClient(ps.frontAddr, grpc.WithTransportCredentials(credentialsTLS(t, p)))
	if err != nil {
		t.Fatal(err)
	}
	defer silent.Close()
	ps2 := client.NewProxyServiceClient(silent)
	sst, err := ps2.Proxy(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := sst.Recv(); status.Code(err) != codes.DeadlineExceeded {
		t.Fatalf("silent frontend client: want DeadlineExceeded, got %v", err)
	}
}

// fakeTokenReview answers TokenReviews: "good-token" is the agent's
// service account.
func fakeTokenReview(t *testing.T) *httptest.Server {
	hs := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var tr authv1.TokenReview
		if err := json.NewDecoder(r.Body).Decode(&tr); err != nil {
			http.Error(w, err.Error(), 400)
			return
		}
		if tr.Spec.Token == "good-token" {
			tr.Status = authv1.TokenReviewStatus{Authenticated: true, Audiences: tr.Spec.Audiences,
				User: authv1.UserInfo{Username: "system:serviceaccount:kube-system:konnectivity-agent"}}
		} else {
			tr.Status.Error = "invalid bearer token"
		}
		w.Header().Set("Content-Type", "application/json")
		json.NewEncoder(w).Encode(&tr)
	}))
	t.Cleanup(hs.Close)
	return hs
}

// TestAgentRejected: an agent with a certificate from another CA, or
// without a valid token when tokens are required, gets no tunnel.
func TestAgentRejected(t *testing.T) {
	p := newPKI(t)
	tr := fakeTokenReview(t)
	cs, err := kubernetes.NewForConfig(&rest.Config{Host: tr.URL, ContentConfig: rest.ContentConfig{ContentType: "application/json"}})
	if err != nil {
		t.Fatal(err)
	}
	ps := startServer(t, p, serverOpts{cfg: server.Config{Auth: auth.New(auth.Config{Client: cs, Namespace: "kube-system", ServiceAccount: "konnectivity-agent", Audience: "system:konnectivity-server"})}})
	dir := t.TempDir()
	good, bad := filepath.Join(dir, "good"), filepath.Join(dir, "bad")
	os.WriteFile(good, []byte("good-token\n"), 0o600)
	os.WriteFile(bad, []byte("stolen"), 0o600)

	wrongCA := startAgent(t, p, ps.agentAddr, func(c *agent.Config) {
		c.Creds = agentCreds(t, p, p.otherAgent)
		c.TokenPath = good
	})
	noToken := startAgent(t, p, ps.agentAddr, nil)
	badToken := startAgent(t, p, ps.agentAddr, func(c *agent.Config) { c.TokenPath = bad })
	okAgent := startAgent(t, p, ps.agentAddr, func(c *agent.Config) { c.TokenPath = good })
	eventually(t, "the good agent", okAgent.a.Ready)
	time.Sleep(500 * time.Millisecond) // the others have retried several times by now
	for name, pa := range map[string]*proxyAgent{"wrong CA": wrongCA, "no token": noToken, "bad token": badToken} {
		if pa.a.Ready() {
			t.Errorf("%s: agent got a tunnel", name)
		}
	}
	if n := ps.srv.Backends(); n != 1 {
		t.Fatalf("server has %d agents, want 1", n)
	}
}

// TestServerRestart: a transfer in flight when the server stops ends with an
// error (not a hang, not corrupt data); the agent reconnects to the new
// server and new connections work.
func TestServerRestart(t *testing.T) {
	p := newPKI(t)
	ps := startServer(t, p, serverOpts{mode: options.ModeHTTPConnect})
	pa := startAgent(t, p, ps.agentAddr, nil)
	eventually(t, "agent tunnel", ps.srv.Ready)
	be := startBackend(t, "tcp", "127.0.0.1:0")
	ctx := context.Background()
	c, _, err := connectDial(ctx, t, p, ps.frontAddr, be.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := c.Write(header('D', 1<<40, 3)); err != nil {
		t.Fatal(err)
	}
	if _, err := io.CopyN(io.Discard, c, 4<<20); err != nil {
		t.Fatal(err)
	}
	ps.stop()
	c.SetReadDeadline(time.Now().Add(30 * time.Second))
	_, err = io.Copy(io.Discard, c)
	if errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatal("connection hung after the server stopped")
	}
	eventually(t, "agent notices", func() bool { return !pa.a.Ready() })
	ps2 := startServer(t, p, serverOpts{mode: options.ModeHTTPConnect, agentAddr: ps.agentAddr})
	eventually(t, "agent reconnects", ps2.srv.Ready)
	c2, _, err := connectDial(ctx, t, p, ps2.frontAddr, be.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c2.Close()
	if err := download(c2, 8<<20, 4); err != nil {
		t.Fatal(err)
	}
	eventually(t, "agent connections released", func() bool { return pa.a.Active() <= 1 })
}

// TestThousandConnections holds 1,000 tunneled connections open at once and
// checks each one's echo.
func TestThousandConnections(t *testing.T) {
	p := newPKI(t)
	ps := startServer(t, p, serverOpts{mode: options.ModeHTTPConnect})
	pa := startAgent(t, p, ps.agentAddr, nil)
	eventually(t, "agent tunnel", ps.srv.Ready)
	be := startBackend(t, "tcp", "127.0.0.1:0")
	n := 1000
	if testing.Short() {
		n = 100
	}
	conns := make([]net.Conn, n)
	var wg sync.WaitGroup
	errs := make(chan error, n)
	sem := make(chan struct{}, 64)
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			sem <- struct{}{}
			defer func() { <-sem }()
			c, err := udsConnect(ps.udsPath, be.Addr().String())
			if err != nil {
				errs <- err
				return
			}
			conns[i] = c
			msg := []byte("conn " + strconv.Itoa(i) + strings.Repeat(".", 1000))
			c.Write(header('E', 0, 0))
			c.Write(msg)
			got := make([]byte, len(msg))
			if _, err := io.ReadFull(c, got); err != nil || string(got) != string(msg) {
				errs <- fmt.Errorf("conn %d: echo %q %v", i, got[:10], err)
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	if got := pa.a.Active(); got != int64(n) {
		t.Fatalf("agent has %d open connections, want %d", got, n)
	}
	for _, c := range conns {
		c.Close()
	}
	eventually(t, "all released", func() bool { return pa.a.Active() == 0 })
}

func udsConnect(uds, address string) (net.Conn, error) {
	nc, err := net.Dial("unix", uds)
	if err != nil {
		return nil, err
	}
	return connectOn(nc, address)
}

// connectOn sends CONNECT address on nc and waits for the 200.
func connectOn(nc net.Conn, address string) (net.Conn, error) {
	fmt.Fprintf(nc, "CONNECT %s HTTP/1.1\r\nHost: %s\r\n\r\n", address, address)
	br := newBufReader(nc)
	resp, err := http.ReadResponse(br, &http.Request{Method: http.MethodConnect})
	if err != nil {
		nc.Close()
		return nil, err
	}
	if resp.StatusCode != 200 {
		nc.Close()
		return nil, fmt.Errorf("CONNECT: %s", resp.Status)
	}
	return &bufConn{Conn: nc, r: br}, nil
}
