package kubetest

import (
	"net/netip"
	"time"
)

// Names of the users every environment's token file holds.
const (
	// AdminUser is in system:masters: every request is allowed.
	AdminUser = "kubetest-admin"
	// UnprivilegedUser is authenticated but belongs to no group beyond
	// system:authenticated, so RBAC grants it nothing until a test binds a role.
	UnprivilegedUser = "kubetest-user"
)

// User is an entry of the static token file.
type User struct {
	Name   string
	Groups []string
}

// Option changes how an environment is started.
type Option func(*options)

type options struct {
	crds          [][]byte
	users         []User
	apiServerArgs []string
	readyTimeout  time.Duration
	bindAddress   netip.Addr
}

func defaultOptions() *options {
	return &options{
		users: []User{
			{Name: AdminUser, Groups: []string{"system:masters"}},
			{Name: UnprivilegedUser},
		},
		// Generous: a cold start on a busy 2-core CI machine is much slower
		// than the ~3 s measured on an idle one.
		readyTimeout: 2 * time.Minute,
		bindAddress:  loopback,
	}
}

// loopback is where etcd always listens, and kube-apiserver by default.
var loopback = netip.MustParseAddr("127.0.0.1")

// WithBindAddress makes kube-apiserver listen on (and advertise) ip instead
// of 127.0.0.1, for clients that cannot reach the host's loopback, such as
// agents inside network namespaces connected to the host by a veth pair. The
// serving certificate covers ip. etcd stays on loopback.
func WithBindAddress(ip netip.Addr) Option {
	return func(o *options) { o.bindAddress = ip.Unmap() }
}

// WithCRDs installs CustomResourceDefinitions (each argument a YAML stream of
// one or more documents) once the server is ready, and waits until they are
// Established and served.
func WithCRDs(yamls ...[]byte) Option {
	return func(o *options) { o.crds = append(o.crds, yamls...) }
}

// WithAPIServerArgs appends kube-apiserver flags (later flags win), for
// example --feature-gates or request limits for benchmarks.
func WithAPIServerArgs(args ...string) Option {
	return func(o *options) { o.apiServerArgs = append(o.apiServerArgs, args...) }
}
