package app

import (
	"context"
	"crypto/tls"
	"io"
	"net/http"
	"strconv"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/moat-net/moat/agent"
	"github.com/moat-net/moat/internal/kubetest"
	"github.com/moat-net/moat/internal/metricsauth"
	"github.com/moat-net/moat/internal/testenv"
)

// TestSecureMetricsAgainstAPIServer: the agent's metrics
// listener, as the binary sets it up by default, against a real API
// server, reviewing tokens as the agent's ServiceAccount under the
// shipped RBAC. Plain HTTP is refused; a scraper without a token gets 401,
// one whose ServiceAccount is not bound to moat-metrics-reader 403, one
// bound to it the metrics but not the profiles; the health endpoints on
// the same listener stay open for the kubelet's probes.
func TestSecureMetricsAgainstAPIServer(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a real kube-apiserver; runs without -short")
	}
	ctx := context.Background()
	env := kubetest.Start(ctx, t)
	objs, err := kubetest.AgentManifests()
	if err != nil {
		t.Fatal(err)
	}
	if err := env.Apply(ctx, objs, kubetest.ApplyOptions{}); err != nil {
		t.Fatalf("apply agent RBAC: %v", err)
	}
	if _, err := env.Client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "monitoring"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	token := map[string]string{}
	for _, sa := range []string{"prometheus", "nobody"} {
		if _, err := env.Client.CoreV1().ServiceAccounts("monitoring").Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: sa}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		cfg, err := env.ServiceAccountConfig(ctx, "monitoring", sa)
		if err != nil {
			t.Fatal(err)
		}
		token[sa] = cfg.BearerToken
	}
	if _, err := env.Client.RbacV1().ClusterRoleBindings().Create(ctx, &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "prometheus-moat-metrics"},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "moat-metrics-reader"},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Namespace: "monitoring", Name: "prometheus"}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	agentCfg, err := env.ServiceAccountConfig(ctx, "moat-system", "moat-agent")
	if err != nil {
		t.Fatal(err)
	}
	clients, err := agent.NewClients(agentCfg)
	if err != nil {
		t.Fatal(err)
	}

	addr := "127.0.0.1:" + strconv.Itoa(testenv.FreePort(t))
	srv, err := listen(addr, addr)
	if err != nil {
		t.Fatal(err)
	}
	defer srv.close()
	srv.profiling = true
	tlsCfg, err := metricsauth.TLSConfig("", "", "n1")
	if err != nil {
		t.Fatal(err)
	}
	srv.secure = &secureMetrics{guard: metricsauth.New(metricsauth.Config{Client: clients.Kube}), tls: tlsCfg}
	reg := prometheus.NewRegistry()
	reg.MustRegister(prometheus.NewCounter(prometheus.CounterOpts{Name: "moat_agent_test_total", Help: "test"}))
	sctx, cancel := context.WithCancel(ctx)
	defer cancel()
	srv.serve(sctx, &stubAgent{reg: reg})

	client := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}}
	get := func(url, token string) (int, string) {
		t.Helper()
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		if token != "" {
			req.Header.Set("Authorization", "Bearer "+token)
		}
		resp, err := client.Do(req)
		if err != nil {
			t.Fatalf("GET %s: %v", url, err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	base := "https://" + srv.metricsAddr()
	if code, _ := get("http://"+srv.metricsAddr()+"/metrics", token["prometheus"]); code != http.StatusBadRequest {
		t.Errorf("plain HTTP /metrics: HTTP %d, want 400 (TLS only)", code)
	}
	for _, c := range []struct {
		what, path, token string
		want              int
		body              string
	}{
		{"no token", "/metrics", "", http.StatusUnauthorized, ""},
		{"a token the API server rejects", "/metrics", "not-a-token", http.StatusUnauthorized, ""},
		{"a ServiceAccount without the role", "/metrics", token["nobody"], http.StatusForbidden, "system:serviceaccount:monitoring:nobody"},
		{"moat-metrics-reader", "/metrics", token["prometheus"], http.StatusOK, "moat_agent_test_total 0"},
		{"moat-metrics-reader, again (cached)", "/metrics", token["prometheus"], http.StatusOK, "go_goroutines"},
		{"moat-metrics-reader on the profiles", "/debug/pprof/", token["prometheus"], http.StatusForbidden, ""},
		{"liveness probe, no token", "/healthz", "", http.StatusOK, "ok"},
		{"readiness probe, no token", "/readyz", "", http.StatusOK, "ok"},
	} {
		code, body := get(base+c.path, c.token)
		if code != c.want || !strings.Contains(body, c.body) {
			t.Errorf("%s: GET %s = %d %.200q, want %d with %q", c.what, c.path, code, body, c.want, c.body)
		}
	}
}
