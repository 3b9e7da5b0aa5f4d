package e2e

import (
	"context"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/moat-net/moat/tunnel/agent"
	"github.com/moat-net/moat/tunnel/server"
)

// stuckReview is a TokenReview that never answers: it returns only when the
// agent's stream goes away.
type stuckReview struct{ calls *atomic.Int64 }

func (s stuckReview) Authenticate(ctx context.Context, _ string) (string, error) {
	s.calls.Add(1)
	<-ctx.Done()
	return "", ctx.Err()
}

// A server whose response header does not come within the agent's connect
// timeout (a review slower than it) makes the agent cancel that stream and
// try again, never wait on it unbounded (the agent's connect
// loop stayed in st.Recv with no tunnel while the server routed dials to
// the stream).
func TestLateHeaderCancelsStream(t *testing.T) {
	p := newPKI(t)
	var calls atomic.Int64
	ps := startServer(t, p, serverOpts{cfg: server.Config{Auth: stuckReview{&calls}}})
	tok := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(tok, []byte("t"), 0o600); err != nil {
		t.Fatal(err)
	}
	startAgent(t, p, ps.agentAddr, func(c *agent.Config) {
		c.TokenPath = tok
		c.ConnectTimeout = 100 * time.Millisecond
		c.MaxBackoff = 100 * time.Millisecond
	})
	eventually(t, "the agent to give up on a silent handshake and retry", func() bool { return calls.Load() >= 3 })
}
