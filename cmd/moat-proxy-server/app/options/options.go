// Package options is moat-proxy-server's command line: every flag with its
// default (Flags, named as upstream's proxy-server), the checks that need
// neither files nor a cluster (Validate), and the server.Config they make
// (Config). The run loop is in cmd/moat-proxy-server/app.
package options

import (
	"crypto/tls"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/util/uuid"
	cliflag "k8s.io/component-base/cli/flag"

	"github.com/moat-net/moat/features"
	"github.com/moat-net/moat/internal/daemon"
	"github.com/moat-net/moat/tunnel/dest"
	"github.com/moat-net/moat/tunnel/proto"
	"github.com/moat-net/moat/tunnel/server"
	"github.com/moat-net/moat/tunnel/upstreamflags"
)

// Modes of the kube-apiserver-facing frontend (upstream --mode).
const (
	ModeGRPC        = "grpc"
	ModeHTTPConnect = "http-connect"
)

// Options are moat-proxy-server's flags.
type Options struct {
	Mode                  string
	UDSName               string
	DeleteExistingUDSFile bool
	ServerBindAddress     string
	ServerPort            int
	ServerCert            string
	ServerKey             string
	ServerCACert          string
	AgentBindAddress      string
	AgentPort             int
	ClusterCert           string
	ClusterKey            string
	ClusterCACert         string
	HealthBindAddress     string
	HealthPort            int
	AdminBindAddress      string
	AdminPort             int
	ServerID              string
	ServerCount           int
	ProxyStrategies       string
	// NodeAddressCIDRs are server.Config.NodeCIDRs' flag form.
	NodeAddressCIDRs    []string
	AgentNamespace      string
	AgentServiceAccount string
	AuthenticationAud   string
	// AgentIdentityBinding is server.IdentityBinding's flag form.
	AgentIdentityBinding string
	// AgentRecheckInterval is server.Config.RecheckInterval (0: never).
	AgentRecheckInterval time.Duration
	Kubeconfig           string
	// KubeconfigQPS and KubeconfigBurst bound the API client's request
	// rate (TokenReviews and Node reads, at connect and every re-check);
	// 0 takes client-go's (5 and 10).
	KubeconfigQPS       float32
	KubeconfigBurst     int
	AllowedDestinations []string
	DialTimeout         time.Duration
	Window              int
	// ShutdownGrace bounds how long frontends may finish on shutdown
	// (upstream's --graceful-shutdown-timeout; 0 keeps the 5s default).
	ShutdownGrace time.Duration
	// TLSMinVersion and CipherSuites apply to both TLS listeners, as
	// upstream's flags do; Moat never goes below TLS 1.2.
	TLSMinVersion string
	CipherSuites  []string
	// Profiling serves Go's profiles on /debug/pprof/ on the admin port.
	Profiling bool

	daemon.Common
}

// DefaultKubeconfigQPS and DefaultKubeconfigBurst are the API client's
// rate limits (as upstream manifests commonly set them): each connected
// agent costs up to two requests per --agent-recheck-interval and at
// connect, so 5,000 token-authenticated agents re-checked every 5 minutes
// need ~33 requests/s, past client-go's default of 5, and a restart's
// reconnects a burst above that.
const (
	DefaultKubeconfigQPS   = 50
	DefaultKubeconfigBurst = 100
)

// New returns the options at upstream's defaults.
func New() (*Options, error) {
	c, err := daemon.NewCommon()
	if err != nil {
		return nil, err
	}
	// As upstream, PROXY_SERVER_ID (a StatefulSet's pod name, say) is the
	// default ID; --server-id overrides it.
	id := os.Getenv("PROXY_SERVER_ID")
	if id == "" {
		id = string(uuid.NewUUID())
	}
	return &Options{Mode: ModeGRPC, DeleteExistingUDSFile: true, ServerPort: 8090, AgentPort: 8091, HealthPort: 8092,
		AdminBindAddress: "127.0.0.1", AdminPort: 8095, ServerID: id, ShutdownGrace: 5 * time.Second,
		ServerCount: 1, ProxyStrategies: "default", AgentIdentityBinding: string(server.BindAuto), AgentRecheckInterval: server.DefaultRecheckInterval,
		KubeconfigQPS: DefaultKubeconfigQPS, KubeconfigBurst: DefaultKubeconfigBurst, DialTimeout: 10 * time.Second, Window: 1 << 20,
		Common: c}, nil
}

// Flags returns the flags, in sections for --help, bound to o.
func (o *Options) Flags() cliflag.NamedFlagSets {
	var fss cliflag.NamedFlagSets
	fs := fss.FlagSet("kube-apiserver frontend")
	fs.StringVar(&o.Mode, "mode", o.Mode, "frontend for kube-apiserver: grpc or http-connect")
	fs.StringVar(&o.UDSName, "uds-name", o.UDSName, "Unix socket path for the frontend (plaintext, file mode 0600; empty: none)")
	fs.BoolVar(&o.DeleteExistingUDSFile, "delete-existing-uds-file", o.DeleteExistingUDSFile, "remove a stale --uds-name file before listening")
	fs.StringVar(&o.ServerBindAddress, "server-bind-address", o.ServerBindAddress, "address of the TCP frontend")
	fs.IntVar(&o.ServerPort, "server-port", o.ServerPort, "port of the mTLS TCP frontend; 0 serves the Unix socket only")
	fs.StringVar(&o.ServerCert, "server-cert", o.ServerCert, "TCP frontend serving certificate")
	fs.StringVar(&o.ServerKey, "server-key", o.ServerKey, "TCP frontend serving key")
	fs.StringVar(&o.ServerCACert, "server-ca-cert", o.ServerCACert, "CA that signs kube-apiserver's client certificate (TCP frontend); it must sign no agent's certificate (a bundle sharing a certificate with --cluster-ca-cert is refused at start), and a client certificate with CN "+proto.NodeCertPrefix+"<node> is refused")
	fs.StringVar(&o.TLSMinVersion, "tls-min-version", o.TLSMinVersion, "minimum TLS version of both listeners: VersionTLS12 or VersionTLS13 (lower values are raised to TLS 1.2); empty: TLS 1.2")
	fs.StringSliceVar(&o.CipherSuites, "cipher-suites", o.CipherSuites, "comma-separated TLS 1.2 cipher suites of both listeners (Go's names; no effect on TLS 1.3); empty: Go's defaults")
	fs.DurationVar(&o.ShutdownGrace, "graceful-shutdown-timeout", o.ShutdownGrace, "on shutdown, how long kube-apiserver's connections may finish before the agent tunnels close; 0: the default")

	fs = fss.FlagSet("agents")
	fs.StringVar(&o.AgentBindAddress, "agent-bind-address", o.AgentBindAddress, "address agents connect to")
	fs.IntVar(&o.AgentPort, "agent-port", o.AgentPort, "port agents connect to (TLS)")
	fs.StringVar(&o.ClusterCert, "cluster-cert", o.ClusterCert, "agent-facing serving certificate")
	fs.StringVar(&o.ClusterKey, "cluster-key", o.ClusterKey, "agent-facing serving key")
	fs.StringVar(&o.ClusterCACert, "cluster-ca-cert", o.ClusterCACert, "CA that signs agent client certificates (mTLS); empty: agents need a token")
	fs.StringVar(&o.ServerID, "server-id", o.ServerID, "unique ID of this server, sent to agents")
	fs.IntVar(&o.ServerCount, "server-count", o.ServerCount, "number of servers behind the agents' load balancer")
	fs.StringVar(&o.ProxyStrategies, "proxy-strategies", o.ProxyStrategies, "comma-separated backend strategies tried in order: default, destHost, defaultRoute")
	fs.StringSliceVar(&o.NodeAddressCIDRs, "node-address-cidrs", o.NodeAddressCIDRs,
		"comma-separated CIDRs holding the nodes' own addresses (their InternalIP/ExternalIP), not pods' or Services': a connection to one goes only to an agent that claims that address (as destHost), "+
			"never to another node's agent by the default or defaultRoute strategy, and is refused while none is connected. A bound agent's node name, the names and addresses it claims and its node certificate's SANs are treated so without it, once that agent has connected")
	fs.StringVar(&o.AgentNamespace, "agent-namespace", o.AgentNamespace, "namespace of the agents' service account (token auth)")
	fs.StringVar(&o.AgentServiceAccount, "agent-service-account", o.AgentServiceAccount, "agents' service account (token auth)")
	fs.StringVar(&o.AuthenticationAud, "authentication-audience", o.AuthenticationAud, "audience agent tokens must carry")
	fs.StringVar(&o.AgentIdentityBinding, "agent-identity-binding", o.AgentIdentityBinding,
		"auto: an agent whose client certificate (CN "+proto.NodeCertPrefix+"<node>) or token (bound to a pod or Node) names a node must use that node's name as --agent-id, and may claim only identifiers its credential vouches for (host=<node> or a DNS SAN, ipv4/ipv6= an IP SAN, no cidr=); "+
			"required: as auto, and agents whose credentials name no node are refused; off: agents' own claims are trusted, as upstream")
	fs.DurationVar(&o.AgentRecheckInterval, "agent-recheck-interval", o.AgentRecheckInterval,
		"how often a connected agent's token is reviewed again and its agentID and identifiers checked again against its credentials and its Node's current addresses; a refusal closes its tunnel (the agent reconnects and is judged afresh), "+
			"no answer keeps it until the next check. A tunnel also closes when its client certificate expires. 0: no re-checks (a tunnel still closes at its certificate's expiry)")
	fs.StringVar(&o.Kubeconfig, "kubeconfig", o.Kubeconfig, "kubeconfig for TokenReview and reading the Nodes agent tokens are bound to (RBAC: deploy/tunnel/moat-proxy-server-rbac.yaml); empty uses $KUBECONFIG, ~/.kube/config, then the in-cluster service account")
	fs.Float32Var(&o.KubeconfigQPS, "kubeconfig-qps", o.KubeconfigQPS, "requests per second of the --kubeconfig client (TokenReviews and Node reads, at each agent's connect and re-check); 0: client-go's default (5)")
	fs.IntVar(&o.KubeconfigBurst, "kubeconfig-burst", o.KubeconfigBurst, "burst of the --kubeconfig client's requests; 0: client-go's default (10)")
	fs.DurationVar(&o.DialTimeout, "dial-timeout", o.DialTimeout, "bound on a dial in either direction")
	fs.IntVar(&o.Window, "flow-control-window", o.Window, "per-connection receive window in bytes with Moat agents; announced to each agent, which sends at most that much unacknowledged data per connection")
	fs.Var(upstreamflags.PositiveDuration{D: &o.DialTimeout}, "backend-dial-timeout", "upstream's name for --dial-timeout's wait for an agent's DIAL_RSP; 0 (upstream: no bound) keeps --dial-timeout")
	_ = fs.MarkDeprecated("backend-dial-timeout", "use --dial-timeout (the same bound; Moat always has one)")
	upstreamflags.Unhide(fs, "backend-dial-timeout")

	fs = fss.FlagSet("node to control plane (KEP-2025)")
	fs.StringArrayVar(&o.AllowedDestinations, "allowed-destination", nil, "host:port node clients may reach (repeatable); none: all refused")
	o.Features.AddFlag(fs)

	fs = fss.FlagSet("health and metrics")
	fs.StringVar(&o.HealthBindAddress, "health-bind-address", o.HealthBindAddress, "address of /healthz, /readyz, /metrics")
	fs.IntVar(&o.HealthPort, "health-port", o.HealthPort, "port of /healthz, /readyz, /metrics (0: off)")
	fs.StringVar(&o.AdminBindAddress, "admin-bind-address", o.AdminBindAddress, "address of the admin /metrics endpoint")
	fs.IntVar(&o.AdminPort, "admin-port", o.AdminPort, "port of the admin /metrics endpoint (0: off)")
	fs.BoolVar(&o.Profiling, "enable-profiling", o.Profiling, "serve Go's runtime profiles on /debug/pprof/ on the admin port")

	o.AddLoggingFlags(&fss)
	upstreamflags.AddIgnored(fss.FlagSet("upstream compatibility"), append(upstreamflags.Klog(), ignoredServerFlags...))
	return fss
}

// ignoredServerFlags are upstream proxy-server flags that have no meaning
// for Moat. They are accepted so that upstream manifests start, and each
// use is warned about (docs/tunnel.md lists them).
var ignoredServerFlags = []upstreamflags.Ignored{
	upstreamflags.Ignore("keepalive-time", upstreamflags.Duration, "the agent port pings idle agents every 30s"),
	upstreamflags.Ignore("frontend-keepalive-time", upstreamflags.Duration, "the frontend sends no keepalive pings of its own"),
	upstreamflags.Ignore("enable-contention-profiling", upstreamflags.Bool, "no block profile; --enable-profiling serves the others"),
	upstreamflags.Ignore("kube-api-content-type", upstreamflags.String, "the API client sends JSON"),
	upstreamflags.Ignore("xfr-channel-size", upstreamflags.Int, "Moat has per-connection flow control (--flow-control-window), not channels"),
	upstreamflags.Ignore("frontend-write-channel-size", upstreamflags.Int, "Moat has per-connection flow control (--flow-control-window), not channels"),
	upstreamflags.Ignore("warn-on-channel-limit", upstreamflags.Bool, "Moat has no channels to warn about"),
	upstreamflags.Ignore("enable-lease-controller", upstreamflags.Bool, "Moat publishes no server leases; agents learn the server count from --server-count"),
	upstreamflags.Ignore("lease-namespace", upstreamflags.String, "Moat publishes no server leases"),
	upstreamflags.Ignore("lease-label", upstreamflags.String, "Moat publishes no server leases"),
}

// TLSVersion is the minimum TLS version --tls-min-version asks for, never
// below TLS 1.2.
func (o *Options) TLSVersion() uint16 {
	v, err := cliflag.TLSVersion(o.TLSMinVersion)
	if err != nil || v < tls.VersionTLS12 {
		return tls.VersionTLS12
	}
	return v
}

// TLSCipherSuites are the --cipher-suites IDs (nil: Go's defaults).
func (o *Options) TLSCipherSuites() []uint16 {
	ids, _ := cliflag.TLSCipherSuites(o.CipherSuites)
	return ids
}

func checkPort(flag string, p int, zeroOK bool) error {
	if p < 0 || p > 65535 || (p == 0 && !zeroOK) {
		return fmt.Errorf("--%s %d: must be 1-65535", flag, p)
	}
	return nil
}

// Validate checks every flag without reading files or reaching a cluster;
// it reports every problem at once, each naming its flag.
func (o *Options) Validate() error {
	var errs []error
	if o.Mode != ModeGRPC && o.Mode != ModeHTTPConnect {
		errs = append(errs, fmt.Errorf("--mode %q: want grpc or http-connect", o.Mode))
	}
	errs = append(errs, checkPort("server-port", o.ServerPort, true), checkPort("agent-port", o.AgentPort, false),
		checkPort("health-port", o.HealthPort, true), checkPort("admin-port", o.AdminPort, true))
	if o.ServerPort == 0 && o.UDSName == "" {
		errs = append(errs, errors.New("--server-port is 0 and --uds-name is empty: kube-apiserver would have no frontend"))
	}
	if o.ServerPort != 0 {
		if o.ServerCert == "" || o.ServerKey == "" {
			errs = append(errs, errors.New("--server-cert and --server-key are required when --server-port is not 0"))
		}
		if o.ServerCACert == "" {
			errs = append(errs, errors.New("--server-ca-cert is required when --server-port is not 0 (the TCP frontend is mTLS only)"))
		}
	}
	if o.ClusterCert == "" || o.ClusterKey == "" {
		errs = append(errs, errors.New("--cluster-cert and --cluster-key are required"))
	}
	if o.ClusterCACert == "" && o.AgentServiceAccount == "" {
		errs = append(errs, errors.New("--cluster-ca-cert or --agent-service-account is required: agents must be authenticated"))
	}
	if o.ServerID == "" {
		errs = append(errs, errors.New("--server-id is empty"))
	}
	if o.ServerCount < 1 {
		errs = append(errs, fmt.Errorf("--server-count %d: must be at least 1", o.ServerCount))
	}
	if _, err := server.ParseStrategies(o.ProxyStrategies); err != nil {
		errs = append(errs, err)
	}
	if _, err := o.nodeCIDRs(); err != nil {
		errs = append(errs, err)
	}
	if o.KubeconfigQPS < 0 || o.KubeconfigBurst < 0 {
		errs = append(errs, fmt.Errorf("--kubeconfig-qps=%g --kubeconfig-burst=%d: must not be negative", o.KubeconfigQPS, o.KubeconfigBurst))
	}
	if (o.AgentNamespace == "") != (o.AgentServiceAccount == "") {
		errs = append(errs, errors.New("--agent-namespace and --agent-service-account must be set together"))
	}
	if o.AuthenticationAud != "" && o.AgentServiceAccount == "" {
		errs = append(errs, errors.New("--authentication-audience needs --agent-service-account"))
	}
	if _, err := dest.NewAllowList(o.AllowedDestinations); err != nil {
		errs = append(errs, err)
	}
	if _, err := server.ParseIdentityBinding(o.AgentIdentityBinding); err != nil {
		errs = append(errs, err)
	}
	if o.DialTimeout <= 0 {
		errs = append(errs, fmt.Errorf("--dial-timeout %s: must be positive", o.DialTimeout))
	}
	if o.AgentRecheckInterval < 0 || (o.AgentRecheckInterval > 0 && o.AgentRecheckInterval < 10*time.Second) {
		errs = append(errs, fmt.Errorf("--agent-recheck-interval %s: must be 0 (never) or at least 10s (a TokenReview per agent each time)", o.AgentRecheckInterval))
	}
	if o.Window < 64<<10 {
		errs = append(errs, fmt.Errorf("--flow-control-window %d: must be at least 65536", o.Window))
	}
	if o.TLSMinVersion != "" {
		if _, err := cliflag.TLSVersion(o.TLSMinVersion); err != nil {
			errs = append(errs, fmt.Errorf("--tls-min-version: %w", err))
		}
	}
	if _, err := cliflag.TLSCipherSuites(o.CipherSuites); err != nil {
		errs = append(errs, fmt.Errorf("--cipher-suites: %w", err))
	}
	if o.ShutdownGrace < 0 {
		errs = append(errs, fmt.Errorf("--graceful-shutdown-timeout %s: must not be negative", o.ShutdownGrace))
	}
	if o.Profiling && o.AdminPort == 0 {
		errs = append(errs, errors.New("--enable-profiling needs --admin-port"))
	}
	if err := o.ValidateLogging(); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// nodeCIDRs parses --node-address-cidrs.
func (o *Options) nodeCIDRs() ([]netip.Prefix, error) {
	var out []netip.Prefix
	for _, c := range o.NodeAddressCIDRs {
		p, err := netip.ParsePrefix(strings.TrimSpace(c))
		if err != nil {
			return nil, fmt.Errorf("--node-address-cidrs %q: %w", c, err)
		}
		if p.Addr().Zone() != "" {
			return nil, fmt.Errorf("--node-address-cidrs %q: a zone is not allowed", c)
		}
		out = append(out, p.Masked())
	}
	return out, nil
}

// Warnings are what valid options still deserve a word about at start.
func (o *Options) Warnings() []string {
	var w []string
	if o.AgentServiceAccount != "" && o.AuthenticationAud == "" {
		// Upstream refuses to start without it; Moat allows it for
		// clusters whose agents only have legacy tokens, but says what
		// it costs: a review that asks for no audience is answered for
		// kube-apiserver's own audiences, so the agents' tokens are API
		// credentials, and audience-bound ones are refused.
		w = append(w, "no --authentication-audience: kube-apiserver then accepts only agent tokens valid for its own audiences (legacy secret tokens, tokens for the API server), which this server, or anything that terminates or reads the agent hop, could replay to kube-apiserver as the agent service account; tokens minted for this server (audience system:konnectivity-server, as deploy/tunnel's DaemonSet projects) are refused. Set --authentication-audience and give agents projected tokens for that audience")
	}
	return w
}

// NodeToControlPlane reports whether the EnableClusterToMasterTraffic gate is on.
func (o *Options) NodeToControlPlane() bool {
	return o.Features.Enabled(features.EnableClusterToMasterTraffic)
}

// Config is the server's behaviour from validated options (authentication,
// logging and metrics are the run loop's to add).
func (o *Options) Config() server.Config {
	strategies, _ := server.ParseStrategies(o.ProxyStrategies)
	allowed, _ := dest.NewAllowList(o.AllowedDestinations)
	binding, _ := server.ParseIdentityBinding(o.AgentIdentityBinding)
	nodeCIDRs, _ := o.nodeCIDRs()
	recheck := o.AgentRecheckInterval
	if recheck == 0 {
		recheck = -1 // never; the library's zero is its default
	}
	return server.Config{RecheckInterval: recheck, ServerID: o.ServerID, ServerCount: o.ServerCount, Strategies: strategies, NodeCIDRs: nodeCIDRs,
		NodeToControlPlane: o.NodeToControlPlane(), Allowed: allowed, DialTimeout: o.DialTimeout, Window: o.Window,
		IdentityBinding: binding}
}
