package ipam

import (
	"cmp"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"testing"

	"pgregory.net/rapid"
)

func TestIndex(t *testing.T) {
	pool := func(name string, order int64, ranges ...string) Pool {
		return Pool{Name: name, Order: order, Ranges: mustRanges(t, ranges...)}
	}
	for _, tc := range []struct {
		name     string
		pools    []Pool
		addr     string
		want     string // "" when no pool holds addr
		shadowed map[string]string
		overlaps map[string][]string
	}{
		{name: "an address in one pool is that pool's",
			pools: []Pool{pool("a", 1, "203.0.113.0/28"), pool("b", 2, "203.0.113.16/28")},
			addr:  "203.0.113.20", want: "b"},
		{name: "an address outside every pool is nobody's",
			pools: []Pool{pool("a", 1, "203.0.113.0/28")},
			addr:  "203.0.113.16"},
		{name: "an IPv6 address is looked up among IPv6 ranges only",
			pools: []Pool{pool("v4", 1, "0.0.0.0/0"), pool("v6", 2, "2001:db8::/64")},
			addr:  "2001:db8::5", want: "v6"},
		{name: "of two overlapping pools the older holds the shared addresses",
			pools: []Pool{pool("young", 2, "203.0.113.4/30"), pool("old", 1, "203.0.113.0/29")},
			addr:  "203.0.113.5", want: "old",
			shadowed: map[string]string{"young": "old", "old": ""},
			overlaps: map[string][]string{"young": {"old"}, "old": {"young"}}},
		{name: "a shadowed pool holds none of its addresses, shared or not",
			pools:    []Pool{pool("old", 1, "203.0.113.0/30"), pool("young", 2, "203.0.113.2-203.0.113.9")},
			addr:     "203.0.113.8",
			shadowed: map[string]string{"young": "old"}},
		{name: "of two pools of the same age the lower name is the older",
			pools: []Pool{pool("b", 1, "203.0.113.0/29"), pool("a", 1, "203.0.113.0/30")},
			addr:  "203.0.113.1", want: "a",
			shadowed: map[string]string{"b": "a"}},
		{name: "a pool that overlaps only a shadowed pool is used",
			pools: []Pool{pool("a", 1, "203.0.113.0/30"), pool("b", 2, "203.0.113.2-203.0.113.5"), pool("c", 3, "203.0.113.4/30")},
			addr:  "203.0.113.6", want: "c",
			shadowed: map[string]string{"a": "", "b": "a", "c": ""},
			overlaps: map[string][]string{"a": {"b"}, "b": {"a", "c"}, "c": {"b"}}},
		{name: "a pool overlapping several older pools is shadowed by the oldest usable one",
			pools: []Pool{pool("x", 5, "203.0.113.0/24"), pool("p", 1, "203.0.113.200/29"), pool("q", 2, "203.0.113.10/31")},
			addr:  "203.0.113.11", want: "q",
			shadowed: map[string]string{"x": "p", "p": "", "q": ""},
			overlaps: map[string][]string{"x": {"p", "q"}}},
		{name: "ranges of one pool that touch or overlap are one range, not an overlap",
			pools: []Pool{pool("a", 1, "203.0.113.0/30", "203.0.113.2-203.0.113.7", "203.0.113.8/29")},
			addr:  "203.0.113.15", want: "a",
			overlaps: map[string][]string{"a": nil}},
		{name: "the last address of the space is found",
			pools: []Pool{pool("all", 1, "0.0.0.0/0"), pool("v6", 1, "::/0")},
			addr:  "255.255.255.255", want: "all"},
		{name: "an IPv4-mapped IPv6 address is looked up as IPv4",
			pools: []Pool{pool("v4", 1, "203.0.113.0/24"), pool("v6", 1, "::/0")},
			addr:  "::ffff:203.0.113.9", want: "v4"},
		{name: "the first address of the space is found",
			pools: []Pool{pool("v6", 1, "::/0")},
			addr:  "::", want: "v6"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			x := NewIndex(tc.pools)
			got, ok := x.PoolOf(ip(tc.addr))
			if got != tc.want || ok != (tc.want != "") {
				t.Errorf("PoolOf(%s) = %q, %v; want %q", tc.addr, got, ok, tc.want)
			}
			for name, want := range tc.shadowed {
				if got := x.Shadowed(name); got != want {
					t.Errorf("Shadowed(%s) = %q, want %q", name, got, want)
				}
			}
			for name, want := range tc.overlaps {
				if got := x.Overlaps(name); !slices.Equal(got, want) {
					t.Errorf("Overlaps(%s) = %v, want %v", name, got, want)
				}
			}
		})
	}
	t.Run("the nil index and unknown names hold nothing", func(t *testing.T) {
		var x *Index
		if _, ok := x.PoolOf(ip("203.0.113.1")); ok || x.Shadowed("a") != "" || x.Overlaps("a") != nil || x.Has("a") {
			t.Error("the nil Index answered")
		}
		if NewIndex(nil).Has("a") {
			t.Error("an empty Index knows a pool")
		}
	})
}

func TestAllocatorIndexIsTheOneItAllocatesBy(t *testing.T) {
	a := New()
	if _, ok := a.Index().PoolOf(ip("203.0.113.1")); ok {
		t.Fatal("a new allocator's index holds a pool")
	}
	old := Pool{Name: "old", Ranges: mustRanges(t, "203.0.113.0/30"), AutoAssign: true, Order: 1}
	young := Pool{Name: "young", Ranges: mustRanges(t, "203.0.113.2-203.0.113.9"), AutoAssign: true, Order: 2}
	a.SetPools([]Pool{old, young})
	before := a.Index()
	for i := range 4 {
		al, err := a.Assign(svc(fmt.Sprintf("ns/s%d", i)))
		if err != nil {
			t.Fatal(err)
		}
		if name, _ := before.PoolOf(al.IPs[0]); name != al.Pool {
			t.Errorf("%s given from %q; the index says %q", al.IPs[0], al.Pool, name)
		}
	}
	a.SetPools([]Pool{young})
	if name, _ := a.Index().PoolOf(ip("203.0.113.5")); name != "young" {
		t.Errorf("after the older pool went, the index says %q", name)
	}
	if name, _ := before.PoolOf(ip("203.0.113.1")); name != "old" {
		t.Errorf("an index taken before a pool change changed: %q", name)
	}
}

// TestIndexAgreesWithThePairwiseRule checks the sweep against the rule as first written:
// visit pools oldest first; a pool is shadowed by the first older usable pool sharing an
// address with it; an address belongs to the usable pool whose ranges hold it.
func TestIndexAgreesWithThePairwiseRule(t *testing.T) {
	universe := []netip.Addr{}
	walk(Range{ip("203.0.113.0"), ip("203.0.113.63")}, func(a netip.Addr) { universe = append(universe, a) })
	walk(Range{ip("2001:db8::"), ip("2001:db8::1f")}, func(a netip.Addr) { universe = append(universe, a) })
	rapid.Check(t, func(t *rapid.T) {
		var pools []Pool
		for i := range rapid.IntRange(0, 6).Draw(t, "pools") {
			p := Pool{Name: fmt.Sprintf("p%d", i), Order: int64(rapid.IntRange(0, 3).Draw(t, "order"))}
			for range rapid.IntRange(1, 3).Draw(t, "ranges") {
				first := rapid.IntRange(0, len(universe)-1).Draw(t, "first")
				last := first + rapid.IntRange(0, 12).Draw(t, "length")
				if last >= len(universe) || universe[last].BitLen() != universe[first].BitLen() {
					last = first
				}
				p.Ranges = append(p.Ranges, Range{universe[first], universe[last]})
			}
			pools = append(pools, p)
		}
		x := NewIndex(pools)

		ps := slices.Clone(pools)
		slices.SortFunc(ps, func(a, b Pool) int {
			if c := cmp.Compare(a.Order, b.Order); c != 0 {
				return c
			}
			return strings.Compare(a.Name, b.Name)
		})
		shadowedBy := map[string]string{}
		overlaps := map[string][]string{}
		share := func(a, b Pool) bool {
			for _, r := range a.Ranges {
				for _, s := range b.Ranges {
					if r.Overlaps(s) {
						return true
					}
				}
			}
			return false
		}
		for i, p := range ps {
			for _, q := range ps[:i] {
				if share(p, q) {
					overlaps[p.Name] = append(overlaps[p.Name], q.Name)
					overlaps[q.Name] = append(overlaps[q.Name], p.Name)
					if shadowedBy[p.Name] == "" && shadowedBy[q.Name] == "" {
						shadowedBy[p.Name] = q.Name
					}
				}
			}
		}
		for _, p := range ps {
			slices.Sort(overlaps[p.Name])
			if got := x.Shadowed(p.Name); got != shadowedBy[p.Name] {
				t.Fatalf("%s shadowed by %q; the pairwise rule says %q", p.Name, got, shadowedBy[p.Name])
			}
			if got := x.Overlaps(p.Name); !slices.Equal(got, overlaps[p.Name]) {
				t.Fatalf("%s overlaps %v; the pairwise rule says %v", p.Name, got, overlaps[p.Name])
			}
		}
		for _, a := range universe {
			want := ""
			for _, p := range ps {
				if shadowedBy[p.Name] == "" && slices.ContainsFunc(p.Ranges, func(r Range) bool { return r.Contains(a) }) {
					want = p.Name
					break
				}
			}
			if got, _ := x.PoolOf(a); got != want {
				t.Fatalf("PoolOf(%s) = %q; the pairwise rule says %q", a, got, want)
			}
		}
	})
}
