package ipam

import (
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"testing"

	"pgregory.net/rapid"
)

// The property tests drive an allocator with random pools, Services, releases, pool changes
// and restarts, and check after every step what must always hold.

var (
	propKeys    = []string{"ns1/a", "ns1/b", "ns1/c", "ns1/d", "ns2/e", "ns2/f", "ns2/g", "ns2/h", "ns3/i", "ns3/j"}
	propSharing = []string{"", "", "web", "dns"}
	propPorts   = []Port{{"TCP", 80}, {"TCP", 443}, {"UDP", 53}, {"TCP", 53}}
	// Small ranges, partly overlapping, so that exhaustion, sharing and overlaps all happen.
	propRanges = []string{
		"203.0.113.0/30", "203.0.113.2-203.0.113.5", "203.0.113.8/31", "203.0.113.255-203.0.114.1", "203.0.113.253-203.0.114.2",
		"2001:db8:100::/126", "2001:db8:100::2-2001:db8:100::4", "2001:db8:100::ff/128",
	}
)

func genPools(t *rapid.T) []Pool {
	n := rapid.IntRange(0, 3).Draw(t, "pools")
	var out []Pool
	for i := range n {
		rs := rapid.SliceOfNDistinct(rapid.SampledFrom(propRanges), 1, 3, rapid.ID).Draw(t, fmt.Sprintf("ranges%d", i))
		var ranges []Range
		for _, s := range rs {
			r, _ := ParseRange(s)
			ranges = append(ranges, r)
		}
		p := Pool{
			Name:          fmt.Sprintf("pool%d", i),
			Ranges:        ranges,
			AutoAssign:    rapid.Bool().Draw(t, "auto"),
			AvoidBuggyIPs: rapid.Bool().Draw(t, "buggy"),
			Order:         int64(rapid.IntRange(0, 5).Draw(t, "order")),
		}
		if rapid.Bool().Draw(t, "hasPriority") {
			v := int32(rapid.IntRange(0, 3).Draw(t, "priority"))
			p.Priority = &v
		}
		if rapid.IntRange(0, 3).Draw(t, "ns-limited") == 0 {
			p.Namespaces = []string{"ns1"}
		}
		out = append(out, p)
	}
	return out
}

func genService(t *rapid.T, key string) Service {
	s := svc(key)
	switch rapid.IntRange(0, 4).Draw(t, "families") {
	case 0:
		s.Families, s.Policy = []Family{IPv6}, SingleStack
	case 1:
		s.Families, s.Policy = []Family{IPv4, IPv6}, PreferDualStack
	case 2:
		s.Families, s.Policy = []Family{IPv6, IPv4}, RequireDualStack
	}
	s.SharingKey = rapid.SampledFrom(propSharing).Draw(t, "key")
	s.Ports = rapid.SliceOfNDistinct(rapid.SampledFrom(propPorts), 1, 2, func(p Port) string { return p.String() }).Draw(t, "ports")
	s.LocalTraffic = rapid.IntRange(0, 4).Draw(t, "local") == 0
	if rapid.IntRange(0, 4).Draw(t, "request") == 0 {
		r, _ := ParseRange(rapid.SampledFrom(propRanges).Draw(t, "reqRange"))
		s.IPs = []netip.Addr{r.First}
	}
	if rapid.IntRange(0, 5).Draw(t, "named") == 0 {
		s.Pool = fmt.Sprintf("pool%d", rapid.IntRange(0, 3).Draw(t, "poolname"))
	}
	return s
}

type propModel struct {
	a     *Allocator
	pools []Pool
	specs map[string]Service // the last spec assigned per key
	// current is each Service's spec now, whether or not assigning it succeeded.
	current map[string]Service
	// stale marks Services that kept a restored allocation their spec no longer wants
	// because assigning them failed: they keep it (never yanked), whatever their families.
	stale map[string]bool
	// failed marks Services whose last assign failed (they keep what they had, possibly at
	// odds with their spec).
	failed map[string]bool
	held   map[string]Allocation // what each Service holds, per the results
	// published is what each Service's status shows: the last result once "written".
	published map[string][]netip.Addr
	pubSpecs  map[string]Service // the spec under which published was obtained
	pubPools  map[string]string  // the pool recorded beside the status (metalvip.io/allocated-pool)
	// heldUnder is, per Service and address, the spec of the last successful assign that
	// gave the Service the address: the terms it holds it on while it lingers.
	heldUnder map[string]map[netip.Addr]Service
}

// publish records that key's status now shows its allocation.
func (m *propModel) publish(key string) {
	al := m.held[key]
	m.published[key] = slices.Clone(al.IPs)
	m.pubSpecs[key] = m.specs[key]
	m.pubPools[key] = al.Pool
	m.a.Published(key, al.IPs)
}

func (m *propModel) check(t *rapid.T) {
	// The allocator agrees with what it returned.
	for key, want := range m.held {
		got, ok := m.a.Get(key)
		if !ok || !slices.Equal(got.IPs, want.IPs) {
			t.Fatalf("%s: allocator says %v, results said %v", key, got, want)
		}
	}
	if m.a.Len() != len(m.held) {
		t.Fatalf("allocator holds %d Services, results %d", m.a.Len(), len(m.held))
	}
	// Whatever a status shows stays held by that Service until the status changes.
	for key, pub := range m.published {
		for _, ip := range pub {
			if !slices.Contains(m.a.Holders(ip), key) {
				t.Fatalf("%s's status shows %s, but the allocator lets it go (holders %v)", key, ip, m.a.Holders(ip))
			}
		}
	}
	// No address is held by two Services unless the sharing rules allow it.
	// A Service that gave an address up but whose status still shows it keeps it under the
	// spec it had then.
	users := map[netip.Addr][]string{}
	specOf := map[netip.Addr]map[string]Service{}
	for key, pub := range m.published {
		for _, ip := range pub {
			if !slices.Contains(m.held[key].IPs, ip) {
				users[ip] = append(users[ip], key)
				if specOf[ip] == nil {
					specOf[ip] = map[string]Service{}
				}
				specOf[ip][key] = m.heldUnder[key][ip]
			}
		}
	}
	for key, al := range m.held {
		fams := map[Family]bool{}
		for _, ip := range al.IPs {
			if fams[FamilyOf(ip)] {
				t.Fatalf("%s holds two %s addresses: %v", key, FamilyOf(ip), al.IPs)
			}
			fams[FamilyOf(ip)] = true
			users[ip] = append(users[ip], key)
		}
		s := m.specs[key]
		if m.stale[key] {
			continue
		}
		wanted, err := wantedFamilies(&s)
		if err != nil {
			t.Fatalf("%s holds %v under an invalid spec", key, al)
		}
		for f := range fams {
			if !slices.Contains(wanted, f) {
				t.Fatalf("%s holds a %s address; it wants %v", key, f, wanted)
			}
		}
		switch {
		case s.Policy == SingleStack && len(al.IPs) != 1:
			t.Fatalf("SingleStack %s holds %v", key, al.IPs)
		case s.Policy == RequireDualStack && len(al.IPs) != 2:
			t.Fatalf("RequireDualStack %s holds %v", key, al.IPs)
		}
	}
	for ip, keys := range users {
		if len(keys) < 2 {
			continue
		}
		slices.Sort(keys)
		ports := map[Port]string{}
		spec := func(k string) Service {
			if s, ok := specOf[ip][k]; ok {
				return s
			}
			return m.specs[k]
		}
		first := spec(keys[0])
		for _, k := range keys {
			s := spec(k)
			if s.SharingKey == "" || s.SharingKey != first.SharingKey || s.LocalTraffic != first.LocalTraffic {
				t.Fatalf("%s shared by %v against the rules (keys %q/%q, local %v/%v); held %v / %v, published %v / %v, lingering %v / %v", ip, keys, first.SharingKey, s.SharingKey, first.LocalTraffic, s.LocalTraffic,
					m.held[keys[0]], m.held[k], m.published[keys[0]], m.published[k], m.a.Lingering(keys[0]), m.a.Lingering(k))
			}
			for _, p := range s.Ports {
				if o, dup := ports[p]; dup {
					t.Fatalf("%s: port %s used by both %s and %s", ip, p, o, k)
				}
				ports[p] = k
			}
		}
	}
	// Held addresses are never free, and every pool's figures add up.
	for _, p := range m.a.pools {
		for f, fs := range p.free {
			fs.t.Ascend(func(r Range) bool {
				if r.Family() != f {
					t.Fatalf("pool %s: %s interval %v in the %s set", p.Name, r.Family(), r, f)
				}
				if p.AvoidBuggyIPs && f == IPv4 && (buggy(r.First) || buggy(r.Last)) {
					t.Fatalf("pool %s avoids .0 and .255, yet its free interval %v ends on one", p.Name, r)
				}
				return true
			})
			// An interval of a pool avoiding .0 and .255 may span such an address that a
			// Service holds (restored from its status): held means not free, not outside
			// every interval.
			for ip := range users {
				if fs.has(ip) {
					t.Fatalf("pool %s: held %s is free", p.Name, ip)
				}
			}
		}
		// The status figures match a count of every held address the pool could give.
		st, _ := m.a.PoolStats(p.Name)
		for _, f := range []Family{IPv4, IPv6} {
			var n int64
			for ip := range m.a.held {
				if FamilyOf(ip) == f && p.contains(ip) && !(p.AvoidBuggyIPs && buggy(ip)) {
					n++
				}
			}
			if st.Allocated[f] != n {
				t.Fatalf("pool %s: %d %s addresses allocated by its figures, %d by a count of the held ones", p.Name, st.Allocated[f], f, n)
			}
		}
		var orphans []netip.Addr
		for _, o := range st.Orphans {
			orphans = append(orphans, o.IP)
		}
		var want []netip.Addr
		for ip, h := range m.a.held {
			if h.pool == p.Name && !inSomePool(m.a, ip) {
				want = append(want, ip)
			}
		}
		slices.SortFunc(want, netip.Addr.Compare)
		if !slices.Equal(orphans, want) {
			t.Fatalf("pool %s reports orphans %v; held outside it after coming from it: %v", p.Name, orphans, want)
		}
	}
	// Every orphan (held where no valid pool holds it), of pools that exist or not, and nothing else.
	var got, want []string
	for _, o := range m.a.Orphans() {
		got = append(got, fmt.Sprintf("%s %s %v %v", o.IP, o.Pool, o.PoolDeleted, o.Services))
	}
	for ip, h := range m.a.held {
		_, exists := m.a.pools[h.pool]
		if h.pool != "" && !inSomePool(m.a, ip) {
			want = append(want, fmt.Sprintf("%s %s %v %v", ip, h.pool, !exists, sortedUsers(h)))
		}
	}
	slices.Sort(got)
	slices.Sort(want)
	if !slices.Equal(got, want) {
		t.Fatalf("orphans %v; held outside the pool they came from: %v", got, want)
	}
}

// inSomePool reports whether a valid pool's ranges (usable or shadowed) hold ip: then that pool
// governs a held address whose own pool is gone or shrank, and it is no orphan.
func inSomePool(a *Allocator, ip netip.Addr) bool {
	for _, p := range a.pools {
		if p.contains(ip) {
			return true
		}
	}
	return false
}

func TestAllocatorProperties(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		m := &propModel{a: New(), specs: map[string]Service{}, held: map[string]Allocation{}, published: map[string][]netip.Addr{}, pubSpecs: map[string]Service{}, pubPools: map[string]string{}, current: map[string]Service{}, heldUnder: map[string]map[netip.Addr]Service{}, stale: map[string]bool{}, failed: map[string]bool{}}
		m.pools = genPools(t)
		m.a.SetPools(m.pools)
		t.Repeat(map[string]func(*rapid.T){
			"assign": func(t *rapid.T) {
				key := rapid.SampledFrom(propKeys).Draw(t, "svc")
				s := genService(t, key)
				s.Published = m.published[key]
				m.current[key] = s
				before, had := m.held[key]
				got, err := m.a.Assign(s)
				if err != nil {
					var e *Error
					if !errors.As(err, &e) {
						t.Fatalf("error of an unknown kind: %v", err)
					}
					m.failed[key] = true
					// Failure leaves the Service with what it had.
					if had && !slices.Equal(got.IPs, before.IPs) {
						t.Fatalf("failed assign of %s changed %v to %v", key, before, got)
					}
					return
				}
				if len(got.IPs) == 0 {
					t.Fatalf("assign of %s succeeded with no address", key)
				}
				// A new address comes from a usable pool that holds it.
				p := m.a.pools[got.Pool]
				for _, ip := range got.IPs {
					if had && slices.Contains(before.IPs, ip) {
						continue
					}
					if p == nil || !p.usable() || !p.contains(ip) {
						t.Fatalf("%s got %s from pool %q, which cannot give it", key, ip, got.Pool)
					}
					if p.AvoidBuggyIPs && buggy(ip) && !slices.Contains(s.IPs, ip) {
						t.Fatalf("%s got avoided address %s", key, ip)
					}
				}
				if len(s.IPs) > 0 && !slices.Equal(sortedAddrs(got.IPs), sortedAddrs(s.IPs)) {
					t.Fatalf("%s requested %v, got %v", key, s.IPs, got.IPs)
				}
				m.specs[key] = s
				m.held[key] = got
				if m.heldUnder[key] == nil {
					m.heldUnder[key] = map[netip.Addr]Service{}
				}
				for _, ip := range got.IPs {
					m.heldUnder[key][ip] = s
				}
				delete(m.stale, key)
				delete(m.failed, key)
				if rapid.Bool().Draw(t, "status written") {
					m.publish(key)
				}
			},
			"withdraw": func(t *rapid.T) {
				// The Service stops being a LoadBalancer; its status is cleared later.
				key := rapid.SampledFrom(propKeys).Draw(t, "svc")
				m.a.Withdraw(key, m.published[key])
				delete(m.held, key)
				delete(m.specs, key)
				delete(m.current, key)
				delete(m.stale, key)
				delete(m.failed, key)
				if rapid.Bool().Draw(t, "status cleared") {
					m.a.Published(key, nil)
					delete(m.published, key)
					delete(m.pubSpecs, key)
					delete(m.pubPools, key)
				}
			},
			"status written": func(t *rapid.T) {
				key := rapid.SampledFrom(propKeys).Draw(t, "svc")
				if _, ok := m.held[key]; ok {
					m.publish(key)
				} else if _, ok := m.published[key]; ok {
					m.a.Published(key, nil)
					delete(m.published, key)
					delete(m.pubSpecs, key)
					delete(m.pubPools, key)
				}
			},
			"release": func(t *rapid.T) {
				key := rapid.SampledFrom(propKeys).Draw(t, "svc")
				m.a.Release(key)
				delete(m.held, key)
				delete(m.specs, key)
				delete(m.current, key)
				delete(m.stale, key)
				delete(m.failed, key)
				delete(m.published, key)
				delete(m.pubSpecs, key)
				delete(m.pubPools, key)
			},
			"change pools": func(t *rapid.T) {
				m.pools = genPools(t)
				m.a.SetPools(m.pools)
			},
			"restart": func(t *rapid.T) {
				// After a restart the Services (their current specs) and their statuses are
				// all there is. A new allocator rebuilt from them holds the same addresses,
				// and assigning every Service again moves none whose status still answers its
				// request. Only a Service caught mid-change may lose a contested address.
				b := New()
				b.SetPools(m.pools)
				keys := make([]string, 0, len(m.published))
				for k, pub := range m.published {
					// A withdrawn Service is no LoadBalancer any more: not restored.
					if _, ours := m.current[k]; len(pub) > 0 && ours {
						keys = append(keys, k)
					}
				}
				slices.Sort(keys)
				keys = rapid.Permutation(keys).Draw(t, "order")
				var recs []Record
				for _, k := range keys {
					s := m.current[k]
					s.Published = m.published[k]
					moving := !slices.Equal(m.published[k], m.held[k].IPs)
					recs = append(recs, Record{s, Allocation{Pool: m.pubPools[k], IPs: m.published[k]}, moving})
				}
				errs := b.Rebuild(recs)
				// A Service that could not move off a shared address it may no longer share
				// (its last assign failed) leaves a conflict that only age can settle.
				contested := map[string]bool{}
				// So can a Service whose status was not yet written when the controller stopped.
				for k, pub := range m.published {
					if !slices.Equal(pub, m.held[k].IPs) {
						contested[k] = true
					}
				}
				for f := range m.failed {
					for k, pub := range m.published {
						if k != f && slices.ContainsFunc(pub, func(ip netip.Addr) bool { return slices.Contains(m.published[f], ip) }) {
							contested[k] = true
						}
					}
				}
				m.held, m.specs, m.stale = map[string]Allocation{}, map[string]Service{}, map[string]bool{}
				var assigned []string
				for _, r := range recs {
					k, s := r.Service.Key, r.Service
					fits := b.Fits(s, r.Allocation)
					if al, ok := b.Get(k); ok && errs[k] == nil {
						// The pool as the rebuilt record has it: a recorded name is not
						// believed where it would give the address another pool's rules
						// (its pool shrank past it and another pool holds it now).
						fits = b.Fits(s, al)
					}
					if err := errs[k]; err != nil {
						if fits && !m.failed[k] && !contested[k] {
							t.Fatalf("rebuild refused %s, whose status %v answers its request: %v", k, r.Allocation, err)
						}
						continue
					}
					got, err := b.Assign(s)
					if err != nil {
						if fits && !m.failed[k] && !contested[k] {
							t.Fatalf("after restart %s: %v; its status shows %v", k, err, r.Allocation)
						}
						got, _ = b.Get(k)
						m.stale[k] = true
					}
					if fits && !m.failed[k] && !contested[k] {
						for _, ip := range r.Allocation.IPs {
							if !slices.Contains(got.IPs, ip) {
								t.Fatalf("after restart %s got %v; its status shows %v", k, got, r.Allocation)
							}
						}
					}
					if len(got.IPs) > 0 {
						m.held[k], m.specs[k] = got, s
						m.heldUnder[k] = map[netip.Addr]Service{}
						for _, ip := range got.IPs {
							m.heldUnder[k][ip] = s
						}
						assigned = append(assigned, k)
					}
				}
				m.a = b
				m.published, m.pubSpecs, m.pubPools = map[string][]netip.Addr{}, map[string]Service{}, map[string]string{}
				for _, k := range assigned {
					m.publish(k)
				}
				for k := range m.current {
					if _, ok := m.held[k]; !ok {
						delete(m.current, k)
					}
				}
			},
			"": m.check,
		})
	})
}

func sortedAddrs(a []netip.Addr) []netip.Addr {
	out := slices.Clone(a)
	slices.SortFunc(out, func(x, y netip.Addr) int { return x.Compare(y) })
	return out
}
