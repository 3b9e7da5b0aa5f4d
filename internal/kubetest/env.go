package kubetest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/moat-net/moat/internal/testenv"
)

// Env is a running etcd + kube-apiserver pair.
type Env struct {
	// Dir holds the certificates, token file, etcd data and server logs.
	Dir string
	// URL is the API server's base URL (https://127.0.0.1:port by default).
	URL string
	// EtcdURL is etcd's client URL.
	EtcdURL string
	// CAData is the PEM certificate that signed the serving certificate.
	CAData []byte
	// Client and Dynamic act as AdminUser.
	Client  kubernetes.Interface
	Dynamic dynamic.Interface

	admin     *rest.Config
	tokens    map[string]string
	etcd      *etcdServer
	apiServer *apiServer
	probe     *http.Client // admin HTTP client for /readyz
	opts      *options
	removeDir bool

	mu       sync.Mutex // serialises StopAPIServer/RestartAPIServer/Stop
	stopOnce sync.Once
	stopErr  error
}

// Start launches an environment for a test and stops it (and removes its
// files) when the test ends. When the binaries are missing it skips the test
// loudly, or fails it when CI=true. Other failures fail the test, with the
// server logs.
func Start(ctx context.Context, t testing.TB, opts ...Option) *Env {
	t.Helper()
	bins := RequireBinaries(t)
	env, err := launch(ctx, bins, t.TempDir(), false, opts)
	if err != nil {
		t.Fatalf("kubetest: %v", err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("kubetest: kube-apiserver log tail:\n%s", env.LogTail("kube-apiserver", 40))
			t.Logf("kubetest: etcd log tail:\n%s", env.LogTail("etcd", 20))
		}
		if err := env.Stop(); err != nil {
			t.Errorf("kubetest: %v", err)
		}
	})
	return env
}

// RequireBinaries finds the binaries or ends the test by the one CI rule
// (internal/testenv): a loud skip naming the build command on a developer
// machine, a failure under CI, so CI never passes by skipping. Other
// errors fail the test.
func RequireBinaries(t testing.TB) Binaries {
	t.Helper()
	bins, err := FindBinaries()
	if err == nil {
		return bins
	}
	if errors.Is(err, ErrBinariesMissing) {
		testenv.Require(t, "a real kube-apiserver and etcd: "+err.Error())
	}
	t.Fatalf("kubetest: %v", err)
	return bins
}

// Launch starts an environment outside a test (for example a benchmark
// command) in a new temporary directory. The caller must call Stop, which
// also removes the directory. Directories left behind by processes that died
// without calling Stop (a test binary killed by its timeout) are removed.
func Launch(ctx context.Context, bins Binaries, opts ...Option) (*Env, error) {
	sweepStaleDirs()
	dir, err := os.MkdirTemp("", launchDirPrefix)
	if err != nil {
		return nil, fmt.Errorf("create environment dir: %w", err)
	}
	if err := os.WriteFile(filepath.Join(dir, ownerFile), []byte(strconv.Itoa(os.Getpid())), 0o600); err != nil {
		_ = os.RemoveAll(dir)
		return nil, fmt.Errorf("create environment dir: %w", err)
	}
	return launch(ctx, bins, dir, true, opts)
}

const (
	launchDirPrefix = "moat-kubetest-"
	ownerFile       = "owner.pid"
)

// sweepStaleDirs removes Launch directories whose owning process is gone.
// Their servers are gone too (they die with the process that started them).
func sweepStaleDirs() {
	dirs, _ := filepath.Glob(filepath.Join(os.TempDir(), launchDirPrefix+"*"))
	for _, d := range dirs {
		data, err := os.ReadFile(filepath.Join(d, ownerFile))
		if err != nil {
			continue // not ours, or still being created
		}
		pid, err := strconv.Atoi(strings.TrimSpace(string(data)))
		if err != nil || pid <= 0 {
			continue
		}
		if err := syscall.Kill(pid, 0); errors.Is(err, syscall.ESRCH) {
			_ = os.RemoveAll(d)
		}
	}
}

func launch(ctx context.Context, bins Binaries, dir string, removeDir bool, opts []Option) (_ *Env, err error) {
	o := defaultOptions()
	for _, opt := range opts {
		opt(o)
	}
	env := &Env{Dir: dir, opts: o, removeDir: removeDir}
	defer func() {
		if err != nil {
			_ = env.Stop()
		}
	}()

	if !o.bindAddress.IsValid() {
		return nil, fmt.Errorf("kube-apiserver bind address is not set")
	}
	p, err := writePKI(filepath.Join(dir, "pki"), o.bindAddress)
	if err != nil {
		return nil, err
	}
	env.CAData = p.caPEM
	tokenFile := filepath.Join(dir, "tokens.csv")
	if env.tokens, err = writeTokenFile(tokenFile, o.users); err != nil {
		return nil, err
	}

	if env.etcd, err = startEtcd(ctx, bins.Etcd, dir); err != nil {
		return nil, err
	}
	env.EtcdURL = env.etcd.clientURL

	for attempt := range startAttempts {
		port, err := freePort(o.bindAddress)
		if err != nil {
			return nil, err
		}
		addr := netip.AddrPortFrom(o.bindAddress, uint16(port))
		env.URL = "https://" + addr.String()
		env.admin = env.configFor(env.tokens[AdminUser])
		if env.probe, err = rest.HTTPClientFor(env.admin); err != nil {
			return nil, fmt.Errorf("admin HTTP client: %w", err)
		}
		env.apiServer = &apiServer{
			bin:  bins.APIServer,
			dir:  dir,
			addr: addr,
			args: apiServerArgs(addr, env.EtcdURL, dir, p, tokenFile, o),
		}
		err = env.apiServer.start(ctx, env.probe, o.readyTimeout)
		if err == nil {
			break
		}
		if attempt == startAttempts-1 || !portTaken(err.Error()) {
			return nil, err
		}
	}

	if env.Client, err = kubernetes.NewForConfig(env.admin); err != nil {
		return nil, fmt.Errorf("admin clientset: %w", err)
	}
	if env.Dynamic, err = dynamic.NewForConfig(env.admin); err != nil {
		return nil, fmt.Errorf("admin dynamic client: %w", err)
	}
	if len(o.crds) > 0 {
		if err := env.InstallCRDs(ctx, o.crds...); err != nil {
			return nil, err
		}
	}
	return env, nil
}

// writeTokenFile writes kube-apiserver's static token file
// (token,user,uid,"group1,group2") with a random token per user.
func writeTokenFile(path string, users []User) (map[string]string, error) {
	tokens := make(map[string]string, len(users))
	var b strings.Builder
	for _, u := range users {
		if u.Name == "" || strings.ContainsAny(u.Name, ",\"\n") {
			return nil, fmt.Errorf("token file: invalid user name %q", u.Name)
		}
		if _, dup := tokens[u.Name]; dup {
			return nil, fmt.Errorf("token file: user %q listed twice", u.Name)
		}
		for _, g := range u.Groups {
			if g == "" || strings.ContainsAny(g, ",\"\n") {
				return nil, fmt.Errorf("token file: user %q: invalid group %q", u.Name, g)
			}
		}
		raw := make([]byte, 24)
		if _, err := rand.Read(raw); err != nil {
			return nil, fmt.Errorf("token file: %w", err)
		}
		tok := hex.EncodeToString(raw)
		tokens[u.Name] = tok
		fmt.Fprintf(&b, "%s,%s,%s", tok, u.Name, u.Name)
		if len(u.Groups) > 0 {
			fmt.Fprintf(&b, ",\"%s\"", strings.Join(u.Groups, ","))
		}
		b.WriteByte('\n')
	}
	if err := os.WriteFile(path, []byte(b.String()), 0o600); err != nil {
		return nil, fmt.Errorf("write token file: %w", err)
	}
	return tokens, nil
}

// configFor builds a client config that verifies the server with CAData and
// authenticates with a bearer token. Client-side rate limits are raised so
// tests that create thousands of objects are limited by the server only.
func (e *Env) configFor(token string) *rest.Config {
	return &rest.Config{
		Host:            e.URL,
		BearerToken:     token,
		TLSClientConfig: rest.TLSClientConfig{CAData: e.CAData},
		QPS:             1000,
		Burst:           2000,
		// No Timeout: it would also cut informers' long-running watches.
	}
}

// Config returns a fresh copy of the admin (system:masters) client config.
func (e *Env) Config() *rest.Config {
	return rest.CopyConfig(e.admin)
}

// UserConfig returns a client config authenticating as a user of the token
// file (AdminUser or UnprivilegedUser).
func (e *Env) UserConfig(name string) (*rest.Config, error) {
	tok, ok := e.tokens[name]
	if !ok {
		return nil, fmt.Errorf("user %q is not in the token file", name)
	}
	return e.configFor(tok), nil
}

// ImpersonatingConfig returns an admin config that impersonates user with
// groups, to check what RBAC grants an identity without a token for it.
func (e *Env) ImpersonatingConfig(user string, groups ...string) *rest.Config {
	c := e.Config()
	c.Impersonate = rest.ImpersonationConfig{UserName: user, Groups: groups}
	return c
}

// LogTail returns the last n lines of "etcd" or "kube-apiserver" output.
func (e *Env) LogTail(name string, n int) string {
	switch {
	case name == "etcd" && e.etcd != nil:
		return e.etcd.proc.logTail(n)
	case name == "kube-apiserver" && e.apiServer != nil && e.apiServer.proc != nil:
		return e.apiServer.proc.logTail(n)
	}
	return fmt.Sprintf("(no %s log)", name)
}

// StopAPIServer kills kube-apiserver, as a crash or a lost node would, and
// leaves etcd running, so a test can check what clients do while the API
// is unreachable. (A graceful stop would take 15 s and more: kube-apiserver
// waits for open watches to end before it exits.)
func (e *Env) StopAPIServer() error {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.apiServer.kill()
}

// RestartAPIServer starts kube-apiserver again on the same address, with the
// same etcd (and so the same objects), and waits until it is ready.
func (e *Env) RestartAPIServer(ctx context.Context) error {
	e.mu.Lock()
	defer e.mu.Unlock()
	if err := e.apiServer.stop(); err != nil {
		return err
	}
	return e.apiServer.start(ctx, e.probe, e.opts.readyTimeout)
}

// Stop ends kube-apiserver, then etcd (kube-apiserver ignores its first
// SIGTERM once etcd is gone), and removes the directory when Launch made it.
// It is safe to call more than once.
func (e *Env) Stop() error {
	e.stopOnce.Do(func() {
		e.mu.Lock()
		defer e.mu.Unlock()
		var errs []error
		if e.apiServer != nil {
			errs = append(errs, e.apiServer.stop())
		}
		if e.etcd != nil {
			errs = append(errs, e.etcd.proc.stop(10*time.Second))
		}
		if e.probe != nil {
			e.probe.CloseIdleConnections()
		}
		if e.removeDir {
			if err := os.RemoveAll(e.Dir); err != nil {
				errs = append(errs, fmt.Errorf("remove %s: %w", e.Dir, err))
			}
		}
		if err := errors.Join(errs...); err != nil {
			e.stopErr = fmt.Errorf("stop environment: %w", err)
		}
	})
	return e.stopErr
}
