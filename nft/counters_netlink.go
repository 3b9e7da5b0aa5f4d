package nft

import (
	"context"
	"fmt"

	gnft "github.com/google/nftables"
	"github.com/google/nftables/expr"
	"github.com/mdlayher/netlink"
)

// NetlinkCounters reads the counter objects of table inet moat straight
// from the kernel: one NFT_MSG_GETOBJ dump of the table's stateful
// objects over a netlink socket, no nft process. `nft list counters`
// loads the whole table (every chain, rule, set and element) into its
// cache before it lists a counter, which costs ~0.5 s of CPU on a node
// with 7,000 rules and 63,000 set elements; the dump costs what the
// counters are (BENCHMARKS.md, "Reading the drop counters").
//
// The request is built and parsed by github.com/google/nftables, which
// knftables already builds on (its UseNetlink listing), so it adds no
// module to the build: the maintained encoding of the nf_tables
// attributes rather than a hand-written one. The kernel filters the dump
// by family and table; Moat's table holds no other kind of object than
// counters, and any other kind is skipped here.
type NetlinkCounters struct {
	// NetNS is an open file descriptor of the network namespace whose
	// table to read; 0 means the calling thread's namespace at the time
	// of the reading, where a knftables.New Interface runs its nft.
	NetNS int
}

// ReadCounters implements CounterReader. The socket lives for one
// reading; a deadline of ctx bounds it.
func (r NetlinkCounters) ReadCounters(ctx context.Context) (map[string]CounterValue, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	var opts []gnft.ConnOption
	if r.NetNS != 0 {
		opts = append(opts, gnft.WithNetNSFd(r.NetNS))
	}
	if dl, ok := ctx.Deadline(); ok {
		opts = append(opts, gnft.WithSockOptions(func(c *netlink.Conn) error { return c.SetDeadline(dl) }))
	}
	conn, err := gnft.New(opts...)
	if err != nil {
		return nil, fmt.Errorf("netlink counters of table inet %s: %w", Table, err)
	}
	objs, err := conn.GetNamedObjects(&gnft.Table{Name: Table, Family: gnft.TableFamilyINet})
	if err != nil {
		return nil, fmt.Errorf("netlink counters of table inet %s: %w", Table, err)
	}
	out := make(map[string]CounterValue, len(objs))
	for _, o := range objs {
		n, ok := o.(*gnft.NamedObj)
		if !ok || n.Type != gnft.ObjTypeCounter {
			continue
		}
		if c, ok := n.Obj.(*expr.Counter); ok {
			out[n.Name] = CounterValue{Packets: c.Packets, Bytes: c.Bytes}
		}
	}
	return out, nil
}
