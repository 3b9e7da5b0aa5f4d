package nft

import (
	"context"
	"errors"
	"fmt"

	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"
)

// The kernel numbers the states of a network namespace's nftables: each
// committed transaction, by anyone, raises the namespace's generation by
// one (skipping 0, which it never holds: it starts at 1). `nft monitor`
// reports each new one ("# new generation N"). A Syncer that reads the
// generation before and after its own commit knows, when the two differ by
// exactly one, that nobody else committed in between, and, when the one
// before is the one its previous commit left (or it replaced the whole
// table), that the table now holds what it programmed. When the generation
// later still reads the same, nobody has committed since, so a periodic
// resync need not replace the table (Syncer.InvalidateIfChanged).

// GenerationReader reads the nftables generation of the namespace a
// Syncer programs.
type GenerationReader interface {
	ReadGeneration(ctx context.Context) (uint32, error)
}

// NetlinkGeneration reads the generation with one NFT_MSG_GETGEN request
// over a netlink socket. github.com/google/nftables (v0.3.0) decodes the
// generation only in its monitor and has no request for it, so the
// request is built here on the netlink package it uses.
type NetlinkGeneration struct {
	// NetNS is an open file descriptor of the network namespace to read;
	// 0 means the calling thread's namespace at the time of the reading,
	// where a knftables.New Interface runs its nft (as NetlinkCounters).
	NetNS int
}

// dialNFTables opens a netfilter netlink socket in the namespace netns
// (0: the calling thread's), bounded by ctx's deadline if it has one.
func dialNFTables(ctx context.Context, netns int) (*netlink.Conn, error) {
	conn, err := netlink.Dial(unix.NETLINK_NETFILTER, &netlink.Config{NetNS: netns})
	if err != nil {
		return nil, err
	}
	if dl, ok := ctx.Deadline(); ok {
		if err := conn.SetDeadline(dl); err != nil {
			conn.Close()
			return nil, err
		}
	}
	return conn, nil
}

// ReadGeneration implements GenerationReader. The socket lives for one
// reading; a deadline of ctx bounds it.
func (r NetlinkGeneration) ReadGeneration(ctx context.Context) (uint32, error) {
	if err := ctx.Err(); err != nil {
		return 0, err
	}
	conn, err := dialNFTables(ctx, r.NetNS)
	if err != nil {
		return 0, fmt.Errorf("nftables generation: %w", err)
	}
	defer conn.Close()
	// The nfgenmsg header: family AF_UNSPEC, version NFNETLINK_V0,
	// resource id 0. The answer is an NFT_MSG_NEWGEN.
	msgs, err := conn.Execute(netlink.Message{
		Header: netlink.Header{Type: nfTablesMsg(unix.NFT_MSG_GETGEN), Flags: netlink.Request},
		Data:   []byte{unix.AF_UNSPEC, unix.NFNETLINK_V0, 0, 0},
	})
	if err != nil {
		return 0, fmt.Errorf("nftables generation: %w", err)
	}
	for _, m := range msgs {
		if m.Header.Type != nfTablesMsg(unix.NFT_MSG_NEWGEN) || len(m.Data) < 4 {
			continue
		}
		var id uint32
		if err := decodeAttrs(m.Data, func(ad *netlink.AttributeDecoder) {
			if ad.Type() == unix.NFTA_GEN_ID && id == 0 {
				id = ad.Uint32()
			}
		}); err != nil {
			return 0, fmt.Errorf("nftables generation: %w", err)
		}
		if id != 0 {
			return id, nil
		}
	}
	return 0, errors.New("nftables generation: the kernel's answer holds none")
}

// nextGeneration is the generation one commit after g.
func nextGeneration(g uint32) uint32 {
	if g++; g == 0 {
		return 1
	}
	return g
}

// GenerationCheck is what a sync after InvalidateIfChanged found.
type GenerationCheck struct {
	// Left is the generation the Syncer's last commit left; 0 when it
	// is not known (another commit came between the readings around
	// it or, for a patch, since the commit before; a reading failed;
	// the last transaction failed; the Interface has no generation).
	Left uint32
	// Found is the generation read by the check; 0 when there is none
	// to read (Err says why when reading failed).
	Found uint32
	Err   error
}

// Unchanged reports whether nobody committed to nftables since the
// Syncer's last commit: the sync patched the table instead of replacing
// it.
func (c *GenerationCheck) Unchanged() bool { return c.Left != 0 && c.Found == c.Left }

// Reason says why the check replaced the table ("" when it did not).
func (c *GenerationCheck) Reason() string {
	switch {
	case c.Unchanged():
		return ""
	case c.Err != nil:
		return fmt.Sprintf("cannot read the nftables generation: %v", c.Err)
	case c.Found == 0:
		return "the dataplane has no nftables generation to check"
	case c.Left == 0:
		return fmt.Sprintf("the nftables generation the last commit left is unknown (now %d)", c.Found)
	default:
		return fmt.Sprintf("nftables generation moved from %d to %d", c.Left, c.Found)
	}
}
