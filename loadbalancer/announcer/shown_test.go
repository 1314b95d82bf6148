package announcer

import (
	"net/netip"
	"slices"
	"testing"
)

// TestShownIndexesServicesAndTheirAddressesBothWays: a table of what Services show, in order,
// and after each: what it touched and who shows each address.
func TestShownIndexesServicesAndTheirAddressesBothWays(t *testing.T) {
	a, b, c := netip.MustParseAddr("203.0.113.1"), netip.MustParseAddr("203.0.113.2"), netip.MustParseAddr("2001:db8::1")
	type step struct {
		key     string
		now     []netip.Addr
		touched []netip.Addr
		showers map[netip.Addr][]string // who shows a, b, c after it
	}
	for _, tc := range []struct {
		name  string
		steps []step
	}{
		{"a Service gets an address, then loses it", []step{
			{"web/front", []netip.Addr{a}, []netip.Addr{a}, map[netip.Addr][]string{a: {"web/front"}}},
			{"web/front", nil, []netip.Addr{a}, map[netip.Addr][]string{}},
		}},
		{"two Services share an address; one leaves", []step{
			{"web/https", []netip.Addr{a}, []netip.Addr{a}, map[netip.Addr][]string{a: {"web/https"}}},
			{"web/http", []netip.Addr{a}, []netip.Addr{a}, map[netip.Addr][]string{a: {"web/http", "web/https"}}},
			{"web/https", nil, []netip.Addr{a}, map[netip.Addr][]string{a: {"web/http"}}},
		}},
		{"an address changed: both touched", []step{
			{"web/front", []netip.Addr{a, c}, []netip.Addr{a, c}, map[netip.Addr][]string{a: {"web/front"}, c: {"web/front"}}},
			{"web/front", []netip.Addr{b, c}, []netip.Addr{a, c, b}, map[netip.Addr][]string{b: {"web/front"}, c: {"web/front"}}},
		}},
		{"the same again touches its addresses (to plan them again), changes nothing", []step{
			{"web/front", []netip.Addr{a}, []netip.Addr{a}, map[netip.Addr][]string{a: {"web/front"}}},
			{"web/front", []netip.Addr{a}, []netip.Addr{a}, map[netip.Addr][]string{a: {"web/front"}}},
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			x := newShown()
			for i, st := range tc.steps {
				if got := x.set(st.key, st.now); !slices.Equal(got, st.touched) {
					t.Fatalf("step %d: touched %v, want %v", i, got, st.touched)
				}
				for _, ip := range []netip.Addr{a, b, c} {
					if got := x.services[ip]; !slices.Equal(got, st.showers[ip]) {
						t.Fatalf("step %d: %s shown by %v, want %v", i, ip, got, st.showers[ip])
					}
				}
				if len(st.now) > 0 && !slices.Equal(x.addrs[st.key], st.now) || len(st.now) == 0 && x.addrs[st.key] != nil {
					t.Fatalf("step %d: %s shows %v, want %v", i, st.key, x.addrs[st.key], st.now)
				}
			}
		})
	}
}
