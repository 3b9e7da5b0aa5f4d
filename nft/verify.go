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
// kernel as programmed. It returns an error wrapping ErrTableMissing when
// the table is gone, one wrapping ErrTableEdited when its chains or
// rules differ from the ruleset programmed (ShapeReader: a chain flushed,
// deleted or added, a rule inserted or deleted, the table made dormant),
// and another error when it cannot tell. Sync alone cannot notice: when
// nothing it builds from changed it keeps the last ruleset without asking
// the kernel (Result.Reused), so a table deleted or edited behind its
// back would stay so until a resync. After either loss the replace that
// repairs the table also cuts the established connections its ruleset
// denies, once, whatever Options.CutDenied says: they were accepted while
// the table did not judge them.
//
// It is cheap enough to call every few seconds. One netlink request reads
// the nftables generation; while it is still the one the Syncer's last
// commit left (or the one the last Verify found the table whole at),
// nobody has committed since and the table cannot have changed. Otherwise
// (another writer committed, as kube-proxy does often) it reads the
// table's shape (TableShape: its flags, its chains with the kernel's use
// count of each, the rules of the fixed chains; ~2 ms of CPU at 30,000
// pods) and the drop counters, one more netlink dump: every ruleset has
// the fixed counters, and a counter is only deleted with the rules that
// use it. The use counts catch rules added to or deleted from any chain
// and verdict map elements added, deleted or pointed elsewhere. Not
// noticed: a rule replaced in place, the elements of plain sets (and a
// map element whose verdict names no chain); a checked resync (--resync)
// repairs those.
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
	if err := s.verifyShape(ctx); err != nil {
		return err
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
		s.lost()
		sort.Strings(missing)
		return fmt.Errorf("%w on node %s: %d of the %d drop counters it was programmed with are gone (first %s): deleted or flushed by another program",
			ErrTableMissing, s.opts.Node, len(missing), len(s.applied.counters), missing[0])
	}
	s.verified = g
	return nil
}

// verifyShape compares the table's shape with the ruleset last
// programmed, when the Syncer has a ShapeReader; s.mu held.
func (s *Syncer) verifyShape(ctx context.Context) error {
	r := s.shapeReader()
	if r == nil {
		return nil
	}
	got, err := r.ReadShape(ctx, countedChains())
	if err != nil {
		return fmt.Errorf("verify table inet %s on node %s: %w", Table, s.opts.Node, err)
	}
	if got == nil {
		s.lost()
		return fmt.Errorf("%w on node %s: deleted or flushed by another program", ErrTableMissing, s.opts.Node)
	}
	_, hooks := r.(NetlinkShape)
	if d := shapeDiff(s.applied.expectedShape(), got, hooks); d != "" {
		s.lost()
		return fmt.Errorf("%w on node %s by another program: %s", ErrTableEdited, s.opts.Node, d)
	}
	return nil
}

// lost records that the table is not what the Syncer programmed: the
// next Verify looks again, and the replace that repairs it cuts what its
// ruleset denies (cutOnce); s.mu held.
func (s *Syncer) lost() {
	s.verified = 0
	s.cutOnce = true
}
