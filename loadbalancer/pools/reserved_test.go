package pools

import (
	"net/netip"
	"strings"
	"testing"

	"github.com/metalvip/metalvip/api/v1alpha1"
)

// Issue 30, fault 7: a pool covering the control-plane VIP let a tenant ask for it and workers
// answer for the API endpoint. A reserved address is cut out of every pool that holds it: it
// is never given out, and a Service holding it already is announced from no node.
func TestAReservedAddressIsInNoPool(t *testing.T) {
	cp := netip.MustParseAddr("203.0.113.10")
	why := map[netip.Addr]string{cp: "the control-plane VIP"}
	wide := DecodePool(pool("wide", 2, v1alpha1.IPPoolSpec{Addresses: addrs("203.0.113.0/28", "2001:db8::/126")}))
	edge := DecodePool(pool("edge", 1, v1alpha1.IPPoolSpec{Addresses: addrs("203.0.113.10-203.0.113.12")}))
	only := DecodePool(pool("only", 0, v1alpha1.IPPoolSpec{Addresses: addrs("203.0.113.10/32")}))
	apart := DecodePool(pool("apart", 0, v1alpha1.IPPoolSpec{Addresses: addrs("203.0.113.64/28")}))
	out := WithReserved([]*Pool{wide, edge, only, apart}, why)
	for i, tc := range []struct {
		name   string
		ranges string
	}{
		{"wide", "[203.0.113.0-203.0.113.9 203.0.113.11-203.0.113.15 2001:db8::-2001:db8::3]"},
		{"edge", "[203.0.113.11-203.0.113.12]"},
		{"only", "[]"},
		{"apart", "[203.0.113.64-203.0.113.79]"},
	} {
		p := out[i]
		if p.Name != tc.name || rangesString(p) != tc.ranges {
			t.Errorf("%s: ranges %s; want %s", p.Name, rangesString(p), tc.ranges)
		}
		if reserved := len(p.Reserved) == 1 && p.Reserved[0] == (Reservation{cp, "the control-plane VIP"}); reserved != (tc.name != "apart") {
			t.Errorf("%s: Reserved %v", p.Name, p.Reserved)
		}
	}
	if apart != out[3] {
		t.Error("a pool without a reserved address was copied")
	}
	if rangesString(wide) != "[203.0.113.0-203.0.113.15 2001:db8::-2001:db8::3]" || len(wide.Reserved) != 0 {
		t.Errorf("the decoded pool was changed: %s %v", rangesString(wide), wide.Reserved)
	}
	set := NewSet(out, nil)
	if p := set.PoolOf(cp); p != nil {
		t.Errorf("PoolOf(the reserved address) = %s; want none (announced from no node)", p.Name)
	}
	if p := set.Governing("wide", cp); p != nil {
		t.Errorf("Governing(wide, the reserved address) = %s; want none", p.Name)
	}
	if p := set.PoolOf(netip.MustParseAddr("203.0.113.11")); p == nil || p.Name != "wide" {
		t.Errorf("PoolOf(203.0.113.11) = %v; want wide, the oldest pool holding it", p)
	}
}

func rangesString(p *Pool) string {
	var s []string
	for _, r := range p.Allocation.Ranges {
		s = append(s, r.String())
	}
	return "[" + strings.Join(s, " ") + "]"
}
