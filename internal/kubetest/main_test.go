package kubetest

import (
	"context"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/moat-net/moat/deploy"
)

// The package's tests share one environment (with the ClusterNetworkPolicy
// CRDs) where they do not need their own, to keep the suite to a few server
// start-ups on a 2-core machine.
var shared struct {
	once sync.Once
	env  *Env
	err  error
}

func TestMain(m *testing.M) {
	code := m.Run()
	if shared.env != nil {
		if err := shared.env.Stop(); err != nil {
			code = 1
			os.Stderr.WriteString(err.Error() + "\n")
		}
	}
	os.Exit(code)
}

// sharedEnv returns the package's shared environment, starting it on first
// use. It skips or fails like Start when the binaries are missing.
func sharedEnv(t *testing.T) *Env {
	t.Helper()
	bins := RequireBinaries(t)
	shared.once.Do(func() {
		crds, err := testCRDs()
		if err != nil {
			shared.err = err
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
		defer cancel()
		shared.env, shared.err = Launch(ctx, bins, WithCRDs(crds...))
	})
	if shared.err != nil {
		t.Fatalf("shared environment: %v", shared.err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("kube-apiserver log tail:\n%s", shared.env.LogTail("kube-apiserver", 40))
		}
	})
	return shared.env
}

// testCRDs returns the experimental-channel ClusterNetworkPolicy CRD the
// project ships (package deploy embeds deploy/crds).
func testCRDs() ([][]byte, error) {
	crds, err := deploy.CRDs(deploy.Experimental)
	if err != nil {
		return nil, err
	}
	return [][]byte{crds}, nil
}
