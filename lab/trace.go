package lab

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"sync"
	"syscall"

	"golang.org/x/sys/unix"
	"sigs.k8s.io/knftables"

	"github.com/moat-net/moat/internal/netns"
	"github.com/moat-net/moat/nft"
	"github.com/moat-net/moat/policy"
)

// Kernel evidence of drops. A probe that is denied would otherwise wait
// out its whole timeout. Each node namespace gets a small table of the
// lab's own that marks the first packet of every new TCP and UDP flow for
// nftables tracing (meta nftrace); the kernel then reports, over netlink,
// every rule verdict that packet meets, with the packet's headers. A drop
// verdict from the policy table (inet moat) for the exact address, port
// and protocol tuple of a probe, source port included, proves that this
// probe's packet was dropped by a policy rule: the probe stops waiting.
// The lab's table has no verdicts of its own and is not the agent's
// table, so enforcement is exactly what the agent programs.

// traceTable is the lab's table in every node namespace.
const traceTable = "moat-lab"

// flowKey is a flow's tuple as its first packet carries it.
type flowKey struct {
	proto    policy.Protocol
	src, dst netip.AddrPort
}

// dropRecord is a policy drop the kernel reported.
type dropRecord struct {
	node  string
	chain string
}

func (d dropRecord) String() string {
	return fmt.Sprintf("dropped by node %s, chain %s", d.node, d.chain)
}

// tracer listens for trace events in every node namespace of a lab.
type tracer struct {
	mu sync.Mutex
	// waiters are the probes waiting, by flow; a probe registers before
	// its first packet leaves, so no drop of it can come earlier.
	waiters map[flowKey]chan dropRecord
	files   []*os.File
	wg      sync.WaitGroup
	// lost counts overflows of a socket's receive buffer: events lost,
	// probes that waited for their timeout instead.
	lost int
}

// startTracer installs the lab's trace table in every node and starts
// listening. Without it probes fall back to timeouts.
func startTracer(ctx context.Context, t *topology, ns *namespaces) (_ *tracer, err error) {
	tr := &tracer{waiters: map[flowKey]chan dropRecord{}}
	defer func() {
		if err != nil {
			tr.close()
		}
	}()
	for _, n := range t.Nodes {
		h, err := ns.Get(n.NS)
		if err != nil {
			return nil, err
		}
		if err := installTrace(ctx, h); err != nil {
			return nil, fmt.Errorf("node %s: %w", n.Name, err)
		}
		f, err := traceSocket(h)
		if err != nil {
			return nil, fmt.Errorf("node %s: %w", n.Name, err)
		}
		tr.files = append(tr.files, f)
		tr.wg.Add(1)
		go tr.read(f, n.Name)
	}
	return tr, nil
}

// installTrace (re)writes the lab's trace table in a node namespace.
func installTrace(ctx context.Context, h *netns.NS) error {
	nf, err := h.Tables(knftables.InetFamily, traceTable)
	if err != nil {
		return err
	}
	tx := nf.NewTransaction()
	tx.Add(&knftables.Table{Comment: knftables.PtrTo("moat lab: marks new flows for tracing, so probes see drops at once")})
	tx.Flush(&knftables.Table{})
	for _, c := range []struct {
		name string
		hook knftables.BaseChainHook
	}{{"prerouting", knftables.PreroutingHook}, {"output", knftables.OutputHook}} {
		tx.Add(&knftables.Chain{Name: c.name, Type: knftables.PtrTo(knftables.FilterType), Hook: knftables.PtrTo(c.hook), Priority: knftables.PtrTo(knftables.ManglePriority)})
		tx.Add(&knftables.Rule{Chain: c.name, Rule: "ct state new meta l4proto { tcp, udp } meta nftrace set 1"})
	}
	return nf.Run(ctx, tx)
}

// traceSocket opens a netlink socket inside the namespace that receives
// nftables trace events.
func traceSocket(h *netns.NS) (*os.File, error) {
	var fd int
	err := h.Do(func() error {
		var err error
		fd, err = unix.Socket(unix.AF_NETLINK, unix.SOCK_RAW|unix.SOCK_CLOEXEC|unix.SOCK_NONBLOCK, unix.NETLINK_NETFILTER)
		if err != nil {
			return fmt.Errorf("netlink socket: %w", err)
		}
		// Bursts of probes make bursts of events: a large buffer keeps
		// them; a lost event only costs that probe its timeout.
		_ = unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_RCVBUFFORCE, 32<<20)
		if err := unix.Bind(fd, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
			unix.Close(fd)
			return fmt.Errorf("bind netlink socket: %w", err)
		}
		if err := unix.SetsockoptInt(fd, unix.SOL_NETLINK, unix.NETLINK_ADD_MEMBERSHIP, unix.NFNLGRP_NFTRACE); err != nil {
			unix.Close(fd)
			return fmt.Errorf("join the nftables trace group: %w", err)
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return os.NewFile(uintptr(fd), "nftrace"), nil
}

// read parses trace events until the socket closes.
func (tr *tracer) read(f *os.File, node string) {
	defer tr.wg.Done()
	buf := make([]byte, 1<<20)
	// The headers come with a packet's first event in each base chain;
	// its verdicts follow under the same trace id.
	ids := map[uint32]flowKey{}
	for {
		n, err := f.Read(buf)
		if errors.Is(err, syscall.ENOBUFS) {
			tr.mu.Lock()
			tr.lost++
			tr.mu.Unlock()
			continue
		}
		if err != nil {
			return
		}
		msgs, err := syscall.ParseNetlinkMessage(buf[:n])
		if err != nil {
			continue
		}
		for _, m := range msgs {
			if m.Header.Type != unix.NFNL_SUBSYS_NFTABLES<<8|unix.NFT_MSG_TRACE || len(m.Data) < 4 {
				continue
			}
			ev := parseTrace(m.Data[4:])
			if ev.hasKey {
				if len(ids) > 1<<16 {
					clear(ids)
				}
				ids[ev.id] = ev.key
			}
			if !ev.drop || ev.table != nft.Table {
				continue
			}
			if k, ok := ids[ev.id]; ok {
				tr.deliver(k, dropRecord{node: node, chain: ev.chain})
			}
		}
	}
}

func (tr *tracer) deliver(k flowKey, d dropRecord) {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	if ch, ok := tr.waiters[k]; ok {
		select {
		case ch <- d:
		default:
		}
	}
}

// watch returns a channel that receives a drop of flow k, and a function
// to stop watching.
func (tr *tracer) watch(k flowKey) (<-chan dropRecord, func()) {
	ch := make(chan dropRecord, 1)
	tr.mu.Lock()
	defer tr.mu.Unlock()
	tr.waiters[k] = ch
	return ch, func() {
		tr.mu.Lock()
		if tr.waiters[k] == ch {
			delete(tr.waiters, k)
		}
		tr.mu.Unlock()
	}
}

// overflows reports how often events were lost.
func (tr *tracer) overflows() int {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	return tr.lost
}

// close stops listening; the trace table stays until the namespaces go.
func (tr *tracer) close() {
	for _, f := range tr.files {
		f.Close()
	}
	tr.wg.Wait()
}

// traceEvent is what the lab needs of one NFT_MSG_TRACE message.
type traceEvent struct {
	id     uint32
	table  string
	chain  string
	drop   bool
	hasKey bool
	key    flowKey
}

// parseTrace reads the attributes of a trace message (after the nfgenmsg
// header): linux/netfilter/nf_tables.h, enum nft_trace_attributes.
func parseTrace(b []byte) traceEvent {
	var ev traceEvent
	var typ, policyVerdict uint32
	verdict := int32(-1) // NFT_CONTINUE
	var nh, th []byte
	hasPolicy := false
	for len(b) >= 4 {
		l := int(binary.NativeEndian.Uint16(b))
		t := binary.NativeEndian.Uint16(b[2:]) & 0x3fff // without NLA_F_NESTED, NLA_F_NET_BYTEORDER
		if l < 4 || l > len(b) {
			break
		}
		v := b[4:l]
		switch t {
		case unix.NFTA_TRACE_TABLE:
			ev.table = cString(v)
		case unix.NFTA_TRACE_CHAIN:
			ev.chain = cString(v)
		case unix.NFTA_TRACE_ID:
			if len(v) >= 4 {
				ev.id = binary.BigEndian.Uint32(v)
			}
		case unix.NFTA_TRACE_TYPE:
			if len(v) >= 4 {
				typ = binary.BigEndian.Uint32(v)
			}
		case unix.NFTA_TRACE_VERDICT:
			if code, ok := verdictCode(v); ok {
				verdict = code
			}
		case unix.NFTA_TRACE_POLICY:
			if len(v) >= 4 {
				policyVerdict, hasPolicy = binary.BigEndian.Uint32(v), true
			}
		case unix.NFTA_TRACE_NETWORK_HEADER:
			nh = v
		case unix.NFTA_TRACE_TRANSPORT_HEADER:
			th = v
		}
		b = b[min((l+3)&^3, len(b)):]
	}
	switch typ {
	case unix.NFT_TRACETYPE_RULE:
		ev.drop = verdict == 0 // NF_DROP
	case unix.NFT_TRACETYPE_POLICY:
		ev.drop = hasPolicy && policyVerdict == 0
	}
	ev.key, ev.hasKey = packetKey(nh, th)
	return ev
}

// verdictCode reads NFTA_VERDICT_CODE from a nested verdict attribute.
func verdictCode(b []byte) (int32, bool) {
	for len(b) >= 4 {
		l := int(binary.NativeEndian.Uint16(b))
		t := binary.NativeEndian.Uint16(b[2:]) & 0x3fff
		if l < 4 || l > len(b) {
			return 0, false
		}
		if t == unix.NFTA_VERDICT_CODE && l >= 8 {
			return int32(binary.BigEndian.Uint32(b[4:8])), true
		}
		b = b[min((l+3)&^3, len(b)):]
	}
	return 0, false
}

// packetKey reads the tuple of a TCP or UDP packet from its network and
// transport headers.
func packetKey(nh, th []byte) (flowKey, bool) {
	if len(nh) < 1 || len(th) < 4 {
		return flowKey{}, false
	}
	var k flowKey
	var proto byte
	var src, dst netip.Addr
	switch nh[0] >> 4 {
	case 4:
		if len(nh) < 20 {
			return k, false
		}
		proto = nh[9]
		src, dst = netip.AddrFrom4([4]byte(nh[12:16])), netip.AddrFrom4([4]byte(nh[16:20]))
	case 6:
		if len(nh) < 40 {
			return k, false
		}
		proto = nh[6]
		src, dst = netip.AddrFrom16([16]byte(nh[8:24])), netip.AddrFrom16([16]byte(nh[24:40]))
	default:
		return k, false
	}
	switch proto {
	case unix.IPPROTO_TCP:
		k.proto = policy.ProtoTCP
	case unix.IPPROTO_UDP:
		k.proto = policy.ProtoUDP
	default:
		return k, false
	}
	k.src = netip.AddrPortFrom(src, binary.BigEndian.Uint16(th[0:2]))
	k.dst = netip.AddrPortFrom(dst, binary.BigEndian.Uint16(th[2:4]))
	return k, true
}

func cString(b []byte) string {
	for i, c := range b {
		if c == 0 {
			return string(b[:i])
		}
	}
	return string(b)
}
