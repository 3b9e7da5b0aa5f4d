package nft

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"sort"
	"strings"

	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"
	"sigs.k8s.io/knftables"
)

// ErrTableEdited is what Verify returns (wrapped) when the table is in
// nftables but not as the Syncer last programmed it: a chain flushed,
// deleted or added, a rule inserted or deleted, the table made dormant.
// Such edits keep the drop counters (they are table objects), so the
// check of ErrTableMissing cannot see them, and a node whose forward
// chain is flushed or holds an inserted accept enforces nothing. As for
// a missing table: Invalidate and Sync.
var ErrTableEdited = errors.New("table inet " + Table + " was edited")

// TableShape is what of table inet moat Verify compares with the ruleset
// last programmed: whether the table is dormant (no hook of it sees a
// packet), its chains with their hooks and the kernel's use count of
// each, and the number of rules of the fixed chains (staticChains: the
// base chains forward, input and output and those they lead every packet
// through). That catches what operators do by hand: a fixed chain flushed
// or deleted, a rule inserted or deleted there, `nft flush table` (every
// chain empty), a chain added; and, through the use counts, which come
// with the chain dump, a rule added to or deleted from a policy chain (a
// policy chain flushed) and a verdict map element added, deleted or
// pointed at another chain (a pod taken out of the egress or ingress map
// is unpoliced). The policy chains' rules are not read: reading every
// rule of the table costs ~70 ms of CPU at 30,000 pods (7,200 rules, 4
// MB of netlink messages; BENCHMARKS.md, "Verifying the table"), the
// fixed chains' ~1 ms. Not seen: a rule replaced in place (`nft replace
// rule ... handle N`: same counts), the elements of plain sets (peer
// addresses, pods4: up to 63,000 elements at 30,000 pods, which the
// kernel does not count for a dump to report) and a verdict map element
// whose verdict names no chain (accept, drop). The checked resync
// (--resync) repairs those.
type TableShape struct {
	// Dormant: NFT_TABLE_F_DORMANT is set.
	Dormant bool
	// Chains by name.
	Chains map[string]ChainShape
}

// ChainShape is one chain of a TableShape.
type ChainShape struct {
	// Hook is the netfilter hook of a base chain ("forward", "input",
	// ...; knftables' names), "" for a regular chain. A hook number that
	// has no name here reads "hook <n>".
	Hook string
	// Rules is how many rules the chain holds, -1 when not counted.
	Rules int
	// Use is the kernel's use count of the chain (NFTA_CHAIN_USE): the
	// rules it holds plus the rules and verdict map elements that jump
	// or go to it; -1 when not known. Every chain's comes with the chain
	// dump at no extra cost, so Verify sees a rule added to or deleted
	// from any chain (policy chains included) and a verdict map element
	// added, deleted or pointed at another chain (the egress and ingress
	// maps say which pods are policed at all).
	Use int
}

// ShapeReader reads the shape of table inet moat, counting the rules of
// the chains named in count (those of them that exist); a nil shape and
// no error mean that there is no such table.
type ShapeReader interface {
	ReadShape(ctx context.Context, count []string) (*TableShape, error)
}

// NetlinkShape reads the shape over one netlink socket: the table
// (NFT_MSG_GETTABLE), the chains of family inet (a dump; the kernel does
// not filter chain dumps by table, so other tables' are skipped here) and
// the rules of each chain to count (a dump the kernel filters by table
// and chain). Of each rule nothing is decoded: it is counted.
type NetlinkShape struct {
	// NetNS is an open file descriptor of the network namespace to read;
	// 0 means the calling thread's namespace at the time of the reading
	// (as NetlinkCounters).
	NetNS int
}

// nfTablesMsg is a message type of subsystem nf_tables.
func nfTablesMsg(m int) netlink.HeaderType {
	return netlink.HeaderType(unix.NFNL_SUBSYS_NFTABLES<<8 | m)
}

// hookNames are the netfilter hooks of family inet by number, with
// knftables' names.
var hookNames = map[uint32]knftables.BaseChainHook{
	unix.NF_INET_PRE_ROUTING:  knftables.PreroutingHook,
	unix.NF_INET_LOCAL_IN:     knftables.InputHook,
	unix.NF_INET_FORWARD:      knftables.ForwardHook,
	unix.NF_INET_LOCAL_OUT:    knftables.OutputHook,
	unix.NF_INET_POST_ROUTING: knftables.PostroutingHook,
}

// ReadShape implements ShapeReader. The socket lives for one reading; a
// deadline of ctx bounds it.
func (r NetlinkShape) ReadShape(ctx context.Context, count []string) (*TableShape, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	conn, err := dialNFTables(ctx, r.NetNS)
	if err != nil {
		return nil, fmt.Errorf("read table inet %s: %w", Table, err)
	}
	defer conn.Close()
	name := []byte(Table + "\x00")
	// request sends one message: the nfgenmsg header (family inet,
	// NFNETLINK_V0, resource id 0), the table's name in attribute attr
	// and, unless "", a chain's in NFTA_RULE_CHAIN.
	request := func(msg int, flags netlink.HeaderFlags, attr uint16, chain string) ([]netlink.Message, error) {
		list := []netlink.Attribute{{Type: attr, Data: name}}
		if chain != "" {
			list = append(list, netlink.Attribute{Type: unix.NFTA_RULE_CHAIN, Data: []byte(chain + "\x00")})
		}
		attrs, err := netlink.MarshalAttributes(list)
		if err != nil {
			return nil, err
		}
		return conn.Execute(netlink.Message{
			Header: netlink.Header{Type: nfTablesMsg(msg), Flags: netlink.Request | flags},
			Data:   append([]byte{unix.NFPROTO_INET, unix.NFNETLINK_V0, 0, 0}, attrs...),
		})
	}
	msgs, err := request(unix.NFT_MSG_GETTABLE, 0, unix.NFTA_TABLE_NAME, "")
	if errors.Is(err, unix.ENOENT) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read table inet %s: %w", Table, err)
	}
	sh := &TableShape{Chains: map[string]ChainShape{}}
	for _, m := range msgs {
		if m.Header.Type != nfTablesMsg(unix.NFT_MSG_NEWTABLE) {
			continue
		}
		err := decodeAttrs(m.Data, func(ad *netlink.AttributeDecoder) {
			if ad.Type() == unix.NFTA_TABLE_FLAGS {
				sh.Dormant = ad.Uint32()&unix.NFT_TABLE_F_DORMANT != 0
			}
		})
		if err != nil {
			return nil, fmt.Errorf("read table inet %s: %w", Table, err)
		}
	}
	msgs, err = request(unix.NFT_MSG_GETCHAIN, netlink.Dump, unix.NFTA_CHAIN_TABLE, "")
	if err != nil {
		return nil, fmt.Errorf("read the chains of table inet %s: %w", Table, err)
	}
	for _, m := range msgs {
		if m.Header.Type != nfTablesMsg(unix.NFT_MSG_NEWCHAIN) {
			continue
		}
		var table, chain string
		c := ChainShape{Rules: -1, Use: -1}
		err := decodeAttrs(m.Data, func(ad *netlink.AttributeDecoder) {
			switch ad.Type() {
			case unix.NFTA_CHAIN_TABLE:
				table = ad.String()
			case unix.NFTA_CHAIN_NAME:
				chain = ad.String()
			case unix.NFTA_CHAIN_USE:
				c.Use = int(ad.Uint32())
			case unix.NFTA_CHAIN_HOOK:
				ad.Nested(func(nad *netlink.AttributeDecoder) error {
					for nad.Next() {
						if nad.Type() == unix.NFTA_HOOK_HOOKNUM {
							n := nad.Uint32()
							c.Hook = string(hookNames[n])
							if c.Hook == "" {
								c.Hook = fmt.Sprintf("hook %d", n)
							}
						}
					}
					return nil
				})
			}
		})
		if err != nil {
			return nil, fmt.Errorf("read the chains of table inet %s: %w", Table, err)
		}
		if table == Table {
			sh.Chains[chain] = c
		}
	}
	for _, chain := range count {
		c, ok := sh.Chains[chain]
		if !ok {
			continue
		}
		msgs, err = request(unix.NFT_MSG_GETRULE, netlink.Dump, unix.NFTA_RULE_TABLE, chain)
		if errors.Is(err, unix.ENOENT) {
			// Deleted since the chains were listed.
			delete(sh.Chains, chain)
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("read the rules of chain %s of table inet %s: %w", chain, Table, err)
		}
		c.Rules = 0
		for _, m := range msgs {
			if m.Header.Type == nfTablesMsg(unix.NFT_MSG_NEWRULE) {
				c.Rules++
			}
		}
		sh.Chains[chain] = c
	}
	return sh, nil
}

// decodeAttrs calls f for each attribute of an nf_tables message (after
// its nfgenmsg header), big-endian as nf_tables encodes them.
func decodeAttrs(data []byte, f func(*netlink.AttributeDecoder)) error {
	if len(data) < 4 {
		return errors.New("short nf_tables message")
	}
	ad, err := netlink.NewAttributeDecoder(data[4:])
	if err != nil {
		return err
	}
	ad.ByteOrder = binary.BigEndian
	for ad.Next() {
		f(ad)
	}
	return ad.Err()
}

// expectedShape is the shape rs programs: the fixed chains with their
// hooks and rules, each policy chain (rules not counted: -1), and the use
// count the kernel keeps of every chain (ChainShape.Use).
func (rs *Ruleset) expectedShape() *TableShape {
	sh := &TableShape{Chains: make(map[string]ChainShape, len(staticChains)+len(rs.chains))}
	refs := rs.chainRefs()
	for _, c := range staticChains {
		sh.Chains[c.name] = ChainShape{Hook: string(c.hook), Rules: len(c.rules), Use: len(c.rules) + refs[c.name]}
	}
	for name, c := range rs.chains {
		sh.Chains[name] = ChainShape{Rules: -1, Use: renderedRules(c) + refs[name]}
	}
	return sh
}

// chainRefs counts, by chain, the jumps and gotos to it that rs
// programs: in the fixed chains' rules, in the policy chains' rules (each
// rendered rule of a chainRule carries its verdict) and in the verdict
// maps' elements. The kernel counts each of them in the target chain's
// use, beside the chain's own rules.
func (rs *Ruleset) chainRefs() map[string]int {
	refs := map[string]int{}
	for _, c := range staticChains {
		for _, r := range c.rules {
			f := strings.Fields(r)
			for i := 0; i+1 < len(f); i++ {
				if f[i] == "jump" || f[i] == "goto" {
					refs[f[i+1]]++
				}
			}
		}
	}
	for _, c := range rs.chains {
		for _, r := range c.Rules {
			if r.Verdict.Kind == verdictGoto {
				refs[r.Verdict.Target] += renderedRules(&policyChain{Rules: []chainRule{r}})
			}
		}
	}
	for _, m := range []map[netip.Addr]string{rs.egress, rs.ingress, rs.egressNext, rs.ingressNext} {
		for _, chain := range m {
			if chain != "" {
				refs[chain]++
			}
		}
	}
	return refs
}

// countedChains are the chains whose rules Verify counts: the fixed ones.
func countedChains() []string {
	out := make([]string, len(staticChains))
	for i, c := range staticChains {
		out[i] = c.name
	}
	return out
}

// shapeDiff describes how got differs from want, "" when it does not.
// With hooks false (a reader other than NetlinkShape, which may not
// see them) hooks are not compared. At most a few
// differences are named, with the number of the others.
func shapeDiff(want, got *TableShape, hooks bool) string {
	var diffs []string
	if got.Dormant {
		diffs = append(diffs, "the table is dormant (flags dormant: no hook of it sees a packet)")
	}
	for _, name := range sortedKeys(want.Chains) {
		w := want.Chains[name]
		g, ok := got.Chains[name]
		switch {
		case !ok:
			diffs = append(diffs, "chain "+name+" is gone")
		case hooks && g.Hook != w.Hook:
			diffs = append(diffs, fmt.Sprintf("chain %s has hook %q, programmed with %q", name, g.Hook, w.Hook))
		case w.Rules >= 0 && g.Rules >= 0 && g.Rules != w.Rules:
			diffs = append(diffs, fmt.Sprintf("chain %s has %d rules, programmed with %d", name, g.Rules, w.Rules))
		case w.Use >= 0 && g.Use >= 0 && g.Use != w.Use:
			diffs = append(diffs, fmt.Sprintf("chain %s is used %d times (its rules, and rules and map elements jumping to it), programmed with %d: a rule or verdict map element was added, deleted or changed", name, g.Use, w.Use))
		}
	}
	var extra []string
	for name := range got.Chains {
		if _, ok := want.Chains[name]; !ok {
			extra = append(extra, name)
		}
	}
	sort.Strings(extra)
	for _, name := range extra {
		diffs = append(diffs, "chain "+name+" was added")
	}
	const named = 3
	if len(diffs) > named {
		diffs = append(diffs[:named], fmt.Sprintf("%d more differences", len(diffs)-named))
	}
	return strings.Join(diffs, "; ")
}
