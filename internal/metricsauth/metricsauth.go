// Package metricsauth guards HTTP endpoints (a node agent's /metrics and
// /debug/pprof/) the way Kubernetes components guard theirs (the kubelet,
// kube-scheduler, kube-controller-manager): the caller's bearer token is
// authenticated with a TokenReview (internal/tokenreview), and the user it names is authorized
// with a SubjectAccessReview for the request's non-resource URL and verb,
// so that access is granted with RBAC, for example
//
//	rules: [{nonResourceURLs: ["/metrics"], verbs: [get]}]
//
// bound to the monitoring system's ServiceAccount. Both answers are cached
// (by default for as long as the kubelet caches them: tokens 2 minutes,
// allowed 5 minutes, denied 30 seconds), so a scrape every 30 s costs the
// API server one TokenReview every 2 minutes and one SubjectAccessReview
// every 5 per node, not two requests per scrape.
//
// It also serves TLS: from certificate files, re-read when they change
// (rotation without restart), or from a self-signed certificate made at
// start, for scrapers that skip verification as they do for kubelets.
package metricsauth

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"fmt"
	"math/big"
	"net/http"
	"os"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/moat-net/moat/internal/tokenreview"
	authzv1 "k8s.io/api/authorization/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apiserver/pkg/authentication/user"
	"k8s.io/client-go/kubernetes"
)

// Defaults, those of the kubelet's webhook authentication and
// authorization.
const (
	DefaultTokenTTL = 2 * time.Minute
	DefaultAllowTTL = 5 * time.Minute
	DefaultDenyTTL  = 30 * time.Second
	// DefaultTimeout bounds one review.
	DefaultTimeout = tokenreview.DefaultTimeout
)

// maxDecisions bounds the authorization cache: one entry per user, path
// and verb, so a handful in practice; past it expired entries go, and if
// none has, all.
const maxDecisions = 4096

// Config configures a Guard.
type Config struct {
	// Client sends the reviews; it needs create on
	// authentication.k8s.io tokenreviews and authorization.k8s.io
	// subjectaccessreviews.
	Client kubernetes.Interface
	// TokenTTL, AllowTTL and DenyTTL are how long an authenticated token,
	// an allowed and a denied request are remembered (defaults above).
	TokenTTL, AllowTTL, DenyTTL time.Duration
	// Timeout bounds one review (default DefaultTimeout).
	Timeout time.Duration
}

// Guard authenticates and authorizes requests against the API server.
type Guard struct {
	cfg    Config
	tokens *tokenreview.Authenticator

	mu        sync.Mutex
	decisions map[string]decision
}

type decision struct {
	allowed bool
	reason  string
	expires time.Time
}

// New returns a Guard for cfg.
func New(cfg Config) *Guard {
	if cfg.TokenTTL <= 0 {
		cfg.TokenTTL = DefaultTokenTTL
	}
	if cfg.AllowTTL <= 0 {
		cfg.AllowTTL = DefaultAllowTTL
	}
	if cfg.DenyTTL <= 0 {
		cfg.DenyTTL = DefaultDenyTTL
	}
	if cfg.Timeout <= 0 {
		cfg.Timeout = DefaultTimeout
	}
	// The cache also makes concurrent requests with one token share one
	// review. Failures are cached briefly so that a scraper with a bad
	// token cannot make every scrape a review.
	tokens := tokenreview.New(tokenreview.Config{Client: cfg.Client, Timeout: cfg.Timeout, SuccessTTL: cfg.TokenTTL, FailureTTL: 10 * time.Second})
	return &Guard{cfg: cfg, tokens: tokens, decisions: map[string]decision{}}
}

// Wrap returns h behind authentication (401 without a token the API
// server accepts) and authorization (403 unless a SubjectAccessReview
// allows the request's path and verb).
func (g *Guard) Wrap(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		token, ok := bearerToken(r)
		if !ok {
			http.Error(w, "Unauthorized: a bearer token is required", http.StatusUnauthorized)
			return
		}
		ctx, cancel := context.WithTimeout(r.Context(), g.cfg.Timeout)
		defer cancel()
		u, err := g.tokens.Authenticate(ctx, token)
		if err != nil {
			http.Error(w, "Unauthorized", http.StatusUnauthorized)
			return
		}
		allowed, reason, err := g.authorize(ctx, u, r.URL.Path, verb(r.Method))
		switch {
		case err != nil:
			http.Error(w, "Internal Server Error: authorization: "+err.Error(), http.StatusInternalServerError)
		case !allowed:
			msg := fmt.Sprintf("Forbidden (user=%s, verb=%s, nonResourceURL=%s)", u.GetName(), verb(r.Method), r.URL.Path)
			if reason != "" {
				msg += ": " + reason
			}
			http.Error(w, msg, http.StatusForbidden)
		default:
			h.ServeHTTP(w, r)
		}
	})
}

// verb is the authorization verb of an HTTP method on a non-resource URL,
// as kube-apiserver names it.
func verb(method string) string {
	if method == http.MethodHead {
		return "get"
	}
	return strings.ToLower(method)
}

func bearerToken(r *http.Request) (string, bool) {
	scheme, token, ok := strings.Cut(r.Header.Get("Authorization"), " ")
	token = strings.TrimSpace(token)
	if !ok || !strings.EqualFold(scheme, "Bearer") || token == "" {
		return "", false
	}
	return token, true
}

// authorize asks (or remembers) whether u may use verb on path.
func (g *Guard) authorize(ctx context.Context, u user.Info, path, verb string) (bool, string, error) {
	key := decisionKey(u, path, verb)
	now := time.Now()
	g.mu.Lock()
	d, ok := g.decisions[key]
	g.mu.Unlock()
	if ok && now.Before(d.expires) {
		return d.allowed, d.reason, nil
	}
	sar := &authzv1.SubjectAccessReview{Spec: authzv1.SubjectAccessReviewSpec{
		User: u.GetName(), UID: u.GetUID(), Groups: u.GetGroups(),
		NonResourceAttributes: &authzv1.NonResourceAttributes{Path: path, Verb: verb},
	}}
	if extra := u.GetExtra(); len(extra) > 0 {
		sar.Spec.Extra = map[string]authzv1.ExtraValue{}
		for k, v := range extra {
			sar.Spec.Extra[k] = v
		}
	}
	res, err := g.cfg.Client.AuthorizationV1().SubjectAccessReviews().Create(ctx, sar, metav1.CreateOptions{})
	if err != nil {
		return false, "", fmt.Errorf("subject access review: %w", err)
	}
	d = decision{allowed: res.Status.Allowed && !res.Status.Denied, reason: res.Status.Reason}
	ttl := g.cfg.DenyTTL
	if d.allowed {
		ttl = g.cfg.AllowTTL
	}
	d.expires = now.Add(ttl)
	g.mu.Lock()
	if len(g.decisions) >= maxDecisions {
		for k, old := range g.decisions {
			if !now.Before(old.expires) {
				delete(g.decisions, k)
			}
		}
		if len(g.decisions) >= maxDecisions {
			clear(g.decisions)
		}
	}
	g.decisions[key] = d
	g.mu.Unlock()
	return d.allowed, d.reason, nil
}

func decisionKey(u user.Info, path, verb string) string {
	var b strings.Builder
	for _, s := range []string{u.GetName(), u.GetUID(), path, verb} {
		fmt.Fprintf(&b, "%q|", s)
	}
	groups := slices.Clone(u.GetGroups())
	slices.Sort(groups)
	fmt.Fprintf(&b, "%q|", groups)
	extra := u.GetExtra()
	keys := make([]string, 0, len(extra))
	for k := range extra {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, k := range keys {
		fmt.Fprintf(&b, "%q=%q|", k, extra[k])
	}
	return b.String()
}

// TLSConfig serves certFile and keyFile, read again whenever either
// changes, or, when both are empty, a self-signed certificate for
// hostnames made now.
func TLSConfig(certFile, keyFile string, hostnames ...string) (*tls.Config, error) {
	switch {
	case certFile == "" && keyFile == "":
		cert, err := selfSigned(hostnames)
		if err != nil {
			return nil, err
		}
		return &tls.Config{MinVersion: tls.VersionTLS12, Certificates: []tls.Certificate{cert}}, nil
	case certFile == "" || keyFile == "":
		return nil, errors.New("give both a certificate and a key file, or neither (self-signed)")
	}
	f := &certFiles{cert: certFile, key: keyFile}
	if _, err := f.get(); err != nil {
		return nil, err
	}
	return &tls.Config{MinVersion: tls.VersionTLS12, GetCertificate: func(*tls.ClientHelloInfo) (*tls.Certificate, error) { return f.get() }}, nil
}

// certFiles loads a key pair again when a file's modification time or
// size changes (cert-manager and kubelet-style rotation replace them).
type certFiles struct {
	cert, key string

	mu    sync.Mutex
	stamp string
	pair  *tls.Certificate
}

func (f *certFiles) get() (*tls.Certificate, error) {
	var stamp strings.Builder
	for _, p := range []string{f.cert, f.key} {
		st, err := os.Stat(p)
		if err != nil {
			return nil, fmt.Errorf("serving certificate: %w", err)
		}
		fmt.Fprintf(&stamp, "%d/%d;", st.ModTime().UnixNano(), st.Size())
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.pair != nil && f.stamp == stamp.String() {
		return f.pair, nil
	}
	pair, err := tls.LoadX509KeyPair(f.cert, f.key)
	if err != nil {
		if f.pair != nil {
			// Half-written during a rotation: keep serving the old pair.
			return f.pair, nil
		}
		return nil, fmt.Errorf("serving certificate %s, key %s: %w", f.cert, f.key, err)
	}
	f.pair, f.stamp = &pair, stamp.String()
	return f.pair, nil
}

// selfSigned makes an ECDSA P-256 certificate valid for a year.
func selfSigned(hostnames []string) (tls.Certificate, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return tls.Certificate{}, fmt.Errorf("self-signed certificate: %w", err)
	}
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 62))
	if err != nil {
		return tls.Certificate{}, fmt.Errorf("self-signed certificate: %w", err)
	}
	now := time.Now()
	name := "moat-agent"
	if len(hostnames) > 0 && hostnames[0] != "" {
		name = hostnames[0]
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial,
		Subject:      pkix.Name{CommonName: fmt.Sprintf("%s@%d", name, now.Unix())},
		NotBefore:    now.Add(-time.Hour),
		NotAfter:     now.Add(365 * 24 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		DNSNames:     slices.DeleteFunc(slices.Clone(hostnames), func(h string) bool { return h == "" }),
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return tls.Certificate{}, fmt.Errorf("self-signed certificate: %w", err)
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}, nil
}
