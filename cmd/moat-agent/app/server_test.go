package app

import (
	"context"
	"errors"
	"io"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/moat-net/moat/agent"
	"github.com/moat-net/moat/internal/testenv"
)

// stubAgent answers the checks as told.
type stubAgent struct {
	healthy, ready error
	reg            *prometheus.Registry
}

func (s *stubAgent) Healthy() error               { return s.healthy }
func (s *stubAgent) Ready() error                 { return s.ready }
func (s *stubAgent) Metrics() prometheus.Gatherer { return s.reg }
func (s *stubAgent) Watches() []agent.WatchStatus {
	return []agent.WatchStatus{
		{Resource: "pods", Watching: true, LastContact: time.Now()},
		{Resource: "nodes", Stale: 12 * time.Second, LastContact: time.Now().Add(-12 * time.Second), LastError: errors.New("connection refused")},
	}
}

func get(t *testing.T, url string) (int, string) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

func TestEndpoints(t *testing.T) {
	for _, tc := range []struct {
		name                string
		metrics, health     string
		wantMetricsOnHealth bool
	}{
		{"two listeners", "127.0.0.1:0", "127.0.0.1:0", false},
		{"one listener", "127.0.0.1:0", "", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			metrics, health := tc.metrics, tc.health
			if tc.wantMetricsOnHealth {
				metrics = "127.0.0.1:" + strconv.Itoa(testenv.FreePort(t))
				health = metrics
			}
			srv, err := listen(metrics, health)
			if err != nil {
				t.Fatal(err)
			}
			defer srv.close()
			reg := prometheus.NewRegistry()
			c := prometheus.NewCounter(prometheus.CounterOpts{Name: "moat_agent_test_total", Help: "test"})
			reg.MustRegister(c)
			a := &stubAgent{reg: reg, ready: errors.New("the first full sync has not been programmed yet")}
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			srv.serve(ctx, a)
			m, h := "http://"+srv.metricsAddr(), "http://"+srv.healthAddr()
			if code, body := get(t, h+"/readyz"); code != http.StatusServiceUnavailable || !strings.Contains(body, "first full sync") {
				t.Errorf("/readyz before ready = %d %q", code, body)
			}
			a.ready = nil
			code, body := get(t, h+"/readyz")
			if code != http.StatusOK || !strings.HasPrefix(body, "ok\n") {
				t.Errorf("/readyz = %d %q", code, body)
			}
			// A stale watch is detail, not a reason to be unready.
			for _, want := range []string{"watch pods: current", "watch nodes: stale for 12s", "failing: connection refused"} {
				if !strings.Contains(body, want) {
					t.Errorf("/readyz lacks %q:\n%s", want, body)
				}
			}
			if code, _ := get(t, h+"/healthz"); code != http.StatusOK {
				t.Errorf("/healthz = %d", code)
			}
			a.healthy = errors.New("a sync has been running for 3m1s")
			if code, body := get(t, h+"/healthz"); code != http.StatusServiceUnavailable || !strings.Contains(body, "3m1s") {
				t.Errorf("/healthz of a hung agent = %d %q", code, body)
			}
			code, body = get(t, m+"/metrics")
			for _, want := range []string{"moat_agent_test_total 0", "process_resident_memory_bytes", "go_goroutines"} {
				if code != http.StatusOK || !strings.Contains(body, want) {
					t.Errorf("/metrics = %d, lacks %q", code, want)
				}
			}
			if code, _ := get(t, m+"/debug/pprof/"); code != http.StatusNotFound {
				t.Errorf("/debug/pprof/ without --profiling: HTTP %d", code)
			}
			code, _ = get(t, h+"/metrics")
			if served := code == http.StatusOK; served != tc.wantMetricsOnHealth {
				t.Errorf("/metrics on the health address: HTTP %d, want served=%v", code, tc.wantMetricsOnHealth)
			}
		})
	}
}

func TestProfiling(t *testing.T) {
	srv, err := listen("127.0.0.1:0", "")
	if err != nil {
		t.Fatal(err)
	}
	defer srv.close()
	srv.profiling = true
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	srv.serve(ctx, &stubAgent{reg: prometheus.NewRegistry()})
	if code, body := get(t, "http://"+srv.metricsAddr()+"/debug/pprof/"); code != http.StatusOK || !strings.Contains(body, "heap") {
		t.Errorf("/debug/pprof/ = %d", code)
	}
}

func TestListenTakenPort(t *testing.T) {
	srv, err := listen("127.0.0.1:0", "")
	if err != nil {
		t.Fatal(err)
	}
	defer srv.close()
	if _, err := listen("127.0.0.1:0", srv.metricsAddr()); err == nil || !strings.Contains(err.Error(), "--health-bind-address") {
		t.Errorf("listen on a taken port: %v, want an error naming --health-bind-address", err)
	}
}
