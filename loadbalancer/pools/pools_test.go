package pools

import (
	"net/netip"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/metalvip/metalvip/api/v1alpha1"
	"github.com/metalvip/metalvip/loadbalancer/planner"
)

func pool(name string, age time.Duration, spec v1alpha1.IPPoolSpec) *v1alpha1.IPPool {
	return &v1alpha1.IPPool{
		ObjectMeta: metav1.ObjectMeta{Name: name, Generation: 1, CreationTimestamp: metav1.NewTime(time.Unix(1e9, 0).Add(-age))},
		Spec:       spec,
	}
}

func addrs(s ...string) []v1alpha1.AddressRange {
	var out []v1alpha1.AddressRange
	for _, a := range s {
		out = append(out, v1alpha1.AddressRange(a))
	}
	return out
}

func TestAPoolWithASelectorTheParserRefusesFailsClosed(t *testing.T) {
	bad := &v1alpha1.LabelSelector{MatchExpressions: []v1alpha1.LabelSelectorRequirement{{Key: "rack", Operator: metav1.LabelSelectorOpIn}}}
	for _, tc := range []struct {
		name  string
		spec  v1alpha1.IPPoolSpec
		field string
	}{
		{"an In with no values in announce.nodeSelector", v1alpha1.IPPoolSpec{Addresses: addrs("203.0.113.0/28"), Announce: v1alpha1.Announce{Mode: v1alpha1.AnnounceL2, NodeSelector: bad}}, "spec.announce.nodeSelector"},
		{"the same in preferredNodeSelector", v1alpha1.IPPoolSpec{Addresses: addrs("203.0.113.0/28"), Announce: v1alpha1.Announce{PreferredNodeSelector: bad}}, "spec.announce.preferredNodeSelector"},
		{"the same in serviceAllocation.serviceSelector", v1alpha1.IPPoolSpec{Addresses: addrs("203.0.113.0/28"), ServiceAllocation: &v1alpha1.ServiceAllocation{ServiceSelector: bad}}, "spec.serviceAllocation.serviceSelector"},
		{"a community above 65535", v1alpha1.IPPoolSpec{Addresses: addrs("203.0.113.0/28"), Announce: v1alpha1.Announce{Mode: v1alpha1.AnnounceBGP, BGP: &v1alpha1.BGPAnnounce{Communities: []string{"65536:1"}}}}, "spec.announce.bgp.communities[0]"},
		{"a localPref above 32 bits", v1alpha1.IPPoolSpec{Addresses: addrs("203.0.113.0/28"), Announce: v1alpha1.Announce{Mode: v1alpha1.AnnounceBGP, BGP: &v1alpha1.BGPAnnounce{LocalPref: ptr(int64(1) << 33)}}}, "spec.announce.bgp.localPref"},
		{"a range that does not parse", v1alpha1.IPPoolSpec{Addresses: addrs("203.0.113.9-203.0.113.1")}, "spec.addresses[0]"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := DecodePool(pool("p", 0, tc.spec))
			if p.Valid() {
				t.Fatal("pool is valid")
			}
			if !strings.Contains(Problems(p.Problems), tc.field+":") {
				t.Errorf("problems %q do not name %s", Problems(p.Problems), tc.field)
			}
			set := NewSet([]*Pool{p}, nil)
			if len(set.AllocatorPools()) != 0 {
				t.Error("an invalid pool is given to the allocator")
			}
			if sel := p.Announce.NodeSelector; strings.HasSuffix(tc.field, "nodeSelector") && tc.field == "spec.announce.nodeSelector" && sel.Matches(labels.Set{"rack": "a"}) {
				t.Error("the refused selector selects a node")
			}
		})
	}
}

func ptr[T any](v T) *T { return &v }

func TestDecodingTypedAndUnstructuredAgree(t *testing.T) {
	ip := pool("web", 0, v1alpha1.IPPoolSpec{Addresses: addrs("203.0.113.0/28", "2001:db8:100::/120"), Announce: v1alpha1.Announce{Mode: v1alpha1.AnnounceBGP, BGP: &v1alpha1.BGPAnnounce{Communities: []string{"64500:1"}, LocalPref: ptr(int64(200))}}})
	obj, err := runtime.DefaultUnstructuredConverter.ToUnstructured(ip)
	if err != nil {
		t.Fatal(err)
	}
	a, b := DecodePool(ip), DecodePool(&unstructured.Unstructured{Object: obj})
	if !a.Valid() || !b.Valid() || a.Announce.Mode != planner.BGP || b.Announce.LocalPref != 200 || len(b.Allocation.Ranges) != 2 {
		t.Errorf("typed %+v, unstructured %+v", a, b)
	}
}

func TestPoolOfIsThePoolWhoseRangesHoldTheAddress(t *testing.T) {
	older := DecodePool(pool("older", time.Hour, v1alpha1.IPPoolSpec{Addresses: addrs("203.0.113.0/28")}))
	younger := DecodePool(pool("younger", 0, v1alpha1.IPPoolSpec{Addresses: addrs("203.0.113.0/24")}))
	other := DecodePool(pool("other", 0, v1alpha1.IPPoolSpec{Addresses: addrs("198.51.100.0/28")}))
	broken := DecodePool(pool("broken", 0, v1alpha1.IPPoolSpec{Addresses: addrs("198.51.100.64/28")}))
	broken.Problems = []Problem{{Field: "spec.announce.nodeSelector", Message: "does not parse"}}
	set := NewSet([]*Pool{younger, older, other, broken}, nil)
	for _, tc := range []struct {
		name, addr string
		want       *Pool
	}{
		{"of overlapping pools the older", "203.0.113.5", older},
		{"a pool an older one shadows still holds what only it holds", "203.0.113.200", younger},
		{"a plain pool", "198.51.100.2", other},
		{"an invalid pool holds its ranges (and is announced from no node)", "198.51.100.65", broken},
		{"an address in no pool has none", "192.0.2.1", nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := set.PoolOf(netip.MustParseAddr(tc.addr)); got != tc.want {
				t.Errorf("PoolOf(%s) = %v, want %v", tc.addr, got, tc.want)
			}
		})
	}
}

// TestGoverningIsTheRecordedPoolWhileItHoldsTheAddressElseThePoolsRanges: the allocator's record
// names the pool an address was given from, which governs it while it holds it; a pool
// deleted, or shrunk so that it no longer holds the address, governs nothing, and the valid
// pool holding the address does (a name a tenant wrote on the Service cannot make it dark);
// an address no valid pool holds is announced from no node.
func TestGoverningIsTheRecordedPoolWhileItHoldsTheAddressElseThePoolsRanges(t *testing.T) {
	older := DecodePool(pool("older", time.Hour, v1alpha1.IPPoolSpec{Addresses: addrs("203.0.113.0/25")}))
	younger := DecodePool(pool("younger", 0, v1alpha1.IPPoolSpec{Addresses: addrs("203.0.113.0/28")}))
	broken := DecodePool(pool("broken", 0, v1alpha1.IPPoolSpec{Addresses: addrs("203.0.113.200/29", "not-a-range")}))
	if broken.Valid() {
		t.Fatal("the broken pool decoded valid")
	}
	set := NewSet([]*Pool{younger, older, broken}, nil)
	for _, tc := range []struct {
		name, from, addr string
		want             *Pool
	}{
		{"the record names younger, which holds it", "younger", "203.0.113.5", younger},
		{"younger no longer holds it: older does", "younger", "203.0.113.100", older},
		{"a deleted pool: the pool holding it", "gone", "203.0.113.5", older},
		{"no record: the pool holding it", "", "203.0.113.5", older},
		{"no valid pool holds it: nil (fail closed)", "gone", "203.0.113.130", nil},
		{"an invalid pool holding it: that pool (the caller reports its problems)", "broken", "203.0.113.201", broken},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := set.Governing(tc.from, netip.MustParseAddr(tc.addr)); got != tc.want {
				t.Errorf("Governing(%q, %s) = %v, want %v", tc.from, tc.addr, got, tc.want)
			}
		})
	}
}

func TestPeersAreCheckedAsTheAgentChecksThem(t *testing.T) {
	base := func() v1alpha1.BGPPeerSpec {
		return v1alpha1.BGPPeerSpec{Address: "198.51.100.1", PeerASN: 64496, MyASN: 64497}
	}
	for _, tc := range []struct {
		name  string
		edit  func(*v1alpha1.BGPPeerSpec)
		field string
	}{
		{"the unspecified address", func(s *v1alpha1.BGPPeerSpec) { s.Address = "0.0.0.0" }, "spec.address"},
		{"a link-local address", func(s *v1alpha1.BGPPeerSpec) { s.Address = "fe80::1" }, "spec.address"},
		{"a multicast address", func(s *v1alpha1.BGPPeerSpec) { s.Address = "224.0.0.5" }, "spec.address"},
		{"a keepalive not below the default hold time", func(s *v1alpha1.BGPPeerSpec) { s.KeepaliveSeconds = ptr(int32(90)) }, "spec.keepaliveSeconds"},
		{"a keepalive not below the hold time", func(s *v1alpha1.BGPPeerSpec) {
			s.HoldTimeSeconds, s.KeepaliveSeconds = ptr(int32(9)), ptr(int32(9))
		}, "spec.keepaliveSeconds"},
		{"BFD with multihop", func(s *v1alpha1.BGPPeerSpec) {
			s.EBGPMultihop, s.BFD = ptr(int32(2)), &v1alpha1.BFDSettings{Enabled: true}
		}, "spec.bfd"},
		{"a source address that is no address", func(s *v1alpha1.BGPPeerSpec) { s.SourceAddress = "eth0" }, "spec.sourceAddress"},
		{"a source address of the other family", func(s *v1alpha1.BGPPeerSpec) { s.SourceAddress = "2001:db8:1::11" }, "spec.sourceAddress"},
		{"a link-local source address", func(s *v1alpha1.BGPPeerSpec) { s.SourceAddress = "169.254.0.1" }, "spec.sourceAddress"},
		{"a connect retry of 0", func(s *v1alpha1.BGPPeerSpec) { s.ConnectRetrySeconds = ptr(int32(0)) }, "spec.connectRetrySeconds"},
		{"neither address nor interface", func(s *v1alpha1.BGPPeerSpec) { s.Address = "" }, "spec.address"},
		{"both address and interface", func(s *v1alpha1.BGPPeerSpec) { s.Interface = "eth1" }, "not both"},
		{"an interface name with a slash", func(s *v1alpha1.BGPPeerSpec) { s.Address, s.Interface = "", "eth/1" }, "spec.interface"},
		{"an unnumbered peer with a source address", func(s *v1alpha1.BGPPeerSpec) {
			s.Address, s.Interface, s.SourceAddress = "", "eth1", "198.51.100.11"
		}, "spec.sourceAddress"},
		{"an unnumbered multihop peer", func(s *v1alpha1.BGPPeerSpec) { s.Address, s.Interface, s.EBGPMultihop = "", "eth1", ptr(int32(2)) }, "spec.ebgpMultihop"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := base()
			tc.edit(&s)
			p := DecodePeer(&v1alpha1.BGPPeer{ObjectMeta: metav1.ObjectMeta{Name: "r"}, Spec: s})
			if p.Valid() || !strings.Contains(Problems(p.Problems), tc.field) {
				t.Errorf("problems %q, want one at %s", Problems(p.Problems), tc.field)
			}
			if p.Selects(map[string]string{}) {
				t.Error("an invalid peer selects a node")
			}
		})
	}
	ok := DecodePeer(&v1alpha1.BGPPeer{ObjectMeta: metav1.ObjectMeta{Name: "r"}, Spec: base()})
	if !ok.Valid() || !ok.Selects(nil) || ok.Session.GetPeerAsn() != 64496 {
		t.Errorf("a valid peer: %+v", ok)
	}
	withSource := base()
	withSource.SourceAddress, withSource.ConnectRetrySeconds = "198.51.100.61", ptr(int32(2))
	if p := DecodePeer(&v1alpha1.BGPPeer{ObjectMeta: metav1.ObjectMeta{Name: "r"}, Spec: withSource}); !p.Valid() ||
		p.Session.GetSourceAddress() != "198.51.100.61" || p.Session.GetConnectRetrySeconds() != 2 {
		t.Errorf("a peer with a source address and a connect retry: %+v", p)
	}
	unnumbered := base()
	unnumbered.Address, unnumbered.Interface = "", "eth1"
	if p := DecodePeer(&v1alpha1.BGPPeer{ObjectMeta: metav1.ObjectMeta{Name: "r"}, Spec: unnumbered}); !p.Valid() ||
		p.Session.GetInterface() != "eth1" || p.Session.GetAddress() != "" {
		t.Errorf("an unnumbered peer: %+v", p)
	}
}

func TestCommunities(t *testing.T) {
	for c, ok := range map[string]bool{"0:0": true, "65535:65535": true, "65536:1": false, "1:65536": false, "1": false, "a:b": false, ":1": false, "123456:1": false} {
		if err := ValidCommunity(c); (err == nil) != ok {
			t.Errorf("ValidCommunity(%q) = %v", c, err)
		}
	}
}

func TestAggregationLengthsMustCoverOnlyThePool(t *testing.T) {
	bgpPool := func(addrs []string, v4, v6 *int32, weights bool) *Pool {
		spec := v1alpha1.IPPoolSpec{Announce: v1alpha1.Announce{Mode: v1alpha1.AnnounceBGP,
			BGP: &v1alpha1.BGPAnnounce{AggregationLength: v4, AggregationLengthV6: v6, WeightByEndpoints: weights}}}
		for _, a := range addrs {
			spec.Addresses = append(spec.Addresses, v1alpha1.AddressRange(a))
		}
		return DecodePool(pool("p", 0, spec))
	}
	for _, tc := range []struct {
		name    string
		p       *Pool
		problem string // "" for none
		want4   uint8
		want6   uint8
	}{
		{"a /27 aggregated to /28 blocks", bgpPool([]string{"203.0.113.0/27"}, ptr(int32(28)), nil, false), "", 28, 0},
		{"a /27 aggregated to its own length", bgpPool([]string{"203.0.113.0/27"}, ptr(int32(27)), nil, false), "", 27, 0},
		{"the host length is no aggregation", bgpPool([]string{"203.0.113.0/27", "2001:db8:100::/64"}, ptr(int32(32)), ptr(int32(128)), false), "", 0, 0},
		{"both families", bgpPool([]string{"203.0.113.0/27", "2001:db8:100::/64"}, ptr(int32(28)), ptr(int32(64)), false), "", 28, 64},
		{"an aggregate wider than the pool", bgpPool([]string{"203.0.113.0/27"}, ptr(int32(24)), nil, false), "spec.announce.bgp.aggregationLength", 0, 0},
		{"a range that is not whole blocks", bgpPool([]string{"203.0.113.10-203.0.113.20"}, ptr(int32(28)), nil, false), "spec.announce.bgp.aggregationLength", 0, 0},
		{"an IPv6 aggregate wider than the pool", bgpPool([]string{"2001:db8:100::/64"}, nil, ptr(int32(48)), false), "spec.announce.bgp.aggregationLengthV6", 0, 0},
		{"aggregates with weights by endpoints", bgpPool([]string{"203.0.113.0/27"}, ptr(int32(28)), nil, true), "spec.announce.bgp.weightByEndpoints", 28, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := Problems(tc.p.Problems)
			if tc.problem == "" && got != "" || tc.problem != "" && !strings.Contains(got, tc.problem) {
				t.Errorf("problems %q; want %q", got, tc.problem)
			}
			if tc.p.Announce.AggregateV4 != tc.want4 || tc.p.Announce.AggregateV6 != tc.want6 {
				t.Errorf("aggregates /%d and /%d; want /%d and /%d", tc.p.Announce.AggregateV4, tc.p.Announce.AggregateV6, tc.want4, tc.want6)
			}
		})
	}
}
