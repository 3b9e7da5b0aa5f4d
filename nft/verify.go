package nft

import (
	"context"
	"errors"
	"fmt"
	"sort"
)

// ErrTableMissing is what Verify returns (wrapped) when the kernel no
// longer holds the table the Syncer last programmed: someone deleted it,
// or flushed the whole ruleset (`nft flush ruleset`, as a reload of
// nftables.service or firewalld does). The node then enforces nothing
// until the table is programmed again: Invalidate and Sync.
var ErrTableMissing = errors.New("table inet " + Table + " is missing from nftables")

// Verify checks that the table the last Sync programmed is still in the
// kernel, and returns an error wrapping ErrTableMissing when it is not.
// Sync alone cannot notice: when nothing it builds from changed it keeps
// the last ruleset without asking the kernel (Result.Reused), so a table
// deleted behind its back would stay deleted until a resync.
//
// It is cheap enough to call every few seconds. One netlink request reads
// the nftables generation; while it is still the one the Syncer's last
// commit left (or the one the last Verify found the table whole at),
// nobody has committed since and the table cannot have changed. Otherwise
// (another writer committed, as kube-proxy does often) it reads the drop
// counters, one netlink dump, and the table is missing when any counter
// of the last ruleset is: every ruleset has the six fixed ones, and a
// counter is only deleted with the rules that use it. It does not notice
// edits that keep the counters (`nft flush table` empties the chains but
// keeps them); a checked resync (--resync) repairs those.
//
// With nothing programmed (no Sync yet, or the last one failed and the
// next replaces the table anyway) there is nothing to verify: nil.
func (s *Syncer) Verify(ctx context.Context) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.applied == nil {
		return nil
	}
	g := s.generation(ctx)
	if g != 0 && (g == s.left || g == s.verified) {
		return nil
	}
	got, err := s.counterReader().ReadCounters(ctx)
	if err != nil {
		return fmt.Errorf("verify table inet %s on node %s: %w", Table, s.opts.Node, err)
	}
	var missing []string
	for name := range s.applied.counters {
		if _, ok := got[name]; !ok {
			missing = append(missing, name)
		}
	}
	if len(missing) > 0 {
		s.verified = 0
		sort.Strings(missing)
		return fmt.Errorf("%w on node %s: %d of the %d drop counters it was programmed with are gone (first %s): deleted or flushed by another program",
			ErrTableMissing, s.opts.Node, len(missing), len(s.applied.counters), missing[0])
	}
	s.verified = g
	return nil
}
