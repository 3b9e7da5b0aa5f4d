package agent

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// stuckAfter is how long a sync may run before /healthz reports the agent
// as hung (nft blocked, a deadlock), so the kubelet restarts it. The old
// rules stay in force through the restart.
const stuckAfter = 3 * time.Minute

// listen opens the configured addresses. One address given for both
// serves everything on one listener.
func (a *Agent) listen() error {
	var err error
	if a.cfg.MetricsAddr != "" {
		if a.metricsLn, err = net.Listen("tcp", a.cfg.MetricsAddr); err != nil {
			return fmt.Errorf("metrics bind address %q: %w", a.cfg.MetricsAddr, err)
		}
	}
	if a.cfg.HealthAddr != "" && a.cfg.HealthAddr != a.cfg.MetricsAddr {
		if a.healthLn, err = net.Listen("tcp", a.cfg.HealthAddr); err != nil {
			if a.metricsLn != nil {
				a.metricsLn.Close()
			}
			return fmt.Errorf("health bind address %q: %w", a.cfg.HealthAddr, err)
		}
	}
	return nil
}

// MetricsAddr returns the address /metrics is served on ("" if none): with
// port 0 in the configuration, the port the kernel chose.
func (a *Agent) MetricsAddr() string {
	if a.metricsLn == nil {
		return ""
	}
	return a.metricsLn.Addr().String()
}

// HealthAddr returns the address /healthz and /readyz are served on.
func (a *Agent) HealthAddr() string {
	switch {
	case a.healthLn != nil:
		return a.healthLn.Addr().String()
	case a.cfg.HealthAddr != "":
		return a.MetricsAddr()
	}
	return ""
}

// Handler serves /metrics, /healthz and /readyz, whatever the listeners.
func (a *Agent) Handler() http.Handler {
	mux := http.NewServeMux()
	a.addHealth(mux)
	a.addMetrics(mux)
	return mux
}

func (a *Agent) addMetrics(mux *http.ServeMux) {
	mux.Handle("/metrics", promhttp.HandlerFor(a.metrics.reg, promhttp.HandlerOpts{Registry: a.metrics.reg}))
}

func (a *Agent) addHealth(mux *http.ServeMux) {
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) {
		if err := a.healthy(time.Now()); err != nil {
			http.Error(w, err.Error(), http.StatusServiceUnavailable)
			return
		}
		fmt.Fprintln(w, "ok")
	})
	mux.HandleFunc("/readyz", func(w http.ResponseWriter, _ *http.Request) {
		switch {
		case !a.programmed.Load():
			http.Error(w, "not ready: the first full sync has not been programmed yet", http.StatusServiceUnavailable)
		case a.lastFailed.Load():
			http.Error(w, "not ready: the last sync failed; the previous rules are in force", http.StatusServiceUnavailable)
		default:
			fmt.Fprintln(w, "ok")
		}
	})
}

func (a *Agent) healthy(now time.Time) error {
	if s := a.syncStarted.Load(); s != 0 {
		if d := now.Sub(time.Unix(0, s)); d > stuckAfter {
			return fmt.Errorf("a sync has been running for %s", d.Round(time.Second))
		}
	}
	return nil
}

// serve starts the HTTP servers; they stop when ctx ends. A server that
// fails reports on errc.
func (a *Agent) serve(ctx context.Context, wg *sync.WaitGroup, errc chan<- error) {
	start := func(ln net.Listener, h http.Handler, what string) {
		srv := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second}
		wg.Add(2)
		go func() {
			defer wg.Done()
			if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
				errc <- fmt.Errorf("%s server on %s: %w", what, ln.Addr(), err)
			}
		}()
		go func() {
			defer wg.Done()
			<-ctx.Done()
			sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			_ = srv.Shutdown(sctx)
		}()
	}
	if a.metricsLn != nil {
		mux := http.NewServeMux()
		a.addMetrics(mux)
		if a.cfg.HealthAddr == a.cfg.MetricsAddr {
			a.addHealth(mux)
		}
		start(a.metricsLn, mux, "metrics")
	}
	if a.healthLn != nil {
		mux := http.NewServeMux()
		a.addHealth(mux)
		start(a.healthLn, mux, "health")
	}
}
