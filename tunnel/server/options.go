package server

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/spf13/pflag"
	"k8s.io/apimachinery/pkg/util/uuid"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/component-base/featuregate"

	"github.com/moat-net/moat/tunnel/auth"
	"github.com/moat-net/moat/tunnel/dest"
	"github.com/moat-net/moat/tunnel/features"
	"github.com/moat-net/moat/tunnel/tlsconfig"
)

// Options are moat-proxy-server's flags, named as upstream's proxy-server.
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
	AgentNamespace        string
	AgentServiceAccount   string
	AuthenticationAud     string
	Kubeconfig            string
	AllowedDestinations   []string
	DialTimeout           time.Duration
	Window                int
	Gate                  featuregate.MutableFeatureGate
}

// NewOptions returns upstream's defaults.
func NewOptions() (*Options, error) {
	g, err := features.NewGate()
	if err != nil {
		return nil, err
	}
	return &Options{Mode: ModeGRPC, ServerPort: 8090, AgentPort: 8091, HealthPort: 8092,
		AdminBindAddress: "127.0.0.1", AdminPort: 8095, ServerID: string(uuid.NewUUID()),
		ServerCount: 1, ProxyStrategies: "default", DialTimeout: 10 * time.Second, Window: 1 << 20, Gate: g}, nil
}

// AddFlags registers the flags on fs.
func (o *Options) AddFlags(fs *pflag.FlagSet) {
	fs.StringVar(&o.Mode, "mode", o.Mode, "frontend for kube-apiserver: grpc or http-connect")
	fs.StringVar(&o.UDSName, "uds-name", o.UDSName, "Unix socket path for the frontend (plaintext; empty: none)")
	fs.BoolVar(&o.DeleteExistingUDSFile, "delete-existing-uds-file", o.DeleteExistingUDSFile, "remove a stale --uds-name file before listening")
	fs.StringVar(&o.ServerBindAddress, "server-bind-address", o.ServerBindAddress, "address of the TCP frontend")
	fs.IntVar(&o.ServerPort, "server-port", o.ServerPort, "port of the mTLS TCP frontend; 0 serves the Unix socket only")
	fs.StringVar(&o.ServerCert, "server-cert", o.ServerCert, "TCP frontend serving certificate")
	fs.StringVar(&o.ServerKey, "server-key", o.ServerKey, "TCP frontend serving key")
	fs.StringVar(&o.ServerCACert, "server-ca-cert", o.ServerCACert, "CA that signs kube-apiserver's client certificate (TCP frontend)")
	fs.StringVar(&o.AgentBindAddress, "agent-bind-address", o.AgentBindAddress, "address agents connect to")
	fs.IntVar(&o.AgentPort, "agent-port", o.AgentPort, "port agents connect to (TLS)")
	fs.StringVar(&o.ClusterCert, "cluster-cert", o.ClusterCert, "agent-facing serving certificate")
	fs.StringVar(&o.ClusterKey, "cluster-key", o.ClusterKey, "agent-facing serving key")
	fs.StringVar(&o.ClusterCACert, "cluster-ca-cert", o.ClusterCACert, "CA that signs agent client certificates (mTLS); empty: agents need a token")
	fs.StringVar(&o.HealthBindAddress, "health-bind-address", o.HealthBindAddress, "address of /healthz, /readyz, /metrics")
	fs.IntVar(&o.HealthPort, "health-port", o.HealthPort, "port of /healthz, /readyz, /metrics")
	fs.StringVar(&o.AdminBindAddress, "admin-bind-address", o.AdminBindAddress, "address of the admin /metrics endpoint")
	fs.IntVar(&o.AdminPort, "admin-port", o.AdminPort, "port of the admin /metrics endpoint")
	fs.StringVar(&o.ServerID, "server-id", o.ServerID, "unique ID of this server, sent to agents")
	fs.IntVar(&o.ServerCount, "server-count", o.ServerCount, "number of servers behind the agents' load balancer")
	fs.StringVar(&o.ProxyStrategies, "proxy-strategies", o.ProxyStrategies, "comma-separated backend strategies tried in order: default, destHost, defaultRoute")
	fs.StringVar(&o.AgentNamespace, "agent-namespace", o.AgentNamespace, "namespace of the agents' service account (token auth)")
	fs.StringVar(&o.AgentServiceAccount, "agent-service-account", o.AgentServiceAccount, "agents' service account (token auth)")
	fs.StringVar(&o.AuthenticationAud, "authentication-audience", o.AuthenticationAud, "audience agent tokens must carry")
	fs.StringVar(&o.Kubeconfig, "kubeconfig", o.Kubeconfig, "kubeconfig for TokenReview (empty: in-cluster)")
	fs.StringArrayVar(&o.AllowedDestinations, "allowed-destination", nil, "host:port node clients may reach (KEP-2025, repeatable); none: all refused")
	fs.DurationVar(&o.DialTimeout, "dial-timeout", o.DialTimeout, "bound on a dial in either direction")
	fs.IntVar(&o.Window, "flow-control-window", o.Window, "per-connection receive window in bytes with Moat agents")
	o.Gate.AddFlag(fs)
}

func checkPort(flag string, p int, zeroOK bool) error {
	if p < 0 || p > 65535 || (p == 0 && !zeroOK) {
		return fmt.Errorf("--%s %d: must be 1-65535", flag, p)
	}
	return nil
}

// Validate checks every flag; errors name the flag.
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
	if _, err := ParseStrategies(o.ProxyStrategies); err != nil {
		errs = append(errs, err)
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
	if o.DialTimeout <= 0 {
		errs = append(errs, fmt.Errorf("--dial-timeout %s: must be positive", o.DialTimeout))
	}
	if o.Window < 64<<10 {
		errs = append(errs, fmt.Errorf("--flow-control-window %d: must be at least 65536", o.Window))
	}
	return errors.Join(errs...)
}

// Run validates, opens the listeners and serves until ctx ends.
func (o *Options) Run(ctx context.Context, log *slog.Logger) error {
	if err := o.Validate(); err != nil {
		return err
	}
	gate := o.Gate.Enabled(features.EnableClusterToMasterTraffic)
	allowed, _ := dest.NewAllowList(o.AllowedDestinations)
	if !gate && allowed.Len() > 0 {
		log.Warn("--allowed-destination ignored: feature gate EnableClusterToMasterTraffic is off")
	}
	strategies, _ := ParseStrategies(o.ProxyStrategies)
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	cfg := Config{ServerID: o.ServerID, ServerCount: o.ServerCount, Strategies: strategies,
		NodeToControlPlane: gate, Allowed: allowed, DialTimeout: o.DialTimeout, Window: o.Window,
		Log: log, Registry: reg}
	if o.AgentServiceAccount != "" {
		rc, err := restConfig(o.Kubeconfig)
		if err != nil {
			return err
		}
		cs, err := kubernetes.NewForConfig(rc)
		if err != nil {
			return fmt.Errorf("--kubeconfig: %w", err)
		}
		cfg.Auth = auth.New(auth.Config{Client: cs, Namespace: o.AgentNamespace, ServiceAccount: o.AgentServiceAccount, Audience: o.AuthenticationAud, Registry: reg})
	}
	l := Listeners{Mode: o.Mode, Gatherer: reg}
	var err error
	var opened []net.Listener
	closeAll := func() {
		for _, ln := range opened {
			ln.Close()
		}
	}
	listen := func(flag, network, addr string) (net.Listener, error) {
		ln, err := net.Listen(network, addr)
		if err != nil {
			closeAll()
			return nil, fmt.Errorf("--%s: listen %s: %w", flag, addr, err)
		}
		opened = append(opened, ln)
		return ln, nil
	}
	if l.AgentTLS, err = tlsconfig.Server(o.ClusterCert, o.ClusterKey, o.ClusterCACert, "cluster"); err != nil {
		return err
	}
	if o.ClusterCACert == "" {
		log.Warn("no --cluster-ca-cert: agents are authenticated by token only")
	}
	if o.ServerPort != 0 {
		if l.FrontendTLS, err = tlsconfig.Server(o.ServerCert, o.ServerKey, o.ServerCACert, "server"); err != nil {
			return err
		}
		if l.FrontendTCP, err = listen("server-port", "tcp", hostPort(o.ServerBindAddress, o.ServerPort)); err != nil {
			return err
		}
	}
	if o.UDSName != "" {
		if o.DeleteExistingUDSFile {
			if err := os.Remove(o.UDSName); err != nil && !errors.Is(err, os.ErrNotExist) {
				closeAll()
				return fmt.Errorf("--delete-existing-uds-file: %w", err)
			}
		}
		if l.FrontendUDS, err = listen("uds-name", "unix", o.UDSName); err != nil {
			return err
		}
		if err := os.Chmod(o.UDSName, 0o600); err != nil {
			closeAll()
			return fmt.Errorf("--uds-name: chmod: %w", err)
		}
	}
	if l.Agent, err = listen("agent-port", "tcp", hostPort(o.AgentBindAddress, o.AgentPort)); err != nil {
		return err
	}
	if o.HealthPort != 0 {
		if l.Health, err = listen("health-port", "tcp", hostPort(o.HealthBindAddress, o.HealthPort)); err != nil {
			return err
		}
	}
	if o.AdminPort != 0 {
		if l.Admin, err = listen("admin-port", "tcp", hostPort(o.AdminBindAddress, o.AdminPort)); err != nil {
			return err
		}
	}
	log.Info("moat-proxy-server starting", "serverID", o.ServerID, "mode", o.Mode, "agentAddr", l.Agent.Addr().String(),
		"nodeToControlPlane", gate, "allowedDestinations", allowed.Len())
	return New(cfg).Serve(ctx, l)
}

func hostPort(h string, p int) string { return net.JoinHostPort(h, strconv.Itoa(p)) }

func restConfig(kubeconfig string) (*rest.Config, error) {
	if kubeconfig == "" {
		rc, err := rest.InClusterConfig()
		if err != nil {
			return nil, fmt.Errorf("--kubeconfig is empty and in-cluster config failed: %w", err)
		}
		return rc, nil
	}
	rc, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		return nil, fmt.Errorf("--kubeconfig %s: %w", kubeconfig, err)
	}
	return rc, nil
}
