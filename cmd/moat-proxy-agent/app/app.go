// Package app is moat-proxy-agent's run loop: it turns options into a
// running agent (tunnels to every proxy server, and with KEP-2025 the bind
// address and its listeners), serves the health and admin endpoints, and
// drains on the first SIGTERM. cmd/moat-proxy-agent's main only executes
// NewCommand.
package app

import (
	"context"
	"crypto/x509"
	"fmt"
	"net"
	"net/http"
	"os"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/spf13/cobra"
	"google.golang.org/grpc/credentials"
	"k8s.io/klog/v2"

	"github.com/moat-net/moat/cmd/moat-proxy-agent/app/options"
	"github.com/moat-net/moat/internal/daemon"
	"github.com/moat-net/moat/tunnel/agent"
	"github.com/moat-net/moat/tunnel/bindaddr"
	"github.com/moat-net/moat/tunnel/tlsconfig"
)

const long = `moat-proxy-agent is the node side of Moat's konnectivity-compatible tunnel: it
keeps one tunnel to every proxy server behind --proxy-server-host and dials
node-side destinations for the control plane. With the feature gate
EnableClusterToMasterTraffic it also listens on --bind-address for each
--target and carries node clients to the control plane (KEP-2025). The
first SIGTERM drains (DRAIN to every server, open connections may finish
within --drain-timeout); a second one exits at once. Flags are upstream
proxy-agent's plus KEP-2025's. See docs/tunnel.md.`

// NewCommand returns the moat-proxy-agent command.
func NewCommand() (*cobra.Command, error) {
	o, err := options.New()
	if err != nil {
		return nil, err
	}
	return daemon.NewCommand("moat-proxy-agent",
		"konnectivity-compatible proxy agent with node-to-control-plane traffic (KEP-2025)",
		long, o, func(ctx context.Context, signals <-chan os.Signal) error {
			return Run(ctx, o, signals)
		}), nil
}

// Run runs the agent for validated options until ctx ends. The first value
// on signals starts draining (DRAIN to every server, then wait up to
// --drain-timeout for open connections); a second one, or the timeout,
// stops the agent.
func Run(ctx context.Context, o *options.Options, signals <-chan os.Signal) error {
	log := klog.FromContext(ctx)
	tlsCfg, err := tlsconfig.Client(o.CACert, o.AgentCert, o.AgentKey, o.ProxyServerHost)
	if err != nil {
		return err
	}
	cfg := o.Config()
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	var leaf *x509.Certificate
	if len(tlsCfg.Certificates) > 0 {
		leaf = tlsCfg.Certificates[0].Leaf
	}
	cfg.Creds, cfg.AgentID, cfg.Identifiers, cfg.Log, cfg.Registry = credentials.NewTLS(tlsCfg), o.AgentIDFor(leaf), o.IdentifiersFor(leaf), log, reg
	if cfg.BindAddress != nil {
		lease, err := bindaddr.Ensure(cfg.BindAddress, o.BindInterface)
		if err != nil {
			return err
		}
		log.Info("Bind address ready", "address", cfg.BindAddress.String(), "interface", o.BindInterface, "owned", lease.Added, "adopted", lease.Adopted)
		defer func() {
			if err := lease.Release(); err != nil {
				log.Error(err, "Release bind address")
			}
		}()
	}
	a, err := agent.New(cfg)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stop, err := serveHTTP(o, a, reg)
	if err != nil {
		return err
	}
	defer stop()
	go drainOnSignal(ctx, cancel, a, signals, o.DrainTimeout)
	log.Info("Starting moat-proxy-agent", "agentID", cfg.AgentID, "identifiers", cfg.Identifiers, "server", cfg.Server, "nodeToControlPlane", cfg.NodeToControlPlane, "targets", len(cfg.Targets))
	return a.Run(ctx)
}

// drainOnSignal waits for the first signal, drains, and cancels the agent
// once its connections are gone, on a second signal or after timeout.
func drainOnSignal(ctx context.Context, cancel context.CancelFunc, a *agent.Agent, signals <-chan os.Signal, timeout time.Duration) {
	log := klog.FromContext(ctx)
	select {
	case <-ctx.Done():
		return
	case <-signals:
	}
	a.Drain()
	deadline := time.After(timeout)
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for a.Active() > 0 {
		select {
		case <-signals:
			log.Info("Second signal: stopping now")
			cancel()
			return
		case <-deadline:
			log.Info("Drain timeout: closing open connections", "open", a.Active())
			cancel()
			return
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
	log.Info("Drained: stopping")
	cancel()
}

// serveHTTP serves /healthz, /readyz and /metrics on the health port and
// /metrics (and /debug/pprof/) on the admin port; stop closes both.
func serveHTTP(o *options.Options, a *agent.Agent, reg prometheus.Gatherer) (stop func(), err error) {
	var stops []func()
	stop = func() {
		for _, f := range stops {
			f()
		}
	}
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
	metricsH := promhttp.HandlerFor(reg, promhttp.HandlerOpts{})
	if o.HealthServerPort != 0 {
		m := http.NewServeMux()
		m.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) { fmt.Fprintln(w, "ok") })
		m.HandleFunc("/readyz", func(w http.ResponseWriter, _ *http.Request) {
			if n := a.Tunnels(); n > 0 {
				fmt.Fprintf(w, "ok: %d tunnels\n", n)
				return
			}
			http.Error(w, "no tunnel to a proxy server", http.StatusServiceUnavailable)
		})
		m.Handle("/metrics", metricsH)
		if err := serve("health-server-port", net.JoinHostPort(o.HealthServerHost, strconv.Itoa(o.HealthServerPort)), m); err != nil {
			return nil, err
		}
	}
	if o.AdminServerPort != 0 {
		m := http.NewServeMux()
		m.Handle("/metrics", metricsH)
		if o.Profiling {
			daemon.AddProfiling(m)
		}
		if err := serve("admin-server-port", net.JoinHostPort(o.AdminBindAddress, strconv.Itoa(o.AdminServerPort)), m); err != nil {
			stop()
			return nil, err
		}
	}
	return stop, nil
}
