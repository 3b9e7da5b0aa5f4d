// Command moat-agent runs on every node (a DaemonSet): it watches the API
// server and keeps the node's nftables table "inet moat" in step with the
// cluster's NetworkPolicies and ClusterNetworkPolicies. See docs/agent.md.
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/component-base/featuregate"
	logsapi "k8s.io/component-base/logs/api/v1"
	_ "k8s.io/component-base/logs/json/register" // --logging-format=json
	"k8s.io/klog/v2"

	"github.com/moat-net/moat/agent"
	"github.com/moat-net/moat/nft"
)

// options are the command line.
type options struct {
	nodeName             string
	kubeconfig           string
	metricsAddr          string
	healthAddr           string
	allowNodeLocal       bool
	cutDeniedEstablished bool
	resync               time.Duration
	leaderElect          bool
	leaseNamespace       string
	netns                string
	features             featuregate.MutableVersionedFeatureGate
	logging              *logsapi.LoggingConfiguration
}

func main() {
	cmd, err := newCommand()
	if err != nil {
		fmt.Fprintln(os.Stderr, "moat-agent:", err)
		os.Exit(1)
	}
	if err := cmd.ExecuteContext(context.Background()); err != nil {
		fmt.Fprintln(os.Stderr, "moat-agent:", err)
		klog.Flush()
		os.Exit(1)
	}
	klog.Flush()
}

func newCommand() (*cobra.Command, error) {
	fg, err := agent.NewFeatureGate()
	if err != nil {
		return nil, err
	}
	o := &options{features: fg, logging: logsapi.NewLoggingConfiguration()}
	cmd := &cobra.Command{
		Use:   "moat-agent",
		Short: "Enforce NetworkPolicies and ClusterNetworkPolicies on this node with nftables",
		Long: `moat-agent watches the API server (pods, namespaces, nodes, NetworkPolicies,
ClusterNetworkPolicies) and keeps this node's nftables table "inet moat" in
step with them: every change is compiled and applied as one nftables
transaction, a diff where possible, the whole table on start and every
--resync. When the API server is unreachable the last programmed rules stay;
when the agent restarts, the table it left keeps enforcing until the new
agent's first full sync replaces it in one transaction. /readyz turns ready
after that first sync.

One agent at a time (a Lease in --leader-election-namespace) writes the
Accepted condition of each ClusterNetworkPolicy and Events about policies.

Feature gates (--feature-gates):
  IngressNetworksAndNodes (alpha, default off): enforce the NPEP-127
    ingress peers spec.ingress[].from[].networks and .nodes of
    ClusterNetworkPolicy (experimental CRD). Off, the agent treats them as
    fields it does not understand: the peer is enforced fail-closed (an
    Accept rule with it matches nothing, a Deny or Pass rule denies all it
    could match) and the policy gets Accepted=False, reason UnknownField.`,
		Args:          cobra.NoArgs,
		SilenceUsage:  true,
		SilenceErrors: true,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return o.run(cmd.Context())
		},
	}
	o.addFlags(cmd.Flags())
	return cmd, nil
}

func (o *options) addFlags(fs *pflag.FlagSet) {
	fs.StringVar(&o.nodeName, "node-name", os.Getenv("NODE_NAME"), "Name of the Node this agent enforces for (the NODE_NAME environment variable, when set, is the default)")
	fs.StringVar(&o.kubeconfig, "kubeconfig", "", "Path to a kubeconfig file; empty uses the in-cluster ServiceAccount configuration")
	fs.StringVar(&o.metricsAddr, "metrics-bind-address", ":9470", "Address (host:port) serving Prometheus metrics on /metrics; empty disables")
	fs.StringVar(&o.healthAddr, "health-bind-address", ":9471", "Address (host:port) serving /healthz (liveness) and /readyz (ready after the first full sync); empty disables")
	fs.BoolVar(&o.allowNodeLocal, "allow-node-local", true, "Allow traffic from this node's own addresses to its pods whatever the policies say (kubelet probes); false polices it like any other source")
	fs.BoolVar(&o.cutDeniedEstablished, "cut-denied-established", false, "After each change, remove conntrack entries of established connections the new rules deny (otherwise only new connections are judged)")
	fs.DurationVar(&o.resync, "resync", 5*time.Minute, "Period of the full resync, which rewrites the whole table in one transaction (repairs edits made behind the agent's back); 0 disables")
	fs.BoolVar(&o.leaderElect, "leader-elect", true, "Take part in the election of the one agent that writes ClusterNetworkPolicy status and policy Events")
	fs.StringVar(&o.leaseNamespace, "leader-election-namespace", envOr("POD_NAMESPACE", agent.DefaultLeaseNamespace), "Namespace of the status writer's Lease (the POD_NAMESPACE environment variable, when set, is the default)")
	fs.StringVar(&o.netns, "netns", "", "Program nftables in this network namespace (a name under /var/run/netns or a path) instead of the agent's own; the API server is still reached from the agent's namespace. For labs and tests that run one agent per simulated node on one host")
	o.features.AddFlag(fs)
	logsapi.AddFlags(o.logging, fs)
}

func envOr(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}

func (o *options) run(ctx context.Context) error {
	if err := logsapi.ValidateAndApply(o.logging, o.features); err != nil {
		return fmt.Errorf("logging flags: %w", err)
	}
	if o.nodeName == "" {
		return fmt.Errorf("--node-name is empty and NODE_NAME is not set")
	}
	if o.resync < 0 {
		return fmt.Errorf("--resync=%s: must not be negative", o.resync)
	}
	restCfg, err := loadConfig(o.kubeconfig)
	if err != nil {
		return err
	}
	restCfg.UserAgent = "moat-agent/" + o.nodeName
	clients, err := agent.NewClients(restCfg)
	if err != nil {
		return err
	}
	dp, closeDP, err := o.dataplane()
	if err != nil {
		return err
	}
	defer closeDP()
	a, err := agent.New(agent.Config{
		NodeName:       o.nodeName,
		AllowNodeLocal: o.allowNodeLocal,
		Resync:         o.resync,
		Features:       o.features,
		MetricsAddr:    o.metricsAddr,
		HealthAddr:     o.healthAddr,
		LeaderElection: agent.LeaderElection{Enabled: o.leaderElect, Namespace: o.leaseNamespace},
	}, clients, dp)
	if err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(ctx, syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	klog.InfoS("Starting moat-agent", "node", o.nodeName, "metrics", a.MetricsAddr(), "health", a.HealthAddr())
	return a.Run(ctx)
}

// dataplane opens nftables in the agent's namespace or in --netns.
func (o *options) dataplane() (*nft.Syncer, func(), error) {
	opts := nft.Options{Node: o.nodeName, CutDenied: o.cutDeniedEstablished}
	if o.netns != "" {
		ns, err := agent.OpenNetNS(o.netns)
		if err != nil {
			return nil, nil, fmt.Errorf("--netns: %w", err)
		}
		dp, err := ns.Dataplane(opts)
		if err != nil {
			ns.Close()
			return nil, nil, fmt.Errorf("--netns: open nftables (is the nft binary installed?): %w", err)
		}
		return dp, ns.Close, nil
	}
	iface, err := nft.NewInterface()
	if err != nil {
		return nil, nil, fmt.Errorf("open nftables (is the nft binary installed, and do we have CAP_NET_ADMIN?): %w", err)
	}
	return nft.New(iface, opts), func() {}, nil
}

func loadConfig(kubeconfig string) (*rest.Config, error) {
	if kubeconfig == "" {
		cfg, err := rest.InClusterConfig()
		if err != nil {
			return nil, fmt.Errorf("in-cluster configuration (pass --kubeconfig outside a pod): %w", err)
		}
		return cfg, nil
	}
	cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		return nil, fmt.Errorf("--kubeconfig %s: %w", kubeconfig, err)
	}
	return cfg, nil
}
