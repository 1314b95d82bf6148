package ipam

import (
	"cmp"
	"errors"
	"net/netip"
	"slices"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/labels"
)

func mustRanges(t testing.TB, ss ...string) []Range {
	t.Helper()
	var out []Range
	for _, s := range ss {
		r, err := ParseRange(s)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, r)
	}
	return out
}

func ip(s string) netip.Addr { return netip.MustParseAddr(s) }

func svc(key string, opts ...func(*Service)) Service {
	ns, _, _ := strings.Cut(key, "/")
	s := Service{Key: key, Namespace: ns, Families: []Family{IPv4}, Ports: []Port{{"TCP", 80}}}
	for _, o := range opts {
		o(&s)
	}
	return s
}

func withPool(p string) func(*Service) { return func(s *Service) { s.Pool = p } }
func withIPs(a ...string) func(*Service) {
	return func(s *Service) {
		for _, x := range a {
			s.IPs = append(s.IPs, ip(x))
		}
	}
}
func withKey(k string) func(*Service) { return func(s *Service) { s.SharingKey = k } }
func withPorts(ps ...Port) func(*Service) {
	return func(s *Service) { s.Ports = ps }
}
func withFamilies(p FamilyPolicy, fs ...Family) func(*Service) {
	return func(s *Service) { s.Policy, s.Families = p, fs }
}

func TestParseRange(t *testing.T) {
	for _, tc := range []struct {
		in, first, last, err string
	}{
		{in: "203.0.113.0/24", first: "203.0.113.0", last: "203.0.113.255"},
		{in: "203.0.113.7/32", first: "203.0.113.7", last: "203.0.113.7"},
		{in: "2001:db8:100::/120", first: "2001:db8:100::", last: "2001:db8:100::ff"},
		{in: "203.0.113.10-203.0.113.20", first: "203.0.113.10", last: "203.0.113.20"},
		{in: "0.0.0.0/0", first: "0.0.0.0", last: "255.255.255.255"},
		{in: "203.0.113.7/24", err: "write 203.0.113.0/24"},
		{in: "203.0.113.20-203.0.113.10", err: "reversed"},
		{in: "203.0.113.1-2001:db8::1", err: "different families"},
		{in: "203.0.113.0/33", err: "neither a CIDR nor a range"},
		{in: "::ffff:203.0.113.1/128", err: "IPv4-mapped"},
		{in: "x-y", err: "not an IP address"},
	} {
		r, err := ParseRange(tc.in)
		if tc.err != "" {
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("ParseRange(%q) = %v, %v; want an error with %q", tc.in, r, err, tc.err)
			}
			continue
		}
		if err != nil || r.First != ip(tc.first) || r.Last != ip(tc.last) {
			t.Errorf("ParseRange(%q) = %v, %v; want %s-%s", tc.in, r, err, tc.first, tc.last)
		}
	}
}

func TestCountBuggy(t *testing.T) {
	for _, tc := range []struct {
		r    string
		want int
	}{
		{"203.0.113.0/24", 2},
		{"203.0.112.0/23", 4},
		{"203.0.113.1-203.0.113.254", 0},
		{"203.0.113.255-203.0.114.0", 2},
		{"203.0.113.5-203.0.113.5", 0},
		{"10.0.0.0/16", 512},
	} {
		r := mustRanges(t, tc.r)[0]
		if got := countBuggy(r); got != tc.want {
			t.Errorf("countBuggy(%s) = %d, want %d", tc.r, got, tc.want)
		}
		// Cross-check by walking.
		n := 0
		for a := r.First; ; a = a.Next() {
			if buggy(a) {
				n++
			}
			if a == r.Last {
				break
			}
		}
		if n != tc.want {
			t.Errorf("walk of %s found %d buggy addresses, want %d", tc.r, n, tc.want)
		}
	}
}

func newAlloc(t testing.TB, pools ...Pool) *Allocator {
	t.Helper()
	a := New()
	a.SetPools(pools)
	return a
}

func TestAssignChoosesPoolsByRequestThenPriority(t *testing.T) {
	one := int32(1)
	five := int32(5)
	a := newAlloc(t,
		Pool{Name: "z-nopriority", Ranges: mustRanges(t, "203.0.113.0/30"), AutoAssign: true},
		Pool{Name: "b-five", Ranges: mustRanges(t, "203.0.113.8/30"), AutoAssign: true, Priority: &five},
		Pool{Name: "a-one", Ranges: mustRanges(t, "203.0.113.16/31"), AutoAssign: true, Priority: &one},
		Pool{Name: "manual", Ranges: mustRanges(t, "203.0.113.32/30"), AutoAssign: false},
	)
	want := []struct{ pool, ip string }{
		{"a-one", "203.0.113.16"}, {"a-one", "203.0.113.17"}, // lowest priority value first
		{"b-five", "203.0.113.8"}, {"b-five", "203.0.113.9"}, {"b-five", "203.0.113.10"}, {"b-five", "203.0.113.11"},
		{"z-nopriority", "203.0.113.0"}, // pools without a priority last
	}
	for i, w := range want {
		got, err := a.Assign(svc("ns/s" + string(rune('a'+i))))
		if err != nil || got.Pool != w.pool || got.IPs[0] != ip(w.ip) {
			t.Fatalf("service %d got %v, %v; want %s from %s", i, got, err, w.ip, w.pool)
		}
	}
	if got, err := a.Assign(svc("ns/manual", withPool("manual"))); err != nil || got.IPs[0] != ip("203.0.113.32") {
		t.Errorf("a Service naming the non-autoAssign pool got %v, %v", got, err)
	}
	if got, err := a.Assign(svc("ns/req", withIPs("203.0.113.34"))); err != nil || got.Pool != "manual" {
		t.Errorf("a Service requesting an address of the non-autoAssign pool got %v, %v", got, err)
	}
	_, err := a.Assign(svc("ns/missing", withPool("nope")))
	if !errors.Is(err, ErrNoPool) || !strings.Contains(err.Error(), `"nope"`) {
		t.Errorf("naming a missing pool: %v", err)
	}
	_, err = a.Assign(svc("ns/outside", withIPs("198.51.100.1")))
	if !errors.Is(err, ErrNoPool) || !strings.Contains(err.Error(), "198.51.100.1 is not in any IP pool") {
		t.Errorf("requesting an address outside every pool: %v", err)
	}
}

func TestAssignIsStickyAndReusesReleasedAddresses(t *testing.T) {
	a := newAlloc(t, Pool{Name: "p", Ranges: mustRanges(t, "203.0.113.0/29"), AutoAssign: true})
	first, _ := a.Assign(svc("ns/a"))
	second, _ := a.Assign(svc("ns/b"))
	again, err := a.Assign(svc("ns/a"))
	if err != nil || !slices.Equal(again.IPs, first.IPs) {
		t.Fatalf("reassign moved: %v -> %v (%v)", first, again, err)
	}
	a.Release("ns/a")
	third, _ := a.Assign(svc("ns/c"))
	if third.IPs[0] != first.IPs[0] || second.IPs[0] == first.IPs[0] {
		t.Errorf("released %s not reused: b %v, c %v", first.IPs[0], second, third)
	}
}

func TestExhaustedPoolAndRequestedAddressInUse(t *testing.T) {
	a := newAlloc(t, Pool{Name: "tiny", Ranges: mustRanges(t, "203.0.113.1-203.0.113.2"), AutoAssign: true})
	if _, err := a.Assign(svc("ns/a")); err != nil {
		t.Fatal(err)
	}
	if _, err := a.Assign(svc("ns/b")); err != nil {
		t.Fatal(err)
	}
	_, err := a.Assign(svc("ns/c"))
	if !errors.Is(err, ErrExhausted) || !strings.Contains(err.Error(), `"tiny" has no free IPv4 address`) {
		t.Errorf("exhausted: %v", err)
	}
	_, err = a.Assign(svc("other/d", withIPs("203.0.113.1")))
	var e *Error
	if !errors.Is(err, ErrInUse) || !errors.As(err, &e) || e.Holder != "ns/a" || !strings.Contains(err.Error(), "held by ns/a") {
		t.Errorf("requested address in use: %v", err)
	}
	a.Release("ns/b")
	if got, err := a.Assign(svc("ns/c")); err != nil || got.IPs[0] != ip("203.0.113.2") {
		t.Errorf("after a release the pending Service got %v, %v", got, err)
	}
}

func TestSharing(t *testing.T) {
	a := newAlloc(t, Pool{Name: "p", Ranges: mustRanges(t, "203.0.113.0/28"), AutoAssign: true})
	dnsTCP, err := a.Assign(svc("ns/dns-tcp", withKey("dns"), withPorts(Port{"TCP", 53})))
	if err != nil {
		t.Fatal(err)
	}
	dnsUDP, err := a.Assign(svc("ns/dns-udp", withKey("dns"), withPorts(Port{"UDP", 53})))
	if err != nil || dnsUDP.IPs[0] != dnsTCP.IPs[0] {
		t.Fatalf("same key, other protocol: %v, %v; want to share %v", dnsUDP, err, dnsTCP)
	}
	clash, err := a.Assign(svc("ns/dns-tcp2", withKey("dns"), withPorts(Port{"TCP", 53})))
	if err != nil || clash.IPs[0] == dnsTCP.IPs[0] {
		t.Errorf("a colliding port must get its own address when none is requested: %v, %v", clash, err)
	}
	_, err = a.Assign(svc("ns/dns-tcp3", withKey("dns"), withPorts(Port{"TCP", 53}), withIPs(dnsTCP.IPs[0].String())))
	if !errors.Is(err, ErrSharing) || !strings.Contains(err.Error(), "port TCP/53") || !strings.Contains(err.Error(), "ns/dns-tcp") {
		t.Errorf("requesting a shared address with a colliding port: %v", err)
	}
	_, err = a.Assign(svc("ns/nokey", withPorts(Port{"TCP", 99}), withIPs(dnsTCP.IPs[0].String())))
	if !errors.Is(err, ErrInUse) {
		t.Errorf("requesting a shared address without the key: %v", err)
	}
	local := svc("ns/local", withKey("dns"), withPorts(Port{"TCP", 853}), withIPs(dnsTCP.IPs[0].String()))
	local.LocalTraffic = true
	if _, err = a.Assign(local); !errors.Is(err, ErrSharing) || !strings.Contains(err.Error(), "externalTrafficPolicy") {
		t.Errorf("sharing across traffic policies: %v", err)
	}
	// The address stays while one sharer remains.
	a.Release("ns/dns-tcp")
	if got := a.Holders(dnsTCP.IPs[0]); !slices.Equal(got, []string{"ns/dns-udp"}) {
		t.Errorf("holders after one release = %v", got)
	}
}

// TestLocalSharersSelectTheSamePods: Services with traffic policy Local join an address only
// with the same selector (MetalLB's rule: only nodes running their pods announce it); a pair
// that shared before the rule existed keeps sharing across a restart, and its members their
// address.
func TestLocalSharersSelectTheSamePods(t *testing.T) {
	local := func(key, selector string, port int32, opts ...func(*Service)) Service {
		s := svc(key, append(opts, withKey("web"), withPorts(Port{"TCP", port}))...)
		s.LocalTraffic, s.Selector = true, selector
		return s
	}
	a := newAlloc(t, Pool{Name: "p", Ranges: mustRanges(t, "203.0.113.0/28"), AutoAssign: true})
	http, err := a.Assign(local("ns/http", "app=web", 80))
	if err != nil {
		t.Fatal(err)
	}
	if https, err := a.Assign(local("ns/https", "app=web", 443)); err != nil || https.IPs[0] != http.IPs[0] {
		t.Errorf("same selector: %v, %v; want to share %s", https, err, http.IPs[0])
	}
	if other, err := a.Assign(local("ns/other", "app=api", 8080)); err != nil || other.IPs[0] == http.IPs[0] {
		t.Errorf("another selector, no address requested: %v, %v; want an address of its own", other, err)
	}
	_, err = a.Assign(local("ns/asks", "app=api", 8443, withIPs(http.IPs[0].String())))
	if !errors.Is(err, ErrSharing) || !strings.Contains(err.Error(), `"app=web"`) || !strings.Contains(err.Error(), "select the same pods") {
		t.Errorf("another selector asking for the shared address: %v; want a sharing conflict naming the selector", err)
	}

	// Shared before the rule: restored from the statuses, both keep the address, and keep it
	// when assigned again.
	b := newAlloc(t, Pool{Name: "p", Ranges: mustRanges(t, "203.0.113.0/28"), AutoAssign: true})
	shared := Allocation{Pool: "p", IPs: []netip.Addr{ip("203.0.113.5")}}
	older, younger := local("ns/older", "app=web", 80), local("ns/younger", "app=api", 443)
	for _, s := range []Service{older, younger} {
		if err := b.Restore(s, shared); err != nil {
			t.Fatalf("restoring %s: %v", s.Key, err)
		}
	}
	for _, s := range []Service{older, younger} {
		if got, err := b.Assign(s); err != nil || got.IPs[0] != shared.IPs[0] {
			t.Errorf("%s after a restart: %v, %v; want to keep %s", s.Key, got, err, shared.IPs[0])
		}
	}
}

func TestDualStackPolicies(t *testing.T) {
	dual := Pool{Name: "dual", Ranges: mustRanges(t, "203.0.113.0/30", "2001:db8:100::/126"), AutoAssign: true}
	v4only := Pool{Name: "v4", Ranges: mustRanges(t, "198.51.100.0/30"), AutoAssign: true}
	a := newAlloc(t, dual)
	got, err := a.Assign(svc("ns/req", withFamilies(RequireDualStack, IPv6, IPv4)))
	if err != nil || len(got.IPs) != 2 || !got.IPs[0].Is6() || !got.IPs[1].Is4() {
		t.Errorf("RequireDualStack [IPv6 IPv4] = %v, %v; want IPv6 then IPv4", got, err)
	}
	got, err = a.Assign(svc("ns/single6", withFamilies(SingleStack, IPv6, IPv4)))
	if err != nil || len(got.IPs) != 1 || !got.IPs[0].Is6() {
		t.Errorf("SingleStack IPv6 = %v, %v", got, err)
	}

	b := newAlloc(t, v4only)
	got, err = b.Assign(svc("ns/prefer", withFamilies(PreferDualStack, IPv4, IPv6)))
	if err != nil || len(got.IPs) != 1 || !got.IPs[0].Is4() {
		t.Errorf("PreferDualStack from an IPv4-only pool = %v, %v; want one IPv4", got, err)
	}
	_, err = b.Assign(svc("ns/require", withFamilies(RequireDualStack, IPv4, IPv6)))
	if !errors.Is(err, ErrExhausted) || !strings.Contains(err.Error(), "no IPv6 addresses") {
		t.Errorf("RequireDualStack from an IPv4-only pool: %v", err)
	}
	_, err = b.Assign(svc("ns/wrongfam", withIPs("2001:db8:100::1")))
	if !errors.Is(err, ErrRequest) || !strings.Contains(err.Error(), "ipFamilies allow only IPv4") {
		t.Errorf("requesting an IPv6 address for an IPv4 Service: %v", err)
	}
	// The pool gains IPv6: the PreferDualStack Service gets it on its next sync, keeping its IPv4.
	held, _ := b.Get("ns/prefer")
	v4only.Ranges = mustRanges(t, "198.51.100.0/30", "2001:db8:100::/126")
	b.SetPools([]Pool{v4only})
	got, err = b.Assign(svc("ns/prefer", withFamilies(PreferDualStack, IPv4, IPv6)))
	if err != nil || len(got.IPs) != 2 || got.IPs[0] != held.IPs[0] {
		t.Errorf("PreferDualStack top-up = %v, %v; want %s plus an IPv6", got, err, held.IPs[0])
	}
}

func TestAvoidBuggyIPs(t *testing.T) {
	a := newAlloc(t, Pool{Name: "p", Ranges: mustRanges(t, "203.0.112.254-203.0.113.1"), AutoAssign: true, AvoidBuggyIPs: true})
	var got []netip.Addr
	for i := range 3 {
		al, err := a.Assign(svc("ns/s" + string(rune('0'+i))))
		if err != nil {
			break
		}
		got = append(got, al.IPs[0])
	}
	if want := []netip.Addr{ip("203.0.112.254"), ip("203.0.113.1")}; !slices.Equal(got, want) {
		t.Errorf("allocated %v, want %v (skipping .255 and .0)", got, want)
	}
	st, _ := a.PoolStats("p")
	if st.Allocated[IPv4] != 2 || st.Available[IPv4] != 0 {
		t.Errorf("stats %+v; want 2 allocated, 0 available", st)
	}
}

func TestPoolChangesNeverTakeAddresses(t *testing.T) {
	p := Pool{Name: "p", Ranges: mustRanges(t, "203.0.113.0/29"), AutoAssign: true}
	a := newAlloc(t, p)
	held, _ := a.Assign(svc("ns/a"))
	p.Ranges = mustRanges(t, "203.0.113.8/29")
	rep := a.SetPools([]Pool{p})
	if len(rep.Orphans) != 1 || rep.Orphans[0].IP != held.IPs[0] || rep.Orphans[0].PoolDeleted {
		t.Errorf("shrunk pool report = %+v", rep)
	}
	if got, err := a.Assign(svc("ns/a")); err != nil || !slices.Equal(got.IPs, held.IPs) {
		t.Errorf("after the pool shrank the Service got %v, %v; want to keep %v", got, err, held)
	}
	rep = a.SetPools(nil)
	if len(rep.Orphans) != 1 || !rep.Orphans[0].PoolDeleted {
		t.Errorf("deleted pool report = %+v", rep)
	}
	if got, err := a.Assign(svc("ns/a")); err != nil || !slices.Equal(got.IPs, held.IPs) {
		t.Errorf("after the pool went the Service got %v, %v; want to keep %v", got, err, held)
	}
	// A new pool covering the address must not give it out again.
	a.SetPools([]Pool{{Name: "q", Ranges: mustRanges(t, "203.0.113.0/30"), AutoAssign: true}})
	for i := range 3 {
		got, err := a.Assign(svc("ns/n" + string(rune('0'+i))))
		if err != nil || got.IPs[0] == held.IPs[0] {
			t.Fatalf("new pool gave %v, %v; %s is held", got, err, held.IPs[0])
		}
	}
}

func TestOverlappingPoolsTheOlderWins(t *testing.T) {
	a := New()
	a.SetPools([]Pool{
		{Name: "young", Ranges: mustRanges(t, "203.0.113.4/30"), AutoAssign: true, Order: 2},
		{Name: "old", Ranges: mustRanges(t, "203.0.113.0/29"), AutoAssign: true, Order: 1},
	})
	st, _ := a.PoolStats("young")
	if st.Usable || st.ShadowedBy != "old" {
		t.Errorf("young pool stats %+v; want unusable, shadowed by old", st)
	}
	st, _ = a.PoolStats("old")
	if !st.Usable || !slices.Equal(st.Overlaps, []string{"young"}) {
		t.Errorf("old pool stats %+v; want usable, overlapping young", st)
	}
	_, err := a.Assign(svc("ns/a", withPool("young")))
	if !errors.Is(err, ErrPoolUnusable) || !strings.Contains(err.Error(), `older pool "old"`) {
		t.Errorf("naming the shadowed pool: %v", err)
	}
}

func TestSelectorsLimitServices(t *testing.T) {
	sel, _ := labels.Parse("tier=edge")
	a := newAlloc(t, Pool{Name: "edge", Ranges: mustRanges(t, "203.0.113.0/30"), AutoAssign: true,
		Namespaces: []string{"web"}, ServiceSelector: sel})
	if _, err := a.Assign(svc("other/a", func(s *Service) { s.Labels = map[string]string{"tier": "edge"} })); !errors.Is(err, ErrNoPool) {
		t.Errorf("wrong namespace: %v", err)
	}
	if _, err := a.Assign(svc("web/a")); !errors.Is(err, ErrNoPool) {
		t.Errorf("missing label: %v", err)
	}
	if _, err := a.Assign(svc("web/a", func(s *Service) { s.Labels = map[string]string{"tier": "edge"} })); err != nil {
		t.Errorf("admitted Service refused: %v", err)
	}
	if _, err := a.Assign(svc("web/b", withIPs("203.0.113.2"))); !errors.Is(err, ErrNotAdmitted) {
		t.Errorf("requesting an address of a pool that does not admit the Service: %v", err)
	}
}

func TestRestoreKeepsTheOlderOfTwoClaims(t *testing.T) {
	a := newAlloc(t, Pool{Name: "p", Ranges: mustRanges(t, "203.0.113.0/29"), AutoAssign: true})
	if err := a.Restore(svc("ns/old"), Allocation{Pool: "p", IPs: []netip.Addr{ip("203.0.113.3")}}); err != nil {
		t.Fatal(err)
	}
	err := a.Restore(svc("ns/young"), Allocation{Pool: "p", IPs: []netip.Addr{ip("203.0.113.3")}})
	if !errors.Is(err, ErrConflict) || !strings.Contains(err.Error(), "ns/old") {
		t.Errorf("conflicting restore: %v", err)
	}
	got, err := a.Assign(svc("ns/young"))
	if err != nil || got.IPs[0] == ip("203.0.113.3") {
		t.Errorf("the younger claimant got %v, %v", got, err)
	}
	if got, _ := a.Assign(svc("ns/old")); got.IPs[0] != ip("203.0.113.3") {
		t.Errorf("the older claimant moved to %v", got)
	}
	// A restored address outside every pool stays held.
	if err := a.Restore(svc("ns/far"), Allocation{IPs: []netip.Addr{ip("198.51.100.77")}}); err != nil {
		t.Fatal(err)
	}
	if got, err := a.Assign(svc("ns/far")); err != nil || got.IPs[0] != ip("198.51.100.77") {
		t.Errorf("an address outside the pools moved: %v, %v", got, err)
	}
}

func TestRequestChangeMovesOnlyWhenTheNewAddressIsFree(t *testing.T) {
	a := newAlloc(t, Pool{Name: "p", Ranges: mustRanges(t, "203.0.113.0/29"), AutoAssign: true})
	a.Assign(svc("ns/a"))            // .0
	held, _ := a.Assign(svc("ns/b")) // .1
	got, err := a.Assign(svc("ns/b", withIPs("203.0.113.0")))
	if !errors.Is(err, ErrInUse) || !slices.Equal(got.IPs, held.IPs) {
		t.Errorf("asking for a taken address: %v, %v; want to keep %v", got, err, held)
	}
	got, err = a.Assign(svc("ns/b", withIPs("203.0.113.5")))
	if err != nil || got.IPs[0] != ip("203.0.113.5") {
		t.Errorf("asking for a free address: %v, %v", got, err)
	}
	if got, _ := a.Assign(svc("ns/c")); got.IPs[0] != held.IPs[0] {
		t.Errorf("the address left behind was not freed: next Service got %v", got)
	}
}

func withCount(n int) func(*Service) { return func(s *Service) { s.Count = n } }

func TestSeveralAddressesPerFamily(t *testing.T) {
	a := newAlloc(t, Pool{Name: "p", Ranges: mustRanges(t, "203.0.113.0/29", "2001:db8:100::/125"), AutoAssign: true, AvoidBuggyIPs: true})
	one, _ := a.Assign(svc("ns/one"))
	got, err := a.Assign(svc("ns/three", withCount(3), withFamilies(RequireDualStack, IPv6, IPv4)))
	want := []netip.Addr{ip("2001:db8:100::"), ip("2001:db8:100::1"), ip("2001:db8:100::2"), ip("203.0.113.2"), ip("203.0.113.3"), ip("203.0.113.4")}
	if err != nil || !slices.Equal(got.IPs, want) {
		t.Fatalf("three per family = %v, %v; want %v (after %v)", got, err, want, one)
	}
	// Sticky, also when the count goes down (the lowest stay) and up again (topped up).
	if again, err := a.Assign(svc("ns/three", withCount(3), withFamilies(RequireDualStack, IPv6, IPv4))); err != nil || !slices.Equal(again.IPs, want) {
		t.Errorf("reassign moved: %v, %v", again, err)
	}
	two, err := a.Assign(svc("ns/three", withCount(2), withFamilies(RequireDualStack, IPv6, IPv4)))
	if err != nil || !slices.Equal(two.IPs, []netip.Addr{want[0], want[1], want[3], want[4]}) {
		t.Errorf("down to two = %v, %v", two, err)
	}
	four, err := a.Assign(svc("ns/three", withCount(4), withFamilies(SingleStack, IPv4)))
	if err != nil || len(four.IPs) != 4 || four.IPs[0] != want[3] || four.IPs[1] != want[4] {
		t.Errorf("IPv4 only, four = %v, %v; want %s and %s kept", four, err, want[3], want[4])
	}
	// Not enough left: pending, holding what it had.
	_, err = a.Assign(svc("ns/many", withCount(5)))
	if !errors.Is(err, ErrExhausted) || !strings.Contains(err.Error(), "fewer than 5 free IPv4 addresses") {
		t.Errorf("exhausted: %v", err)
	}
	if held, ok := a.Get("ns/many"); ok && len(held.IPs) > 0 {
		t.Errorf("a Service that could not get all its addresses holds %v", held)
	}
	// Several addresses exclude requested addresses and sharing.
	for _, s := range []Service{svc("ns/x", withCount(2), withIPs("203.0.113.6")), svc("ns/y", withCount(2), withKey("k"))} {
		if _, err := a.Assign(s); !errors.Is(err, ErrRequest) {
			t.Errorf("%s: %v; want a request error", s.Key, err)
		}
	}
	// A restart restores them.
	b := newAlloc(t, Pool{Name: "p", Ranges: mustRanges(t, "203.0.113.0/29", "2001:db8:100::/125"), AutoAssign: true, AvoidBuggyIPs: true})
	s := svc("ns/three", withCount(4), withFamilies(SingleStack, IPv4))
	if errs := b.Rebuild([]Record{{Service: s, Allocation: four}}); len(errs) != 0 {
		t.Fatal(errs)
	}
	if again, err := b.Assign(s); err != nil || !slices.Equal(again.IPs, four.IPs) {
		t.Errorf("after a restart %v, %v; want %v", again, err, four)
	}
}

// TestARestoredPoolNameIsAClaimCheckedAgainstThePools: after a restart the pool an address was
// given from comes from an annotation anyone who may edit the Service can write. It is the
// record only where it cannot give the address another pool's rules: a name of a pool that
// does not hold the address (valid, gone or invalid) is ignored where a valid pool holds it, so
// a tenant can neither pick which pool's rules announce their address nor make it an orphan
// announced from no node. Only an address no valid pool holds keeps the name it shows.
func TestARestoredPoolNameIsAClaimCheckedAgainstThePools(t *testing.T) {
	a := newAlloc(t,
		Pool{Name: "l2", Order: 1, Ranges: mustRanges(t, "203.0.113.0/28"), AutoAssign: true},
		Pool{Name: "bgp", Order: 2, Ranges: mustRanges(t, "203.0.113.64/28"), AutoAssign: true},
		Pool{Name: "wide", Order: 3, Ranges: mustRanges(t, "203.0.113.0/27")}, // overlaps l2: shadowed
	)
	for _, tc := range []struct {
		name, key, claim, addr, want string
		record                       string // the pool the record keeps, when not want
	}{
		{"the pool holding the address", "ns/a", "l2", "203.0.113.1", "l2", ""},
		{"another pool's name is ignored", "ns/b", "bgp", "203.0.113.2", "l2", ""},
		{"no name", "ns/c", "", "203.0.113.3", "l2", ""},
		{"of overlapping pools, the one named when it holds the address", "ns/d", "wide", "203.0.113.4", "wide", ""},
		{"a shadowed pool keeps what only it holds", "ns/e", "bgp", "203.0.113.20", "wide", ""},
		{"an address in no valid pool keeps the name of a pool that is gone", "ns/f", "deleted", "198.51.100.7", "deleted", ""},
		{"but not one a valid pool holds: that pool's rules, not an orphan", "ns/h", "deleted", "203.0.113.5", "l2", "deleted"},
		{"and the name of a pool that shrank: no valid pool holds the address", "ns/g", "bgp", "198.51.100.8", "bgp", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if err := a.Restore(svc(tc.key), Allocation{Pool: tc.claim, IPs: []netip.Addr{ip(tc.addr)}}); err != nil {
				t.Fatal(err)
			}
			record := cmp.Or(tc.record, tc.want)
			if got, _ := a.Get(tc.key); got.Pool != record {
				t.Errorf("restored with pool %q, want %q", got.Pool, record)
			}
			if got, held := a.PoolOf(ip(tc.addr)); got != record || !held {
				t.Errorf("PoolOf(%s) = %q, %v; want %q, held", tc.addr, got, held, record)
			}
			gov := tc.want
			if strings.HasPrefix(tc.addr, "198.51.100.") {
				gov = "" // no pool holds it: announced from no node
			}
			if got := governs(a, ip(tc.addr)); got != gov {
				t.Errorf("governed by %q, want %q", got, gov)
			}
		})
	}
	if got, held := a.PoolOf(ip("203.0.113.70")); got != "bgp" || held {
		t.Errorf("PoolOf a free address = %q, %v; want the pool holding it, not held", got, held)
	}
}

// TestAnAddressWhosePoolIsGoneIsGovernedByThePoolHoldingIt: the pool whose rules announce a held
// address is one answer, the same while the CCM runs as after it restarts. When the pool an
// address came from is deleted or shrinks and a valid pool holds the address (an overlapping
// pool it shadowed), that pool's rules govern it; only an address no valid pool holds is an
// orphan, announced from no node. The soak's seed 8: a tenant wrote the name of the BGP pool
// on its L2 address while the BGP pool was deleted and the CCM restarted; the address stayed
// dark after the BGP pool came back.
func TestAnAddressWhosePoolIsGoneIsGovernedByThePoolHoldingIt(t *testing.T) {
	l2 := Pool{Name: "l2", Order: 1, Ranges: mustRanges(t, "203.0.113.0/28"), AutoAssign: true}
	bgp := Pool{Name: "bgp", Order: 2, Ranges: mustRanges(t, "203.0.113.64/28"), AutoAssign: true}
	wide := Pool{Name: "wide", Order: 3, Ranges: mustRanges(t, "203.0.113.0/27")} // shadowed by l2
	a := newAlloc(t, l2, wide)
	held, err := a.Assign(svc("ns/a", withPool("l2")))
	if err != nil {
		t.Fatal(err)
	}
	addr := held.IPs[0]
	if got := governs(a, addr); got != "l2" {
		t.Fatalf("%s governed by %q, want l2", addr, got)
	}
	// Deleting l2 leaves wide, which holds the address: wide governs it, live.
	rep := a.SetPools([]Pool{wide})
	if got := governs(a, addr); got != "wide" {
		t.Errorf("l2 deleted: %s governed by %q, want wide (the valid pool holding it)", addr, got)
	}
	if len(rep.Orphans) != 0 {
		t.Errorf("l2 deleted: orphans %v; want none, wide holds the address", rep.Orphans)
	}
	// Still held by the Service that asked for l2: a pool change takes no address.
	if again, err := a.Assign(svc("ns/a", withPool("l2"))); !slices.Equal(again.IPs, held.IPs) {
		t.Errorf("after l2 went: %v, %v; want the Service to keep %v", again, err, held.IPs)
	}
	// And none holds it: an orphan of the pool it came from.
	rep = a.SetPools([]Pool{bgp})
	if got := governs(a, addr); got != "" {
		t.Errorf("no pool holds it: %s governed by %q, want none (an orphan, announced from no node)", addr, got)
	}
	if len(rep.Orphans) != 1 || rep.Orphans[0].Pool != "l2" || !rep.Orphans[0].PoolDeleted {
		t.Errorf("no pool holds it: orphans %v; want the address, of deleted pool l2", rep.Orphans)
	}
	// A CCM restart while the BGP pool is deleted, the Service's record forged to name it.
	b := newAlloc(t, l2)
	if errs := b.Rebuild([]Record{{Service: svc("ns/t"), Allocation: Allocation{Pool: "bgp", IPs: []netip.Addr{ip("203.0.113.1")}}}}); len(errs) != 0 {
		t.Fatal(errs)
	}
	b.SetPools([]Pool{l2, bgp}) // the BGP pool back
	if got := governs(b, ip("203.0.113.1")); got != "l2" {
		t.Errorf("a forged record of a deleted pool: governed by %q after the pool came back, want l2", got)
	}
	if o := b.Orphans(); len(o) != 0 {
		t.Errorf("a forged record of a deleted pool: orphans %v; want none", o)
	}
}

// governs is the pool whose rules announce an address, as the announcer derives it: the
// allocator's record through the pools' Index; "" when none.
func governs(a *Allocator, addr netip.Addr) string {
	from, _ := a.PoolOf(addr)
	name, _ := a.Index().Governing(from, addr)
	return name
}
