package ipam

import (
	"fmt"
	"testing"
)

var benchKeys = func() []string {
	out := make([]string, 100_000)
	for i := range out {
		out[i] = fmt.Sprintf("ns%d/svc%d", i%50, i)
	}
	return out
}()

func benchPool(b *testing.B) Pool {
	r, err := ParseRange("10.20.0.0/16")
	if err != nil {
		b.Fatal(err)
	}
	return Pool{Name: "big", Ranges: []Range{r}, AutoAssign: true, AvoidBuggyIPs: true}
}

// BenchmarkAssign10000 allocates 10,000 Services from one /16 pool; the figure per op is the
// whole batch, per-Service cost is reported as ns/service.
func BenchmarkAssign10000(b *testing.B) {
	p := benchPool(b)
	for b.Loop() {
		a := New()
		a.SetPools([]Pool{p})
		for _, k := range benchKeys[:10_000] {
			if _, err := a.Assign(Service{Key: k, Families: []Family{IPv4}, Ports: []Port{{"TCP", 80}}}); err != nil {
				b.Fatal(err)
			}
		}
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/10_000, "ns/service")
}

// BenchmarkAssignWithHeld measures one more Service (assign then release) with n already held:
// the per-Service cost as the pool fills.
func BenchmarkAssignWithHeld(b *testing.B) {
	for _, n := range []int{1_000, 10_000, 50_000} {
		b.Run(fmt.Sprintf("held=%d", n), func(b *testing.B) {
			a := New()
			a.SetPools([]Pool{benchPool(b)})
			for _, k := range benchKeys[:n] {
				if _, err := a.Assign(Service{Key: k, Families: []Family{IPv4}}); err != nil {
					b.Fatal(err)
				}
			}
			// Free every tenth address so the pool is fragmented.
			for i := 0; i < n; i += 10 {
				a.Release(benchKeys[i])
			}
			s := Service{Key: "bench/one", Families: []Family{IPv4}}
			for b.Loop() {
				if _, err := a.Assign(s); err != nil {
					b.Fatal(err)
				}
				a.Release(s.Key)
			}
		})
	}
}

// BenchmarkRestore10000 rebuilds an allocator from 10,000 recorded Services, as after a restart.
func BenchmarkRestore10000(b *testing.B) {
	p := benchPool(b)
	a := New()
	a.SetPools([]Pool{p})
	type rec struct {
		s  Service
		al Allocation
	}
	var recs []rec
	for _, k := range benchKeys[:10_000] {
		s := Service{Key: k, Families: []Family{IPv4}}
		al, err := a.Assign(s)
		if err != nil {
			b.Fatal(err)
		}
		recs = append(recs, rec{s, al})
	}
	for b.Loop() {
		c := New()
		c.SetPools([]Pool{p})
		for _, r := range recs {
			if err := c.Restore(r.s, r.al); err != nil {
				b.Fatal(err)
			}
		}
	}
}

// BenchmarkSetPools10000Held recomputes the pools with 10,000 addresses held, as on a pool change.
func BenchmarkSetPools10000Held(b *testing.B) {
	p := benchPool(b)
	a := New()
	a.SetPools([]Pool{p})
	for _, k := range benchKeys[:10_000] {
		if _, err := a.Assign(Service{Key: k, Families: []Family{IPv4}}); err != nil {
			b.Fatal(err)
		}
	}
	for b.Loop() {
		a.SetPools([]Pool{p})
	}
}

// BenchmarkPoolSize measures what a pool's size must not change: a pool change (SetPools), one
// more Service (Assign, then Release) and the status figures (PoolStats), for pools from a /8
// to the whole IPv4 and IPv6 space with avoidBuggyIPs, 1,000 Services already held.
func BenchmarkPoolSize(b *testing.B) {
	for _, tc := range []struct {
		name, cidr string
		fam        Family
	}{
		{"v4-slash8", "10.0.0.0/8", IPv4},
		{"v4-slash0", "0.0.0.0/0", IPv4},
		{"v6-slash0", "::/0", IPv6},
	} {
		b.Run(tc.name, func(b *testing.B) {
			r, err := ParseRange(tc.cidr)
			if err != nil {
				b.Fatal(err)
			}
			p := Pool{Name: "big", Ranges: []Range{r}, AutoAssign: true, AvoidBuggyIPs: true}
			a := New()
			a.SetPools([]Pool{p})
			for _, k := range benchKeys[:1_000] {
				if _, err := a.Assign(Service{Key: k, Families: []Family{tc.fam}}); err != nil {
					b.Fatal(err)
				}
			}
			b.Run("SetPools", func(b *testing.B) {
				b.ReportAllocs()
				for b.Loop() {
					a.SetPools([]Pool{p})
				}
			})
			b.Run("Assign", func(b *testing.B) {
				b.ReportAllocs()
				s := Service{Key: "bench/one", Families: []Family{tc.fam}}
				for b.Loop() {
					if _, err := a.Assign(s); err != nil {
						b.Fatal(err)
					}
					a.Release(s.Key)
				}
			})
			b.Run("PoolStats", func(b *testing.B) {
				b.ReportAllocs()
				for b.Loop() {
					if st, ok := a.PoolStats(p.Name); !ok || st.Allocated[tc.fam] != 1_000 {
						b.Fatalf("stats %+v", st)
					}
				}
			})
		})
	}
}
