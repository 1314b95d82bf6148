package ipam

import (
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"testing"

	"pgregory.net/rapid"
)

// These properties check that skipping .0 and .255 by arithmetic gives what splitting every
// range into /24 pieces gave, against brute force: on small ranges by enumerating every
// address, on ranges up to the whole IPv4 space by walking only as far as the answer.

func addrFrom32(v uint32) netip.Addr {
	return netip.AddrFrom4([4]byte{byte(v >> 24), byte(v >> 16), byte(v >> 8), byte(v)})
}

// walk calls f on every address of r in order; r must be small.
func walk(r Range, f func(netip.Addr)) {
	for a := r.First; a.IsValid() && !r.Last.Less(a); a = a.Next() {
		f(a)
	}
}

// TestFreeSetMatchesABruteForceSet drives a free set with takes and give-backs around /24
// boundaries and the ends of the address space, and compares it after every step with the
// plain set of free addresses it stands for.
func TestFreeSetMatchesABruteForceSet(t *testing.T) {
	universes := []Range{
		{ip("203.0.112.250"), ip("203.0.114.5")}, // two /24 boundaries
		{ip("0.0.0.0"), ip("0.0.1.3")},           // the bottom of the space
		{ip("255.255.254.250"), ip("255.255.255.255")},
		{ip("2001:db8::fe"), ip("2001:db8::1:2")},
	}
	rapid.Check(t, func(t *rapid.T) {
		u := rapid.SampledFrom(universes).Draw(t, "universe")
		skip := u.Family() == IPv4 && rapid.Bool().Draw(t, "skipBuggy")
		givable := func(a netip.Addr) bool { return !skip || !buggy(a) }
		var all []netip.Addr
		walk(u, func(a netip.Addr) { all = append(all, a) })
		// off is an address's place in all (the universes differ only in their last bits).
		off := func(a netip.Addr) int {
			x, y := a.As16(), u.First.As16()
			return int(uint32(x[12])<<24|uint32(x[13])<<16|uint32(x[14])<<8|uint32(x[15])) -
				int(uint32(y[12])<<24|uint32(y[13])<<16|uint32(y[14])<<8|uint32(y[15]))
		}
		s := newFreeSet(skip)
		model := make([]bool, len(all)) // free, by place
		if rapid.Bool().Draw(t, "start full") {
			s.add(u)
			for i, a := range all {
				model[i] = givable(a)
			}
		}
		place := rapid.IntRange(0, len(all)-1)
		t.Repeat(map[string]func(*rapid.T){
			"take": func(t *rapid.T) {
				i := place.Draw(t, "addr")
				if got := s.take(all[i]); got != model[i] {
					t.Fatalf("take(%s) = %v; it was free: %v", all[i], got, model[i])
				}
				model[i] = false
			},
			"give back a run": func(t *rapid.T) {
				// A run of addresses that are not free, as a pool change or a release gives.
				i := place.Draw(t, "from")
				n := rapid.IntRange(0, 300).Draw(t, "length")
				if model[i] {
					return
				}
				j := i
				for j+1 < len(all) && !model[j+1] && j-i < n {
					j++
				}
				s.add(Range{all[i], all[j]})
				for k := i; k <= j; k++ {
					model[k] = givable(all[k])
				}
			},
			"lowest not in": func(t *rapid.T) {
				var skipped []netip.Addr
				for range rapid.IntRange(0, 3).Draw(t, "skips") {
					skipped = append(skipped, all[place.Draw(t, "skip")])
				}
				var want netip.Addr
				for i, a := range all {
					if model[i] && !slices.Contains(skipped, a) {
						want = a
						break
					}
				}
				if got, ok := s.lowestNotIn(skipped); got != want || ok != want.IsValid() {
					t.Fatalf("lowestNotIn(%v) = %v, %v; want %v", skipped, got, ok, want)
				}
			},
			"has": func(t *rapid.T) {
				i := place.Draw(t, "addr")
				if s.has(all[i]) != model[i] {
					t.Fatalf("has(%s) = %v, want %v", all[i], s.has(all[i]), model[i])
				}
			},
			"": func(t *rapid.T) {
				// The intervals, read with the .0 and .255 inside them not free, are the model.
				free := make([]bool, len(all))
				var prev Range
				s.t.Ascend(func(r Range) bool {
					if !u.Contains(r.First) || !u.Contains(r.Last) || r.Last.Less(r.First) {
						t.Fatalf("interval %v is not within %v", r, u)
					}
					if !givable(r.First) || !givable(r.Last) {
						t.Fatalf("interval %v does not start and end on a givable address", r)
					}
					if prev.First.IsValid() {
						if !prev.Last.Less(r.First) {
							t.Fatalf("intervals %v and %v overlap", prev, r)
						}
						gap := all[off(prev.Last)+1 : off(r.First)]
						if !slices.ContainsFunc(gap, givable) {
							t.Fatalf("intervals %v and %v have nothing givable between them: they should be one", prev, r)
						}
					}
					for k := off(r.First); k <= off(r.Last); k++ {
						free[k] = givable(all[k])
					}
					prev = r
					return true
				})
				if i := firstDiff(free, model); i >= 0 {
					t.Fatalf("%s free by the intervals: %v; by the model: %v", all[i], free[i], model[i])
				}
				if lo, ok := s.lowest(); ok != (s.t.Len() > 0) || (ok && !model[off(lo)]) {
					t.Fatalf("lowest = %v, %v, which is not free", lo, ok)
				}
			},
		})
	})
}

func firstDiff(a, b []bool) int {
	for i := range a {
		if a[i] != b[i] {
			return i
		}
	}
	return -1
}

// TestAvoidBuggyIPsOverBigRanges gives addresses from ranges up to 0.0.0.0/0 with addresses
// already held near /24 boundaries: never a .0 or a .255, always the lowest address neither
// held nor skipped, found by walking up from the start of the range.
func TestAvoidBuggyIPsOverBigRanges(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		bits := rapid.IntRange(0, 30).Draw(t, "prefix length")
		base := rapid.Uint32().Draw(t, "base")
		pfx := netip.PrefixFrom(addrFrom32(base), bits).Masked()
		r, err := ParseRange(pfx.String())
		if err != nil {
			t.Fatal(err)
		}
		a := New()
		p := Pool{Name: "big", Ranges: []Range{r}, AutoAssign: true, AvoidBuggyIPs: true}
		a.SetPools([]Pool{p})

		// Addresses restored from statuses, .0 and .255 among them (written before the
		// option was turned on), near the start of the range where giving happens.
		held := map[netip.Addr]string{}
		first := u32(r.First)
		for i := range rapid.IntRange(0, 20).Draw(t, "restored") {
			off := rapid.SampledFrom([]uint64{0, 1, 254, 255, 256, 257, 510, 511, 512}).Draw(t, "near") +
				uint64(rapid.IntRange(0, 3).Draw(t, "jitter"))
			if off >= uint64(r.Size().Int64()) {
				continue
			}
			addr := addrFrom32(uint32(first + off))
			if _, dup := held[addr]; dup {
				continue
			}
			key := fmt.Sprintf("restored/%d", i)
			if err := a.Restore(svc(key), Allocation{Pool: "big", IPs: []netip.Addr{addr}}); err != nil {
				t.Fatal(err)
			}
			held[addr] = key
		}
		if rapid.Bool().Draw(t, "pool change after the restores") {
			a.SetPools([]Pool{p})
		}

		lowestFree := func() netip.Addr {
			for x := r.First; x.IsValid() && !r.Last.Less(x); x = x.Next() {
				if _, h := held[x]; !h && !buggy(x) {
					return x
				}
			}
			return netip.Addr{}
		}
		st0, _ := a.PoolStats("big")
		for i := range rapid.IntRange(1, 40).Draw(t, "services") {
			if len(held) > 0 && rapid.IntRange(0, 3).Draw(t, "release one") == 0 {
				var keys []netip.Addr
				for x := range held {
					keys = append(keys, x)
				}
				slices.SortFunc(keys, netip.Addr.Compare)
				x := rapid.SampledFrom(keys).Draw(t, "released")
				a.Release(held[x])
				delete(held, x)
			}
			want := lowestFree()
			key := fmt.Sprintf("ns/s%d", i)
			got, err := a.Assign(svc(key))
			if !want.IsValid() {
				if !errors.Is(err, ErrExhausted) {
					t.Fatalf("range %v full, yet Assign gave %v, %v", r, got, err)
				}
				continue
			}
			if err != nil || len(got.IPs) != 1 || got.IPs[0] != want {
				t.Fatalf("range %v, held %d: Assign = %v, %v; want %s", r, len(held), got, err, want)
			}
			if buggy(got.IPs[0]) {
				t.Fatalf("gave %s although the pool avoids .0 and .255", got.IPs[0])
			}
			held[got.IPs[0]] = key
		}
		st, _ := a.PoolStats("big")
		var counted int64
		for x := range held {
			if !buggy(x) {
				counted++
			}
		}
		if st.Allocated[IPv4] != counted {
			t.Fatalf("allocated %d; %d held addresses may be given", st.Allocated[IPv4], counted)
		}
		if d := st0.Available[IPv4] - st.Available[IPv4]; d != counted-st0.Allocated[IPv4] {
			t.Fatalf("available went from %d to %d while allocated went from %d to %d", st0.Available[IPv4], st.Available[IPv4], st0.Allocated[IPv4], counted)
		}
	})
}

// TestPoolFiguresMatchABruteForceCount compares a pool's status figures with a count of every
// address of small random ranges, across /24 boundaries, with addresses held inside and
// outside the pool, after assigning until the pool is full and releasing some.
func TestPoolFiguresMatchABruteForceCount(t *testing.T) {
	universe := Range{ip("203.0.112.0"), ip("203.0.115.255")}
	rapid.Check(t, func(t *rapid.T) {
		var ranges []Range
		for i := range rapid.IntRange(1, 4).Draw(t, "ranges") {
			if rapid.IntRange(0, 4).Draw(t, fmt.Sprintf("v6 %d", i)) == 0 {
				lo := rapid.IntRange(0, 300).Draw(t, "v6 first")
				hi := lo + rapid.IntRange(0, 40).Draw(t, "v6 length")
				ranges = append(ranges, Range{netip.AddrFrom16([16]byte{0x20, 0x01, 0x0d, 0xb8, 14: byte(lo >> 8), 15: byte(lo)}),
					netip.AddrFrom16([16]byte{0x20, 0x01, 0x0d, 0xb8, 14: byte(hi >> 8), 15: byte(hi)})})
				continue
			}
			lo := rapid.Uint32Range(0, 1023).Draw(t, "first")
			hi := min(lo+rapid.Uint32Range(0, 700).Draw(t, "length"), 1023)
			base := uint32(u32(universe.First))
			ranges = append(ranges, Range{addrFrom32(base + lo), addrFrom32(base + hi)})
		}
		p := Pool{Name: "p", Ranges: ranges, AutoAssign: true, AvoidBuggyIPs: rapid.Bool().Draw(t, "avoid")}
		a := New()
		a.SetPools([]Pool{p})
		inPool := func(x netip.Addr) bool {
			return slices.ContainsFunc(ranges, func(r Range) bool { return r.Contains(x) })
		}
		givable := func(x netip.Addr) bool { return inPool(x) && !(p.AvoidBuggyIPs && buggy(x)) }

		held := map[netip.Addr]bool{}
		for i := range rapid.IntRange(0, 10).Draw(t, "restored") {
			x := addrFrom32(uint32(u32(universe.First)) + rapid.Uint32Range(0, 1100).Draw(t, "restored addr"))
			if held[x] {
				continue
			}
			if err := a.Restore(svc(fmt.Sprintf("r/%d", i)), Allocation{IPs: []netip.Addr{x}}); err != nil {
				t.Fatal(err)
			}
			held[x] = true
		}
		check := func(when string) {
			var capacity, allocated [7]int64
			count := func(x netip.Addr) {
				if givable(x) {
					capacity[FamilyOf(x)]++
					if held[x] {
						allocated[FamilyOf(x)]++
					}
				}
			}
			walk(Range{universe.First, ip("203.0.116.255")}, count)
			walk(Range{ip("2001:db8::"), ip("2001:db8::200")}, count)
			st, _ := a.PoolStats("p")
			for _, f := range []Family{IPv4, IPv6} {
				if st.Allocated[f] != allocated[f] || st.Available[f] != capacity[f]-allocated[f] {
					t.Fatalf("%s: %s allocated %d available %d; counted %d of %d", when, f, st.Allocated[f], st.Available[f], allocated[f], capacity[f])
				}
			}
		}
		check("after the restores")
		a.SetPools([]Pool{p})
		check("after a pool change")
		var mine []string
		for _, f := range []Family{IPv4, IPv6} {
			for i := range 1100 {
				key := fmt.Sprintf("ns/%s-%d", f, i)
				got, err := a.Assign(svc(key, withFamilies(SingleStack, f)))
				if errors.Is(err, ErrExhausted) {
					if st, _ := a.PoolStats("p"); st.Available[f] != 0 {
						t.Fatalf("%s exhausted with %d available", f, st.Available[f])
					}
					break
				}
				if err != nil {
					t.Fatal(err)
				}
				if !givable(got.IPs[0]) || held[got.IPs[0]] {
					t.Fatalf("gave %s: held or not givable", got.IPs[0])
				}
				held[got.IPs[0]] = true
				mine = append(mine, key)
			}
		}
		check("when full")
		for _, key := range mine {
			if rapid.Bool().Draw(t, "release") {
				al, _ := a.Get(key)
				a.Release(key)
				delete(held, al.IPs[0])
			}
		}
		check("after releases")
	})
}
