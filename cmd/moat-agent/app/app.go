// Package app is moat-agent's run loop: it turns options into a running
// agent, its nftables dataplane and its HTTP endpoints, and stops them on
// SIGTERM. cmd/moat-agent's main only executes NewCommand.
package app

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/spf13/cobra"
	"k8s.io/klog/v2"

	"github.com/moat-net/moat/agent"
	"github.com/moat-net/moat/cmd/moat-agent/app/options"
	"github.com/moat-net/moat/features"
	"github.com/moat-net/moat/internal/daemon"
	"github.com/moat-net/moat/internal/kubeconfig"
	"github.com/moat-net/moat/internal/metricsauth"
	"github.com/moat-net/moat/internal/netns"
	"github.com/moat-net/moat/nft"
)

const long = `moat-agent watches the API server (pods, namespaces, nodes, NetworkPolicies,
ClusterNetworkPolicies) and keeps this node's nftables table "inet moat" in
step with them: every change is compiled and applied as one nftables
transaction, a diff where possible, the whole table on start and on SIGHUP,
and every --resync if anything else committed to nftables since the agent's
last transaction. When the API server is unreachable the last programmed rules stay;
when the agent restarts, the table it left keeps enforcing until the new
agent's first full sync replaces it in one transaction. /readyz turns ready
after that first sync.

--cleanup deletes the table and exits (uninstall, docs/install.md): run it on
every node once the agents are gone, since a table that no agent updates
keeps the last policies and drops every pod created afterwards as an
unknown source.

One agent per node programs it: the agent holds a lock (--lock-file) while it
runs, as --cleanup does while it deletes, and a second one exits.

One agent at a time (a Lease in --leader-election-namespace) writes the
Accepted condition of each ClusterNetworkPolicy and Events about policies;
only --leader-elect-candidates agents campaign for it, the others stand by
and campaign only when it is abandoned.

/metrics is HTTPS, for callers the API server authorizes for the path
(--metrics-secure: bind the ClusterRole moat-metrics-reader); /healthz and
/readyz are plain HTTP for the kubelet's probes.

Feature gates (--feature-gates):
  IngressNetworksAndNodes (alpha, default off): enforce the NPEP-127
    ingress peers spec.ingress[].from[].networks and .nodes of
    ClusterNetworkPolicy (experimental CRD). Off, the agent treats them as
    fields it does not understand: the peer is enforced fail-closed (an
    Accept rule with it matches nothing, a Deny or Pass rule denies all it
    could match) and the policy gets Accepted=False, reason UnknownField.`

// NewCommand returns the moat-agent command.
func NewCommand() (*cobra.Command, error) {
	o, err := options.New()
	if err != nil {
		return nil, err
	}
	cmd := daemon.NewCommand("moat-agent",
		"Enforce NetworkPolicies and ClusterNetworkPolicies on this node with nftables",
		long, o, func(ctx context.Context, signals <-chan os.Signal) error {
			ctx, stop := daemon.StopOnSignal(ctx, signals)
			defer stop()
			return Run(ctx, o)
		})
	// The registry's own usage lists every gate the agent's gate holds
	// (AllAlpha, AllBeta, the logging and tunnel gates): it lists the
	// policy compiler's, as moat's --feature-gates does. The others are
	// still taken (--logging-format reads the logging gates).
	if g := cmd.Flags().Lookup("feature-gates"); g != nil {
		g.Usage = "Feature gates of the policy compiler (key=true|false,...; see above), the same as moat's --feature-gates; component-base's logging gates are taken too. Options are:\n" + strings.Join(features.PolicyGates(o.Features), "\n")
	}
	return cmd, nil
}

// resyncOnHangup turns each SIGHUP into a request for a forced resync,
// until ctx ends: an operator who edited or deleted the node's table by
// hand gets it rewritten at once, without restarting the agent (which
// would list the whole cluster again) or waiting for --resync. Forced,
// not checked as --resync's: the operator asked for the rewrite.
func resyncOnHangup(ctx context.Context, hup <-chan os.Signal, a *agent.Agent, log klog.Logger) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-hup:
			log.Info("SIGHUP: resyncing the whole table")
			a.Resync()
		}
	}
}

// Run runs the agent for validated options until ctx ends: it opens the
// HTTP listeners first (a taken port fails at once), connects to the API
// server and to nftables, and serves /metrics, /healthz and /readyz while
// the agent runs.
func Run(ctx context.Context, o *options.Options) error {
	if o.Cleanup {
		return cleanup(ctx, o)
	}
	// SIGHUP is caught from the start: before the agent exists one is
	// kept for it, instead of ending the process (its default action).
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)
	srv, err := listen(o.MetricsBindAddress, o.HealthBindAddress)
	if err != nil {
		return err
	}
	defer srv.close()
	srv.profiling = o.Profiling
	restCfg, err := kubeconfig.Load(o.Kubeconfig, o.Context, "moat-agent/"+o.NodeName)
	if err != nil {
		return err
	}
	clients, err := agent.NewClients(restCfg)
	if err != nil {
		return err
	}
	if o.MetricsSecure && srv.metricsLn != nil {
		tlsCfg, err := metricsauth.TLSConfig(o.TLSCertFile, o.TLSPrivateKeyFile, o.NodeName)
		if err != nil {
			return fmt.Errorf("--tls-cert-file, --tls-private-key-file: %w", err)
		}
		srv.secure = &secureMetrics{guard: metricsauth.New(metricsauth.Config{Client: clients.Kube}), tls: tlsCfg}
	}
	unlock, err := lock(o)
	if err != nil {
		return err
	}
	defer unlock()
	dp, closeDP, err := dataplane(o)
	if err != nil {
		return err
	}
	defer closeDP()
	a, err := agent.New(o.Config(), clients, dp)
	if err != nil {
		return err
	}
	log := klog.FromContext(ctx)
	log.Info("Starting moat-agent", "node", o.NodeName, "apiServer", restCfg.Host, "metrics", srv.metricsAddr(), "metricsSecure", srv.secure != nil, "health", srv.healthAddr())
	if o.NetNS == "" {
		warnBridgeNetfilter(log)
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	serveErr := srv.serve(ctx, a)
	go resyncOnHangup(ctx, hup, a, log)
	go checkedResyncOnUser1(ctx, a, log)
	runErr := make(chan error, 1)
	go func() { runErr <- a.Run(ctx) }()
	select {
	case err := <-runErr:
		return err
	case err := <-serveErr:
		cancel()
		<-runErr
		return err
	}
}

// cleanup deletes the node's table (in --netns if given) and returns:
// moat-agent --cleanup, the uninstall step after the agents are gone. It
// contacts no API server and opens no port. A node without the table is
// not an error, so it can run again on every node.
func cleanup(ctx context.Context, o *options.Options) error {
	unlock, err := lock(o)
	if err != nil {
		return fmt.Errorf("--cleanup: %w", err)
	}
	defer unlock()
	dp, closeDP, err := dataplane(o)
	if err != nil {
		return err
	}
	defer closeDP()
	if err := dp.Remove(ctx); err != nil {
		return fmt.Errorf("--cleanup: %w", err)
	}
	where := "this network namespace"
	if o.NetNS != "" {
		where = "network namespace " + o.NetNS
	}
	klog.FromContext(ctx).Info("Cleanup: deleted table inet "+nft.Table+" (if it existed); the node no longer enforces Moat's policies", "where", where)
	return nil
}

// lock takes the node's lock (--lock-file; lockNode) for the agent's
// lifetime, or for --cleanup's, which must not delete the table under a
// running agent either.
func lock(o *options.Options) (func(), error) {
	path, err := lockPath(o)
	if err != nil || path == "" {
		return func() {}, err
	}
	return lockNode(path)
}

// dataplane opens nftables in the agent's namespace or in --netns.
func dataplane(o *options.Options) (*nft.Syncer, func(), error) {
	opts := nft.Options{Node: o.NodeName, CutDenied: o.CutDeniedEstablished}
	if o.NetNS != "" {
		ns, err := netns.Open(o.NetNS)
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
