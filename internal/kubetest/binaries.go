package kubetest

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
)

// Environment variables that point the harness at specific binaries, for
// developers who built them elsewhere.
const (
	EnvAPIServer = "MOAT_KUBE_APISERVER"
	EnvEtcd      = "MOAT_ETCD"
	// EnvCache overrides the cache directory hack/kube/build.sh writes to.
	EnvCache = "MOAT_KUBE_CACHE"
)

const moduleLine = "module github.com/moat-net/moat"

// ErrBinariesMissing is wrapped by FindBinaries when a binary is not built,
// so callers can tell "not built yet" from other failures.
var ErrBinariesMissing = errors.New("kube-apiserver/etcd binaries not built: run hack/kube/build.sh (about 9 minutes cold, seconds when cached)")

// Binaries are the paths of the executables the harness runs.
type Binaries struct {
	APIServer string
	Etcd      string
}

// RepoRoot walks up from the working directory to the directory holding the
// project's go.mod. Tests run in their package directory, so this finds the
// clone they belong to (deploy/, bin/, hack/).
func RepoRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", fmt.Errorf("find repository root: %w", err)
	}
	for {
		if isProjectRoot(dir) {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", fmt.Errorf("find repository root: no go.mod with %q above the working directory", moduleLine)
		}
		dir = parent
	}
}

func isProjectRoot(dir string) bool {
	f, err := os.Open(filepath.Join(dir, "go.mod"))
	if err != nil {
		return false
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if strings.TrimSpace(sc.Text()) == moduleLine {
			return true
		}
	}
	return false
}

// Versions reads the kube-apiserver and etcd versions pinned in the nested
// tools modules under hack/kube, which are the single place they are set.
func Versions(root string) (kube, etcd string, err error) {
	kube, err = requiredVersion(filepath.Join(root, "hack/kube/apiserver/go.mod"), "k8s.io/kubernetes")
	if err != nil {
		return "", "", err
	}
	etcd, err = requiredVersion(filepath.Join(root, "hack/kube/etcd/go.mod"), "go.etcd.io/etcd/server/v3")
	if err != nil {
		return "", "", err
	}
	return kube, etcd, nil
}

// requiredVersion returns the version module is required at in a go.mod file.
func requiredVersion(gomod, module string) (string, error) {
	data, err := os.ReadFile(gomod)
	if err != nil {
		return "", fmt.Errorf("read pinned version of %s: %w", module, err)
	}
	for line := range strings.SplitSeq(string(data), "\n") {
		f := strings.Fields(line)
		if len(f) >= 2 && f[0] == "require" {
			f = f[1:]
		}
		if len(f) >= 2 && f[0] == module && strings.HasPrefix(f[1], "v") {
			return f[1], nil
		}
	}
	return "", fmt.Errorf("read pinned version of %s: not required in %s", module, gomod)
}

// CacheDir is where hack/kube/build.sh keeps built binaries, outside any
// clone so fresh clones on the same machine reuse them.
func CacheDir() (string, error) {
	if d := os.Getenv(EnvCache); d != "" {
		return d, nil
	}
	base := os.Getenv("XDG_CACHE_HOME")
	if base == "" {
		home, err := os.UserHomeDir()
		if err != nil {
			return "", fmt.Errorf("locate binary cache: %w", err)
		}
		base = filepath.Join(home, ".cache")
	}
	return filepath.Join(base, "moat", "kube"), nil
}

// FindBinaries locates kube-apiserver and etcd: the environment overrides
// first, then bin/ in the repository, then the version-keyed cache. The
// error wraps ErrBinariesMissing when a binary is not found and names every
// place that was tried.
func FindBinaries() (Binaries, error) {
	root, err := RepoRoot()
	if err != nil {
		root = "" // only the environment overrides can help
	}
	cache, err := CacheDir()
	if err != nil {
		cache = ""
	}
	return findBinaries(root, cache)
}

// findBinaries is FindBinaries for a given repository root and cache
// directory (either may be empty when unknown).
func findBinaries(root, cache string) (Binaries, error) {
	var b Binaries
	var kubeV, etcdV string
	if root != "" {
		var err error
		if kubeV, etcdV, err = Versions(root); err != nil {
			return b, err
		}
	}
	find := func(name, envVar, version string) (string, error) {
		if p := os.Getenv(envVar); p != "" {
			if err := checkExecutable(p); err != nil {
				return "", fmt.Errorf("%s=%s: %w", envVar, p, err)
			}
			return p, nil
		}
		tried := []string{"$" + envVar}
		var candidates []string
		if root != "" {
			candidates = append(candidates, filepath.Join(root, "bin", name))
		}
		if root != "" && cache != "" {
			candidates = append(candidates, filepath.Join(cache, name+"-"+version, name))
		}
		for _, p := range candidates {
			if checkExecutable(p) == nil {
				return p, nil
			}
			tried = append(tried, p)
		}
		return "", fmt.Errorf("%s not found (tried %s): %w", name, strings.Join(tried, ", "), ErrBinariesMissing)
	}
	var err error
	if b.APIServer, err = find("kube-apiserver", EnvAPIServer, kubeV); err != nil {
		return b, err
	}
	if b.Etcd, err = find("etcd", EnvEtcd, etcdV); err != nil {
		return b, err
	}
	return b, nil
}

func checkExecutable(p string) error {
	st, err := os.Stat(p)
	if err != nil {
		return err
	}
	if st.IsDir() || st.Mode()&0o111 == 0 {
		return fmt.Errorf("%s is not an executable file", p)
	}
	return nil
}
