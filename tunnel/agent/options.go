package agent

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/spf13/pflag"
	"google.golang.org/grpc/credentials"
	"k8s.io/apimachinery/pkg/util/uuid"
	"k8s.io/component-base/featuregate"

	"github.com/moat-net/moat/tunnel/bindaddr"
	"github.com/moat-net/moat/tunnel/dest"
	"github.com/moat-net/moat/tunnel/features"
	"github.com/moat-net/moat/tunnel/proto"
	"github.com/moat-net/moat/tunnel/tlsconfig"
)

// Options are moat-proxy-agent's flags, named as upstream's proxy-agent
// plus KEP-2025's --bind-address and --target.
type Options struct {
	ProxyServerHost         string
	ProxyServerPort         int
	CACert                  string
	AgentCert               string
	AgentKey                string
	AgentID                 string
	AgentIdentifiers        string
	ServiceAccountTokenPath string
	HealthServerHost        string
	HealthServerPort        int
	AdminBindAddress        string
	AdminServerPort         int
	SyncInterval            time.Duration
	SyncIntervalCap         time.Duration
	DialTimeout             time.Duration
	DrainTimeout            time.Duration
	BindAddress             string
	BindInterface           string
	Targets                 []string
	Gate                    featuregate.MutableFeatureGate
}

// NewOptions returns upstream's defaults.
func NewOptions() (*Options, error) {
	g, err := features.NewGate()
	if err != nil {
		return nil, err
	}
	return &Options{ProxyServerHost: "127.0.0.1", ProxyServerPort: 8091, AgentID: string(uuid.NewUUID()),
		HealthServerPort: 8093, AdminBindAddress: "127.0.0.1", AdminServerPort: 8094,
		SyncInterval: time.Second, SyncIntervalCap: 10 * time.Second, DialTimeout: 10 * time.Second,
		DrainTimeout: 30 * time.Second, BindInterface: "lo", Gate: g}, nil
}

// AddFlags registers the flags on fs.
func (o *Options) AddFlags(fs *pflag.FlagSet) {
	fs.StringVar(&o.ProxyServerHost, "proxy-server-host", o.ProxyServerHost, "proxy server (or load balancer) host")
	fs.IntVar(&o.ProxyServerPort, "proxy-server-port", o.ProxyServerPort, "proxy server agent port")
	fs.StringVar(&o.CACert, "ca-cert", o.CACert, "CA that signs the proxy server's certificate")
	fs.StringVar(&o.AgentCert, "agent-cert", o.AgentCert, "client certificate for mTLS")
	fs.StringVar(&o.AgentKey, "agent-key", o.AgentKey, "client key for mTLS")
	fs.StringVar(&o.AgentID, "agent-id", o.AgentID, "unique ID of this agent")
	fs.StringVar(&o.AgentIdentifiers, "agent-identifiers", o.AgentIdentifiers, "URL-encoded identifiers for destHost/defaultRoute, e.g. ipv4=10.0.0.5&host=node1")
	fs.StringVar(&o.ServiceAccountTokenPath, "service-account-token-path", o.ServiceAccountTokenPath, "file with a bearer token sent to the server")
	fs.StringVar(&o.HealthServerHost, "health-server-host", o.HealthServerHost, "address of /healthz and /readyz")
	fs.IntVar(&o.HealthServerPort, "health-server-port", o.HealthServerPort, "port of /healthz and /readyz (0: off)")
	fs.StringVar(&o.AdminBindAddress, "admin-bind-address", o.AdminBindAddress, "address of /metrics")
	fs.IntVar(&o.AdminServerPort, "admin-server-port", o.AdminServerPort, "port of /metrics (0: off)")
	fs.DurationVar(&o.SyncInterval, "sync-interval", o.SyncInterval, "how often missing tunnels are retried")
	fs.DurationVar(&o.SyncIntervalCap, "sync-interval-cap", o.SyncIntervalCap, "cap of the retry backoff")
	fs.DurationVar(&o.DialTimeout, "dial-timeout", o.DialTimeout, "bound on dials and on waiting for the server's DIAL_RSP")
	fs.DurationVar(&o.DrainTimeout, "drain-timeout", o.DrainTimeout, "after the first SIGTERM, how long open connections may finish")
	fs.StringVar(&o.BindAddress, "bind-address", o.BindAddress, "IP node clients connect to (KEP-2025); added host-scoped to --bind-interface unless already local")
	fs.StringVar(&o.BindInterface, "bind-interface", o.BindInterface, "interface that receives --bind-address")
	fs.StringArrayVar(&o.Targets, "target", nil, "local_port:dst_host:dst_port forwarded to the control plane (KEP-2025, repeatable)")
	o.Gate.AddFlag(fs)
}

// Validate checks every flag; errors name the flag.
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
	if o.DialTimeout <= 0 {
		errs = append(errs, fmt.Errorf("--dial-timeout %s: must be positive", o.DialTimeout))
	}
	if _, err := o.targets(); err != nil {
		errs = append(errs, err)
	}
	if o.BindAddress != "" && net.ParseIP(o.BindAddress) == nil {
		errs = append(errs, fmt.Errorf("--bind-address %q: not an IP address", o.BindAddress))
	}
	if len(o.Targets) > 0 && o.BindAddress == "" {
		errs = append(errs, errors.New("--target needs --bind-address"))
	}
	if o.BindAddress != "" && o.BindInterface == "" {
		errs = append(errs, errors.New("--bind-interface is empty"))
	}
	return errors.Join(errs...)
}

func (o *Options) targets() ([]dest.Target, error) {
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

// Run validates and runs the agent until ctx ends. The first value on
// signals starts draining (DRAIN to every server, wait up to --drain-timeout
// for open connections); a second one, or the timeout, stops the agent.
func (o *Options) Run(ctx context.Context, log *slog.Logger, signals <-chan os.Signal) error {
	if err := o.Validate(); err != nil {
		return err
	}
	tlsCfg, err := tlsconfig.Client(o.CACert, o.AgentCert, o.AgentKey, o.ProxyServerHost)
	if err != nil {
		return err
	}
	gate := o.Gate.Enabled(features.EnableClusterToMasterTraffic)
	targets, _ := o.targets()
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	cfg := Config{
		Server:             net.JoinHostPort(o.ProxyServerHost, strconv.Itoa(o.ProxyServerPort)),
		Creds:              credentials.NewTLS(tlsCfg),
		AgentID:            o.AgentID,
		Identifiers:        o.AgentIdentifiers,
		TokenPath:          o.ServiceAccountTokenPath,
		SyncInterval:       o.SyncInterval,
		MaxBackoff:         o.SyncIntervalCap,
		DialTimeout:        o.DialTimeout,
		NodeToControlPlane: gate,
		Targets:            targets,
		Log:                log,
		Registry:           reg,
	}
	if gate && len(targets) > 0 {
		ip := net.ParseIP(o.BindAddress)
		lease, err := bindaddr.Ensure(ip, o.BindInterface)
		if err != nil {
			return err
		}
		log.Info("bind address ready", "address", ip.String(), "interface", o.BindInterface, "owned", lease.Added, "adopted", lease.Adopted)
		defer func() {
			if err := lease.Release(); err != nil {
				log.Error("release bind address", "err", err)
			}
		}()
		cfg.BindAddress = ip
	}
	a, err := New(cfg)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var stops []func()
	serve := func(flag, addr string, h http.Handler) error {
		ln, err := net.Listen("tcp", addr)
		if err != nil {
			return fmt.Errorf("--%s: listen %s: %w", flag, addr, err)
		}
		hs := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second}
		go hs.Serve(ln) //nolint:errcheck // ends with Close below
		stops = append(stops, func() { hs.Close() })
		return nil
	}
	defer func() {
		for _, f := range stops {
			f()
		}
	}()
	metricsH := promhttp.HandlerFor(reg, promhttp.HandlerOpts{})
	if o.HealthServerPort != 0 {
		if err := serve("health-server-port", net.JoinHostPort(o.HealthServerHost, strconv.Itoa(o.HealthServerPort)), a.HealthHandler(metricsH)); err != nil {
			return err
		}
	}
	if o.AdminServerPort != 0 {
		m := http.NewServeMux()
		m.Handle("/metrics", metricsH)
		if err := serve("admin-server-port", net.JoinHostPort(o.AdminBindAddress, strconv.Itoa(o.AdminServerPort)), m); err != nil {
			return err
		}
	}
	go func() {
		select {
		case <-ctx.Done():
			return
		case <-signals:
		}
		a.Drain()
		deadline := time.After(o.DrainTimeout)
		tick := time.NewTicker(100 * time.Millisecond)
		defer tick.Stop()
		for a.Active() > 0 {
			select {
			case <-signals:
				log.Info("second signal: stopping now")
				cancel()
				return
			case <-deadline:
				log.Warn("drain timeout: closing open connections", "open", a.Active())
				cancel()
				return
			case <-ctx.Done():
				return
			case <-tick.C:
			}
		}
		log.Info("drained: stopping")
		cancel()
	}()
	log.Info("moat-proxy-agent starting", "agentID", o.AgentID, "server", cfg.Server, "nodeToControlPlane", gate, "targets", len(targets))
	return a.Run(ctx)
}

// HealthHandler serves /healthz (process up), /readyz (a tunnel is up) and /metrics.
func (a *Agent) HealthHandler(metrics http.Handler) http.Handler {
	m := http.NewServeMux()
	m.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) { fmt.Fprintln(w, "ok") })
	m.HandleFunc("/readyz", func(w http.ResponseWriter, _ *http.Request) {
		if n := a.Tunnels(); n > 0 {
			fmt.Fprintf(w, "ok: %d tunnels\n", n)
			return
		}
		http.Error(w, "no tunnel to a proxy server", http.StatusServiceUnavailable)
	})
	m.Handle("/metrics", metrics)
	return m
}
