package policy

import (
	"math/rand/v2"
	"net/netip"
	"slices"
	"strings"
	"testing"
)

// withAddr and withoutAddr (peers gaining and losing pods) agree with
// building the set from scratch, ranges normalised alike.
func TestAddrSetSingleAddressUpdates(t *testing.T) {
	r := rand.New(rand.NewPCG(5, 6))
	addr := func() netip.Addr {
		if r.IntN(3) == 0 {
			return netip.AddrFrom16([16]byte{0xfd, 15: byte(r.IntN(40))})
		}
		return netip.AddrFrom4([4]byte{10, 0, 0, byte(r.IntN(40))})
	}
	for round := 0; round < 2000; round++ {
		in := map[netip.Addr]bool{}
		set := NewAddrSet()
		for range 60 {
			a := addr()
			if r.IntN(3) == 0 {
				delete(in, a)
				set = set.withoutAddr(a)
			} else {
				in[a] = true
				set = set.withAddr(a)
			}
			var rs []AddrRange
			for a := range in {
				rs = append(rs, AddrRange{a, a})
			}
			if want := NewAddrSet(rs...); !slices.Equal(set.Ranges(), want.Ranges()) {
				t.Fatalf("round %d: after %s: %s, want %s", round, a, set, want)
			}
		}
	}
	if s := AllAddrs().withoutAddr(netip.MustParseAddr("0.0.0.0")).withAddr(netip.MustParseAddr("0.0.0.0")); !slices.Equal(s.Ranges(), AllAddrs().Ranges()) {
		t.Errorf("edges: %s", s)
	}
}

func TestCmpKey(t *testing.T) {
	names := []string{"", "a", "a-b", "a.b", "ab", "a/b", "b", "z"}
	for _, ns := range names {
		for _, name := range names {
			p := Pod{Namespace: ns, Name: name}
			for _, kns := range names {
				for _, kn := range names {
					key := kns + "/" + kn
					if got, want := cmpKey(&p, key), strings.Compare(p.Key(), key); got != want {
						t.Fatalf("cmpKey(%q, %q) = %d, want %d", p.Key(), key, got, want)
					}
				}
			}
			for _, key := range names {
				if got, want := cmpKey(&p, key), strings.Compare(p.Key(), key); got != want {
					t.Fatalf("cmpKey(%q, %q) = %d, want %d", p.Key(), key, got, want)
				}
			}
		}
	}
}

// with (a batch of peer changes) builds the set that adding and removing
// the addresses one by one builds, for batches small and large, both
// families, adjacent addresses merging and ranges splitting.
func TestAddrSetBatchUpdates(t *testing.T) {
	r := rand.New(rand.NewPCG(7, 8))
	addr := func() netip.Addr {
		if r.IntN(3) == 0 {
			return netip.AddrFrom16([16]byte{0xfd, 15: byte(r.IntN(60))})
		}
		return netip.AddrFrom4([4]byte{10, 0, 0, byte(r.IntN(60))})
	}
	batches := 0
	for round := 0; round < 3000; round++ {
		set := NewAddrSet()
		for range r.IntN(80) {
			set = set.withAddr(addr())
		}
		var adds, dels []netip.Addr
		seen := map[netip.Addr]bool{}
		for range r.IntN(12) {
			a := addr()
			if seen[a] {
				continue
			}
			seen[a] = true
			if set.Contains(a) {
				dels = append(dels, a)
			} else {
				adds = append(adds, a)
			}
		}
		slices.SortFunc(adds, netip.Addr.Compare)
		slices.SortFunc(dels, netip.Addr.Compare)
		want := set
		for _, a := range dels {
			want = want.withoutAddr(a)
		}
		for _, a := range adds {
			want = want.withAddr(a)
		}
		got := set.with(adds, dels)
		if !slices.Equal(got.Ranges(), want.Ranges()) {
			t.Fatalf("round %d: %s with +%v -%v = %s, one by one %s", round, set, adds, dels, got, want)
		}
		if len(adds)+len(dels) > 1 {
			batches++
		}
	}
	if batches == 0 {
		t.Fatal("no batch took the one-pass path")
	}
}
