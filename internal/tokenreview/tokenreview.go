// Package tokenreview authenticates a bearer token with a Kubernetes
// TokenReview behind kube-apiserver's own token cache. It is the one
// implementation both of Moat's token checks use: moat-proxy-server's
// agent tokens (tunnel/auth: one service account, an audience, a bound
// token's node) and moat-agent's metrics guard (internal/metricsauth:
// any user, then a SubjectAccessReview). The cache makes callers
// presenting one token at once share one review and remembers answers
// for the TTLs the caller gives, so a reconnecting agent or a periodic
// scraper does not cost the API server a review each time; the timeout
// bounds both the caller's wait and the review itself, so a slow API
// server cannot hold a caller past it.
package tokenreview

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

// DefaultTimeout bounds one review when Config.Timeout is unset: kube's
// webhook authenticators' request timeout.
const DefaultTimeout = 10 * time.Second

// Result labels of Config.Results.
const (
	Accepted = "accepted"
	Rejected = "rejected"
	Error    = "error"
	Timeout  = "timeout"
)

// Config configures an Authenticator.
type Config struct {
	// Client sends the reviews; it needs create on
	// authentication.k8s.io tokenreviews.
	Client kubernetes.Interface
	// Audience, if set, is asked for and must be among the token's
	// audiences in the answer.
	Audience string
	// Username, if set, is the only user accepted; any other
	// authenticated user is rejected (and so never cached as accepted).
	Username string
	// Timeout bounds a review and a caller's wait for it, including the
	// wait for a review of the same token another caller started
	// (default DefaultTimeout).
	Timeout time.Duration
	// SuccessTTL and FailureTTL are how long an accepted and a rejected
	// token are remembered; zero or negative: not remembered. Errors
	// (no answer, a failed request) are never remembered. When both are
	// unset there is no cache, and concurrent callers each send a review.
	SuccessTTL, FailureTTL time.Duration
	// Results, if set, counts the reviews sent by their result, its one
	// label: Accepted, Rejected, Error or Timeout. Answers from the cache
	// are not counted.
	Results *prometheus.CounterVec
}

// Authenticator authenticates tokens with cached TokenReviews.
type Authenticator struct {
	tokens  authenticator.Token
	timeout time.Duration
}

// New returns an Authenticator for cfg.
func New(cfg Config) *Authenticator {
	if cfg.Timeout <= 0 {
		cfg.Timeout = DefaultTimeout
	}
	var tok authenticator.Token = reviewer{cfg}
	if cfg.SuccessTTL > 0 || cfg.FailureTTL > 0 {
		// cache.New takes 0 as "do not cache"; errors are never cached.
		tok = cache.New(tok, false, max(cfg.SuccessTTL, 0), max(cfg.FailureTTL, 0))
	}
	return &Authenticator{tokens: tok, timeout: cfg.Timeout}
}

// Authenticate returns the user the token authenticates as (name, UID,
// groups, extra), or an error saying why not: the API server's reason or
// the check that failed (only "not authenticated" when FailureTTL is set),
// both ErrRejected, or that no answer came within the timeout.
func (a *Authenticator) Authenticate(ctx context.Context, token string) (user.Info, error) {
	ctx, cancel := context.WithTimeout(ctx, a.timeout)
	defer cancel()
	resp, ok, err := a.tokens.AuthenticateToken(ctx, token)
	switch {
	case errors.Is(err, context.DeadlineExceeded):
		return nil, fmt.Errorf("token review: no answer within %s: %w", a.timeout, err)
	case err != nil:
		return nil, err
	case !ok:
		return nil, rejectedError{"token review: not authenticated"}
	}
	return resp.User, nil
}

// ErrRejected is matched (errors.Is) by the error for a token the API
// server answered about and that was refused (not authenticated, another
// audience or user), as against an error that got no answer: a caller
// checking a token again can then tell a revoked or expired token from an
// API server that is unavailable for the moment.
var ErrRejected = errors.New("token rejected")

// rejectedError is a refusal with its reason; it is ErrRejected.
type rejectedError struct{ msg string }

func (e rejectedError) Error() string        { return e.msg }
func (e rejectedError) Is(target error) bool { return target == ErrRejected }

// rejected is the reviewer's answer for a token it refuses. kube's token
// cache remembers a refusal only as (nil, false, nil), which carries no
// reason, and never remembers an error: so a refusal is that answer when
// refusals are to be remembered (FailureTTL > 0), and otherwise an error
// that says why.
func (r reviewer) rejected(format string, args ...any) (*authenticator.Response, bool, error) {
	r.count(Rejected)
	if r.cfg.FailureTTL > 0 {
		return nil, false, nil
	}
	return nil, false, rejectedError{fmt.Sprintf("token review: "+format, args...)}
}

// reviewer sends one TokenReview. The cache in front of it runs it with a
// context detached from the callers' (theirs may end while others still
// wait), hence its own timeout.
type reviewer struct{ cfg Config }

func (r reviewer) count(result string) {
	if r.cfg.Results != nil {
		r.cfg.Results.WithLabelValues(result).Inc()
	}
}

func (r reviewer) AuthenticateToken(ctx context.Context, token string) (*authenticator.Response, bool, error) {
	ctx, cancel := context.WithTimeout(ctx, r.cfg.Timeout)
	defer cancel()
	tr := &authv1.TokenReview{Spec: authv1.TokenReviewSpec{Token: token}}
	if r.cfg.Audience != "" {
		tr.Spec.Audiences = []string{r.cfg.Audience}
	}
	res, err := r.cfg.Client.AuthenticationV1().TokenReviews().Create(ctx, tr, metav1.CreateOptions{})
	if err != nil {
		if ctx.Err() != nil {
			r.count(Timeout)
		} else {
			r.count(Error)
		}
		return nil, false, fmt.Errorf("token review: %w", err)
	}
	u := res.Status.User
	switch {
	case !res.Status.Authenticated:
		msg := res.Status.Error
		if msg == "" {
			msg = "not authenticated"
		}
		return r.rejected("%s", msg)
	case r.cfg.Audience != "" && !slices.Contains(res.Status.Audiences, r.cfg.Audience):
		return r.rejected("token not valid for audience %q", r.cfg.Audience)
	case r.cfg.Username != "" && u.Username != r.cfg.Username:
		return r.rejected("user %q is not %q", u.Username, r.cfg.Username)
	}
	r.count(Accepted)
	info := &user.DefaultInfo{Name: u.Username, UID: u.UID, Groups: u.Groups}
	if len(u.Extra) > 0 {
		info.Extra = make(map[string][]string, len(u.Extra))
		for k, v := range u.Extra {
			info.Extra[k] = v
		}
	}
	return &authenticator.Response{User: info}, true, nil
}
