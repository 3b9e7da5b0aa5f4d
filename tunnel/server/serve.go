package server

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
	"google.golang.org/grpc/experimental"
	"google.golang.org/grpc/keepalive"

	"github.com/moat-net/moat/tunnel/grpcbuf"
)

// Modes of the kube-apiserver-facing frontend (upstream --mode).
const (
	ModeGRPC        = "grpc"
	ModeHTTPConnect = "http-connect"
)

// Listeners are the sockets Serve uses; nil ones are skipped. The caller
// opens them so that flags (or tests, with port 0) decide the addresses.
type Listeners struct {
	Mode        string
	FrontendUDS net.Listener // plaintext, protected by file permissions
	FrontendTCP net.Listener // wrapped with FrontendTLS
	FrontendTLS *tls.Config
	Agent       net.Listener // wrapped with AgentTLS
	AgentTLS    *tls.Config
	Health      net.Listener // /healthz, /readyz, /metrics
	Admin       net.Listener // /metrics
	Gatherer    prometheus.Gatherer
	// ShutdownGrace bounds how long frontends may finish on shutdown (default 5s).
	ShutdownGrace time.Duration
}

// WindowSize is the HTTP/2 stream and connection window on the agent hop:
// one agent stream carries many connections, so it needs more than gRPC's
// default to keep a fast link full.
const WindowSize = 8 << 20

// MaxFrame bounds one received gRPC message; larger frames end the stream
// with ResourceExhausted.
const MaxFrame = 4 << 20

// Serve runs every listener until ctx ends, then shuts down: frontends
// first (bounded by ShutdownGrace), then agent tunnels.
func (s *Server) Serve(ctx context.Context, l Listeners) error {
	if l.ShutdownGrace <= 0 {
		l.ShutdownGrace = 5 * time.Second
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
	var stops []func()
	var frontStops []func()
	pool := grpcbuf.New()

	if l.Agent != nil {
		if l.AgentTLS == nil {
			return errors.New("agent listener needs TLS")
		}
		g := grpc.NewServer(grpc.Creds(credentials.NewTLS(l.AgentTLS)),
			grpc.ConnectionTimeout(10*time.Second), experimental.BufferPool(pool), grpc.ForceServerCodecV2(grpcbuf.Codec{Pool: pool}),
			grpc.InitialWindowSize(WindowSize), grpc.InitialConnWindowSize(WindowSize),
			grpc.ReadBufferSize(256<<10), grpc.WriteBufferSize(256<<10),
			grpc.MaxRecvMsgSize(MaxFrame),
			grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: 5 * time.Second, PermitWithoutStream: true}),
			grpc.KeepaliveParams(keepalive.ServerParameters{Time: 30 * time.Second, Timeout: 10 * time.Second}))
		s.RegisterAgentService(g)
		run("agent server", func() error { return g.Serve(l.Agent) })
		stops = append(stops, g.Stop)
	}
	front := func(ln net.Listener, tlsCfg *tls.Config) {
		if ln == nil {
			return
		}
		switch l.Mode {
		case ModeHTTPConnect:
			hs := &http.Server{Handler: s.HTTPConnect(), ReadHeaderTimeout: 10 * time.Second}
			if tlsCfg != nil {
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
		default:
			// kube-apiserver opens one gRPC connection per tunneled
			// connection: keep idle ones cheap (write buffers are returned to
			// a pool after each flush, small read buffers).
			opts := []grpc.ServerOption{grpc.MaxRecvMsgSize(MaxFrame), grpc.ConnectionTimeout(10 * time.Second),
				grpc.SharedWriteBuffer(true), grpc.ReadBufferSize(16 << 10), experimental.BufferPool(pool), grpc.ForceServerCodecV2(grpcbuf.Codec{Pool: pool}),
				grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: 5 * time.Second, PermitWithoutStream: true})}
			if tlsCfg != nil {
				opts = append(opts, grpc.Creds(credentials.NewTLS(tlsCfg)))
			}
			g := grpc.NewServer(opts...)
			s.RegisterProxyService(g)
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
	}
	if l.FrontendTCP != nil && l.FrontendTLS == nil {
		return errors.New("TCP frontend needs TLS")
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
	gath := l.Gatherer
	if gath == nil {
		if g, ok := s.cfg.Registry.(prometheus.Gatherer); ok {
			gath = g
		}
	}
	metricsH := http.NotFoundHandler()
	if gath != nil {
		metricsH = promhttp.HandlerFor(gath, promhttp.HandlerOpts{})
	}
	health := http.NewServeMux()
	health.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) { fmt.Fprintln(w, "ok") })
	health.HandleFunc("/readyz", func(w http.ResponseWriter, _ *http.Request) {
		if !s.Ready() {
			http.Error(w, "no agent connected", http.StatusServiceUnavailable)
			return
		}
		fmt.Fprintf(w, "ok: %d agent tunnels\n", s.Backends())
	})
	health.Handle("/metrics", metricsH)
	httpSrv("health server", l.Health, health)
	admin := http.NewServeMux()
	admin.Handle("/metrics", metricsH)
	httpSrv("admin server", l.Admin, admin)

	var err error
	select {
	case <-ctx.Done():
	case err = <-errc:
	}
	s.log.Info("shutting down")
	for _, f := range frontStops {
		f()
	}
	for _, f := range stops {
		f()
	}
	wg.Wait()
	return err
}
