package lab

import (
	"context"
	"encoding/binary"
	"net/netip"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/moat-net/moat/policy"
)

// TestDropRecordsEndDeniedProbes: with drop records a denied probe ends
// as "dropped" with the node and chain that dropped it, however long its
// timeout (here 30 s: a probe that waited for it would show "timed out").
// TCP and UDP, IPv4 and IPv6; an allowed flow still needs its reply.
func TestDropRecordsEndDeniedProbes(t *testing.T) {
	prog := behaviour(t, isolateServer+"---\n"+denyClientV6, policy.Options{IngressNetworksAndNodes: true})
	l := upLab(t, prog, Options{})
	ctx := context.Background()
	tr, err := startTracer(ctx, l.st.Topology, l.ns)
	if err != nil {
		t.Fatal(err)
	}
	defer tr.close()
	pr := &prober{ns: l.ns, tr: tr}
	at := func(src, dst string, proto policy.Protocol, port uint16) probeSpec {
		s := netip.MustParseAddr(src)
		place, _ := l.st.Topology.Locate(s)
		return probeSpec{SrcNS: place.NS, Src: s, Dst: netip.MustParseAddr(dst), Proto: proto, Port: port}
	}
	for _, tc := range []struct {
		probe probeSpec
		want  outcome
	}{
		{at(clientIP4, serverIP4, policy.ProtoTCP, 80), dropped},
		{at(clientIP4, serverIP4, policy.ProtoUDP, 53), dropped},
		{at(clientIP6, serverIP6, policy.ProtoTCP, 80), dropped},
		{at(otherIP4, serverIP4, policy.ProtoTCP, 80), reached},
		{at(clientIP4, otherIP4, policy.ProtoTCP, 80), reached},
	} {
		r := pr.one(ctx, tc.probe, 30*time.Second)
		if r.Outcome != tc.want {
			t.Errorf("%s: %v (%v), want %v", tc.probe, r.Outcome, r.Err, tc.want)
			continue
		}
		if tc.want == dropped && !strings.Contains(r.Evidence, "node n-b, chain ") {
			t.Errorf("%s: evidence %q does not name the server's node and a chain", tc.probe, r.Evidence)
		}
	}
	// And Measure reports the same for every denied flow of the matrix.
	rep, err := l.Measure(ctx, ProbeOptions{Timeout: 20 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	denied := 0
	for _, f := range rep.Flows {
		if !f.Agree {
			t.Errorf("disagreement: %s", describe(f))
		}
		if f.Measured && !f.Allowed {
			denied++
			if f.Outcome != "dropped" || f.Evidence == "" {
				t.Errorf("%s -> %s %d/%s: denied as %q (%q), want a drop record", f.From, f.To, f.Port, f.Protocol, f.Outcome, f.Evidence)
			}
		}
	}
	if denied == 0 {
		t.Error("nothing denied")
	}
}

// TestDropRecordGoesToItsFlowOnly: a record is attributed by the whole
// tuple, source port included.
func TestDropRecordGoesToItsFlowOnly(t *testing.T) {
	tr := &tracer{waiters: map[flowKey]chan dropRecord{}}
	k := flowKey{proto: policy.ProtoTCP, src: netip.MustParseAddrPort("10.0.0.1:40000"), dst: netip.MustParseAddrPort("10.0.0.2:80")}
	others := []flowKey{
		{proto: policy.ProtoUDP, src: k.src, dst: k.dst},
		{proto: k.proto, src: netip.MustParseAddrPort("10.0.0.1:40001"), dst: k.dst},
		{proto: k.proto, src: k.src, dst: netip.MustParseAddrPort("10.0.0.2:81")},
		{proto: k.proto, src: k.src, dst: netip.MustParseAddrPort("10.0.0.3:80")},
	}
	ch, stop := tr.watch(k)
	defer stop()
	for _, o := range others {
		tr.deliver(o, dropRecord{node: "n", chain: "c"})
	}
	select {
	case d := <-ch:
		t.Fatalf("got a record of another flow: %v", d)
	default:
	}
	tr.deliver(k, dropRecord{node: "n", chain: "c"})
	select {
	case d := <-ch:
		if d.String() != "dropped by node n, chain c" {
			t.Errorf("record %v", d)
		}
	default:
		t.Fatal("no record for the flow")
	}
	stop()
	tr.deliver(k, dropRecord{}) // nobody waits: no block, no panic
}

// attr encodes one netlink attribute.
func attr(typ uint16, v []byte) []byte {
	b := make([]byte, 4, 4+len(v)+3)
	binary.NativeEndian.PutUint16(b, uint16(4+len(v)))
	binary.NativeEndian.PutUint16(b[2:], typ)
	b = append(b, v...)
	for len(b)%4 != 0 {
		b = append(b, 0)
	}
	return b
}

func be32(v uint32) []byte { return binary.BigEndian.AppendUint32(nil, v) }

func TestParseTrace(t *testing.T) {
	ip4 := make([]byte, 20)
	ip4[0], ip4[9] = 0x45, unix.IPPROTO_TCP
	copy(ip4[12:], []byte{10, 0, 0, 1})
	copy(ip4[16:], []byte{10, 0, 0, 2})
	ip6 := make([]byte, 40)
	ip6[0], ip6[6] = 0x60, unix.IPPROTO_UDP
	copy(ip6[8:], netip.MustParseAddr("fd00::1").AsSlice())
	copy(ip6[24:], netip.MustParseAddr("fd00::2").AsSlice())
	ports := []byte{0x9c, 0x40, 0, 80} // 40000 -> 80
	verdict := func(code int32) []byte {
		return attr(unix.NFTA_TRACE_VERDICT|0x8000, attr(unix.NFTA_VERDICT_CODE, be32(uint32(code))))
	}
	cat := func(parts ...[]byte) []byte {
		var out []byte
		for _, p := range parts {
			out = append(out, p...)
		}
		return out
	}
	for _, tc := range []struct {
		name string
		msg  []byte
		want traceEvent
	}{
		{"packet headers, IPv4 TCP", cat(attr(unix.NFTA_TRACE_ID, be32(7)), attr(unix.NFTA_TRACE_TABLE, []byte("moat\x00")), attr(unix.NFTA_TRACE_TYPE, be32(unix.NFT_TRACETYPE_RULE)), verdict(-3), attr(unix.NFTA_TRACE_NETWORK_HEADER, ip4), attr(unix.NFTA_TRACE_TRANSPORT_HEADER, ports)),
			traceEvent{id: 7, table: "moat", hasKey: true, key: flowKey{proto: policy.ProtoTCP, src: netip.MustParseAddrPort("10.0.0.1:40000"), dst: netip.MustParseAddrPort("10.0.0.2:80")}}},
		{"packet headers, IPv6 UDP", cat(attr(unix.NFTA_TRACE_ID, be32(8)), attr(unix.NFTA_TRACE_NETWORK_HEADER, ip6), attr(unix.NFTA_TRACE_TRANSPORT_HEADER, ports)),
			traceEvent{id: 8, hasKey: true, key: flowKey{proto: policy.ProtoUDP, src: netip.MustParseAddrPort("[fd00::1]:40000"), dst: netip.MustParseAddrPort("[fd00::2]:80")}}},
		{"rule drop", cat(attr(unix.NFTA_TRACE_ID, be32(7)), attr(unix.NFTA_TRACE_TABLE, []byte("moat\x00")), attr(unix.NFTA_TRACE_CHAIN, []byte("ing-abc\x00")), attr(unix.NFTA_TRACE_TYPE, be32(unix.NFT_TRACETYPE_RULE)), verdict(0)),
			traceEvent{id: 7, table: "moat", chain: "ing-abc", drop: true}},
		{"rule accept", cat(attr(unix.NFTA_TRACE_ID, be32(7)), attr(unix.NFTA_TRACE_TYPE, be32(unix.NFT_TRACETYPE_RULE)), verdict(1)),
			traceEvent{id: 7}},
		{"policy drop", cat(attr(unix.NFTA_TRACE_ID, be32(9)), attr(unix.NFTA_TRACE_TYPE, be32(unix.NFT_TRACETYPE_POLICY)), attr(unix.NFTA_TRACE_POLICY, be32(0))),
			traceEvent{id: 9, drop: true}},
		{"policy accept", cat(attr(unix.NFTA_TRACE_ID, be32(9)), attr(unix.NFTA_TRACE_TYPE, be32(unix.NFT_TRACETYPE_POLICY)), attr(unix.NFTA_TRACE_POLICY, be32(1))),
			traceEvent{id: 9}},
		{"ICMP is no probe", cat(attr(unix.NFTA_TRACE_ID, be32(1)), attr(unix.NFTA_TRACE_NETWORK_HEADER, append(append([]byte{}, ip4[:9]...), append([]byte{unix.IPPROTO_ICMP}, ip4[10:]...)...)), attr(unix.NFTA_TRACE_TRANSPORT_HEADER, ports)),
			traceEvent{id: 1}},
		{"truncated", attr(unix.NFTA_TRACE_ID, be32(1))[:6], traceEvent{}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := parseTrace(tc.msg); got != tc.want {
				t.Errorf("got %+v\nwant %+v", got, tc.want)
			}
		})
	}
}
