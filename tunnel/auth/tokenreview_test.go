package auth

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	authv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/rest"
	k8stesting "k8s.io/client-go/testing"
)

// fakeAPIServer answers TokenReviews over real HTTP the way kube-apiserver
// does: token "good" (and any token starting with "good") is the agent's
// service account for audience "konn", "good-node-a" is the same account's
// token bound to a pod on node-a (the node-name extra), "other" is another
// account, "slow" is never answered, "good-nodes" names two nodes (no
// kube-apiserver does that; a webhook authenticator behind it could). It counts the reviews it receives.
func fakeAPIServer(t *testing.T, reviews *atomic.Int64) *httptest.Server {
	hs := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodPost || r.URL.Path != "/apis/authentication.k8s.io/v1/tokenreviews" {
			http.NotFound(w, r)
			return
		}
		reviews.Add(1)
		var tr authv1.TokenReview
		if err := json.NewDecoder(r.Body).Decode(&tr); err != nil {
			http.Error(w, err.Error(), 400)
			return
		}
		switch tok := tr.Spec.Token; {
		case tok == "slow":
			<-r.Context().Done() // a reviewer that never answers
			return
		case strings.HasPrefix(tok, "good"):
			tr.Status = authv1.TokenReviewStatus{Authenticated: true, Audiences: tr.Spec.Audiences,
				User: authv1.UserInfo{Username: "system:serviceaccount:kube-system:konnectivity-agent"}}
			if tok == "good-nodes" {
				tr.Status.User.Extra = map[string]authv1.ExtraValue{NodeNameExtra: {"node-a", "node-b"}}
			}
			if node, ok := strings.CutPrefix(tok, "good-"); ok && strings.HasPrefix(node, "node-") {
				tr.Status.User.Extra = map[string]authv1.ExtraValue{
					NodeNameExtra:                           {node},
					"authentication.kubernetes.io/pod-name": {"konnectivity-agent-x"},
				}
			}
		case tok == "other":
			tr.Status = authv1.TokenReviewStatus{Authenticated: true, Audiences: tr.Spec.Audiences,
				User: authv1.UserInfo{Username: "system:serviceaccount:default:default"}}
		default:
			tr.Status = authv1.TokenReviewStatus{Error: "invalid bearer token"}
		}
		tr.APIVersion, tr.Kind = "authentication.k8s.io/v1", "TokenReview"
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(&tr)
	}))
	t.Cleanup(hs.Close)
	return hs
}

func newReview(t *testing.T, reviews *atomic.Int64, cfg Config) (*TokenReview, *prometheus.Registry) {
	hs := fakeAPIServer(t, reviews)
	cs, err := kubernetes.NewForConfig(&rest.Config{Host: hs.URL, ContentConfig: rest.ContentConfig{ContentType: "application/json"}})
	if err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	cfg.Client, cfg.Namespace, cfg.ServiceAccount, cfg.Audience, cfg.Registry = cs, "kube-system", "konnectivity-agent", "konn", reg
	return New(cfg), reg
}

func TestTokenReview(t *testing.T) {
	var reviews atomic.Int64
	a, reg := newReview(t, &reviews, Config{})
	cases := []struct {
		token, wantNode, wantErr string
	}{
		{"good", "", ""},
		{"good-node-a", "node-a", ""},
		{"good-node-a", "node-a", ""}, // from the cache
		{"other", "", "is not"},
		{"bad", "", "invalid bearer token"},
		// Several nodes is no node to hold the agent to: refused, where
		// "names none" would have trusted it cluster-wide under auto.
		{"good-nodes", "", `names 2 nodes ["node-a" "node-b"]`},
	}
	for _, c := range cases {
		node, err := a.Authenticate(context.Background(), c.token)
		if c.wantErr == "" && err != nil {
			t.Errorf("%s: %v", c.token, err)
		}
		if node != c.wantNode {
			t.Errorf("%s: node %q, want %q", c.token, node, c.wantNode)
		}
		if c.wantErr != "" && (err == nil || !strings.Contains(err.Error(), c.wantErr)) {
			t.Errorf("%s: err %v, want %q", c.token, err, c.wantErr)
		}
	}
	for result, want := range map[string]float64{"accepted": 3, "rejected": 2} {
		if got := reviewed(t, reg, result); got != want {
			t.Errorf("moat_tunnel_token_reviews_total{result=%q} = %v, want %v", result, got, want)
		}
	}
}

// reviewed reads moat_tunnel_token_reviews_total{result}.
func reviewed(t *testing.T, reg *prometheus.Registry, result string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			if mf.GetName() == "moat_tunnel_token_reviews_total" && m.GetLabel()[0].GetValue() == result {
				return m.GetCounter().GetValue()
			}
		}
	}
	return 0
}

// A reviewer that never answers holds a connecting agent no longer than the
// review timeout, and the failure is counted.
func TestTokenReviewTimeout(t *testing.T) {
	var reviews atomic.Int64
	a, reg := newReview(t, &reviews, Config{Timeout: 300 * time.Millisecond})
	done := make(chan error, 1)
	go func() {
		_, err := a.Authenticate(context.Background(), "slow")
		done <- err
	}()
	select {
	case err := <-done:
		if err == nil || !strings.Contains(err.Error(), "token review") {
			t.Fatalf("slow reviewer: err %v, want a token review error", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("Authenticate still waiting for a reviewer that never answers")
	}
	eventually(t, func() bool { return reviewed(t, reg, "timeout") == 1 })
}

// Accepted tokens are reviewed once per cache TTL, concurrent checks of one
// token share a review, and with FailureTTL negative rejected tokens are
// reviewed every time.
func TestTokenReviewCache(t *testing.T) {
	var reviews atomic.Int64
	a, _ := newReview(t, &reviews, Config{CacheTTL: 300 * time.Millisecond, FailureTTL: -1})
	for range 5 {
		if _, err := a.Authenticate(context.Background(), "good"); err != nil {
			t.Fatal(err)
		}
	}
	if n := reviews.Load(); n != 1 {
		t.Fatalf("5 checks of one good token within the TTL made %d reviews, want 1", n)
	}
	var wg sync.WaitGroup
	for range 20 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if _, err := a.Authenticate(context.Background(), "good-2"); err != nil {
				t.Error(err)
			}
		}()
	}
	wg.Wait()
	if n := reviews.Load(); n != 2 {
		t.Fatalf("20 concurrent checks of a new token made %d reviews in all, want 2", n)
	}
	for range 3 {
		if _, err := a.Authenticate(context.Background(), "bad"); err == nil {
			t.Fatal("bad token accepted")
		}
	}
	if n := reviews.Load(); n != 5 {
		t.Fatalf("3 checks of a bad token: %d reviews in all, want 5 (failures are not cached here)", n)
	}
	eventually(t, func() bool {
		before := reviews.Load()
		if _, err := a.Authenticate(context.Background(), "good"); err != nil {
			t.Fatal(err)
		}
		return reviews.Load() == before+1 // reviewed again once the TTL passed
	})
}

// A refused token is refused again for the failure TTL without a review,
// for the same reason: a peer of the agent port that reconnects with a bad
// token (a flood, a fleet of misconfigured agents) cannot make each stream
// cost the API server a review. A token answered with an error, not a
// refusal, is reviewed again at once, and a refused token is reviewed
// again once the TTL has passed.
func TestTokenReviewRemembersRefusals(t *testing.T) {
	var reviews atomic.Int64
	a, reg := newReview(t, &reviews, Config{FailureTTL: time.Hour, Timeout: 300 * time.Millisecond})
	var first error
	for i := range 50 {
		for _, tok := range []string{"bad", "other", "good-nodes"} {
			_, err := a.Authenticate(context.Background(), tok)
			if err == nil {
				t.Fatalf("%s accepted", tok)
			}
			if tok == "bad" && i == 0 {
				first = err
			}
			if tok == "bad" && err.Error() != first.Error() {
				t.Fatalf("bad token refused again as %q, first as %q", err, first)
			}
		}
	}
	if n := reviews.Load(); n != 3 {
		t.Fatalf("50 checks each of 3 refused tokens made %d reviews, want 3", n)
	}
	if got := remembered(t, reg); got != 147 {
		t.Errorf("moat_tunnel_token_refusals_remembered_total = %v, want 147", got)
	}
	eventually(t, func() bool { // errors are not remembered
		if _, err := a.Authenticate(context.Background(), "slow"); err == nil || !isUnavailable(err) {
			t.Fatalf("slow reviewer: err %v, want unavailable", err)
		}
		return reviews.Load() >= 5
	})

	short, _ := newReview(t, &reviews, Config{FailureTTL: 100 * time.Millisecond})
	before := reviews.Load()
	if _, err := short.Authenticate(context.Background(), "bad"); err == nil {
		t.Fatal("bad token accepted")
	}
	eventually(t, func() bool {
		if _, err := short.Authenticate(context.Background(), "bad"); err == nil {
			t.Fatal("bad token accepted")
		}
		return reviews.Load() > before+1 // reviewed again once the TTL passed
	})
}

func isUnavailable(err error) bool {
	var u interface{ Unavailable() bool }
	return errors.As(err, &u) && u.Unavailable()
}

// remembered reads moat_tunnel_token_refusals_remembered_total.
func remembered(t *testing.T, reg *prometheus.Registry) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == "moat_tunnel_token_refusals_remembered_total" {
			return mf.GetMetric()[0].GetCounter().GetValue()
		}
	}
	return 0
}

func eventually(t *testing.T, cond func() bool) {
	t.Helper()
	for range 200 {
		if cond() {
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatal("condition never held")
}

// TestNodesAddresses: a token-bound agent may claim its Node's IP
// addresses and DNS names, read as kube-apiserver would dial them; other
// address types and unparsable values vouch for nothing, and a server
// without permission to read Nodes says which RBAC it lacks.
func TestNodesAddresses(t *testing.T) {
	cs := fake.NewClientset(&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node-a"}, Status: corev1.NodeStatus{Addresses: []corev1.NodeAddress{
		{Type: corev1.NodeInternalIP, Address: "192.0.2.10"},
		{Type: corev1.NodeInternalIP, Address: "::ffff:192.0.2.12"},
		{Type: corev1.NodeExternalIP, Address: "2001:db8::a"},
		{Type: corev1.NodeInternalIP, Address: "fe80::1%eth0"}, // a zone is no node address
		{Type: corev1.NodeInternalIP, Address: "not-an-ip"},
		{Type: corev1.NodeHostName, Address: "Node-A"},
		{Type: corev1.NodeInternalDNS, Address: "node-a.internal."},
		{Type: corev1.NodeExternalDNS, Address: "node-a.example"},
		{Type: "Other", Address: "192.0.2.99"},
	}}})
	addrs, hosts, err := Nodes{Client: cs}.NodeAddresses(context.Background(), "node-a")
	if err != nil {
		t.Fatal(err)
	}
	want := []netip.Addr{netip.MustParseAddr("192.0.2.10"), netip.MustParseAddr("192.0.2.12"), netip.MustParseAddr("2001:db8::a")}
	if !slices.Equal(addrs, want) {
		t.Errorf("addresses %v, want %v", addrs, want)
	}
	if w := []string{"node-a", "node-a.internal", "node-a.example"}; !slices.Equal(hosts, w) {
		t.Errorf("names %v, want %v", hosts, w)
	}
	if _, _, err := (Nodes{Client: cs}).NodeAddresses(context.Background(), "node-b"); !apierrors.IsNotFound(err) || !strings.Contains(err.Error(), `get Node "node-b"`) {
		t.Errorf("missing Node: got %v, want NotFound naming it", err)
	}
	cs.PrependReactor("get", "nodes", func(k8stesting.Action) (bool, runtime.Object, error) {
		return true, nil, apierrors.NewForbidden(corev1.Resource("nodes"), "node-a", errors.New("RBAC: no"))
	})
	if _, _, err := (Nodes{Client: cs}).NodeAddresses(context.Background(), "node-a"); err == nil || !strings.Contains(err.Error(), "moat-proxy-server-rbac.yaml") {
		t.Errorf("forbidden: got %v, want the RBAC it lacks", err)
	}
}
