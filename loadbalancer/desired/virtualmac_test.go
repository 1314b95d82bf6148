package desired

import (
	"net/netip"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/metalvip/metalvip/api/v1alpha1"
	"github.com/metalvip/metalvip/loadbalancer/planner"
	"github.com/metalvip/metalvip/loadbalancer/pools"
)

func TestAnL2AnnouncementCarriesItsPoolsVirtualMAC(t *testing.T) {
	spec := func(vm *v1alpha1.VirtualMAC) *pools.Pool {
		return pools.DecodePool(&v1alpha1.IPPool{ObjectMeta: metav1.ObjectMeta{Name: "p"}, Spec: v1alpha1.IPPoolSpec{
			Addresses: []v1alpha1.AddressRange{"203.0.113.0/24"},
			Announce:  v1alpha1.Announce{Mode: v1alpha1.AnnounceL2, L2: &v1alpha1.L2Announce{VirtualMAC: vm}},
		}})
	}
	addr := netip.MustParseAddr("203.0.113.9")
	none := func(string) netip.Addr { return netip.Addr{} }
	for _, tc := range []struct {
		name string
		pool *pools.Pool
		want string
	}{
		{"a pool with virtualMAC gives the VIP's MAC", spec(&v1alpha1.VirtualMAC{Scheme: v1alpha1.VirtualMACLocal}), "02:00:cb:00:71:09"},
		{"a pool without gives none", spec(nil), ""},
		{"an address in no pool gets none", nil, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			an := Announcement(planner.Entry{Mode: planner.L2, Nodes: []string{"node1", "node2"}}, planner.VIP{Addr: addr, Mode: planner.L2}, tc.pool, nil, none, nil, nil)
			if got := an.GetL2().GetVirtualMac(); got != tc.want {
				t.Errorf("virtual_mac %q; want %q", got, tc.want)
			}
		})
	}
}
