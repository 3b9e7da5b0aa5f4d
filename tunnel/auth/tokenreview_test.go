package auth

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	authv1 "k8s.io/api/authentication/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
)

// fakeAPIServer answers TokenReviews over real HTTP the way kube-apiserver
// does: token "good" is the agent's service account for audience "konn",
// "other" is another account.
func fakeAPIServer(t *testing.T) *httptest.Server {
	hs := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodPost || r.URL.Path != "/apis/authentication.k8s.io/v1/tokenreviews" {
			http.NotFound(w, r)
			return
		}
		var tr authv1.TokenReview
		if err := json.NewDecoder(r.Body).Decode(&tr); err != nil {
			http.Error(w, err.Error(), 400)
			return
		}
		switch tr.Spec.Token {
		case "good":
			tr.Status = authv1.TokenReviewStatus{Authenticated: true, Audiences: tr.Spec.Audiences,
				User: authv1.UserInfo{Username: "system:serviceaccount:kube-system:konnectivity-agent"}}
		case "other":
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

func TestTokenReview(t *testing.T) {
	hs := fakeAPIServer(t)
	cs, err := kubernetes.NewForConfig(&rest.Config{Host: hs.URL, ContentConfig: rest.ContentConfig{ContentType: "application/json"}})
	if err != nil {
		t.Fatal(err)
	}
	a := &TokenReview{Client: cs, Namespace: "kube-system", ServiceAccount: "konnectivity-agent", Audience: "konn"}
	cases := []struct {
		token, wantErr string
	}{
		{"good", ""},
		{"other", "is not"},
		{"bad", "invalid bearer token"},
	}
	for _, c := range cases {
		err := a.Authenticate(context.Background(), c.token)
		if c.wantErr == "" && err != nil {
			t.Errorf("%s: %v", c.token, err)
		}
		if c.wantErr != "" && (err == nil || !strings.Contains(err.Error(), c.wantErr)) {
			t.Errorf("%s: err %v, want %q", c.token, err, c.wantErr)
		}
	}
}
