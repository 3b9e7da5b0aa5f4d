// Package agent is moat-proxy-agent's library: it keeps a tunnel to every
// proxy server behind the load balancer, dials node-side destinations for the
// control plane, and (KEP-2025) forwards node clients to control-plane
// destinations through the tunnel.
package agent

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/experimental"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/metadata"
	"k8s.io/klog/v2"

	"github.com/moat-net/moat/tunnel/dest"
	"github.com/moat-net/moat/tunnel/grpcbuf"
	"github.com/moat-net/moat/tunnel/mux"
	"github.com/moat-net/moat/tunnel/proto"
)

// DefaultConnectTimeout is Config.ConnectTimeout's default: above the
// server's 10s TokenReview bound, with room for the round trip.
const DefaultConnectTimeout = 30 * time.Second

// Config is the agent's behaviour.
type Config struct {
	// Server is the proxy server (or its load balancer) as host:port.
	Server string
	// Creds secure the tunnel (mTLS); required.
	Creds   credentials.TransportCredentials
	AgentID string
	// Identifiers is the URL-encoded agentIdentifiers value.
	Identifiers string
	// TokenPath, if set, is read before each connect and sent as a bearer token.
	TokenPath string
	// SyncInterval is how often missing tunnels are retried (default 1s);
	// failures back off exponentially up to MaxBackoff (default 30s).
	SyncInterval, MaxBackoff time.Duration
	// DialTimeout bounds dials for the control plane and the wait for a
	// DIAL_RSP for node clients (a stock server never answers; default 10s).
	DialTimeout time.Duration
	// ConnectTimeout bounds the tunnel handshake: the wait for the server's
	// response header, which a server sends only after its TokenReview
	// (bounded at 10s there), so it must be longer than that (default 30s).
	// Separate from DialTimeout, which operators lower for dials.
	ConnectTimeout time.Duration
	// NodeToControlPlane is the EnableClusterToMasterTraffic gate; Targets
	// are only served when it is on.
	NodeToControlPlane bool
	BindAddress        net.IP
	Targets            []dest.Target
	Window, MaxQueue   int
	// CloseLinger bounds delivering a closed connection's remaining data to
	// a local reader that stops reading (see mux.Config; default 30s).
	CloseLinger time.Duration
	// NoExtensions makes the agent announce none of Moat's protocol
	// extensions, so the tunnel runs upstream's protocol exactly (no
	// credit-based flow control); used to test interoperability.
	NoExtensions bool
	// Log receives the agent's structured log (the zero Logger discards).
	Log      klog.Logger
	Registry prometheus.Registerer
}

type tunnel struct {
	serverID string
	feat     proto.Features
	sess     *mux.Session
	cc       *grpc.ClientConn
}

// Agent maintains the tunnels.
type Agent struct {
	cfg     Config
	pool    *grpcbuf.Pool
	metrics *mux.Metrics
	gauge   prometheus.Gauge
	log     klog.Logger

	mu          sync.Mutex
	tunnels     map[string]*tunnel
	serverCount int
	draining    bool

	listenMu  sync.Mutex
	listeners []net.Listener
	wg        sync.WaitGroup
}

// New validates cfg and returns an agent.
func New(cfg Config) (*Agent, error) {
	if cfg.Server == "" {
		return nil, errors.New("proxy server address is empty")
	}
	if cfg.Creds == nil {
		return nil, errors.New("agent needs transport credentials")
	}
	if cfg.AgentID == "" {
		return nil, errors.New("--agent-id is empty")
	}
	if cfg.SyncInterval <= 0 {
		cfg.SyncInterval = time.Second
	}
	if cfg.MaxBackoff <= 0 {
		cfg.MaxBackoff = 30 * time.Second
	}
	if cfg.DialTimeout <= 0 {
		cfg.DialTimeout = 10 * time.Second
	}
	if cfg.ConnectTimeout <= 0 {
		cfg.ConnectTimeout = DefaultConnectTimeout
	}
	if cfg.Registry == nil {
		cfg.Registry = prometheus.NewRegistry()
	}
	g := prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "moat_tunnel_backends",
		Help: "Tunnels this agent has open to proxy servers.",
	})
	cfg.Registry.MustRegister(g)
	return &Agent{cfg: cfg, pool: grpcbuf.New(), metrics: mux.NewMetrics(cfg.Registry), gauge: g, log: cfg.Log,
		tunnels: map[string]*tunnel{}, serverCount: 1}, nil
}

// Ready reports whether at least one tunnel is up.
func (a *Agent) Ready() bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	return len(a.tunnels) > 0
}

// Tunnels is the number of open tunnels.
func (a *Agent) Tunnels() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return len(a.tunnels)
}

// Active is the number of open tunneled connections.
func (a *Agent) Active() int64 {
	a.mu.Lock()
	defer a.mu.Unlock()
	var n int64
	for _, t := range a.tunnels {
		n += t.sess.Active()
	}
	return n
}

// Run keeps tunnels up and serves targets until ctx ends.
func (a *Agent) Run(ctx context.Context) error {
	if len(a.cfg.Targets) > 0 {
		if !a.cfg.NodeToControlPlane {
			a.log.Info("Ignoring --target: feature gate EnableClusterToMasterTraffic is off; no listener opened")
		} else if err := a.listen(ctx); err != nil {
			return err
		}
	}
	defer a.closeListeners()
	backoff := a.cfg.SyncInterval
	for {
		err := a.sync(ctx)
		wait := a.cfg.SyncInterval
		if err != nil {
			a.log.Info("Connect to proxy server failed", "server", a.cfg.Server, "err", err, "retry", backoff)
			wait = backoff + time.Duration(rand.Int64N(int64(backoff)/5+1))
			backoff = min(backoff*2, a.cfg.MaxBackoff)
		} else {
			backoff = a.cfg.SyncInterval
		}
		select {
		case <-ctx.Done():
			a.closeListeners()
			a.closeAll()
			a.wg.Wait()
			return nil
		case <-time.After(wait):
		}
	}
}

// sync opens tunnels until one per server is up. A round that reached
// only servers it already has a tunnel to (one of serverCount is down,
// behind a load balancer) is a failure, so that Run backs off: otherwise
// every agent would reconnect several times a sync interval, each time a
// TLS handshake and a token review on the servers still up.
func (a *Agent) sync(ctx context.Context) error {
	added, dups := false, 0
	for range 3 * max(a.wantTunnels(), 1) {
		a.mu.Lock()
		have, want, draining := len(a.tunnels), a.serverCount, a.draining
		a.mu.Unlock()
		if draining || have >= want {
			return nil
		}
		switch err := a.connect(ctx); {
		case errors.Is(err, errDuplicate):
			dups++
		case err != nil:
			return err
		default:
			added = true
		}
	}
	if !added && dups > 0 {
		a.mu.Lock()
		have, want := len(a.tunnels), a.serverCount
		a.mu.Unlock()
		return fmt.Errorf("%d attempts reached only servers already connected (%d of %d tunnels up)", dups, have, want)
	}
	return nil
}

// errDuplicate is connect's answer when the server it reached already has
// a tunnel from this agent.
var errDuplicate = errors.New("server already connected")

func (a *Agent) wantTunnels() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.serverCount
}

// connect opens one tunnel. Each gets its own TCP connection so that a load
// balancer spreads them; a duplicate server ID is closed again.
func (a *Agent) connect(ctx context.Context) error {
	cc, err := grpc.NewClient(a.cfg.Server,
		grpc.WithTransportCredentials(grpcbuf.LimitUnsentCreds(a.cfg.Creds)),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(4<<20), grpc.ForceCodecV2(grpcbuf.Codec{Pool: a.pool})),
		grpc.WithInitialWindowSize(8<<20), grpc.WithInitialConnWindowSize(8<<20),
		grpc.WithReadBufferSize(256<<10), grpc.WithWriteBufferSize(256<<10),
		experimental.WithBufferPool(a.pool),
		grpc.WithKeepaliveParams(keepalive.ClientParameters{Time: 30 * time.Second, Timeout: 10 * time.Second, PermitWithoutStream: true}))
	if err != nil {
		return fmt.Errorf("dial %s: %w", a.cfg.Server, err)
	}
	md := metadata.Pairs(proto.MetaAgentID, a.cfg.AgentID)
	if !a.cfg.NoExtensions {
		md.Set(proto.MetaFeatures, proto.Features{Origin: true, Credit: true, Window: a.window(), HalfClose: true}.String())
	}
	if a.cfg.Identifiers != "" {
		md.Set(proto.MetaAgentIdentifiers, a.cfg.Identifiers)
	}
	if a.cfg.TokenPath != "" {
		tok, err := os.ReadFile(a.cfg.TokenPath)
		if err != nil {
			cc.Close()
			return fmt.Errorf("--service-account-token-path: %w", err)
		}
		md.Set(proto.MetaAuthorization, "Bearer "+strings.TrimSpace(string(tok)))
	}
	sctx, cancel := context.WithCancel(metadata.NewOutgoingContext(ctx, md))
	st, err := proto.Connect(sctx, cc)
	if err != nil {
		cancel()
		cc.Close()
		return err
	}
	// The header is awaited with a bound and the stream cancelled when it
	// passes: a stream nobody runs must not stay open, or the server (which
	// registers it once its review passes) routes dials into it while this
	// agent's connect loop is stuck and it holds no tunnel.
	type header struct {
		md  metadata.MD
		err error
	}
	hdrc := make(chan header, 1)
	go func() {
		h, err := st.Header()
		hdrc <- header{h, err}
	}()
	timer := time.NewTimer(a.cfg.ConnectTimeout)
	var h header
	select {
	case h = <-hdrc:
	case <-timer.C:
		h.err = fmt.Errorf("no response header within %s (--connect-timeout)", a.cfg.ConnectTimeout)
	case <-ctx.Done():
		h.err = ctx.Err()
	}
	timer.Stop()
	fail := func(err error) error { cancel(); cc.Close(); return err }
	if h.err == nil && len(h.md) == 0 {
		// A refused tunnel is a trailers-only answer: Header has no
		// metadata and no error, and the server's reason (bad token,
		// identity not matching the credential) is the stream's status,
		// which Recv returns at once.
		if _, err := st.Recv(); err != nil && err != io.EOF {
			h.err = err
		}
	}
	if h.err != nil || len(h.md) == 0 {
		if h.err == nil {
			h.err = errors.New("no response header")
		}
		return fail(fmt.Errorf("connect %s: %w", a.cfg.Server, h.err))
	}
	hdr := h.md
	ids := hdr.Get(proto.HeaderServerID)
	if len(ids) != 1 {
		return fail(fmt.Errorf("connect %s: server sent %d serverID headers", a.cfg.Server, len(ids)))
	}
	count := 1
	if v := hdr.Get(proto.HeaderServerCount); len(v) == 1 {
		if n, err := strconv.Atoi(v[0]); err == nil && n > 0 {
			count = n
		}
	}
	feat := proto.ParseFeatures(hdr.Get(proto.MetaFeatures))
	t := &tunnel{serverID: ids[0], feat: feat, cc: cc}
	t.sess = mux.New(st, mux.Config{
		LocalOrigin: proto.OriginNode,
		Credit:      feat.Credit,
		HalfClose:   feat.HalfClose,
		Window:      a.window(),
		PeerWindow:  feat.PeerWindow(),
		MaxQueue:    a.cfg.MaxQueue,
		DialTimeout: a.cfg.DialTimeout,
		CloseLinger: a.cfg.CloseLinger,
		Dial:        a.dialNodeSide,
		Pool:        a.pool,
		Metrics:     a.metrics,
		Log:         a.log.WithValues("serverID", t.serverID),
	})
	a.mu.Lock()
	a.serverCount = count
	if _, dup := a.tunnels[t.serverID]; dup || a.draining {
		a.mu.Unlock()
		if dup {
			return fail(errDuplicate)
		}
		return fail(nil)
	}
	a.tunnels[t.serverID] = t
	a.gauge.Set(float64(len(a.tunnels)))
	a.mu.Unlock()
	a.log.Info("Tunnel up", "serverID", t.serverID, "serverCount", count, "features", feat.String())
	a.wg.Add(1)
	go func() {
		defer a.wg.Done()
		err := t.sess.Run(sctx)
		cancel()
		cc.Close()
		a.mu.Lock()
		if a.tunnels[t.serverID] == t {
			delete(a.tunnels, t.serverID)
		}
		a.gauge.Set(float64(len(a.tunnels)))
		a.mu.Unlock()
		a.log.Info("Tunnel down", "serverID", t.serverID, "err", err)
	}()
	return nil
}

// window is the per-connection receive window this agent announces.
func (a *Agent) window() int {
	if a.cfg.Window > 0 {
		return a.cfg.Window
	}
	return proto.DefaultWindow
}

// dialNodeSide makes the TCP dial the control plane asked for.
func (a *Agent) dialNodeSide(ctx context.Context, _ proto.Origin, address string) (net.Conn, error) {
	d := net.Dialer{Timeout: a.cfg.DialTimeout}
	c, err := d.DialContext(ctx, "tcp", address)
	if err != nil {
		return nil, fmt.Errorf("dial %s: %w", address, err)
	}
	return c, nil
}

// pick chooses a tunnel for a node client: one that announced the origin
// extension and is not being drained, else any.
func (a *Agent) pick() *tunnel {
	a.mu.Lock()
	defer a.mu.Unlock()
	var best, any []*tunnel
	for _, t := range a.tunnels {
		any = append(any, t)
		if t.feat.Origin {
			best = append(best, t)
		}
	}
	if len(best) > 0 {
		return best[rand.IntN(len(best))]
	}
	if len(any) > 0 {
		return any[rand.IntN(len(any))]
	}
	return nil
}

// Drain sends DRAIN on every tunnel and stops opening new ones, so servers
// prefer other agents for new dials.
func (a *Agent) Drain() {
	a.mu.Lock()
	a.draining = true
	ts := make([]*tunnel, 0, len(a.tunnels))
	for _, t := range a.tunnels {
		ts = append(ts, t)
	}
	a.mu.Unlock()
	for _, t := range ts {
		if err := t.sess.SendDrain(); err != nil {
			a.log.Error(err, "Send DRAIN failed", "serverID", t.serverID)
		}
	}
	a.log.Info("Draining", "tunnels", len(ts))
}

func (a *Agent) closeAll() {
	a.mu.Lock()
	for _, t := range a.tunnels {
		t.sess.Close()
	}
	a.mu.Unlock()
}
