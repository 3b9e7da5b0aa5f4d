package tokenreview

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	authv1 "k8s.io/api/authentication/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
)

// newAuthenticator serves TokenReviews over real HTTP as kube-apiserver
// does: "good" is user alice in group team with an extra, "down" gets a
// 503, anything else is refused. It counts the reviews it receives.
func newAuthenticator(t *testing.T, reviews *atomic.Int64, cfg Config) *Authenticator {
	hs := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		reviews.Add(1)
		var tr authv1.TokenReview
		if err := json.NewDecoder(r.Body).Decode(&tr); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		switch tr.Spec.Token {
		case "down":
			http.Error(w, "unavailable", http.StatusServiceUnavailable)
			return
		case "good":
			tr.Status = authv1.TokenReviewStatus{Authenticated: true, User: authv1.UserInfo{
				Username: "alice", UID: "u1", Groups: []string{"team"},
				Extra: map[string]authv1.ExtraValue{"scopes": {"a", "b"}},
			}}
		default:
			tr.Status = authv1.TokenReviewStatus{Error: "invalid bearer token"}
		}
		tr.APIVersion, tr.Kind = "authentication.k8s.io/v1", "TokenReview"
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(&tr)
	}))
	t.Cleanup(hs.Close)
	cs, err := kubernetes.NewForConfig(&rest.Config{Host: hs.URL, ContentConfig: rest.ContentConfig{ContentType: "application/json"}})
	if err != nil {
		t.Fatal(err)
	}
	cfg.Client = cs
	return New(cfg)
}

// The whole user comes back (the metrics guard authorizes it with its
// groups and extra); with FailureTTL a refused token is reviewed once per
// TTL, and errors are never remembered.
func TestRememberedRefusals(t *testing.T) {
	var reviews atomic.Int64
	results := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "reviews"}, []string{"result"})
	a := newAuthenticator(t, &reviews, Config{SuccessTTL: DefaultTimeout, FailureTTL: DefaultTimeout, Results: results})
	u, err := a.Authenticate(context.Background(), "good")
	if err != nil {
		t.Fatal(err)
	}
	if u.GetName() != "alice" || u.GetUID() != "u1" || strings.Join(u.GetGroups(), ",") != "team" || strings.Join(u.GetExtra()["scopes"], ",") != "a,b" {
		t.Errorf("user %+v: want alice, u1, [team], scopes [a b]", u)
	}
	for range 3 {
		if _, err := a.Authenticate(context.Background(), "bad"); err == nil || !strings.Contains(err.Error(), "not authenticated") || !errors.Is(err, ErrRejected) {
			t.Fatalf("bad token: err %v, want not authenticated (ErrRejected)", err)
		}
	}
	for range 2 {
		if _, err := a.Authenticate(context.Background(), "down"); err == nil || !strings.Contains(err.Error(), "token review") || errors.Is(err, ErrRejected) {
			t.Fatalf("unavailable reviewer: err %v, want a token review error that is not ErrRejected", err)
		}
	}
	if n := reviews.Load(); n != 4 {
		t.Errorf("good once, bad 3 times, down twice: %d reviews, want 4 (bad remembered, errors not)", n)
	}
	for result, want := range map[string]float64{Accepted: 1, Rejected: 1, Error: 2} {
		var m dto.Metric
		if err := results.WithLabelValues(result).Write(&m); err != nil {
			t.Fatal(err)
		}
		if got := m.GetCounter().GetValue(); got != want {
			t.Errorf("reviews{result=%q} = %v, want %v", result, got, want)
		}
	}
}

// Without FailureTTL a refusal says why: the API server's reason or the
// check that failed; either is ErrRejected, so a caller checking a token
// again can tell it from an API server that did not answer.
func TestRefusalReasons(t *testing.T) {
	var reviews atomic.Int64
	a := newAuthenticator(t, &reviews, Config{Username: "bob"})
	for token, want := range map[string]string{"bad": "invalid bearer token", "good": `user "alice" is not "bob"`} {
		if _, err := a.Authenticate(context.Background(), token); err == nil || !strings.Contains(err.Error(), want) || !errors.Is(err, ErrRejected) {
			t.Errorf("%s: err %v, want %q (ErrRejected)", token, err, want)
		}
	}
}
