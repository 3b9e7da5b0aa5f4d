// Package auth checks agent bearer tokens with the Kubernetes TokenReview
// API, as upstream's server does with --agent-namespace,
// --agent-service-account and --authentication-audience. A review has its
// own time limit, and successful reviews are cached briefly
// (internal/tokenreview, kube-apiserver's own token cache), so
// reconnecting agents do not each cost the API server a review and a slow
// reviewer cannot hold an unauthenticated agent stream open.
package auth

import (
	"context"
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
	"k8s.io/client-go/kubernetes"
)

// Defaults.
const (
	// DefaultTimeout bounds one review, including the wait for a review
	// another connecting agent with the same token started.
	DefaultTimeout = tokenreview.DefaultTimeout
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
	reviews *tokenreview.Authenticator
}

// New returns an authenticator for cfg.
func New(cfg Config) *TokenReview {
	if cfg.CacheTTL == 0 {
		cfg.CacheTTL = DefaultCacheTTL
	}
	results := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "moat_tunnel_token_reviews_total",
		Help: "TokenReviews of agent tokens sent to the API server, by result: accepted, rejected, error, timeout. An accepted token is not reviewed again for the cache TTL.",
	}, []string{"result"})
	if cfg.Registry != nil {
		cfg.Registry.MustRegister(results)
	}
	return &TokenReview{reviews: tokenreview.New(tokenreview.Config{
		Client:     cfg.Client,
		Audience:   cfg.Audience,
		Username:   "system:serviceaccount:" + cfg.Namespace + ":" + cfg.ServiceAccount,
		Timeout:    cfg.Timeout,
		SuccessTTL: cfg.CacheTTL, // negative: no cache
		Results:    results,
	})}
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
// survives an API server outage.
func (a *TokenReview) Authenticate(ctx context.Context, token string) (node string, err error) {
	u, err := a.reviews.Authenticate(ctx, token)
	if err != nil {
		if !errors.Is(err, tokenreview.ErrRejected) {
			return "", unavailableError{err}
		}
		return "", err
	}
	switch v := u.GetExtra()[NodeNameExtra]; len(v) {
	case 0:
		return "", nil
	case 1:
		return v[0], nil
	default:
		return "", fmt.Errorf("token review: the token names %d nodes %q in %s, want at most one", len(v), v, NodeNameExtra)
	}
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
