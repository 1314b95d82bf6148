package desired

import (
	"slices"
	"strings"
	"testing"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/metalvip/metalvip/api/v1alpha1"
	"github.com/metalvip/metalvip/loadbalancer/pools"
)

func TestServiceCommunitiesAreThoseThePoolAllows(t *testing.T) {
	bgpPool := pools.DecodePool(&v1alpha1.IPPool{ObjectMeta: metav1.ObjectMeta{Name: "edge"}, Spec: v1alpha1.IPPoolSpec{
		Addresses: []v1alpha1.AddressRange{"203.0.113.0/28"},
		Announce: v1alpha1.Announce{Mode: v1alpha1.AnnounceBGP, BGP: &v1alpha1.BGPAnnounce{
			Communities: []string{"64496:1"}, ServiceCommunities: []string{"64496:200", "64496:300"}}},
	}})
	l2Pool := pools.DecodePool(&v1alpha1.IPPool{ObjectMeta: metav1.ObjectMeta{Name: "lan"}, Spec: v1alpha1.IPPoolSpec{
		Addresses: []v1alpha1.AddressRange{"203.0.113.16/28"}}})
	svc := func(v string) *v1.Service {
		s := &v1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "s"}}
		if v != "" {
			s.Annotations = map[string]string{"metalvip.io/bgp-communities": v}
		}
		return s
	}
	for _, tc := range []struct {
		name       string
		annotation string
		pool       *pools.Pool
		granted    []string
		refused    string // a part of the reason; "" for none
	}{
		{"no annotation asks for nothing", "", bgpPool, nil, ""},
		{"allowed communities are granted, sorted and once", " 64496:300,64496:200 ,64496:300,", bgpPool, []string{"64496:200", "64496:300"}, ""},
		{"one the pool does not list is refused alone", "64496:200,64496:999", bgpPool, []string{"64496:200"},
			"64496:999: IPPool edge does not list it in announce.bgp.serviceCommunities"},
		{"the pool's own community is not the Service's to add", "64496:1", bgpPool, nil, "64496:1: IPPool edge does not list it"},
		{"a malformed one is refused with its reason", "64496:65536,no-export", bgpPool, nil, "65536 is above 65535"},
		{"an L2 pool grants none", "64496:200", l2Pool, nil, "IPPool lan announces by L2"},
		{"an address without a pool grants none", "64496:200", nil, nil, "the address has no pool"},
		{"a flood of refused ones is named in part", strings.Repeat("1:1,", 10000) + "64496:200", bgpPool, []string{"64496:200"}, "; and 9995 more"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			granted, refused := ServiceCommunities(svc(tc.annotation), tc.pool)
			if !slices.Equal(granted, tc.granted) {
				t.Errorf("granted %q, want %q", granted, tc.granted)
			}
			if tc.refused == "" && refused != "" || !strings.Contains(refused, tc.refused) || len(refused) > 1000 {
				t.Errorf("refused %q, want one with %q", refused, tc.refused)
			}
		})
	}
}
