//go:build moatbench

package app

import (
	"context"
	"os"
	"os/signal"
	"syscall"

	"k8s.io/klog/v2"

	"github.com/moat-net/moat/agent"
)

// checkedResyncOnUser1 lets agent/e2e's BenchmarkAgentScale time a
// checked resync, the one each --resync period asks for, at the moment it
// chooses instead of a period's: SIGUSR1 asks for one. Only binaries built
// with -tags moatbench have it (agent/e2e builds its agent so); the
// shipped agent keeps SIGUSR1's default action.
func checkedResyncOnUser1(ctx context.Context, a *agent.Agent, log klog.Logger) {
	usr1 := make(chan os.Signal, 1)
	signal.Notify(usr1, syscall.SIGUSR1)
	defer signal.Stop(usr1)
	for {
		select {
		case <-ctx.Done():
			return
		case <-usr1:
			log.Info("SIGUSR1 (moatbench build): checked resync")
			a.CheckedResync()
		}
	}
}
