package ipam

import (
	"cmp"
	"math"
	"math/big"
	"net/netip"
	"slices"
)

// SetPools replaces the set of pools. Held addresses are never taken away, also when their
// pool shrank or went: the report lists them.
func (a *Allocator) SetPools(in []Pool) Report {
	a.index = NewIndex(in)
	a.pools = make(map[string]*pool, len(a.index.pools))
	a.byIndex = make([]*pool, len(a.index.pools))
	a.shadowed = nil
	byName := make(map[string]Pool, len(in))
	for _, p := range in {
		if q, dup := byName[p.Name]; !dup || p.Order < q.Order {
			byName[p.Name] = p
		}
	}
	for i, ip := range a.index.pools {
		p := &pool{Pool: byName[ip.name], shadowedBy: ip.shadowedBy, overlaps: ip.overlaps}
		p.Ranges = ip.ranges
		a.pools[p.Name], a.byIndex[i] = p, p
		if !p.usable() {
			a.shadowed = append(a.shadowed, p)
		}
	}

	// Free sets and figures: each pool's ranges minus the held addresses (and the avoided
	// ones), walking the held addresses in order beside the ranges.
	heldSorted := make([]netip.Addr, 0, len(a.held))
	for ip := range a.held {
		heldSorted = append(heldSorted, ip)
	}
	slices.SortFunc(heldSorted, netip.Addr.Compare)
	for _, p := range a.byIndex {
		p.capacity = map[Family]*big.Int{IPv4: new(big.Int), IPv6: new(big.Int)}
		p.allocated = map[Family]int64{IPv4: 0, IPv6: 0}
		if p.usable() {
			p.free = map[Family]*freeSet{IPv4: newFreeSet(p.AvoidBuggyIPs), IPv6: newFreeSet(false)}
		}
		for _, r := range p.Ranges {
			f := r.Family()
			p.capacity[f].Add(p.capacity[f], usableSize(r, p.AvoidBuggyIPs))
			var fs *freeSet
			if p.usable() {
				fs = p.free[f]
			}
			p.allocated[f] += fillFree(fs, r, heldSorted, p.AvoidBuggyIPs)
		}
	}
	a.orphans = map[string]map[netip.Addr]*holder{}
	for _, h := range a.held {
		if h.pool == "" {
			if p := a.poolOf(h.ip); p != nil {
				h.pool = p.Name
			}
		}
		a.trackOrphan(h)
	}
	return a.report()
}

// usableSize is the number of addresses of r that may be given out.
func usableSize(r Range, avoidBuggy bool) *big.Int {
	n := r.Size()
	if avoidBuggy && r.Family() == IPv4 {
		n.Sub(n, big.NewInt(int64(countBuggy(r))))
	}
	return n
}

func countBuggy(r Range) int {
	f, l := u32(r.First), u32(r.Last)
	// Addresses x in [f, l] with x%256 == 0, then with x%256 == 255.
	zeros := l/256 - f/256
	if f%256 == 0 {
		zeros++
	}
	ones := (l+1)/256 - f/256
	return int(zeros + ones)
}

func u32(a netip.Addr) uint64 {
	b := a.As4()
	return uint64(b[0])<<24 | uint64(b[1])<<16 | uint64(b[2])<<8 | uint64(b[3])
}

// fillFree adds r minus the held addresses to fs (when fs is not nil; fs skips the avoided
// ones itself) and returns how many held addresses of r count as allocated. It costs
// O(k log n) for the k held addresses in r.
func fillFree(fs *freeSet, r Range, held []netip.Addr, avoidBuggy bool) int64 {
	i, _ := slices.BinarySearchFunc(held, r.First, netip.Addr.Compare)
	var allocated int64
	start := r.First
	emit := func(end netip.Addr) {
		if fs != nil {
			fs.add(Range{start, end})
		}
	}
	for ; i < len(held) && r.Contains(held[i]); i++ {
		if !(avoidBuggy && buggy(held[i])) {
			allocated++
		}
		if held[i] != start {
			emit(held[i].Prev())
		}
		start = held[i].Next()
		if !start.IsValid() || held[i] == r.Last {
			return allocated // the last address of r is held: nothing after it
		}
	}
	emit(r.Last)
	return allocated
}

func mergeRanges(rs []Range) []Range {
	out := slices.Clone(rs)
	slices.SortFunc(out, func(x, y Range) int {
		if c := cmp.Compare(x.BitLen(), y.BitLen()); c != 0 {
			return c
		}
		return x.First.Compare(y.First)
	})
	merged := out[:0]
	for _, r := range out {
		if n := len(merged); n > 0 {
			last := &merged[n-1]
			if last.BitLen() == r.BitLen() && (last.Overlaps(r) || last.Last.Next() == r.First) {
				if r.Last.Compare(last.Last) > 0 {
					last.Last = r.Last
				}
				continue
			}
		}
		merged = append(merged, r)
	}
	return merged
}

// Report describes the pools after SetPools.
type Report struct {
	// Orphans are addresses held by Services that are no longer in the pool they came from.
	Orphans []Orphan
}

// Orphan is a held address outside the pool it was given from.
type Orphan struct {
	IP          netip.Addr
	Pool        string
	PoolDeleted bool
	Services    []string
}

func (a *Allocator) report() Report {
	var r Report
	for name, m := range a.orphans {
		_, exists := a.pools[name]
		for _, h := range m {
			r.Orphans = append(r.Orphans, Orphan{IP: h.ip, Pool: name, PoolDeleted: !exists, Services: sortedUsers(h)})
		}
	}
	slices.SortFunc(r.Orphans, func(x, y Orphan) int { return x.IP.Compare(y.IP) })
	return r
}

// Orphans returns the addresses held outside the pool they came from.
func (a *Allocator) Orphans() []Orphan { return a.report().Orphans }

// Stats is what a pool's status reports.
type Stats struct {
	Allocated map[Family]int64
	Available map[Family]int64 // saturated at math.MaxInt64
	Usable    bool
	// ShadowedBy names the older pool this one overlaps (then it is not used); Overlaps
	// names every pool it overlaps.
	ShadowedBy string
	Overlaps   []string
	// Orphans are addresses given from this pool, still held, no longer in its ranges.
	Orphans []Orphan
}

// PoolStats computes a pool's figures; it costs O(1), plus O(k log k) for k orphans.
func (a *Allocator) PoolStats(name string) (Stats, bool) {
	p, ok := a.pools[name]
	if !ok {
		return Stats{}, false
	}
	st := Stats{
		Allocated:  map[Family]int64{IPv4: p.allocated[IPv4], IPv6: p.allocated[IPv6]},
		Available:  map[Family]int64{},
		Usable:     p.usable(),
		ShadowedBy: p.shadowedBy,
		Overlaps:   slices.Clone(p.overlaps),
	}
	for ip, h := range a.orphans[name] {
		st.Orphans = append(st.Orphans, Orphan{IP: ip, Pool: name, Services: sortedUsers(h)})
	}
	slices.SortFunc(st.Orphans, func(x, y Orphan) int { return x.IP.Compare(y.IP) })
	for _, f := range []Family{IPv4, IPv6} {
		free := new(big.Int).Sub(p.capacity[f], big.NewInt(st.Allocated[f]))
		if free.Sign() < 0 {
			free.SetInt64(0)
		}
		if free.IsInt64() {
			st.Available[f] = free.Int64()
		} else {
			st.Available[f] = math.MaxInt64
		}
	}
	return st, true
}

// FamilyUsage is one address family of a pool: the addresses held in it and the addresses it
// can still give (never below zero; approximate above 2^53, as a /64 is).
type FamilyUsage struct {
	Family    Family
	Allocated int64
	Available float64
}

// Usage is what metrics show of a pool: whether it gives out addresses and, for each family
// its ranges hold, how many are held and free. Unlike PoolStats it lists no orphans and does
// not saturate, so a scrape costs O(r) for r ranges whatever the pool's size.
func (a *Allocator) Usage(name string) (usable bool, families []FamilyUsage, ok bool) {
	p, ok := a.pools[name]
	if !ok {
		return false, nil, false
	}
	for _, f := range []Family{IPv4, IPv6} {
		if !p.hasFamily(f) {
			continue
		}
		free := new(big.Int).Sub(p.capacity[f], big.NewInt(p.allocated[f]))
		if free.Sign() < 0 {
			free.SetInt64(0)
		}
		avail, _ := new(big.Float).SetInt(free).Float64()
		families = append(families, FamilyUsage{Family: f, Allocated: p.allocated[f], Available: avail})
	}
	return p.usable(), families, true
}
