package announcer

import (
	"net/netip"
	"slices"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/metalvip/metalvip/api/v1alpha1"
	"github.com/metalvip/metalvip/loadbalancer/pools"
)

// records is the allocator's record as a table: address -> pool name.
type records map[netip.Addr]string

func (r records) PoolOf(ip netip.Addr) (string, bool) { n, ok := r[ip]; return n, ok }
func (records) Ready() <-chan struct{}                { return nil }

func testPool(name string, age int, addrs ...v1alpha1.AddressRange) *pools.Pool {
	created := metav1.NewTime(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC).Add(-time.Duration(age) * time.Hour))
	return pools.DecodePool(&v1alpha1.IPPool{ObjectMeta: metav1.ObjectMeta{Name: name, CreationTimestamp: created}, Spec: v1alpha1.IPPoolSpec{Addresses: addrs}})
}

// TestAnAddressesPoolIsTheAllocatorsRecord: which pool's rules announce an address, from the
// allocator's record alone (a Service's annotations are not an input), without the rest of
// the announcer.
func TestAnAddressesPoolIsTheAllocatorsRecord(t *testing.T) {
	ip := netip.MustParseAddr("203.0.113.5")
	// old and wide overlap on ip; old is older, so it is the usable pool of the range.
	old, wide, other := testPool("old", 2, "203.0.113.0/28"), testPool("wide", 1, "203.0.113.0/24"), testPool("other", 1, "198.51.100.0/28")
	set := pools.NewSet([]*pools.Pool{old, wide, other}, nil)
	for _, tc := range []struct {
		name    string
		records Records
		want    *pools.Pool
	}{
		{"no allocator: the pool whose ranges hold it", nil, old},
		{"not held (an externalIP): the pool whose ranges hold it", records{}, old},
		{"held from the younger overlapping pool: that pool", records{ip: "wide"}, wide},
		{"held from a pool that no longer holds it: the valid pool holding it", records{ip: "other"}, old},
		{"held from a pool that is gone: the valid pool holding it", records{ip: "gone"}, old},
	} {
		t.Run(tc.name, func(t *testing.T) {
			x := newAddrPools(tc.records)
			if got := x.resolve(set, ip); got != tc.want {
				t.Errorf("pool %v, want %v", name(got), name(tc.want))
			}
		})
	}
	t.Run("held, and no pool holds it: none (announced from no node)", func(t *testing.T) {
		x := newAddrPools(records{ip: "other"})
		if got := x.resolve(pools.NewSet([]*pools.Pool{other}, nil), ip); got != nil {
			t.Errorf("pool %s, want none", got.Name)
		}
	})
}

// TestAPoolChangeReplansTheAddressesItConcerns: after a change of the pools, the shown
// addresses planned again are those whose pool is another now or whose pool's spec changed.
func TestAPoolChangeReplansTheAddressesItConcerns(t *testing.T) {
	a, b, c := netip.MustParseAddr("203.0.113.1"), netip.MustParseAddr("203.0.113.20"), netip.MustParseAddr("198.51.100.1")
	low, high, other := testPool("low", 2, "203.0.113.0/28"), testPool("high", 3, "203.0.113.16/28"), testPool("other", 2, "198.51.100.0/28")
	wideLow := testPool("low", 2, "203.0.113.0/27") // low, its spec changed to hold b too
	shown := map[netip.Addr][]string{a: {"ns/a"}, b: {"ns/b"}, c: {"ns/c"}}
	for _, tc := range []struct {
		name    string
		planned map[netip.Addr]*pools.Pool
		set     []*pools.Pool
		changed []string
		want    []netip.Addr
	}{
		{"nothing changed", map[netip.Addr]*pools.Pool{a: low, b: high, c: other}, []*pools.Pool{low, high, other}, nil, nil},
		{"a pool's spec changed: its addresses", map[netip.Addr]*pools.Pool{a: low, b: high, c: other}, []*pools.Pool{low, high, other}, []string{"high"}, []netip.Addr{b}},
		{"a pool deleted: its addresses (now none)", map[netip.Addr]*pools.Pool{a: low, b: high, c: other}, []*pools.Pool{low, high}, []string{"other"}, []netip.Addr{c}},
		{"a pool created over addresses of none", map[netip.Addr]*pools.Pool{a: low, b: high}, []*pools.Pool{low, high, other}, []string{"other"}, []netip.Addr{c}},
		{"a pool widened over an older one's address: that address keeps its pool, the widened one's are planned again",
			map[netip.Addr]*pools.Pool{a: low, b: high, c: other}, []*pools.Pool{wideLow, high, other}, []string{"low"}, []netip.Addr{a}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			x := newAddrPools(nil)
			for ip, p := range tc.planned {
				x.plan(ip, p)
			}
			changed := map[string]bool{}
			for _, n := range tc.changed {
				changed[n] = true
			}
			got := x.replan(pools.NewSet(tc.set, nil), shown, changed)
			slices.SortFunc(got, netip.Addr.Compare)
			if !slices.Equal(got, tc.want) {
				t.Errorf("planned again %v, want %v", got, tc.want)
			}
		})
	}
	t.Run("an address planned with no pool is forgotten", func(t *testing.T) {
		x := newAddrPools(nil)
		x.plan(a, low)
		x.plan(a, nil)
		if p := x.of(a); p != nil {
			t.Errorf("planned with %s, want none", p.Name)
		}
	})
}

func name(p *pools.Pool) string {
	if p == nil {
		return "none"
	}
	return p.Name
}
