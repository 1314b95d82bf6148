package ipam

import (
	"fmt"
	"math/big"
	"net/netip"
	"slices"
	"strings"

	"github.com/google/btree"
)

// Family is an IP family.
type Family uint8

// The families.
const (
	IPv4 Family = 4
	IPv6 Family = 6
)

func (f Family) String() string {
	if f == IPv6 {
		return "IPv6"
	}
	return "IPv4"
}

// FamilyOf returns the family of a.
func FamilyOf(a netip.Addr) Family {
	if a.Is4() {
		return IPv4
	}
	return IPv6
}

// Range is an inclusive range of addresses of one family.
type Range struct {
	First, Last netip.Addr
}

// Contains reports whether a lies in r.
func (r Range) Contains(a netip.Addr) bool {
	return a.BitLen() == r.First.BitLen() && r.First.Compare(a) <= 0 && a.Compare(r.Last) <= 0
}

// Family is the range's family.
func (r Range) Family() Family { return FamilyOf(r.First) }

func (r Range) String() string {
	if r.First == r.Last {
		return r.First.String()
	}
	return r.First.String() + "-" + r.Last.String()
}

// Overlaps reports whether r and o share an address.
func (r Range) Overlaps(o Range) bool {
	return r.First.BitLen() == o.First.BitLen() && r.First.Compare(o.Last) <= 0 && o.First.Compare(r.Last) <= 0
}

// Size is the number of addresses in r.
func (r Range) Size() *big.Int {
	n := new(big.Int).Sub(addrInt(r.Last), addrInt(r.First))
	return n.Add(n, big.NewInt(1))
}

func addrInt(a netip.Addr) *big.Int {
	b := a.As16()
	return new(big.Int).SetBytes(b[:])
}

// ParseRange parses what IPPool.spec.addresses holds: a CIDR without host bits or a range
// "first-last" of one family, first not after last. The rules are the CRD's CEL rules, so an
// address the API server accepted parses here.
func ParseRange(s string) (Range, error) {
	if first, last, ok := strings.Cut(s, "-"); ok {
		a, err := parseAddr(first)
		if err != nil {
			return Range{}, fmt.Errorf("range %q: %w", s, err)
		}
		b, err := parseAddr(last)
		if err != nil {
			return Range{}, fmt.Errorf("range %q: %w", s, err)
		}
		if a.BitLen() != b.BitLen() {
			return Range{}, fmt.Errorf("range %q: the two ends are of different families", s)
		}
		if a.Compare(b) > 0 {
			return Range{}, fmt.Errorf("range %q is reversed", s)
		}
		return Range{a, b}, nil
	}
	p, err := netip.ParsePrefix(s)
	if err != nil {
		return Range{}, fmt.Errorf("%q is neither a CIDR nor a range first-last", s)
	}
	if p.Addr().Is4In6() || p.Addr().Zone() != "" {
		return Range{}, fmt.Errorf("%q: IPv4-mapped and zoned addresses are not allowed", s)
	}
	if p.Masked() != p {
		return Range{}, fmt.Errorf("CIDR %q has bits set after its prefix length; write %s", s, p.Masked())
	}
	return Range{p.Addr(), lastOf(p)}, nil
}

func parseAddr(s string) (netip.Addr, error) {
	a, err := netip.ParseAddr(s)
	if err != nil {
		return netip.Addr{}, fmt.Errorf("%q is not an IP address", s)
	}
	if a.Is4In6() || a.Zone() != "" {
		return netip.Addr{}, fmt.Errorf("%q: IPv4-mapped and zoned addresses are not allowed", s)
	}
	return a, nil
}

func lastOf(p netip.Prefix) netip.Addr {
	b := p.Addr().As16()
	bits := p.Bits()
	if p.Addr().Is4() {
		bits += 96
	}
	for i := bits; i < 128; i++ {
		b[i/8] |= 1 << (7 - i%8)
	}
	a := netip.AddrFrom16(b)
	if p.Addr().Is4() {
		return a.Unmap()
	}
	return a
}

// buggy reports whether a is an IPv4 address ending in .0 or .255.
func buggy(a netip.Addr) bool {
	if !a.Is4() {
		return false
	}
	last := a.As4()[3]
	return last == 0 || last == 255
}

// freeSet is the set of free addresses of one family of one pool, kept as disjoint
// intervals ordered by their first address: taking the lowest free address, taking a given
// address and giving one back all cost O(log n) in the number of intervals, however large the
// pool.
//
// With skipBuggy (an IPv4 pool with avoidBuggyIPs) addresses ending in .0 or .255 are never
// free, and that is arithmetic, not splitting: an interval starts and ends on an address that
// may be given, the .0 and .255 addresses inside it are not free, and two intervals with only
// such addresses between them are one. A /0 is then one interval, as it is without the option.
type freeSet struct {
	t         *btree.BTreeG[Range]
	skipBuggy bool
}

func newFreeSet(skipBuggy bool) *freeSet {
	return &freeSet{t: btree.NewG(16, func(a, b Range) bool { return a.First.Less(b.First) }), skipBuggy: skipBuggy}
}

// givable reports whether a may ever be free in this set.
func (s *freeSet) givable(a netip.Addr) bool { return !s.skipBuggy || !buggy(a) }

// up returns the lowest givable address at or after a; invalid when there is none.
func (s *freeSet) up(a netip.Addr) netip.Addr {
	for a.IsValid() && !s.givable(a) {
		a = a.Next()
	}
	return a
}

// down returns the highest givable address at or before a; invalid when there is none.
func (s *freeSet) down(a netip.Addr) netip.Addr {
	for a.IsValid() && !s.givable(a) {
		a = a.Prev()
	}
	return a
}

// joins reports whether nothing givable lies strictly between lo and hi (lo before hi), so
// that intervals ending at lo and starting at hi are one.
func (s *freeSet) joins(lo, hi netip.Addr) bool { return s.up(lo.Next()) == hi }

// add adds the givable addresses of r, which must not overlap the free addresses of the set,
// merging neighbours.
func (s *freeSet) add(r Range) {
	r.First, r.Last = s.up(r.First), s.down(r.Last)
	if !r.First.IsValid() || !r.Last.IsValid() || r.Last.Less(r.First) {
		return
	}
	if prev, ok := s.before(r.First); ok && s.joins(prev.Last, r.First) {
		s.t.Delete(prev)
		r.First = prev.First
	}
	if n := s.up(r.Last.Next()); n.IsValid() {
		if next, ok := s.t.Get(Range{First: n}); ok {
			s.t.Delete(next)
			r.Last = next.Last
		}
	}
	s.t.ReplaceOrInsert(r)
}

// before returns the interval starting strictly before a, if any.
func (s *freeSet) before(a netip.Addr) (Range, bool) {
	var out Range
	var found bool
	s.t.DescendLessOrEqual(Range{First: a}, func(r Range) bool {
		if r.First == a {
			return true
		}
		out, found = r, true
		return false
	})
	return out, found
}

// containing returns the interval whose span holds a, if any (a may still be ungivable).
func (s *freeSet) containing(a netip.Addr) (Range, bool) {
	var out Range
	var found bool
	s.t.DescendLessOrEqual(Range{First: a}, func(r Range) bool {
		out, found = r, r.Contains(a)
		return false
	})
	return out, found
}

// lowest returns the lowest free address.
func (s *freeSet) lowest() (netip.Addr, bool) {
	r, ok := s.t.Min()
	return r.First, ok
}

// lowestNotIn returns the lowest free address not in skip (a few addresses).
func (s *freeSet) lowestNotIn(skip []netip.Addr) (netip.Addr, bool) {
	var out netip.Addr
	s.t.Ascend(func(r Range) bool {
		for a := r.First; a.IsValid() && !r.Last.Less(a); a = s.up(a.Next()) {
			if !slices.Contains(skip, a) {
				out = a
				return false
			}
		}
		return true
	})
	return out, out.IsValid()
}

// take removes a; it reports false when a is not free.
func (s *freeSet) take(a netip.Addr) bool {
	if !s.givable(a) {
		return false
	}
	r, ok := s.containing(a)
	if !ok {
		return false
	}
	s.cut(r, a)
	return true
}

// cut removes a, a givable address, from r, an interval of the set that holds it.
func (s *freeSet) cut(r Range, a netip.Addr) {
	s.t.Delete(r)
	if r.First != a {
		s.t.ReplaceOrInsert(Range{r.First, s.down(a.Prev())})
	}
	if r.Last != a {
		s.t.ReplaceOrInsert(Range{s.up(a.Next()), r.Last})
	}
}

// has reports whether a is free.
func (s *freeSet) has(a netip.Addr) bool {
	if !s.givable(a) {
		return false
	}
	_, ok := s.containing(a)
	return ok
}
