package policy

import (
	"fmt"
	"net/netip"
	"slices"
	"sort"
	"strconv"
	"strings"
)

// AddrRange is an inclusive range of addresses of one family. Peers resolve
// to ranges rather than prefixes because ipBlock.except and merged pod IPs
// rarely stay aligned to prefix boundaries; nftables interval sets take
// ranges directly.
type AddrRange struct {
	From, To netip.Addr
}

// String renders a range as a single address, a prefix when it is one, or
// "from-to".
func (r AddrRange) String() string {
	if r.From == r.To {
		return r.From.String()
	}
	for bits := 0; bits <= r.From.BitLen(); bits++ {
		p := netip.PrefixFrom(r.From, bits).Masked()
		if p.Addr() == r.From && lastAddr(p) == r.To {
			return p.String()
		}
	}
	return r.From.String() + "-" + r.To.String()
}

// AddrSet is an immutable set of addresses kept as sorted, disjoint,
// non-adjacent ranges, IPv4 before IPv6. Membership is a binary search, so
// a peer with thousands of pod IPs costs the same to test as one CIDR.
type AddrSet struct {
	ranges []AddrRange
}

// AllAddrs is every IPv4 and IPv6 address: the peer of an empty from/to list.
func AllAddrs() *AddrSet {
	return NewAddrSet(
		AddrRange{netip.IPv4Unspecified(), netip.MustParseAddr("255.255.255.255")},
		AddrRange{netip.IPv6Unspecified(), netip.MustParseAddr("ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff")},
	)
}

// NewAddrSet normalises arbitrary ranges (in any order, overlapping or not)
// into a set. Ranges whose ends differ in family or are reversed are dropped:
// callers validate input before building sets.
func NewAddrSet(rs ...AddrRange) *AddrSet {
	clean := make([]AddrRange, 0, len(rs))
	for _, r := range rs {
		if !r.From.IsValid() || !r.To.IsValid() || r.From.Is4() != r.To.Is4() || r.To.Less(r.From) {
			continue
		}
		clean = append(clean, r)
	}
	slices.SortFunc(clean, func(a, b AddrRange) int { return a.From.Compare(b.From) })
	out := clean[:0]
	for _, r := range clean {
		out = appendRange(out, r)
	}
	return &AddrSet{ranges: out}
}

// appendRange appends r to out (ranges in order of From), merging it into
// the last one when they overlap or touch: sets keep their ranges in this
// normal form.
func appendRange(out []AddrRange, r AddrRange) []AddrRange {
	if n := len(out); n > 0 {
		last := &out[n-1]
		if last.To.Is4() == r.From.Is4() && (!last.To.Less(r.From) || last.To.Next() == r.From) {
			if last.To.Less(r.To) {
				last.To = r.To
			}
			return out
		}
	}
	return append(out, r)
}

// PrefixRange converts a prefix into the range of addresses it covers.
func PrefixRange(p netip.Prefix) AddrRange {
	p = p.Masked()
	return AddrRange{From: p.Addr(), To: lastAddr(p)}
}

func lastAddr(p netip.Prefix) netip.Addr {
	b := p.Addr().AsSlice()
	bits := p.Bits()
	for i := range b {
		for bit := 0; bit < 8; bit++ {
			if i*8+bit >= bits {
				b[i] |= 0x80 >> bit
			}
		}
	}
	a, _ := netip.AddrFromSlice(b)
	return a
}

// Ranges returns the normalised ranges; callers must not modify them.
func (s *AddrSet) Ranges() []AddrRange {
	if s == nil {
		return nil
	}
	return s.ranges
}

// Empty reports whether the set holds no address.
func (s *AddrSet) Empty() bool { return s == nil || len(s.ranges) == 0 }

// Contains reports whether a is in the set.
func (s *AddrSet) Contains(a netip.Addr) bool {
	if s == nil || !a.IsValid() {
		return false
	}
	a = a.Unmap()
	i := sort.Search(len(s.ranges), func(i int) bool { return !s.ranges[i].To.Less(a) })
	return i < len(s.ranges) && !a.Less(s.ranges[i].From) && s.ranges[i].From.Is4() == a.Is4()
}

// Union returns the addresses in s or o.
func (s *AddrSet) Union(o *AddrSet) *AddrSet {
	return NewAddrSet(append(append([]AddrRange{}, s.Ranges()...), o.Ranges()...)...)
}

// Subtract returns the addresses of s that are not in o: ipBlock.except.
func (s *AddrSet) Subtract(o *AddrSet) *AddrSet {
	out := make([]AddrRange, 0, len(s.Ranges()))
	holes := o.Ranges()
	for _, r := range s.Ranges() {
		cur := r
		alive := true
		for _, h := range holes {
			if !alive {
				break
			}
			if h.From.Is4() != cur.From.Is4() || h.To.Less(cur.From) || cur.To.Less(h.From) {
				continue
			}
			if cur.From.Less(h.From) {
				out = append(out, AddrRange{cur.From, h.From.Prev()})
			}
			if h.To.Less(cur.To) {
				cur.From = h.To.Next()
			} else {
				alive = false
			}
		}
		if alive {
			out = append(out, cur)
		}
	}
	return NewAddrSet(out...)
}

// String lists the ranges, for explanations and golden files.
func (s *AddrSet) String() string {
	parts := make([]string, len(s.Ranges()))
	for i, r := range s.Ranges() {
		parts[i] = r.String()
	}
	return "{" + strings.Join(parts, ", ") + "}"
}

// ParseCIDR parses a CIDR. Host bits are masked (the API server accepts them
// in ipBlock), but an unparsable string or a zone is an error. An
// IPv4-mapped IPv6 prefix of at least 96 bits is the IPv4 prefix it maps
// (::ffff:10.0.0.0/104 is 10.0.0.0/8), as the API server reads it (its
// validation warns it "will be considered invalid in a future release:
// use 10.0.0.0/8") and as Moat reads mapped addresses everywhere: kept as
// IPv6, an ipBlock of it matched no IPv4 packet.
func ParseCIDR(s string) (netip.Prefix, error) {
	p, err := netip.ParsePrefix(s)
	if err != nil {
		return netip.Prefix{}, fmt.Errorf("invalid CIDR %q: %s", s, prefixProblem(s, err))
	}
	if p.Addr().Zone() != "" {
		return netip.Prefix{}, fmt.Errorf("invalid CIDR %q: zones are not allowed", s)
	}
	if p.Addr().Is4In6() && p.Bits() >= 96 {
		p = netip.PrefixFrom(p.Addr().Unmap(), p.Bits()-96)
	}
	return p.Masked(), nil
}

// prefixProblem is what is wrong with s, from netip.ParsePrefix's error
// without the Go call chain it starts with
// (`netip.ParsePrefix("10.0.0.300/8"): ParseAddr("10.0.0.300"): IPv4
// field has value >255`): the message already quotes s.
func prefixProblem(s string, err error) string {
	msg := strings.TrimPrefix(err.Error(), "netip.ParsePrefix("+strconv.Quote(s)+"): ")
	addr, _, _ := strings.Cut(s, "/")
	msg = strings.TrimPrefix(msg, "ParseAddr("+strconv.Quote(addr)+"): ")
	if msg == "no '/'" {
		return "no prefix length (such as /32)"
	}
	if _, bits, _ := strings.Cut(s, "/"); len(bits) > 1 && bits[0] == '0' && strings.HasPrefix(msg, "bad bits after slash") {
		return "prefix length with a leading zero"
	}
	return msg
}

// withAddr returns s plus one address, in time linear in s without
// sorting: for pods joining a peer.
func (s *AddrSet) withAddr(a netip.Addr) *AddrSet {
	if s.Contains(a) {
		return s
	}
	rs := s.Ranges()
	i := sort.Search(len(rs), func(i int) bool { return a.Less(rs[i].From) })
	out := make([]AddrRange, 0, len(rs)+1)
	out = append(out, rs[:i]...)
	r := AddrRange{a, a}
	if n := len(out); n > 0 && out[n-1].To.Is4() == a.Is4() && out[n-1].To.Next() == a {
		out[n-1].To = a
		r = out[n-1]
		out = out[:n-1]
	}
	if i < len(rs) && rs[i].From.Is4() == a.Is4() && a.Next() == rs[i].From {
		r.To = rs[i].To
		i++
	}
	out = append(out, r)
	out = append(out, rs[i:]...)
	return &AddrSet{ranges: out}
}

// with returns s plus adds minus dels (sorted; an address of adds is not
// in s, one of dels is). One change is withAddr or withoutAddr; more are
// made in one pass over s, where each of those would copy it.
func (s *AddrSet) with(adds, dels []netip.Addr) *AddrSet {
	switch n := len(adds) + len(dels); {
	case n == 0:
		return s
	case n == 1 && len(adds) == 1:
		return s.withAddr(adds[0])
	case n == 1:
		return s.withoutAddr(dels[0])
	}
	rs := s.Ranges()
	out := make([]AddrRange, 0, len(rs)+len(dels)+len(adds))
	push := func(r AddrRange) { out = appendRange(out, r) }
	i := 0 // next of adds
	emit := func(r AddrRange) {
		for i < len(adds) && adds[i].Less(r.From) {
			push(AddrRange{adds[i], adds[i]})
			i++
		}
		push(r)
	}
	j := 0 // next of dels
	for _, r := range rs {
		for j < len(dels) && dels[j].Less(r.From) {
			j++ // not in s
		}
		for j < len(dels) && !r.To.Less(dels[j]) {
			d := dels[j]
			j++
			if r.From.Less(d) {
				emit(AddrRange{r.From, d.Prev()})
			}
			if d == r.To {
				r = AddrRange{}
				break
			}
			r.From = d.Next()
		}
		if r.From.IsValid() {
			emit(r)
		}
	}
	for ; i < len(adds); i++ {
		push(AddrRange{adds[i], adds[i]})
	}
	return &AddrSet{ranges: out}
}

// withoutAddr returns s minus one address.
func (s *AddrSet) withoutAddr(a netip.Addr) *AddrSet {
	if !s.Contains(a) {
		return s
	}
	rs := s.Ranges()
	i := sort.Search(len(rs), func(i int) bool { return !rs[i].To.Less(a) })
	out := make([]AddrRange, 0, len(rs)+1)
	out = append(out, rs[:i]...)
	r := rs[i]
	if r.From.Less(a) {
		out = append(out, AddrRange{r.From, a.Prev()})
	}
	if a.Less(r.To) {
		out = append(out, AddrRange{a.Next(), r.To})
	}
	out = append(out, rs[i+1:]...)
	return &AddrSet{ranges: out}
}
