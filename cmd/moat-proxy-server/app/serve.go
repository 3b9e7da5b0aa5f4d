package app

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/http"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"k8s.io/klog/v2"

	"github.com/moat-net/moat/cmd/moat-proxy-server/app/options"
	"github.com/moat-net/moat/internal/daemon"
	"github.com/moat-net/moat/tunnel/server"
)

// Listeners are the sockets Serve uses; nil ones are skipped. The caller
// opens them so that flags (or tests, with port 0) decide the addresses.
type Listeners struct {
	// Mode is options.ModeGRPC or options.ModeHTTPConnect.
	Mode        string
	FrontendUDS net.Listener // plaintext, protected by file permissions
	FrontendTCP net.Listener // TLS with FrontendTLS
	FrontendTLS *tls.Config
	Agent       net.Listener // TLS with AgentTLS
	AgentTLS    *tls.Config
	Health      net.Listener // /healthz, /readyz, /metrics
	Admin       net.Listener // /metrics (and /debug/pprof/ with Profiling)
	Gatherer    prometheus.Gatherer
	Profiling   bool
	// ShutdownGrace bounds how long frontends may finish on shutdown (default 5s).
	ShutdownGrace time.Duration
}

// Serve runs srv on every listener until ctx ends, then shuts down:
// frontends first (bounded by ShutdownGrace), then agent tunnels and the
// HTTP endpoints.
func Serve(ctx context.Context, srv *server.Server, l Listeners) error {
	log := klog.FromContext(ctx)
	if l.ShutdownGrace <= 0 {
		l.ShutdownGrace = 5 * time.Second
	}
	if l.Agent != nil && l.AgentTLS == nil {
		return errors.New("agent listener needs TLS")
	}
	if l.FrontendTCP != nil && l.FrontendTLS == nil {
		return errors.New("TCP frontend needs TLS")
	}
	if l.FrontendTLS != nil {
		// kube-apiserver's frontend: never a node's certificate.
		l.FrontendTLS = l.FrontendTLS.Clone()
		l.FrontendTLS.VerifyConnection = server.RefuseNodeClients
	}
	var wg sync.WaitGroup
	errc := make(chan error, 8)
	run := func(name string, f func() error) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := f(); err != nil && !errors.Is(err, http.ErrServerClosed) && !errors.Is(err, grpc.ErrServerStopped) {
				errc <- fmt.Errorf("%s: %w", name, err)
			}
		}()
	}
	var stops, frontStops []func()
	if l.Agent != nil {
		g := grpc.NewServer(srv.AgentServerOptions(credentials.NewTLS(l.AgentTLS))...)
		srv.RegisterAgentService(g)
		run("agent server", func() error { return g.Serve(l.Agent) })
		stops = append(stops, g.Stop)
	}
	front := func(ln net.Listener, tlsCfg *tls.Config) {
		if ln == nil {
			return
		}
		if l.Mode == options.ModeHTTPConnect {
			// HTTP/1.1 only: CONNECT hands the socket over (Hijack), which
			// an HTTP/2 stream cannot do, so h2 is neither offered in ALPN
			// nor served.
			hs := &http.Server{Handler: srv.HTTPConnect(), ReadHeaderTimeout: 10 * time.Second,
				TLSNextProto: map[string]func(*http.Server, *tls.Conn, http.Handler){}}
			if tlsCfg != nil {
				tlsCfg = tlsCfg.Clone()
				tlsCfg.NextProtos = []string{"http/1.1"}
				ln = tls.NewListener(ln, tlsCfg)
			}
			run("http-connect frontend", func() error { return hs.Serve(ln) })
			frontStops = append(frontStops, func() {
				c, cancel := context.WithTimeout(context.Background(), l.ShutdownGrace)
				defer cancel()
				if hs.Shutdown(c) != nil {
					hs.Close()
				}
			})
			return
		}
		var creds credentials.TransportCredentials
		if tlsCfg != nil {
			creds = credentials.NewTLS(tlsCfg)
		}
		g := grpc.NewServer(srv.FrontendServerOptions(creds)...)
		srv.RegisterProxyService(g)
		run("grpc frontend", func() error { return g.Serve(ln) })
		frontStops = append(frontStops, func() {
			done := make(chan struct{})
			go func() { g.GracefulStop(); close(done) }()
			select {
			case <-done:
			case <-time.After(l.ShutdownGrace):
				g.Stop()
			}
		})
	}
	front(l.FrontendUDS, nil)
	front(l.FrontendTCP, l.FrontendTLS)

	httpSrv := func(name string, ln net.Listener, h http.Handler) {
		if ln == nil {
			return
		}
		hs := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second}
		run(name, func() error { return hs.Serve(ln) })
		stops = append(stops, func() { hs.Close() })
	}
	metricsH := http.NotFoundHandler()
	if l.Gatherer != nil {
		metricsH = promhttp.HandlerFor(l.Gatherer, promhttp.HandlerOpts{})
	}
	health := http.NewServeMux()
	health.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) { fmt.Fprintln(w, "ok") })
	health.HandleFunc("/readyz", func(w http.ResponseWriter, _ *http.Request) {
		if !srv.Ready() {
			http.Error(w, "no agent connected", http.StatusServiceUnavailable)
			return
		}
		fmt.Fprintf(w, "ok: %d agent tunnels\n", srv.Backends())
	})
	health.Handle("/metrics", metricsH)
	httpSrv("health server", l.Health, health)
	admin := http.NewServeMux()
	admin.Handle("/metrics", metricsH)
	if l.Profiling {
		daemon.AddProfiling(admin)
	}
	httpSrv("admin server", l.Admin, admin)

	var err error
	select {
	case <-ctx.Done():
	case err = <-errc:
	}
	log.Info("Shutting down")
	for _, f := range frontStops {
		f()
	}
	for _, f := range stops {
		f()
	}
	wg.Wait()
	return err
}
