// Package options is moat-proxy-agent's command line: every flag with its
// default (Flags, named as upstream's proxy-agent plus KEP-2025's
// --bind-address and --target), the checks that need neither files nor a
// server (Validate), and the tunnel/agent.Config they make (Config). The
// run loop is in cmd/moat-proxy-agent/app.
package options

import (
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"net/url"
	"slices"
	"strconv"
	"time"

	"k8s.io/apimachinery/pkg/util/uuid"
	cliflag "k8s.io/component-base/cli/flag"

	"github.com/moat-net/moat/features"
	"github.com/moat-net/moat/internal/daemon"
	"github.com/moat-net/moat/tunnel/agent"
	"github.com/moat-net/moat/tunnel/dest"
	"github.com/moat-net/moat/tunnel/proto"
	"github.com/moat-net/moat/tunnel/upstreamflags"
)

// Options are moat-proxy-agent's flags.
type Options struct {
	ProxyServerHost  string
	ProxyServerPort  int
	CACert           string
	AgentCert        string
	AgentKey         string
	AgentID          string
	AgentIdentifiers string
	// IdentifiersFromCert adds a node certificate's SANs to
	// AgentIdentifiers (see IdentifiersFor).
	IdentifiersFromCert     bool
	ServiceAccountTokenPath string
	HealthServerHost        string
	HealthServerPort        int
	AdminBindAddress        string
	AdminServerPort         int
	SyncInterval            time.Duration
	SyncIntervalCap         time.Duration
	DialTimeout             time.Duration
	ConnectTimeout          time.Duration
	DrainTimeout            time.Duration
	BindAddress             string
	BindInterface           string
	Targets                 []string
	// generatedID is AgentID's default, a new UUID (see AgentIDFor).
	generatedID string
	// Profiling serves Go's profiles on /debug/pprof/ on the admin port.
	Profiling bool

	daemon.Common
}

// New returns the options at upstream's defaults.
func New() (*Options, error) {
	c, err := daemon.NewCommon()
	if err != nil {
		return nil, err
	}
	id := string(uuid.NewUUID())
	return &Options{ProxyServerHost: "127.0.0.1", ProxyServerPort: 8091, AgentID: id, generatedID: id,
		HealthServerPort: 8093, AdminBindAddress: "127.0.0.1", AdminServerPort: 8094,
		SyncInterval: time.Second, SyncIntervalCap: 10 * time.Second, DialTimeout: 10 * time.Second, ConnectTimeout: agent.DefaultConnectTimeout,
		DrainTimeout: 30 * time.Second, BindInterface: "lo", IdentifiersFromCert: true, Common: c}, nil
}

// AgentIDFor is the agent ID to announce: --agent-id when given, else the
// node that the client certificate cert names (CN system:node:<node>), which
// is the only ID a server binding agent identities accepts from it, else a
// new UUID.
func (o *Options) AgentIDFor(cert *x509.Certificate) string {
	if o.AgentID != o.generatedID || cert == nil {
		return o.AgentID
	}
	if node, _, _ := proto.NodeCert(cert); node != "" {
		return node
	}
	return o.AgentID
}

// IdentifiersFor is the agentIdentifiers value to announce: with
// --identifiers-from-cert and a client certificate cert that names a node
// (CN system:node:<node>), --agent-identifiers plus host= for each DNS SAN
// of cert and ipv4=/ipv6= for each IP SAN, the names and addresses the
// server lets this agent claim; else --agent-identifiers as given. So the
// shipped agent claims its node's name and address without per-node flags,
// and the destHost strategy sends that node's connections to it alone.
func (o *Options) IdentifiersFor(cert *x509.Certificate) string {
	if !o.IdentifiersFromCert || cert == nil {
		return o.AgentIdentifiers
	}
	node, hosts, addrs := proto.NodeCert(cert)
	if node == "" {
		return o.AgentIdentifiers
	}
	q, err := url.ParseQuery(o.AgentIdentifiers)
	if err != nil {
		return o.AgentIdentifiers // Validate refuses it
	}
	add := func(k, v string) {
		if !slices.Contains(q[k], v) {
			q[k] = append(q[k], v)
		}
	}
	for _, h := range hosts {
		add("host", h)
	}
	for _, a := range addrs {
		if a.Is4() {
			add("ipv4", a.String())
		} else {
			add("ipv6", a.String())
		}
	}
	return q.Encode()
}

// Flags returns the flags, in sections for --help, bound to o.
func (o *Options) Flags() cliflag.NamedFlagSets {
	var fss cliflag.NamedFlagSets
	fs := fss.FlagSet("proxy server")
	fs.StringVar(&o.ProxyServerHost, "proxy-server-host", o.ProxyServerHost, "proxy server (or load balancer) host")
	fs.IntVar(&o.ProxyServerPort, "proxy-server-port", o.ProxyServerPort, "proxy server agent port")
	fs.StringVar(&o.CACert, "ca-cert", o.CACert, "CA that signs the proxy server's certificate")
	fs.StringVar(&o.AgentCert, "agent-cert", o.AgentCert, "client certificate for mTLS")
	fs.StringVar(&o.AgentKey, "agent-key", o.AgentKey, "client key for mTLS")
	fs.StringVar(&o.AgentID, "agent-id", o.AgentID, "unique ID of this agent; default: the node an --agent-cert with CN "+proto.NodeCertPrefix+"<node> names (a server binding identities requires it), else a new UUID")
	fs.StringVar(&o.AgentIdentifiers, "agent-identifiers", o.AgentIdentifiers, "URL-encoded identifiers for destHost/defaultRoute, e.g. ipv4=10.0.0.5&host=node1")
	fs.BoolVar(&o.IdentifiersFromCert, "identifiers-from-cert", o.IdentifiersFromCert, "with an --agent-cert whose CN is "+proto.NodeCertPrefix+"<node>, also claim its DNS SANs as host= and its IP SANs as ipv4=/ipv6= identifiers (the node's name and address, which the server routes that node's connections by)")
	fs.StringVar(&o.ServiceAccountTokenPath, "service-account-token-path", o.ServiceAccountTokenPath, "file with a bearer token sent to the server")
	fs.DurationVar(&o.SyncInterval, "sync-interval", o.SyncInterval, "how often missing tunnels are retried")
	fs.DurationVar(&o.SyncIntervalCap, "sync-interval-cap", o.SyncIntervalCap, "cap of the retry backoff")
	fs.DurationVar(&o.DialTimeout, "dial-timeout", o.DialTimeout, "bound on dials and on waiting for the server's DIAL_RSP (not on connecting to the server: see --connect-timeout)")
	fs.DurationVar(&o.ConnectTimeout, "connect-timeout", o.ConnectTimeout, "bound on a tunnel's handshake with the server; the server answers only after reviewing the agent's token, which it bounds at 10s, so keep this above that")
	fs.DurationVar(&o.DrainTimeout, "drain-timeout", o.DrainTimeout, "after the first SIGTERM, how long open connections may finish")

	fs = fss.FlagSet("node to control plane (KEP-2025)")
	fs.StringVar(&o.BindAddress, "bind-address", o.BindAddress, "IP node clients connect to; added host-scoped to --bind-interface unless already local")
	fs.StringVar(&o.BindInterface, "bind-interface", o.BindInterface, "interface that receives --bind-address")
	fs.StringArrayVar(&o.Targets, "target", nil, "local_port:dst_host:dst_port forwarded to the control plane (repeatable)")
	o.Features.AddFlag(fs)

	fs = fss.FlagSet("health and metrics")
	fs.StringVar(&o.HealthServerHost, "health-server-host", o.HealthServerHost, "address of /healthz, /readyz and /metrics")
	fs.IntVar(&o.HealthServerPort, "health-server-port", o.HealthServerPort, "port of /healthz, /readyz and /metrics (0: off)")
	fs.StringVar(&o.AdminBindAddress, "admin-bind-address", o.AdminBindAddress, "address of /metrics")
	fs.IntVar(&o.AdminServerPort, "admin-server-port", o.AdminServerPort, "port of /metrics (0: off)")
	fs.BoolVar(&o.Profiling, "enable-profiling", o.Profiling, "serve Go's runtime profiles on /debug/pprof/ on the admin port")

	o.AddLoggingFlags(&fss)
	upstreamflags.AddIgnored(fss.FlagSet("upstream compatibility"), append(upstreamflags.Klog(), ignoredAgentFlags...))
	return fss
}

// ignoredAgentFlags are upstream proxy-agent flags that have no meaning for
// Moat. They are accepted so that upstream manifests start, and each use
// is warned about (docs/tunnel.md lists them).
var ignoredAgentFlags = []upstreamflags.Ignored{
	upstreamflags.Ignore("probe-interval", upstreamflags.Duration, "a tunnel's health is its stream, checked by gRPC keepalive every 30s"),
	upstreamflags.Ignore("keepalive-time", upstreamflags.Duration, "the agent pings the server every 30s"),
	upstreamflags.Ignore("sync-forever", upstreamflags.Bool, "the agent always keeps syncing: it reopens lost tunnels for as long as it runs"),
	upstreamflags.Ignore("server-count", upstreamflags.Int, "the agent takes the server count from the server's serverCount header"),
	upstreamflags.Ignore("count-server-leases", upstreamflags.Bool, "the agent takes the server count from the server's serverCount header"),
	upstreamflags.Ignore("server-count-lease-selector", upstreamflags.String, "the agent takes the server count from the server's serverCount header"),
	upstreamflags.Ignore("xfr-channel-size", upstreamflags.Int, "Moat has per-connection flow control, not channels"),
	upstreamflags.Ignore("warn-on-channel-limit", upstreamflags.Bool, "Moat has no channels to warn about"),
	upstreamflags.Ignore("enable-contention-profiling", upstreamflags.Bool, "no block profile; --enable-profiling serves the others"),
	upstreamflags.Ignore("enable-push-service-account-token", upstreamflags.Bool, "not supported: the agent sends its token to the proxy server only"),
	upstreamflags.Ignore("alpn-proto", upstreamflags.Strings, "not supported: the agent offers h2 only"),
}

// Validate checks every flag without reading files or reaching a server;
// it reports every problem at once, each naming its flag.
func (o *Options) Validate() error {
	var errs []error
	if o.ProxyServerHost == "" {
		errs = append(errs, errors.New("--proxy-server-host is empty"))
	}
	if o.ProxyServerPort < 1 || o.ProxyServerPort > 65535 {
		errs = append(errs, fmt.Errorf("--proxy-server-port %d: must be 1-65535", o.ProxyServerPort))
	}
	for _, p := range []struct {
		f string
		v int
	}{{"health-server-port", o.HealthServerPort}, {"admin-server-port", o.AdminServerPort}} {
		if p.v < 0 || p.v > 65535 {
			errs = append(errs, fmt.Errorf("--%s %d: must be 0-65535", p.f, p.v))
		}
	}
	if o.CACert == "" {
		errs = append(errs, errors.New("--ca-cert is required"))
	}
	if (o.AgentCert == "") != (o.AgentKey == "") {
		errs = append(errs, errors.New("--agent-cert and --agent-key must be set together"))
	}
	if o.AgentID == "" {
		errs = append(errs, errors.New("--agent-id is empty"))
	}
	if o.AgentIdentifiers != "" {
		if _, err := proto.ParseIdentifiers(o.AgentIdentifiers); err != nil {
			errs = append(errs, fmt.Errorf("--agent-identifiers: %w", err))
		}
	}
	if o.SyncInterval <= 0 {
		errs = append(errs, fmt.Errorf("--sync-interval %s: must be positive", o.SyncInterval))
	}
	if o.SyncIntervalCap < o.SyncInterval {
		errs = append(errs, fmt.Errorf("--sync-interval-cap %s: must be at least --sync-interval", o.SyncIntervalCap))
	}
	if o.ConnectTimeout <= 0 {
		errs = append(errs, fmt.Errorf("--connect-timeout %s: must be positive", o.ConnectTimeout))
	}
	if o.DialTimeout <= 0 {
		errs = append(errs, fmt.Errorf("--dial-timeout %s: must be positive", o.DialTimeout))
	}
	if _, err := o.parsedTargets(); err != nil {
		errs = append(errs, err)
	}
	if ip := net.ParseIP(o.BindAddress); o.BindAddress != "" && ip == nil {
		errs = append(errs, fmt.Errorf("--bind-address %q: not an IP address", o.BindAddress))
	} else if ip != nil && (ip.IsUnspecified() || ip.IsMulticast()) {
		// The listeners would accept on every interface of the node (or
		// not at all): the address must be one node clients are given.
		errs = append(errs, fmt.Errorf("--bind-address %s: must be a unicast address of the node, not unspecified or multicast (it would listen on every interface)", o.BindAddress))
	}
	if len(o.Targets) > 0 && o.BindAddress == "" {
		errs = append(errs, errors.New("--target needs --bind-address"))
	}
	if o.BindAddress != "" && o.BindInterface == "" {
		errs = append(errs, errors.New("--bind-interface is empty"))
	}
	if o.Profiling && o.AdminServerPort == 0 {
		errs = append(errs, errors.New("--enable-profiling needs --admin-server-port"))
	}
	if err := o.ValidateLogging(); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// parsedTargets are the --target values; local ports must be distinct.
func (o *Options) parsedTargets() ([]dest.Target, error) {
	var out []dest.Target
	seen := map[uint16]bool{}
	for _, s := range o.Targets {
		t, err := dest.ParseTarget(s)
		if err != nil {
			return nil, err
		}
		if seen[t.LocalPort] {
			return nil, fmt.Errorf("--target %q: local port %d used twice", s, t.LocalPort)
		}
		seen[t.LocalPort] = true
		out = append(out, t)
	}
	return out, nil
}

// NodeToControlPlane reports whether the EnableClusterToMasterTraffic gate is on.
func (o *Options) NodeToControlPlane() bool {
	return o.Features.Enabled(features.EnableClusterToMasterTraffic)
}

// Config is the agent's behaviour from validated options. The run loop
// adds what needs files or the process: Creds (from --ca-cert,
// --agent-cert, --agent-key), AgentID when the certificate names a node
// (AgentIDFor), Log and Registry; and it makes BindAddress local before
// the agent listens on it.
func (o *Options) Config() agent.Config {
	targets, _ := o.parsedTargets()
	cfg := agent.Config{
		Server:             net.JoinHostPort(o.ProxyServerHost, strconv.Itoa(o.ProxyServerPort)),
		AgentID:            o.AgentID,
		Identifiers:        o.AgentIdentifiers,
		TokenPath:          o.ServiceAccountTokenPath,
		SyncInterval:       o.SyncInterval,
		MaxBackoff:         o.SyncIntervalCap,
		DialTimeout:        o.DialTimeout,
		ConnectTimeout:     o.ConnectTimeout,
		NodeToControlPlane: o.NodeToControlPlane(),
		Targets:            targets,
	}
	if cfg.NodeToControlPlane && len(targets) > 0 {
		// Without the gate or a target nothing listens: the address is
		// neither added nor used.
		cfg.BindAddress = net.ParseIP(o.BindAddress)
	}
	return cfg
}
