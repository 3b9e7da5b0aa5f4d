// Package server is moat-proxy-server's library: it accepts agent tunnels
// (AgentService), serves kube-apiserver through the gRPC ProxyService and
// HTTP CONNECT frontends, and dials allowed control-plane destinations for
// node clients (KEP-2025).
package server

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"strconv"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"k8s.io/klog/v2"
	"sigs.k8s.io/apiserver-network-proxy/konnectivity-client/proto/client"

	"github.com/moat-net/moat/tunnel/dest"
	"github.com/moat-net/moat/tunnel/grpcbuf"
	"github.com/moat-net/moat/tunnel/mux"
	"github.com/moat-net/moat/tunnel/proto"
)

// Authenticator checks an agent's bearer token. node is the node the token
// is bound to (a pod's or a Node's bound service-account token), "" when it
// names none; IdentityBinding holds the agent to it.
type Authenticator interface {
	Authenticate(ctx context.Context, token string) (node string, err error)
}

// Config is the server's behaviour; listeners and TLS are wired by Serve.
type Config struct {
	ServerID    string
	ServerCount int
	// Strategies are tried in order to pick an agent for a dial.
	Strategies []Strategy
	// NodeToControlPlane is the EnableClusterToMasterTraffic gate.
	NodeToControlPlane bool
	// Allowed are the destinations node clients may reach; nil allows none.
	Allowed *dest.AllowList
	// Auth, if set, requires a valid bearer token from every agent.
	Auth Authenticator
	// IdentityBinding ties agents' agentID and identifiers to the node
	// their client certificate or token names (default BindAuto).
	IdentityBinding IdentityBinding
	// Nodes, if set, reads the addresses of the node an agent's token is
	// bound to, which such an agent may then claim as identifiers (ipv4=,
	// ipv6=, host=); without it a token-bound agent may claim only its
	// node's name (and what its certificate vouches for).
	Nodes NodeLookup
	// NodeCIDRs hold the nodes' own addresses (--node-address-cidrs): a
	// destination in them goes only to an agent that claims it, as the
	// names and addresses bound agents have claimed do (see backends.pick),
	// so also before that node's agent has connected to this server.
	NodeCIDRs []netip.Prefix
	// RecheckInterval is how often a connected agent's token is reviewed
	// again and its claims checked again against its credentials (and its
	// Node's addresses); a refusal ends its tunnel, and so does its client
	// certificate's expiry (see watchIdentity). Default
	// DefaultRecheckInterval; negative: checked only at connect (the
	// certificate's expiry still ends the tunnel).
	RecheckInterval time.Duration
	// DialTimeout bounds a dial in either direction (default 10s).
	DialTimeout time.Duration
	// Window and MaxQueue tune per-connection flow control (see mux.Config).
	Window, MaxQueue int
	// CloseLinger bounds delivering a closed connection's remaining data to
	// a local reader that stops reading (see mux.Config; default 30s).
	CloseLinger time.Duration
	// Log receives the server's structured log (the zero Logger discards).
	Log      klog.Logger
	Registry prometheus.Registerer
}

// Server holds the connected agents.
type Server struct {
	cfg      Config
	backends *backends
	metrics  *mux.Metrics
	refused  prometheus.Counter
	closed   *prometheus.CounterVec
	// sameNode counts tunnels that stayed connected beside another tunnel
	// bound to the same node (see warnShared).
	sameNode prometheus.Counter
	log      klog.Logger
	// pool backs every gRPC buffer of both hops, so that buffers move
	// between the agent stream and the frontends without copies.
	pool *grpcbuf.Pool
}

// New returns a server; cfg.Registry defaults to a private registry.
func New(cfg Config) *Server {
	if cfg.ServerCount <= 0 {
		cfg.ServerCount = 1
	}
	if cfg.DialTimeout <= 0 {
		cfg.DialTimeout = 10 * time.Second
	}
	if cfg.RecheckInterval == 0 {
		cfg.RecheckInterval = DefaultRecheckInterval
	}
	if cfg.IdentityBinding == "" {
		cfg.IdentityBinding = BindAuto
	}
	if len(cfg.Strategies) == 0 {
		cfg.Strategies = []Strategy{StrategyDefault}
	}
	if cfg.Registry == nil {
		cfg.Registry = prometheus.NewRegistry()
	}
	backendGauge := prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "moat_tunnel_backends",
		Help: "Agent tunnels connected to this server.",
	})
	refused := prometheus.NewCounter(prometheus.CounterOpts{
		Name: "moat_tunnel_refused_destinations_total",
		Help: "Node-originated dials refused because the destination is not allowed or the feature gate is off.",
	})
	closed := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "moat_tunnel_agents_closed_total",
		Help: "Agent tunnels the server ended because what admitted them no longer holds, by reason: certificate_expired, recheck_refused (token refused, claims no longer vouched for, Node gone).",
	}, []string{"reason"})
	sameNode := prometheus.NewCounter(prometheus.CounterOpts{
		Name: "moat_tunnel_node_tunnels_shared_total",
		Help: "Agent tunnels that stayed connected for 5 s beside another tunnel bound to the same node on this server, which then shares that node's connections: a copied certificate or token, or a reconnect before the server noticed the old tunnel end.",
	})
	cfg.Registry.MustRegister(backendGauge, refused, closed, sameNode)
	return &Server{
		cfg:      cfg,
		backends: newBackends(backendGauge, cfg.NodeCIDRs),
		metrics:  mux.NewMetrics(cfg.Registry),
		refused:  refused,
		closed:   closed,
		sameNode: sameNode,
		log:      cfg.Log,
		pool:     grpcbuf.New(),
	}
}

// Ready reports whether at least one agent is connected.
func (s *Server) Ready() bool { return s.backends.count() > 0 }

// Backends is the number of connected agent tunnels.
func (s *Server) Backends() int { return s.backends.count() }

// Register adds the AgentService to an agent-facing gRPC server.
func (s *Server) RegisterAgentService(g *grpc.Server) { proto.RegisterAgentServiceServer(g, s) }

// RegisterProxyService adds the ProxyService to a kube-apiserver-facing gRPC server.
func (s *Server) RegisterProxyService(g *grpc.Server) { client.RegisterProxyServiceServer(g, s) }

// Connect serves one agent tunnel.
func (s *Server) Connect(st proto.AgentService_ConnectServer) error {
	ctx := st.Context()
	md, _ := metadata.FromIncomingContext(ctx)
	ids := md.Get(proto.MetaAgentID)
	if len(ids) != 1 || ids[0] == "" {
		s.metrics.BadPacket("agent_id")
		return status.Errorf(codes.InvalidArgument, "expected exactly one non-empty agentID metadata value, got %d", len(ids))
	}
	agentID := ids[0]
	var idents proto.Identifiers
	if v := md.Get(proto.MetaAgentIdentifiers); len(v) > 0 {
		var err error
		if idents, err = proto.ParseIdentifiers(v[0]); err != nil {
			return status.Errorf(codes.InvalidArgument, "agent %s: agentIdentifiers: %v", agentID, err)
		}
	}
	var token credential
	var tok string
	if s.cfg.Auth != nil {
		var err error
		tok, err = bearer(md.Get(proto.MetaAuthorization))
		if err == nil {
			token, err = s.authenticate(ctx, tok)
		}
		if err != nil {
			s.log.Info("Agent rejected", "agentID", agentID, "err", err)
			s.metrics.BadPacket("unauthenticated")
			return status.Errorf(codes.Unauthenticated, "agent %s: %v", agentID, err)
		}
	}
	cert := certCredential(ctx)
	bound, err := s.bindIdentity(ctx, cert, token, agentID, idents)
	if le := (lookupError{}); errors.As(err, &le) {
		s.log.Info("Agent refused: its node's addresses could not be read", "agentID", agentID, "err", err)
		return status.Errorf(codes.Unavailable, "agent %s: %v", agentID, err)
	}
	if err != nil {
		s.log.Info("Agent rejected: claims do not match its credentials", "agentID", agentID, "identifiers", md.Get(proto.MetaAgentIdentifiers), "err", err)
		s.metrics.BadPacket("identity")
		return status.Errorf(codes.PermissionDenied, "agent %s: %v", agentID, err)
	}
	feat := proto.ParseFeatures(md.Get(proto.MetaFeatures))
	hdr := metadata.Pairs(proto.HeaderServerID, s.cfg.ServerID, proto.HeaderServerCount, strconv.Itoa(s.cfg.ServerCount))
	// The answer lists the extensions both use and, with credit, this
	// server's own receive window: the agent's send credit starts there.
	answer := proto.Features{Origin: feat.Origin, Credit: feat.Credit, HalfClose: feat.HalfClose}
	if feat.Credit {
		answer.Window = s.window()
	}
	if answer != (proto.Features{}) {
		hdr.Set(proto.MetaFeatures, answer.String())
	}
	if err := st.SendHeader(hdr); err != nil {
		return fmt.Errorf("agent %s: send header: %w", agentID, err)
	}
	b := &backend{id: agentID, node: bound, idents: idents}
	if bound != "" && cert.node == bound {
		b.vouched = proto.Identifiers{Hosts: cert.hosts, Addrs: cert.addrs}
	}
	b.sess = mux.New(st, mux.Config{
		LocalOrigin: proto.OriginControlPlane,
		Credit:      feat.Credit,
		HalfClose:   feat.HalfClose,
		Window:      s.window(),
		PeerWindow:  feat.PeerWindow(),
		MaxQueue:    s.cfg.MaxQueue,
		DialTimeout: s.cfg.DialTimeout,
		CloseLinger: s.cfg.CloseLinger,
		Dial:        s.dialNode,
		OnDrain:     func() { s.log.Info("Agent draining", "agentID", agentID) },
		Pool:        s.pool,
		Metrics:     s.metrics,
		Log:         s.log.WithValues("agentID", agentID),
	})
	// Only a token can stop holding (revoked, its Node's addresses
	// moved): a certificate's claims stay what they were at connect, and
	// its expiry ends the tunnel without a re-check (watchIdentity).
	var recheck func(context.Context) error
	if s.cfg.Auth != nil {
		recheck = func(ctx context.Context) error {
			token, err := s.authenticate(ctx, tok)
			if err != nil {
				return err
			}
			node, err := s.bindIdentity(ctx, cert, token, agentID, idents)
			if err == nil && node != bound {
				err = fmt.Errorf("its credentials now bind it to node %q, not %q", node, bound)
			}
			return err
		}
	}
	runCtx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	go s.watchIdentity(runCtx, cancel, agentID, certExpiry(ctx), recheck)
	s.backends.add(b)
	defer s.backends.remove(b)
	s.log.Info("Agent connected", "agentID", agentID, "features", feat.String(), "boundNode", bound)
	if bound != "" {
		shared := time.AfterFunc(sharedNodeGrace, func() { s.warnShared(b) })
		defer shared.Stop()
	}
	ran := make(chan error, 1)
	go func() { ran <- b.sess.Run(runCtx) }()
	select {
	case err = <-ran:
	case <-runCtx.Done():
		if ctx.Err() == nil {
			// watchIdentity ended it. The session's read loop waits in
			// the stream's Recv, which returns once this handler does:
			// the agent learns why, and reconnects to be judged afresh.
			cause := context.Cause(runCtx)
			s.backends.remove(b)
			s.log.Info("Agent disconnected", "agentID", agentID, "err", cause)
			return status.Errorf(codes.PermissionDenied, "agent %s: tunnel closed: %v", agentID, cause)
		}
		err = <-ran
	}
	s.log.Info("Agent disconnected", "agentID", agentID, "err", err)
	if errors.Is(err, proto.ErrUndecodable) {
		// The agent learns why its tunnel ended (a protocol error, not
		// a server going away) and reconnects with a fresh stream.
		return status.Errorf(codes.InvalidArgument, "agent %s: %v", agentID, err)
	}
	return nil
}

// sharedNodeGrace is how long a tunnel must stay connected beside another
// tunnel bound to the same node before that is warned about: an agent
// that finds it reached a server it already has a tunnel to (through a
// load balancer, with several servers) closes the new one at once.
const sharedNodeGrace = 5 * time.Second

// warnShared logs and counts b if another tunnel bound to its node is
// connected too. Not refused: a reconnect can come before the server
// notices the old tunnel end. But a copy of a node's credential (a copied
// certificate, a stolen token) would otherwise take a share of that
// node's connections unnoticed, since the strategies pick among every
// tunnel of the node.
func (s *Server) warnShared(b *backend) {
	others := s.backends.sharing(b)
	if len(others) == 0 {
		return
	}
	s.sameNode.Inc()
	s.log.Info("Warning: another tunnel bound to this agent's node is connected, and the node's connections are shared among them: a reconnect before the old tunnel ended, or a copy of the node's certificate or token",
		"agentID", b.id, "boundNode", b.node, "connected", others)
}

// authenticate reviews an agent's bearer token: the credential it is,
// naming the node it is bound to, if any.
func (s *Server) authenticate(ctx context.Context, tok string) (credential, error) {
	node, err := s.cfg.Auth.Authenticate(ctx, tok)
	return credential{node: node, what: "token (TokenReview node-name)"}, err
}

// window is the per-connection receive window this server announces.
func (s *Server) window() int {
	if s.cfg.Window > 0 {
		return s.cfg.Window
	}
	return proto.DefaultWindow
}

func bearer(vals []string) (string, error) {
	if len(vals) != 1 {
		return "", fmt.Errorf("expected one authorization header, got %d", len(vals))
	}
	tok, ok := strings.CutPrefix(vals[0], "Bearer ")
	if !ok || tok == "" {
		return "", fmt.Errorf("authorization header is not a bearer token")
	}
	return tok, nil
}

// dialNode dials a control-plane destination for a node client (KEP-2025).
func (s *Server) dialNode(ctx context.Context, o proto.Origin, address string) (net.Conn, error) {
	if !s.cfg.NodeToControlPlane {
		s.refused.Inc()
		s.metrics.Refused(o)
		return nil, fmt.Errorf("dial %s refused: node-to-control-plane traffic is disabled (feature gate EnableClusterToMasterTraffic)", address)
	}
	d, err := s.cfg.Allowed.Match(address)
	if err != nil {
		s.refused.Inc()
		s.metrics.Refused(o)
		s.log.Info("Node dial refused", "address", address, "err", err)
		return nil, fmt.Errorf("dial refused: %w", err)
	}
	var nd net.Dialer
	c, err := nd.DialContext(ctx, "tcp", d.String())
	if err != nil {
		return nil, fmt.Errorf("dial %s: %w", d, err)
	}
	return c, nil
}

// dial picks an agent for address and asks it to connect.
func (s *Server) dial(ctx context.Context, address string) (*mux.Conn, error) {
	b, err := s.backends.pick(s.cfg.Strategies, address)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(ctx, s.cfg.DialTimeout)
	defer cancel()
	return b.sess.Dial(ctx, address)
}

// DrainingBackends is the number of agent tunnels that sent DRAIN.
func (s *Server) DrainingBackends() int { return s.backends.draining() }
