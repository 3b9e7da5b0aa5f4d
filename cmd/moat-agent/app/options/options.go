// Package options is moat-agent's command line: every flag with its
// default (Flags), the checks that need no cluster (Validate), and the
// agent.Config they make (Config). The run loop is in cmd/moat-agent/app.
package options

import (
	"errors"
	"fmt"
	"net"
	"os"
	"time"

	cliflag "k8s.io/component-base/cli/flag"

	"github.com/moat-net/moat/agent"
	"github.com/moat-net/moat/internal/daemon"
)

// Options are moat-agent's flags.
type Options struct {
	// NodeName is the Node this agent enforces for (default $NODE_NAME).
	NodeName string
	// Kubeconfig and Context choose the API server as kubectl does
	// (internal/kubeconfig); both empty in a pod means the ServiceAccount.
	Kubeconfig, Context string
	// MetricsBindAddress serves /metrics, HealthBindAddress /healthz and
	// /readyz (empty: not served; one address may serve all three).
	MetricsBindAddress, HealthBindAddress string
	// MetricsSecure serves /metrics (and /debug/pprof/) over TLS to
	// callers the API server authenticates (TokenReview) and authorizes
	// (SubjectAccessReview), as the kubelet and kube-scheduler do; false
	// serves plain HTTP to anyone who reaches the address.
	MetricsSecure bool
	// TLSCertFile and TLSPrivateKeyFile are the metrics' serving
	// certificate (re-read when they change); both empty: self-signed.
	TLSCertFile, TLSPrivateKeyFile string
	AllowNodeLocal                 bool
	CutDeniedEstablished           bool
	Resync                         time.Duration
	LeaderElect                    bool
	LeaderElectionNamespace        string
	// LeaseDuration, RenewDeadline and RetryPeriod time the election as
	// client-go's leaderelection (and kube-controller-manager's flags of
	// the same names). Every candidate that does not lead reads the
	// Lease every RetryPeriod (up to 1.2 times it): at thousands of
	// nodes that is the election's cost to the API server
	// (docs/scale.md), which a longer period lowers at the price of a
	// slower change of status writer.
	LeaseDuration, RenewDeadline, RetryPeriod time.Duration
	// Candidates is how many agents campaign for the Lease (0 or
	// negative: every agent); the others stand by (agent/election.go).
	Candidates int
	// NetNS programs nftables in this network namespace instead of the
	// agent's own (labs and tests: one agent per simulated node).
	NetNS string
	// Profiling serves Go's profiles on /debug/pprof/ beside /metrics.
	Profiling bool
	// Cleanup removes the node's table and exits instead of running the
	// agent (uninstall: a table no agent updates drops new pods).
	Cleanup bool
	// LockFile is the file the agent holds an exclusive lock on for its
	// lifetime, so that only one agent programs the node (empty: none).
	// At its default with NetNS, each namespace has its own
	// (cmd/moat-agent/app).
	LockFile string

	daemon.Common
}

// DefaultLockFile is --lock-file's default: under /run, which the
// DaemonSet mounts from the host (deploy/agent/daemonset.yaml), so that
// every agent on the node, in a pod or started by hand, sees one file.
const DefaultLockFile = "/run/moat/agent.lock"

// GCPercent is the agent's garbage-collection target unless GOGC is set:
// its heap is mostly caches that live as long as it does, so it keeps
// half its live heap as room for garbage instead of Go's default of all
// of it (daemon.Common.GCPercent).
const GCPercent = 50

// New returns the options at their defaults (NODE_NAME and POD_NAMESPACE
// from the environment).
func New() (*Options, error) {
	c, err := daemon.NewCommon()
	if err != nil {
		return nil, err
	}
	c.GCPercent = GCPercent
	return &Options{
		NodeName:                os.Getenv("NODE_NAME"),
		MetricsBindAddress:      ":9470",
		HealthBindAddress:       ":9471",
		MetricsSecure:           true,
		AllowNodeLocal:          true,
		Resync:                  5 * time.Minute,
		LeaderElect:             true,
		LeaseDuration:           agent.DefaultLeaseDuration,
		RenewDeadline:           agent.DefaultRenewDeadline,
		RetryPeriod:             agent.DefaultRetryPeriod,
		Candidates:              agent.DefaultCandidates,
		LockFile:                DefaultLockFile,
		LeaderElectionNamespace: envOr("POD_NAMESPACE", agent.DefaultLeaseNamespace),
		Common:                  c,
	}, nil
}

func envOr(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}

// Flags returns the flags, in sections for --help, bound to o.
func (o *Options) Flags() cliflag.NamedFlagSets {
	var fss cliflag.NamedFlagSets
	fs := fss.FlagSet("agent")
	fs.StringVar(&o.NodeName, "node-name", o.NodeName, "Name of the Node this agent enforces for (the NODE_NAME environment variable, when set, is the default)")
	fs.StringVar(&o.Kubeconfig, "kubeconfig", o.Kubeconfig, "Path to a kubeconfig file; empty uses $KUBECONFIG, ~/.kube/config, then the in-cluster ServiceAccount, as kubectl does")
	fs.StringVar(&o.Context, "context", o.Context, "The kubeconfig context to use; empty uses the current context")
	fs.StringVar(&o.MetricsBindAddress, "metrics-bind-address", o.MetricsBindAddress, "Address (host:port) serving Prometheus metrics on /metrics; empty disables")
	fs.BoolVar(&o.MetricsSecure, "metrics-secure", o.MetricsSecure, "Serve --metrics-bind-address over HTTPS, /metrics and /debug/pprof/ only to callers whose bearer token the API server authenticates (TokenReview) and authorizes for the path (SubjectAccessReview, e.g. the ClusterRole moat-metrics-reader), as the kubelet does; false serves plain HTTP to anyone who reaches the address (then bind it to 127.0.0.1, as kube-proxy does)")
	fs.StringVar(&o.TLSCertFile, "tls-cert-file", o.TLSCertFile, "PEM serving certificate of the secure metrics endpoint, read again when it changes; empty with --tls-private-key-file: a self-signed certificate made at start")
	fs.StringVar(&o.TLSPrivateKeyFile, "tls-private-key-file", o.TLSPrivateKeyFile, "PEM private key of --tls-cert-file")
	fs.StringVar(&o.HealthBindAddress, "health-bind-address", o.HealthBindAddress, "Address (host:port) serving /healthz (liveness) and /readyz (ready after the first full sync; lists how current each watch is); empty disables")
	fs.BoolVar(&o.Profiling, "profiling", o.Profiling, "Serve Go's runtime profiles (CPU, heap, goroutines) on /debug/pprof/ at --metrics-bind-address (with --metrics-secure, to callers authorized for /debug/pprof/*)")
	fs.DurationVar(&o.Resync, "resync", o.Resync, "Period of the resync: a compilation from scratch, and a rewrite of the whole table in one transaction if anything committed to nftables since the agent's last transaction (repairs edits made behind the agent's back; SIGHUP rewrites unconditionally); 0 disables")
	o.Features.AddFlag(fs)

	fs = fss.FlagSet("dataplane")
	fs.BoolVar(&o.AllowNodeLocal, "allow-node-local", o.AllowNodeLocal, "Allow traffic from this node's own addresses to its pods whatever the policies say (kubelet probes); false polices it like any other source")
	fs.BoolVar(&o.CutDeniedEstablished, "cut-denied-established", o.CutDeniedEstablished, "After each change, remove conntrack entries of established connections the new rules deny (without it they last until they end; the agent still cuts once after programming a table it found missing or edited, and always removes the entries of pod addresses that change owners)")
	fs.BoolVar(&o.Cleanup, "cleanup", o.Cleanup, "Delete this node's nftables table inet moat (in --netns, if given) and exit, without contacting the API server: the uninstall step once the agents are gone, since a table no agent updates any more keeps the last policies and drops every pod created afterwards as an unknown source. Only --netns and the logging flags apply")
	fs.StringVar(&o.LockFile, "lock-file", o.LockFile, "File the agent holds an exclusive lock (flock) on while it runs, so that only one agent programs the node: a second one (a DaemonSet updated with maxSurge, an agent started by hand) exits with an error naming the holder's pid. With --netns and this default, each network namespace has its own file in the same directory. Empty: no lock")
	fs.StringVar(&o.NetNS, "netns", o.NetNS, "Program nftables in this network namespace (a name under /var/run/netns or a path) instead of the agent's own; the API server is still reached from the agent's namespace. For labs and tests that run one agent per simulated node on one host")

	fs = fss.FlagSet("leader election")
	fs.BoolVar(&o.LeaderElect, "leader-elect", o.LeaderElect, "Take part in the election of the one agent that writes ClusterNetworkPolicy status and policy Events")
	fs.StringVar(&o.LeaderElectionNamespace, "leader-election-namespace", o.LeaderElectionNamespace, "Namespace of the status writer's Lease (the POD_NAMESPACE environment variable, when set, is the default)")
	fs.DurationVar(&o.LeaseDuration, "leader-elect-lease-duration", o.LeaseDuration, "How long the other agents wait after the status writer's last renewal before one of them takes the Lease")
	fs.DurationVar(&o.RenewDeadline, "leader-elect-renew-deadline", o.RenewDeadline, "How long the status writer keeps retrying to renew the Lease before it stops writing; less than --leader-elect-lease-duration")
	fs.DurationVar(&o.RetryPeriod, "leader-elect-retry-period", o.RetryPeriod, "How often every candidate that does not lead reads the Lease (up to 1.2 times this), and the status writer renews it; less than --leader-elect-renew-deadline")
	fs.IntVar(&o.Candidates, "leader-elect-candidates", o.Candidates, "How many agents campaign for the Lease: those of the nodes first in hash order of their names, as every agent computes from its Node cache. The others read the Lease about once every retry period times nodes per candidate (from the API server's watch cache) and campaign only when they find it abandoned, so that the election costs the API server about the same at 5 or 5,000 nodes (docs/scale.md). 0 or negative: every agent campaigns")

	o.AddLoggingFlags(&fss)
	return fss
}

// Validate checks the options without touching the cluster or the
// system; it reports every problem at once, each naming its flag.
func (o *Options) Validate() error {
	var errs []error
	if o.Cleanup {
		// Cleanup needs no cluster, so no node name and no election.
		return o.ValidateLogging()
	}
	if o.NodeName == "" {
		errs = append(errs, errors.New("--node-name is empty and NODE_NAME is not set"))
	}
	if o.Resync < 0 {
		errs = append(errs, fmt.Errorf("--resync=%s: must not be negative", o.Resync))
	}
	for _, a := range []struct{ flag, addr string }{{"--metrics-bind-address", o.MetricsBindAddress}, {"--health-bind-address", o.HealthBindAddress}} {
		if a.addr == "" {
			continue
		}
		if _, port, err := net.SplitHostPort(a.addr); err != nil || port == "" {
			errs = append(errs, fmt.Errorf("%s=%s: want host:port", a.flag, a.addr))
		}
	}
	if (o.TLSCertFile == "") != (o.TLSPrivateKeyFile == "") {
		errs = append(errs, errors.New("--tls-cert-file and --tls-private-key-file: give both or neither (self-signed)"))
	}
	if !o.MetricsSecure && o.TLSCertFile != "" {
		errs = append(errs, errors.New("--tls-cert-file needs --metrics-secure"))
	}
	if o.Profiling && o.MetricsBindAddress == "" {
		errs = append(errs, errors.New("--profiling needs --metrics-bind-address"))
	}
	if o.LeaderElect && o.LeaderElectionNamespace == "" {
		errs = append(errs, errors.New("--leader-election-namespace is empty"))
	}
	if o.LeaderElect {
		// agent.LeaderElection holds the rule; the flags only name it.
		if err := o.Config().LeaderElection.CheckTiming(); err != nil {
			errs = append(errs, fmt.Errorf("--leader-elect-retry-period=%s, --leader-elect-renew-deadline=%s, --leader-elect-lease-duration=%s: %w", o.RetryPeriod, o.RenewDeadline, o.LeaseDuration, err))
		}
	}
	if err := o.ValidateLogging(); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// Config is the agent's configuration from the options.
func (o *Options) Config() agent.Config {
	return agent.Config{
		NodeName:       o.NodeName,
		AllowNodeLocal: o.AllowNodeLocal,
		Resync:         o.Resync,
		Features:       o.Features,
		LeaderElection: agent.LeaderElection{
			Enabled: o.LeaderElect, Namespace: o.LeaderElectionNamespace,
			LeaseDuration: o.LeaseDuration, RenewDeadline: o.RenewDeadline, RetryPeriod: o.RetryPeriod,
			Candidates: candidates(o.Candidates),
		},
	}
}

// candidates maps the flag to agent.LeaderElection.Candidates, where 0
// is the default and negative means every agent.
func candidates(n int) int {
	if n <= 0 {
		return -1
	}
	return n
}
