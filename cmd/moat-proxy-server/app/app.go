// Package app is moat-proxy-server's run loop: it turns options into a
// running server, opens its sockets (frontends for kube-apiserver, the agent
// port, health and admin endpoints) and stops them on SIGTERM.
// cmd/moat-proxy-server's main only executes NewCommand.
package app

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"strconv"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/spf13/cobra"
	"k8s.io/client-go/kubernetes"
	"k8s.io/klog/v2"

	"github.com/moat-net/moat/cmd/moat-proxy-server/app/options"
	"github.com/moat-net/moat/internal/daemon"
	"github.com/moat-net/moat/internal/kubeconfig"
	"github.com/moat-net/moat/tunnel/auth"
	"github.com/moat-net/moat/tunnel/server"
	"github.com/moat-net/moat/tunnel/tlsconfig"
)

const long = `moat-proxy-server is the control-plane side of Moat's konnectivity-compatible
tunnel: kube-apiserver reaches it over gRPC (ProxyService) or HTTP CONNECT,
on a Unix socket or mTLS TCP, and it carries each connection to a node's
moat-proxy-agent over that agent's tunnel. With the feature gate
EnableClusterToMasterTraffic it also dials --allowed-destination for node
clients (KEP-2025). Flags are upstream proxy-server's. See docs/tunnel.md.`

// NewCommand returns the moat-proxy-server command.
func NewCommand() (*cobra.Command, error) {
	o, err := options.New()
	if err != nil {
		return nil, err
	}
	return daemon.NewCommand("moat-proxy-server",
		"konnectivity-compatible proxy server with node-to-control-plane traffic (KEP-2025)",
		long, o, func(ctx context.Context, signals <-chan os.Signal) error {
			ctx, stop := daemon.StopOnSignal(ctx, signals)
			defer stop()
			return Run(ctx, o)
		}), nil
}

// Run serves validated options until ctx ends.
func Run(ctx context.Context, o *options.Options) error {
	log := klog.FromContext(ctx)
	cfg := o.Config()
	if !cfg.NodeToControlPlane && len(o.AllowedDestinations) > 0 {
		log.Info("Ignoring --allowed-destination: feature gate EnableClusterToMasterTraffic is off")
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	cfg.Log, cfg.Registry = log, reg
	if o.AgentServiceAccount != "" {
		rc, err := kubeconfig.Load(o.Kubeconfig, "", "moat-proxy-server")
		if err != nil {
			return fmt.Errorf("--kubeconfig: %w", err)
		}
		rc.QPS, rc.Burst = o.KubeconfigQPS, o.KubeconfigBurst
		cs, err := kubernetes.NewForConfig(rc)
		if err != nil {
			return fmt.Errorf("--kubeconfig: %w", err)
		}
		cfg.Auth = auth.New(auth.Config{Client: cs, Namespace: o.AgentNamespace, ServiceAccount: o.AgentServiceAccount,
			Audience: o.AuthenticationAud, Registry: reg})
		// A token names its node, not the node's addresses: the Node
		// object says which ipv4=/ipv6=/host= its agent may claim.
		cfg.Nodes = auth.Nodes{Client: cs}
	}
	for _, w := range o.Warnings() {
		log.Info("Warning: " + w)
	}
	l, closeAll, err := listen(o)
	if err != nil {
		return err
	}
	defer closeAll()
	l.Gatherer = reg
	if o.ClusterCACert == "" {
		log.Info("No --cluster-ca-cert: agents are authenticated by token only")
	}
	log.Info("Starting moat-proxy-server", "serverID", o.ServerID, "mode", o.Mode, "agentAddr", l.Agent.Addr().String(),
		"nodeToControlPlane", cfg.NodeToControlPlane, "allowedDestinations", cfg.Allowed.Len(),
		"agentIdentityBinding", cfg.IdentityBinding)
	return Serve(ctx, server.New(cfg), l)
}

// listen loads the TLS configurations and opens every socket the options
// name; closeAll closes those Serve has not taken over.
func listen(o *options.Options) (l Listeners, closeAll func(), err error) {
	l = Listeners{Mode: o.Mode, Profiling: o.Profiling, ShutdownGrace: o.ShutdownGrace}
	var opened []net.Listener
	closeOpened := func() {
		for _, ln := range opened {
			ln.Close()
		}
	}
	defer func() {
		if err != nil {
			closeOpened()
		}
	}()
	open := func(flag, network, addr string) (net.Listener, error) {
		ln, err := net.Listen(network, addr)
		if err != nil {
			return nil, fmt.Errorf("--%s: listen %s: %w", flag, addr, err)
		}
		opened = append(opened, ln)
		return ln, nil
	}
	if l.AgentTLS, err = tlsconfig.Server(o.ClusterCert, o.ClusterKey, o.ClusterCACert, "cluster"); err != nil {
		return l, nil, err
	}
	l.AgentTLS.MinVersion, l.AgentTLS.CipherSuites = o.TLSVersion(), o.TLSCipherSuites()
	if o.ServerPort != 0 {
		if l.FrontendTLS, err = tlsconfig.Server(o.ServerCert, o.ServerKey, o.ServerCACert, "server"); err != nil {
			return l, nil, err
		}
		if o.ClusterCACert != "" {
			// Every certificate the agent CA signs would open the
			// frontend, and with it tunnels through every agent.
			shared, err := tlsconfig.SharedCA(o.ServerCACert, o.ClusterCACert)
			if err != nil {
				return l, nil, fmt.Errorf("--server-ca-cert/--cluster-ca-cert: %w", err)
			}
			if shared != nil {
				return l, nil, fmt.Errorf("--server-ca-cert and --cluster-ca-cert share the CA %q: every agent's certificate would be accepted by kube-apiserver's frontend and could dial through every node's agent; give the frontend a CA that signs only kube-apiserver's client certificate", shared.Subject)
			}
		}
		l.FrontendTLS.MinVersion, l.FrontendTLS.CipherSuites = o.TLSVersion(), o.TLSCipherSuites()
		if l.FrontendTCP, err = open("server-port", "tcp", hostPort(o.ServerBindAddress, o.ServerPort)); err != nil {
			return l, nil, err
		}
	}
	if o.UDSName != "" {
		if o.DeleteExistingUDSFile {
			if err := os.Remove(o.UDSName); err != nil && !errors.Is(err, os.ErrNotExist) {
				return l, nil, fmt.Errorf("--delete-existing-uds-file: %w", err)
			}
		}
		if l.FrontendUDS, err = open("uds-name", "unix", o.UDSName); err != nil {
			return l, nil, err
		}
		if err := os.Chmod(o.UDSName, 0o600); err != nil {
			return l, nil, fmt.Errorf("--uds-name: chmod: %w", err)
		}
	}
	if l.Agent, err = open("agent-port", "tcp", hostPort(o.AgentBindAddress, o.AgentPort)); err != nil {
		return l, nil, err
	}
	if o.HealthPort != 0 {
		if l.Health, err = open("health-port", "tcp", hostPort(o.HealthBindAddress, o.HealthPort)); err != nil {
			return l, nil, err
		}
	}
	if o.AdminPort != 0 {
		if l.Admin, err = open("admin-port", "tcp", hostPort(o.AdminBindAddress, o.AdminPort)); err != nil {
			return l, nil, err
		}
	}
	return l, closeOpened, nil
}

func hostPort(h string, p int) string { return net.JoinHostPort(h, strconv.Itoa(p)) }
