// Package auth checks agent bearer tokens with the Kubernetes TokenReview
// API, as upstream's server does with --agent-namespace,
// --agent-service-account and --authentication-audience. A review has its
// own time limit, and successful reviews are cached briefly with
// kube-apiserver's own token cache, so reconnecting agents do not each cost
// the API server a review and a slow reviewer cannot hold an
// unauthenticated agent stream open.
package auth

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	authv1 "k8s.io/api/authentication/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apiserver/pkg/authentication/authenticator"
	"k8s.io/apiserver/pkg/authentication/token/cache"
	"k8s.io/apiserver/pkg/authentication/user"
	"k8s.io/client-go/kubernetes"
)

// Defaults.
const (
	// DefaultTimeout bounds one review, including the wait for a review
	// another connecting agent with the same token started.
	DefaultTimeout = 10 * time.Second
	// DefaultCacheTTL is how long an accepted token stays accepted without
	// a new review: kube-apiserver's token cache default for successes
	// (failures and errors are never cached, as there).
	DefaultCacheTTL = 10 * time.Second
)

// Config configures a TokenReview authenticator.
type Config struct {
	Client         kubernetes.Interface
	Namespace      string
	ServiceAccount string
	// Audience, if set, must be among the token's audiences.
	Audience string
	// Timeout bounds a review (default DefaultTimeout).
	Timeout time.Duration
	// CacheTTL is how long a success is cached (default DefaultCacheTTL;
	// negative disables the cache).
	CacheTTL time.Duration
	// Registry receives moat_tunnel_token_reviews_total; nil registers
	// nowhere.
	Registry prometheus.Registerer
}

// TokenReview accepts tokens the API server authenticates as the expected
// service account (and, if Audience is set, for that audience).
type TokenReview struct {
	cached  authenticator.Token
	timeout time.Duration
	want    string
}

// New returns an authenticator for cfg.
func New(cfg Config) *TokenReview {
	if cfg.Timeout <= 0 {
		cfg.Timeout = DefaultTimeout
	}
	if cfg.CacheTTL == 0 {
		cfg.CacheTTL = DefaultCacheTTL
	}
	reviews := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "moat_tunnel_token_reviews_total",
		Help: "TokenReviews of agent tokens sent to the API server, by result: accepted, rejected, error, timeout. An accepted token is not reviewed again for the cache TTL.",
	}, []string{"result"})
	if cfg.Registry != nil {
		cfg.Registry.MustRegister(reviews)
	}
	var tok authenticator.Token = &reviewer{cfg: cfg, results: reviews}
	if cfg.CacheTTL > 0 {
		tok = cache.New(tok, false, cfg.CacheTTL, 0)
	}
	return &TokenReview{
		cached:  tok,
		timeout: cfg.Timeout,
		want:    "system:serviceaccount:" + cfg.Namespace + ":" + cfg.ServiceAccount,
	}
}

// NodeNameExtra is the TokenReview extra that names the node of a token
// bound to a pod (the pod's node) or to a Node object.
const NodeNameExtra = "authentication.kubernetes.io/node-name"

// Authenticate implements server.Authenticator: node is the token's
// NodeNameExtra, "" for a token bound to no node (or to several, which
// kube-apiserver never returns). It returns within the configured timeout
// whatever the API server does.
func (a *TokenReview) Authenticate(ctx context.Context, token string) (node string, err error) {
	ctx, cancel := context.WithTimeout(ctx, a.timeout)
	defer cancel()
	resp, ok, err := a.cached.AuthenticateToken(ctx, token)
	switch {
	case errors.Is(err, context.DeadlineExceeded):
		return "", fmt.Errorf("token review: no answer within %s: %w", a.timeout, err)
	case err != nil:
		return "", err
	case !ok:
		return "", errors.New("token review: not authenticated")
	case resp.User.GetName() != a.want:
		// The reviewer already refused other users; this guards the cache.
		return "", fmt.Errorf("token review: user %q is not %q", resp.User.GetName(), a.want)
	}
	if v := resp.User.GetExtra()[NodeNameExtra]; len(v) == 1 {
		return v[0], nil
	}
	return "", nil
}

// reviewer makes one TokenReview; the cache in front of it shares a review
// between agents presenting the same token at once and remembers successes.
type reviewer struct {
	cfg     Config
	results *prometheus.CounterVec
}

func (r *reviewer) AuthenticateToken(ctx context.Context, token string) (*authenticator.Response, bool, error) {
	ctx, cancel := context.WithTimeout(ctx, r.cfg.Timeout)
	defer cancel()
	tr := &authv1.TokenReview{Spec: authv1.TokenReviewSpec{Token: token}}
	if r.cfg.Audience != "" {
		tr.Spec.Audiences = []string{r.cfg.Audience}
	}
	res, err := r.cfg.Client.AuthenticationV1().TokenReviews().Create(ctx, tr, metav1.CreateOptions{})
	if err != nil {
		if ctx.Err() != nil {
			r.results.WithLabelValues("timeout").Inc()
		} else {
			r.results.WithLabelValues("error").Inc()
		}
		return nil, false, fmt.Errorf("token review: %w", err)
	}
	if !res.Status.Authenticated {
		r.results.WithLabelValues("rejected").Inc()
		msg := res.Status.Error
		if msg == "" {
			msg = "not authenticated"
		}
		return nil, false, fmt.Errorf("token review: %s", msg)
	}
	if r.cfg.Audience != "" && !slices.Contains(res.Status.Audiences, r.cfg.Audience) {
		r.results.WithLabelValues("rejected").Inc()
		return nil, false, fmt.Errorf("token review: token not valid for audience %q", r.cfg.Audience)
	}
	want := "system:serviceaccount:" + r.cfg.Namespace + ":" + r.cfg.ServiceAccount
	if res.Status.User.Username != want {
		r.results.WithLabelValues("rejected").Inc()
		return nil, false, fmt.Errorf("token review: user %q is not %q", res.Status.User.Username, want)
	}
	r.results.WithLabelValues("accepted").Inc()
	u := &user.DefaultInfo{Name: res.Status.User.Username, UID: res.Status.User.UID}
	if v := res.Status.User.Extra[NodeNameExtra]; len(v) > 0 {
		u.Extra = map[string][]string{NodeNameExtra: v}
	}
	return &authenticator.Response{User: u}, true, nil
}
