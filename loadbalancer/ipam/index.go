package ipam

import (
	"cmp"
	"net/netip"
	"slices"
	"strings"
)

// Index answers which pool holds an address, by the allocator's own overlap rule: of two
// pools that share an address, the older (lower Order, then the lower name) is used, and the
// younger holds nothing until the overlap is removed. A pool that overlaps only pools which
// are themselves shadowed stays usable.
//
// An Index is immutable: SetPools builds a new one, so an Index obtained from
// Allocator.Index keeps describing the pools of that moment and may be read from any
// goroutine. Building one costs O(r log r + o) for r ranges and o overlapping range pairs;
// a lookup costs O(log r). The nil Index holds no pool.
type Index struct {
	pools   []indexedPool // by Order, then name
	byName  map[string]int
	entries []indexEntry // the usable pools' ranges: sorted, disjoint
}

type indexedPool struct {
	name       string
	ranges     []Range // merged and sorted
	shadowedBy string
	overlaps   []string // sorted
}

type indexEntry struct {
	r    Range
	pool int // into Index.pools
}

// NewIndex indexes pools. Names should be unique; of two pools with one name the older is
// kept. Ranges need not be merged or sorted.
func NewIndex(pools []Pool) *Index {
	sorted := slices.Clone(pools)
	slices.SortStableFunc(sorted, func(x, y Pool) int {
		if c := cmp.Compare(x.Order, y.Order); c != 0 {
			return c
		}
		return strings.Compare(x.Name, y.Name)
	})
	x := &Index{byName: make(map[string]int, len(sorted))}
	for _, p := range sorted {
		if _, dup := x.byName[p.Name]; dup {
			continue
		}
		x.byName[p.Name] = len(x.pools)
		x.pools = append(x.pools, indexedPool{name: p.Name, ranges: mergeRanges(p.Ranges)})
	}

	// Overlapping pools, by a sweep over every range in address order: the ranges still
	// open when one starts are exactly those it overlaps.
	var all []indexEntry
	for i, p := range x.pools {
		for _, r := range p.ranges {
			all = append(all, indexEntry{r, i})
		}
	}
	slices.SortFunc(all, compareEntries)
	overlapping := map[[2]int]bool{}
	var open []indexEntry
	for _, e := range all {
		open = slices.DeleteFunc(open, func(o indexEntry) bool {
			return o.r.BitLen() != e.r.BitLen() || o.r.Last.Less(e.r.First)
		})
		for _, o := range open {
			if o.pool != e.pool {
				overlapping[[2]int{min(o.pool, e.pool), max(o.pool, e.pool)}] = true
			}
		}
		open = append(open, e)
	}
	older := make([][]int, len(x.pools)) // per pool, the older pools it overlaps
	for pair := range overlapping {
		a, b := pair[0], pair[1]
		x.pools[a].overlaps = append(x.pools[a].overlaps, x.pools[b].name)
		x.pools[b].overlaps = append(x.pools[b].overlaps, x.pools[a].name)
		older[b] = append(older[b], a)
	}
	for i := range x.pools {
		p := &x.pools[i]
		slices.Sort(p.overlaps)
		// The oldest usable pool it overlaps shadows it; pools are visited oldest first, so
		// whether an older pool is usable is already known.
		slices.Sort(older[i])
		for _, j := range older[i] {
			if x.pools[j].shadowedBy == "" {
				p.shadowedBy = x.pools[j].name
				break
			}
		}
		if p.shadowedBy == "" {
			for _, r := range p.ranges {
				x.entries = append(x.entries, indexEntry{r, i})
			}
		}
	}
	slices.SortFunc(x.entries, compareEntries)
	return x
}

func compareEntries(x, y indexEntry) int {
	if c := cmp.Compare(x.r.BitLen(), y.r.BitLen()); c != 0 {
		return c
	}
	return x.r.First.Compare(y.r.First)
}

// lookup returns the position of the usable pool holding a, or -1.
func (x *Index) lookup(a netip.Addr) int {
	if x == nil || !a.IsValid() {
		return -1
	}
	// The last entry starting at or before a is the only one that can hold it.
	i, found := slices.BinarySearchFunc(x.entries, a, func(e indexEntry, t netip.Addr) int {
		if c := cmp.Compare(e.r.BitLen(), t.BitLen()); c != 0 {
			return c
		}
		return e.r.First.Compare(t)
	})
	if !found {
		i--
	}
	if i < 0 || !x.entries[i].r.Contains(a) {
		return -1
	}
	return x.entries[i].pool
}

// PoolOf returns the name of the pool that holds a: a usable pool with a range containing
// it. Shadowed pools hold nothing. An IPv4-mapped IPv6 address is looked up as IPv4.
func (x *Index) PoolOf(a netip.Addr) (name string, ok bool) {
	i := x.lookup(a.Unmap())
	if i < 0 {
		return "", false
	}
	return x.pools[i].name, true
}

// Governing returns the pool whose rules govern an address given from the pool named from:
// that pool while its ranges hold the address (of overlapping pools, the one it was given
// from), else the usable pool holding it, else the oldest shadowed pool whose ranges hold it;
// ok is false when no pool holds it (an orphan, announced from no node). A pool deleted or
// shrunk under an address, or a name written on a Service, changes the answer only through
// the pools' ranges: the same while the controller runs as after it restarts.
func (x *Index) Governing(from string, a netip.Addr) (name string, ok bool) {
	a = a.Unmap()
	i := x.lookup(a)
	if i >= 0 && x.pools[i].name == from {
		return from, true // the common case, one lookup
	}
	if p := x.pool(from); p != nil && rangesHold(p.ranges, a) {
		return from, true
	}
	if i >= 0 {
		return x.pools[i].name, true
	}
	if x == nil {
		return "", false
	}
	for _, p := range x.pools { // oldest first
		if p.shadowedBy != "" && rangesHold(p.ranges, a) {
			return p.name, true
		}
	}
	return "", false
}

func rangesHold(rs []Range, a netip.Addr) bool {
	for _, r := range rs {
		if r.Contains(a) {
			return true
		}
	}
	return false
}

// Shadowed returns the older pool that keeps the named pool from being used, or "" when the
// pool is usable or unknown.
func (x *Index) Shadowed(name string) string {
	if p := x.pool(name); p != nil {
		return p.shadowedBy
	}
	return ""
}

// Overlaps returns, sorted, every pool that shares an address with the named pool.
func (x *Index) Overlaps(name string) []string {
	if p := x.pool(name); p != nil {
		return slices.Clone(p.overlaps)
	}
	return nil
}

// Has reports whether the index holds a pool of that name (usable or shadowed).
func (x *Index) Has(name string) bool { return x.pool(name) != nil }

func (x *Index) pool(name string) *indexedPool {
	if x == nil {
		return nil
	}
	i, ok := x.byName[name]
	if !ok {
		return nil
	}
	return &x.pools[i]
}
