package policy_test

import (
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/moat-net/moat/manifest"
	"github.com/moat-net/moat/matrix"
	"github.com/moat-net/moat/policy"
)

// FuzzDecodeCompileEvaluate feeds arbitrary manifests through the whole
// pipeline: decode -> validate -> compile -> evaluate. It must never panic,
// whatever the input.
func FuzzDecodeCompileEvaluate(f *testing.F) {
	files, _ := filepath.Glob("../examples/*/policy.yaml")
	for _, file := range files {
		if b, err := os.ReadFile(file); err == nil {
			f.Add(string(b))
		}
	}
	f.Add("apiVersion: networking.k8s.io/v1\nkind: NetworkPolicy\nmetadata: {name: p, namespace: a}\nspec: {podSelector: {}, ingress: [{ports: [{port: 65535, endPort: 1}]}]}")
	f.Add("apiVersion: policy.networking.k8s.io/v1alpha2\nkind: ClusterNetworkPolicy\nmetadata: {name: c}\nspec: {tier: Admin, subject: {}, egress: [{action: Pass, to: [{}], protocols: [{}]}]}")
	f.Add(`{"apiVersion":"v1","kind":"List","items":[{"apiVersion":"v1","kind":"List","items":[]}]}`)
	f.Fuzz(func(t *testing.T, doc string) {
		l := manifest.Loader{Stdin: strings.NewReader(baseCluster + "\n---\n" + doc)}
		res, err := l.Load("-")
		if err != nil {
			return
		}
		prog := policy.Compile(&res.Cluster, policy.Options{})
		eps := matrix.Endpoints(prog, []netip.Addr{netip.MustParseAddr("192.168.100.5"), netip.MustParseAddr("2001:db8::5")})
		for _, pp := range []matrix.PortProto{{Port: 80, Protocol: policy.ProtoTCP}, {Port: 53, Protocol: policy.ProtoUDP}} {
			for _, s := range eps {
				for _, d := range eps {
					matrix.Judge(prog, s, d, pp)
				}
			}
		}
	})
}

// FuzzAddrSet checks set algebra against brute force over a small IPv4
// window.
func FuzzAddrSet(f *testing.F) {
	f.Add(uint8(10), uint8(20), uint8(15), uint8(30), uint8(0), uint8(5))
	f.Fuzz(func(t *testing.T, a1, a2, b1, b2, c1, c2 uint8) {
		r := func(x, y uint8) policy.AddrRange {
			return policy.AddrRange{From: netip.AddrFrom4([4]byte{10, 0, 0, x}), To: netip.AddrFrom4([4]byte{10, 0, 0, y})}
		}
		a := policy.NewAddrSet(r(a1, a2), r(c1, c2))
		b := policy.NewAddrSet(r(b1, b2))
		in := func(x, lo, hi uint8) bool { return lo <= x && x <= hi }
		u, d := a.Union(b), a.Subtract(b)
		for i := 0; i < 256; i++ {
			x := uint8(i)
			ip := netip.AddrFrom4([4]byte{10, 0, 0, x})
			inA := in(x, a1, a2) || in(x, c1, c2)
			inB := in(x, b1, b2)
			if a.Contains(ip) != inA || u.Contains(ip) != (inA || inB) || d.Contains(ip) != (inA && !inB) {
				t.Fatalf("%s: a=%v(%v) b=%v union=%v diff=%v", ip, a, inA, b, u, d)
			}
		}
		rs := u.Ranges()
		for i := 1; i < len(rs); i++ {
			if !rs[i-1].To.Next().Less(rs[i].From) {
				t.Fatalf("ranges not disjoint and non-adjacent: %v", rs)
			}
		}
	})
}

// FuzzPortSet checks port matching against brute force.
func FuzzPortSet(f *testing.F) {
	f.Add(uint16(1), uint16(100), uint16(50), uint16(200), uint16(150))
	f.Fuzz(func(t *testing.T, a1, a2, b1, b2, probe uint16) {
		var b policy.PortSetBuilder
		b.Add(policy.ProtoTCP, policy.PortRange{From: a1, To: a2})
		b.Add(policy.ProtoTCP, policy.PortRange{From: b1, To: b2})
		s := b.Build()
		want := (a1 <= probe && probe <= a2) || (b1 <= probe && probe <= b2)
		if s.Matches(policy.ProtoTCP, probe) != want {
			t.Fatalf("%v matches %d = %v, want %v", s, probe, !want, want)
		}
		if s.Matches(policy.ProtoUDP, probe) {
			t.Fatalf("TCP set matched UDP")
		}
	})
}
