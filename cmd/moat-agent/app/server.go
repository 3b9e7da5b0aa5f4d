package app

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/moat-net/moat/agent"
	"github.com/moat-net/moat/internal/daemon"
	"github.com/moat-net/moat/internal/metricsauth"
)

// checker is what the endpoints ask the agent (*agent.Agent).
type checker interface {
	Healthy() error
	Ready() error
	Watches() []agent.WatchStatus
	Metrics() prometheus.Gatherer
}

// server holds the metrics and health listeners. One address given for
// both (other than port 0) serves everything on one listener.
type server struct {
	metricsLn, healthLn net.Listener
	// profiling adds /debug/pprof/ to the metrics listener.
	profiling bool
	// healthOnMetrics: the health endpoints share the metrics listener.
	healthOnMetrics bool
	// secure, when set, serves the metrics listener over TLS with
	// /metrics and /debug/pprof/ behind the API server's TokenReview and
	// SubjectAccessReview (--metrics-secure). The health endpoints stay
	// open: the kubelet probes them without credentials.
	secure *secureMetrics
}

// secureMetrics is how the metrics listener is protected.
type secureMetrics struct {
	guard *metricsauth.Guard
	tls   *tls.Config
}

// listen opens the configured addresses ("" means not served).
func listen(metricsAddr, healthAddr string) (*server, error) {
	s := &server{}
	var err error
	if metricsAddr != "" {
		if s.metricsLn, err = net.Listen("tcp", metricsAddr); err != nil {
			return nil, fmt.Errorf("--metrics-bind-address=%s: %w", metricsAddr, err)
		}
	}
	switch {
	case healthAddr == "":
	case healthAddr == metricsAddr && !strings.HasSuffix(healthAddr, ":0"):
		// Port 0 twice asks for two ports the kernel chooses.
		s.healthOnMetrics = true
	default:
		if s.healthLn, err = net.Listen("tcp", healthAddr); err != nil {
			s.close()
			return nil, fmt.Errorf("--health-bind-address=%s: %w", healthAddr, err)
		}
	}
	return s, nil
}

func (s *server) close() {
	for _, ln := range []net.Listener{s.metricsLn, s.healthLn} {
		if ln != nil {
			ln.Close()
		}
	}
}

func addrOf(ln net.Listener) string {
	if ln == nil {
		return ""
	}
	return ln.Addr().String()
}

func (s *server) metricsAddr() string { return addrOf(s.metricsLn) }

func (s *server) healthAddr() string {
	if s.healthOnMetrics {
		return s.metricsAddr()
	}
	return addrOf(s.healthLn)
}

// serve starts the HTTP servers; they stop when ctx ends. The channel
// reports a server that failed.
func (s *server) serve(ctx context.Context, a checker) <-chan error {
	errc := make(chan error, 2)
	start := func(ln net.Listener, h http.Handler, what string, tlsCfg *tls.Config) {
		srv := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second, TLSConfig: tlsCfg}
		go func() {
			var err error
			if tlsCfg != nil {
				err = srv.ServeTLS(ln, "", "")
			} else {
				err = srv.Serve(ln)
			}
			if err != nil && !errors.Is(err, http.ErrServerClosed) {
				errc <- fmt.Errorf("%s server on %s: %w", what, ln.Addr(), err)
			}
		}()
		go func() {
			<-ctx.Done()
			sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			_ = srv.Shutdown(sctx)
		}()
	}
	if s.metricsLn != nil {
		guarded := http.NewServeMux()
		addMetrics(guarded, a)
		if s.profiling {
			daemon.AddProfiling(guarded)
		}
		mux := http.NewServeMux()
		var tlsCfg *tls.Config
		if s.secure != nil {
			mux.Handle("/", s.secure.guard.Wrap(guarded))
			tlsCfg = s.secure.tls
		} else {
			mux.Handle("/", guarded)
		}
		if s.healthOnMetrics {
			addHealth(mux, a)
		}
		start(s.metricsLn, mux, "metrics", tlsCfg)
	}
	if s.healthLn != nil {
		mux := http.NewServeMux()
		addHealth(mux, a)
		start(s.healthLn, mux, "health", nil)
	}
	return errc
}

// addMetrics serves the agent's series with the process and Go runtime
// ones.
func addMetrics(mux *http.ServeMux, a checker) {
	proc := prometheus.NewRegistry()
	proc.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	g := prometheus.Gatherers{a.Metrics(), proc}
	mux.Handle("/metrics", promhttp.HandlerFor(g, promhttp.HandlerOpts{}))
}

func addHealth(mux *http.ServeMux, a checker) {
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) {
		if err := a.Healthy(); err != nil {
			http.Error(w, "not healthy: "+err.Error(), http.StatusServiceUnavailable)
			return
		}
		fmt.Fprintln(w, "ok")
	})
	// /readyz says below its verdict how current each watch is. Staleness
	// does not make the agent unready: its rules stay in force, and every
	// agent turning unready in an API server outage would help no one.
	mux.HandleFunc("/readyz", func(w http.ResponseWriter, _ *http.Request) {
		var b strings.Builder
		code := http.StatusOK
		if err := a.Ready(); err != nil {
			code = http.StatusServiceUnavailable
			fmt.Fprintf(&b, "not ready: %v\n", err)
		} else {
			b.WriteString("ok\n")
		}
		for _, ws := range a.Watches() {
			fmt.Fprintln(&b, ws)
		}
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		w.Header().Set("X-Content-Type-Options", "nosniff")
		w.WriteHeader(code)
		_, _ = io.WriteString(w, b.String())
	})
}
