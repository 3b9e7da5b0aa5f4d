// Package auth checks agent bearer tokens with the Kubernetes TokenReview
// API, as upstream's server does with --agent-namespace,
// --agent-service-account and --authentication-audience. A review has its
// own time limit, and successful reviews are cached briefly
// (internal/tokenreview, kube-apiserver's own token cache), so
// reconnecting agents do not each cost the API server a review and a slow
// reviewer cannot hold an unauthenticated agent stream open. Refused
// tokens are remembered briefly too, by their hash: in token-only mode
// anyone who reaches the agent port can present a token, and a peer
// reconnecting with a refused one (a flood, or a fleet of misconfigured
// agents) would otherwise cost a review per stream.
package auth

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"net/netip"
	"strings"
	"time"

	"github.com/moat-net/moat/internal/tokenreview"
	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/cache"
	"k8s.io/client-go/kubernetes"
)

// Defaults.
const (
	// DefaultTimeout bounds one review, including the wait for a review
	// another connecting agent with the same token started.
	DefaultTimeout = tokenreview.DefaultTimeout
	// DefaultCacheTTL is how long an accepted token stays accepted without
	// a new review: kube-apiserver's token cache default for successes.
	DefaultCacheTTL = 10 * time.Second
	// DefaultFailureTTL is how long a refused token stays refused without
	// a new review (errors that got no answer are never remembered).
	DefaultFailureTTL = 10 * time.Second
	// maxRefused bounds the refused tokens remembered (least recently
	// used go first): a flood of distinct tokens cannot grow the memory,
	// and each of them costs a review anyway.
	maxRefused = 4096
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
	// FailureTTL is how long a refused token is refused again without a
	// review, with the same reason (default DefaultFailureTTL; negative:
	// never).
	FailureTTL time.Duration
	// Registry receives moat_tunnel_token_reviews_total and
	// moat_tunnel_token_refusals_remembered_total; nil registers nowhere.
	Registry prometheus.Registerer
}

// TokenReview accepts tokens the API server authenticates as the expected
// service account (and, if Audience is set, for that audience).
type TokenReview struct {
	reviews *tokenreview.Authenticator
	// refused maps the SHA-256 of a refused token to the refusal (an
	// error), for failureTTL; nil when failureTTL is negative. Keyed by
	// hash so that the server holds no tokens it did not accept.
	refused    *cache.LRUExpireCache
	failureTTL time.Duration
	remembered prometheus.Counter
}

// New returns an authenticator for cfg.
func New(cfg Config) *TokenReview {
	if cfg.CacheTTL == 0 {
		cfg.CacheTTL = DefaultCacheTTL
	}
	if cfg.FailureTTL == 0 {
		cfg.FailureTTL = DefaultFailureTTL
	}
	results := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "moat_tunnel_token_reviews_total",
		Help: "TokenReviews of agent tokens sent to the API server, by result: accepted, rejected, error, timeout. An accepted token is not reviewed again for the cache TTL, a rejected one for the failure TTL.",
	}, []string{"result"})
	remembered := prometheus.NewCounter(prometheus.CounterOpts{
		Name: "moat_tunnel_token_refusals_remembered_total",
		Help: "Agent tokens refused without a TokenReview because the same token was refused within the failure TTL.",
	})
	if cfg.Registry != nil {
		cfg.Registry.MustRegister(results, remembered)
	}
	a := &TokenReview{reviews: tokenreview.New(tokenreview.Config{
		Client:     cfg.Client,
		Audience:   cfg.Audience,
		Username:   "system:serviceaccount:" + cfg.Namespace + ":" + cfg.ServiceAccount,
		Timeout:    cfg.Timeout,
		SuccessTTL: cfg.CacheTTL, // negative: no cache
		Results:    results,
	}), failureTTL: cfg.FailureTTL, remembered: remembered}
	if cfg.FailureTTL > 0 {
		a.refused = cache.NewLRUExpireCache(maxRefused)
	}
	return a
}

// NodeNameExtra is the TokenReview extra that names the node of a token
// bound to a pod (the pod's node) or to a Node object.
const NodeNameExtra = "authentication.kubernetes.io/node-name"

// Authenticate implements server.Authenticator: node is the token's
// NodeNameExtra, "" for a token bound to no node; a token naming several
// nodes (kube-apiserver never answers so, another authenticator behind the
// review could) is refused, since no node could hold it and "none" would
// trust it cluster-wide. It returns within the configured timeout
// whatever the API server does. An error that is not a refusal (no answer,
// a failed request) is server.Unavailable, so a tunnel being re-checked
// survives an API server outage. A refusal is remembered for the failure
// TTL: the same token is refused again, for the same reason, without a
// review.
func (a *TokenReview) Authenticate(ctx context.Context, token string) (node string, err error) {
	key := sha256.Sum256([]byte(token))
	if a.refused != nil {
		if v, ok := a.refused.Get(key); ok {
			a.remembered.Inc()
			return "", v.(error)
		}
	}
	u, err := a.reviews.Authenticate(ctx, token)
	if err != nil {
		if !errors.Is(err, tokenreview.ErrRejected) {
			return "", unavailableError{err}
		}
		return "", a.refuse(key, err)
	}
	switch v := u.GetExtra()[NodeNameExtra]; len(v) {
	case 0:
		return "", nil
	case 1:
		return v[0], nil
	default:
		return "", a.refuse(key, fmt.Errorf("token review: the token names %d nodes %q in %s, want at most one", len(v), v, NodeNameExtra))
	}
}

// refuse remembers err as the answer for the token hashed to key.
func (a *TokenReview) refuse(key [sha256.Size]byte, err error) error {
	if a.refused != nil {
		a.refused.Add(key, err, a.failureTTL)
	}
	return err
}

// unavailableError is an error that got no answer from the API server
// (server.Unavailable), as against a refusal.
type unavailableError struct{ err error }

func (e unavailableError) Error() string     { return e.err.Error() }
func (e unavailableError) Unwrap() error     { return e.err }
func (e unavailableError) Unavailable() bool { return true }

// Nodes reads Node objects for server.Config.Nodes: the addresses a
// token-bound agent may claim are those of its node's status.addresses,
// the ones kube-apiserver dials that node's kubelet at. It needs get on
// nodes.
type Nodes struct {
	Client kubernetes.Interface
	// Timeout bounds one read (default DefaultTimeout), so a slow API
	// server cannot hold a connecting agent past the agent's
	// --connect-timeout together with the token's review.
	Timeout time.Duration
}

// NodeAddresses implements server.NodeLookup: the IP addresses (types
// InternalIP and ExternalIP; others and unparsable values are skipped)
// and the DNS names (Hostname, InternalDNS, ExternalDNS: lower-case,
// without a trailing dot) the Node lists. An error other than the Node not
// existing is server.Unavailable.
func (n Nodes) NodeAddresses(ctx context.Context, node string) ([]netip.Addr, []string, error) {
	timeout := n.Timeout
	if timeout <= 0 {
		timeout = DefaultTimeout
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	obj, err := n.Client.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
	if err != nil {
		if apierrors.IsNotFound(err) {
			return nil, nil, fmt.Errorf("get Node %q: %w", node, err)
		}
		if apierrors.IsForbidden(err) {
			return nil, nil, unavailableError{fmt.Errorf("get Node %q: %w (moat-proxy-server's --kubeconfig identity needs get on nodes: deploy/tunnel/moat-proxy-server-rbac.yaml)", node, err)}
		}
		return nil, nil, unavailableError{fmt.Errorf("get Node %q: %w", node, err)}
	}
	var addrs []netip.Addr
	var hosts []string
	for _, a := range obj.Status.Addresses {
		switch a.Type {
		case corev1.NodeInternalIP, corev1.NodeExternalIP:
			if ip, err := netip.ParseAddr(a.Address); err == nil && ip.Zone() == "" {
				addrs = append(addrs, ip.Unmap())
			}
		case corev1.NodeHostName, corev1.NodeInternalDNS, corev1.NodeExternalDNS:
			if h := strings.ToLower(strings.TrimSuffix(a.Address, ".")); h != "" {
				hosts = append(hosts, h)
			}
		}
	}
	return addrs, hosts, nil
}
