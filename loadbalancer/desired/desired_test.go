package desired

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"testing"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"pgregory.net/rapid"

	"github.com/metalvip/metalvip/api/v1alpha1"
	"github.com/metalvip/metalvip/loadbalancer/planner"
	"github.com/metalvip/metalvip/loadbalancer/pools"
	agentv1 "github.com/metalvip/metalvip/proto/metalvip/agent/v1"
)

// TestARecordReadsBackAsWritten: what the CCM writes in a ServiceAnnouncement, metalvipctl
// reads back as it was, whatever the node names hold (the condition's text, which it parsed
// before, split on ", ").
func TestARecordReadsBackAsWritten(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		node := rapid.StringMatching(`[a-z][a-z0-9., -]{0,12}`)
		n := rapid.IntRange(1, 5).Draw(t, "addresses")
		var in []Address
		for i := range n {
			a := Address{
				Addr: netip.AddrFrom4([4]byte{203, 0, 113, byte(i)}),
				Mode: rapid.SampledFrom([]string{ModeL2, ModeL2PerClient, ModeBGP}).Draw(t, "mode"),
			}
			if rapid.Bool().Draw(t, "v6") {
				a.Addr = netip.MustParseAddr("2001:db8:100::1").Next()
			}
			a.Nodes = rapid.SliceOfNDistinct(node, 0, 4, func(s string) string { return s }).Draw(t, "nodes")
			if rapid.Bool().Draw(t, "refused") {
				a.RefusedBy = rapid.SliceOfNDistinct(node, 1, 2, func(s string) string { return s }).Draw(t, "refusedBy")
			}
			in = append(in, a)
		}
		out, err := FromRecord(Record(in))
		if err != nil {
			t.Fatalf("%+v: %v", Record(in), err)
		}
		if len(out) != len(in) {
			t.Fatalf("%d addresses back, want %d", len(out), len(in))
		}
		for i := range in {
			if out[i].Addr != in[i].Addr || out[i].Mode != in[i].Mode || !slices.Equal(out[i].Nodes, in[i].Nodes) && len(in[i].Nodes)+len(out[i].Nodes) > 0 || !slices.Equal(out[i].RefusedBy, in[i].RefusedBy) && len(in[i].RefusedBy)+len(out[i].RefusedBy) > 0 {
				t.Fatalf("%+v came back as %+v", in[i], out[i])
			}
		}
	})
}

func TestARecordThatCannotBeReadIsAnError(t *testing.T) {
	for _, rec := range [][]v1alpha1.AnnouncedAddress{
		{{Address: "203.0.113.300", Mode: v1alpha1.AnnouncedL2}},
		{{Address: "203.0.113.1", Mode: "Anycast"}},
	} {
		if out, err := FromRecord(rec); err == nil {
			t.Errorf("%+v read as %+v, want an error", rec, out)
		}
	}
}

func TestConditionSaysWhyAnAddressIsNotAnnounced(t *testing.T) {
	ip := netip.MustParseAddr("203.0.113.1")
	for _, tc := range []struct {
		name   string
		addrs  []Address
		status metav1.ConditionStatus
		reason string
	}{
		{"every address announced is True", []Address{AddressOf(ip, planner.Entry{Mode: planner.L2, Nodes: []string{"a", "b"}}, false, nil)}, metav1.ConditionTrue, ReasonAnnounced},
		{"an address with no node is NoEligibleNode", []Address{AddressOf(ip, planner.Entry{Mode: planner.L2}, false, nil)}, metav1.ConditionFalse, ReasonNoEligibleNode},
		{"an agent's refusal wins", []Address{AddressOf(ip, planner.Entry{Mode: planner.L2}, false, nil), AddressOf(ip.Next(), planner.Entry{Mode: planner.BGP, Nodes: []string{"a"}}, false, []string{"a"})}, metav1.ConditionFalse, ReasonRefusedByAgent},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := Condition(tc.addrs, 3)
			if c.Status != tc.status || c.Reason != tc.reason || c.ObservedGeneration != 3 || c.Type != ConditionAnnounced {
				t.Errorf("condition %+v", c)
			}
		})
	}
	if got := FormatAddresses([]Address{AddressOf(ip, planner.Entry{Mode: planner.L2, Nodes: []string{"c", "a", "b"}}, true, nil)}); got != "203.0.113.1 (L2 per client): a, b, c" {
		t.Errorf("per client: %q", got)
	}
}

func svc(name string, local bool, ips ...string) *v1.Service {
	s := &v1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: name}, Spec: v1.ServiceSpec{Type: v1.ServiceTypeLoadBalancer}}
	if local {
		s.Spec.ExternalTrafficPolicy = v1.ServiceExternalTrafficPolicyLocal
	}
	for _, ip := range ips {
		s.Status.LoadBalancer.Ingress = append(s.Status.LoadBalancer.Ingress, v1.LoadBalancerIngress{IP: ip})
	}
	return s
}

func TestVIPFromItsServicesAndPool(t *testing.T) {
	ip := netip.MustParseAddr("203.0.113.1")
	bgp := pools.DecodePool(&v1alpha1.IPPool{ObjectMeta: metav1.ObjectMeta{Name: "p"}, Spec: v1alpha1.IPPoolSpec{
		Addresses: []v1alpha1.AddressRange{"203.0.113.0/28"},
		Announce:  v1alpha1.Announce{Mode: v1alpha1.AnnounceBGP, NodeSelector: &v1alpha1.LabelSelector{MatchLabels: map[string]v1alpha1.LabelValue{"rack": "a"}}},
	}})
	invalid := pools.DecodePool(&v1alpha1.IPPool{ObjectMeta: metav1.ObjectMeta{Name: "bad"}, Spec: v1alpha1.IPPoolSpec{
		Addresses: []v1alpha1.AddressRange{"203.0.113.0/28"},
		Announce:  v1alpha1.Announce{NodeSelector: &v1alpha1.LabelSelector{MatchExpressions: []v1alpha1.LabelSelectorRequirement{{Key: "x", Operator: "In"}}}},
	}})
	t.Run("sharing Local Services announce from the nodes of either's endpoints", func(t *testing.T) {
		v := VIP(ip, []Sharer{{Service: svc("a", true, "203.0.113.1"), EndpointNodes: []string{"n2"}}, {Service: svc("b", true, "203.0.113.1"), EndpointNodes: []string{"n1", "n2"}}}, bgp)
		if v.Mode != planner.BGP || !v.Local || !slices.Equal(v.EndpointNodes, []string{"n1", "n2"}) || v.Group != "" {
			t.Errorf("%+v", v)
		}
		if !v.NodeSelector.Matches(map[string]string{"rack": "a"}) || v.NodeSelector.Matches(map[string]string{"rack": "b"}) {
			t.Error("the pool's node selector is not kept")
		}
	})
	t.Run("a Service's two IPv4 addresses form a group", func(t *testing.T) {
		v := VIP(ip, []Sharer{{Service: svc("a", false, "203.0.113.1", "203.0.113.2", "2001:db8::1")}}, nil)
		if v.Group != "ns/a/IPv4" || v.Mode != planner.L2 {
			t.Errorf("%+v", v)
		}
	})
	t.Run("an invalid pool is announced from no node", func(t *testing.T) {
		v := VIP(ip, []Sharer{{Service: svc("a", false, "203.0.113.1")}}, invalid)
		if v.NodeSelector == nil || v.NodeSelector.Matches(map[string]string{}) || v.NodeSelector.Matches(map[string]string{"x": "y"}) {
			t.Error("an invalid pool's VIP selects nodes")
		}
		if SameVIP(v, planner.VIP{Addr: ip, Mode: planner.L2}) {
			t.Error("a VIP of an invalid pool is the same as one selecting every node")
		}
	})
}

func TestNodeStateNamesItsHeartbeatPeersWithKeys(t *testing.T) {
	node := &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1", Labels: map[string]string{"rack": "a"}},
		Status: v1.NodeStatus{Addresses: []v1.NodeAddress{{Type: v1.NodeInternalIP, Address: "198.51.100.11"}}}}
	addrs := map[string]netip.Addr{"n1": netip.MustParseAddr("198.51.100.11"), "n2": netip.MustParseAddr("198.51.100.12")}
	keys := func(n string) [][]byte {
		if n == "n2" {
			return [][]byte{[]byte("k2")}
		}
		return nil
	}
	set := pools.NewSet(nil, []*pools.Peer{
		pools.DecodePeer(&v1alpha1.BGPPeer{ObjectMeta: metav1.ObjectMeta{Name: "old", CreationTimestamp: metav1.Unix(1, 0)}, Spec: v1alpha1.BGPPeerSpec{Address: "198.51.100.1", PeerASN: 64496, MyASN: 64497}}),
		pools.DecodePeer(&v1alpha1.BGPPeer{ObjectMeta: metav1.ObjectMeta{Name: "new", CreationTimestamp: metav1.Unix(2, 0)}, Spec: v1alpha1.BGPPeerSpec{Address: "198.51.100.1", PeerASN: 64499, MyASN: 64497}}),
		pools.DecodePeer(&v1alpha1.BGPPeer{ObjectMeta: metav1.ObjectMeta{Name: "pw"}, Spec: v1alpha1.BGPPeerSpec{Address: "198.51.100.2", PeerASN: 64496, MyASN: 64497,
			PasswordSecretRef: &v1alpha1.SecretKeyRef{Namespace: "s", Name: "x", Key: "k"}}}),
		pools.DecodePeer(&v1alpha1.BGPPeer{ObjectMeta: metav1.ObjectMeta{Name: "elsewhere"}, Spec: v1alpha1.BGPPeerSpec{Address: "198.51.100.3", PeerASN: 64496, MyASN: 64497,
			NodeSelector: &v1alpha1.LabelSelector{MatchLabels: map[string]v1alpha1.LabelValue{"rack": "b"}}}}),
	})
	peers, conflicts := Peers(node, set, func(*pools.Peer) (string, bool) { return "", false })
	if len(peers) != 1 || peers[0].GetPeerAsn() != 64496 {
		t.Errorf("peers %v: want only the older of the same address, none whose password cannot be read, none for other nodes", peers)
	}
	if len(conflicts) != 1 || conflicts[0].Peer != "new" || conflicts[0].Older != "old" {
		t.Errorf("conflicts %+v", conflicts)
	}
	an := &agentv1.Announcement{Vip: "203.0.113.1", Mode: agentv1.Mode_MODE_L2, L2: &agentv1.L2Announcement{Candidates: []*agentv1.Candidate{{Node: "n2"}, {Node: "n1"}}}}

	// Unnumbered peers are one session per interface: two interfaces are two sessions, a
	// second peer on the same interface is left off.
	unnumbered := func(name, iface string, created int64) *pools.Peer {
		return pools.DecodePeer(&v1alpha1.BGPPeer{ObjectMeta: metav1.ObjectMeta{Name: name, CreationTimestamp: metav1.Unix(created, 0)},
			Spec: v1alpha1.BGPPeerSpec{Interface: iface, PeerASN: 64496, MyASN: 64497}})
	}
	two, twoConflicts := Peers(node, pools.NewSet(nil, []*pools.Peer{unnumbered("tor-a", "eth1", 1), unnumbered("tor-b", "eth2", 2), unnumbered("again", "eth1", 3)}),
		func(*pools.Peer) (string, bool) { return "", false })
	if len(two) != 2 || two[0].GetInterface() != "eth1" || two[1].GetInterface() != "eth2" || len(twoConflicts) != 1 || twoConflicts[0].Peer != "again" || twoConflicts[0].Older != "tor-a" {
		t.Errorf("unnumbered peers %v, conflicts %+v", two, twoConflicts)
	}

	st := NodeState(node, []*agentv1.Announcement{an}, peers, []string{"n2", "n1"}, Options{}, func(n string) netip.Addr { return addrs[n] }, keys)
	if len(st.GetHeartbeatPeers()) != 1 || st.GetHeartbeatPeers()[0].GetNode() != "n2" || st.GetHeartbeatPeers()[0].GetAddress() != "198.51.100.12" || string(st.GetHeartbeatPeers()[0].GetPublicKeys()[0]) != "k2" {
		t.Errorf("heartbeat peers %v", st.GetHeartbeatPeers())
	}
	if st.GetBgp().GetRouterId() != "198.51.100.11" || st.GetBgp().GetAsn() != 64497 {
		t.Errorf("bgp options %v", st.GetBgp())
	}
}

func TestNodesDifferOnlyByWhatThePlanReads(t *testing.T) {
	a := &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n", Labels: map[string]string{"x": "1"}}, Status: v1.NodeStatus{Conditions: []v1.NodeCondition{{Type: v1.NodeReady}}}}
	b := a.DeepCopy()
	b.Status.Conditions[0].LastHeartbeatTime = metav1.Now()
	if !SameNode(a, b) {
		t.Error("a kubelet heartbeat changes the node")
	}
	b.Labels[LabelExcludeLB] = ""
	if SameNode(a, b) || !Node(b, true).Excluded {
		t.Error("excluding the node is not a change")
	}
}

func TestWeightsCountEachNodesReadyEndpoints(t *testing.T) {
	ip := netip.MustParseAddr("203.0.113.1")
	pool := func(weighted bool, mode v1alpha1.AnnounceMode) *pools.Pool {
		an := v1alpha1.Announce{Mode: mode}
		if mode == v1alpha1.AnnounceBGP {
			an.BGP = &v1alpha1.BGPAnnounce{WeightByEndpoints: weighted}
		}
		return pools.DecodePool(&v1alpha1.IPPool{ObjectMeta: metav1.ObjectMeta{Name: "p"}, Spec: v1alpha1.IPPoolSpec{
			Addresses: []v1alpha1.AddressRange{"203.0.113.0/28"}, Announce: an}})
	}
	local := func(name string, counts map[string]int) Sharer {
		s := Sharer{Service: svc(name, true, "203.0.113.1"), EndpointCounts: counts}
		for n := range counts {
			s.EndpointNodes = append(s.EndpointNodes, n)
		}
		return s
	}
	cluster := Sharer{Service: svc("c", false, "203.0.113.1"), EndpointCounts: map[string]int{"n1": 5}}
	for _, tc := range []struct {
		name    string
		sharers []Sharer
		pool    *pools.Pool
		want    map[string]uint32
	}{
		{"endpoints 1, 2 and 3 weigh 1, 2 and 3", []Sharer{local("a", map[string]int{"n1": 1, "n2": 2, "n3": 3})}, pool(true, v1alpha1.AnnounceBGP),
			map[string]uint32{"n1": 1, "n2": 2, "n3": 3}},
		{"sharing Services add up on a node", []Sharer{local("a", map[string]int{"n1": 1}), local("b", map[string]int{"n1": 2, "n2": 1})}, pool(true, v1alpha1.AnnounceBGP),
			map[string]uint32{"n1": 3, "n2": 1}},
		{"a node's weight is capped", []Sharer{local("a", map[string]int{"n1": MaxWeight + 7})}, pool(true, v1alpha1.AnnounceBGP),
			map[string]uint32{"n1": MaxWeight}},
		{"a pool without weighting gives none", []Sharer{local("a", map[string]int{"n1": 1})}, pool(false, v1alpha1.AnnounceBGP), nil},
		{"a Cluster-policy Service gives none", []Sharer{cluster}, pool(true, v1alpha1.AnnounceBGP), nil},
		{"an L2 pool gives none", []Sharer{local("a", map[string]int{"n1": 1})}, pool(false, v1alpha1.AnnounceL2), nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			v := VIP(ip, tc.sharers, tc.pool)
			got := Weights(v, tc.sharers, tc.pool)
			if (got == nil) != (tc.want == nil) || len(got) != len(tc.want) {
				t.Fatalf("weights %v, want %v", got, tc.want)
			}
			for n, w := range tc.want {
				if got[n] != w {
					t.Errorf("weights %v, want %v", got, tc.want)
				}
			}
			if got == nil {
				return
			}
			e := planner.Entry{Mode: planner.BGP, Nodes: v.EndpointNodes}
			an := Announcement(e, v, tc.pool, nil, func(string) netip.Addr { return netip.Addr{} }, got, nil)
			if len(an.GetBgp().GetWeights()) != len(e.Nodes) {
				t.Errorf("announcement weights %v for nodes %v", an.GetBgp().GetWeights(), e.Nodes)
			}
			for _, w := range an.GetBgp().GetWeights() {
				if w.GetEndpoints() != got[w.GetNode()] {
					t.Errorf("announcement gives %s %d, want %d", w.GetNode(), w.GetEndpoints(), got[w.GetNode()])
				}
			}
		})
	}
}

func TestAnAnnouncementSaysWhetherItsPoolDrainsByWeight(t *testing.T) {
	ip := netip.MustParseAddr("203.0.113.1")
	for _, tc := range []struct {
		name  string
		drain v1alpha1.DrainMode
		want  bool
	}{
		{"a pool without a drain mode drains by GRACEFUL_SHUTDOWN", "", false},
		{"a pool that names GracefulShutdown drains by it", v1alpha1.DrainGracefulShutdown, false},
		{"a pool that names Weight drains by weight", v1alpha1.DrainWeight, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pool := pools.DecodePool(&v1alpha1.IPPool{ObjectMeta: metav1.ObjectMeta{Name: "p"}, Spec: v1alpha1.IPPoolSpec{
				Addresses: []v1alpha1.AddressRange{"203.0.113.0/28"},
				Announce:  v1alpha1.Announce{Mode: v1alpha1.AnnounceBGP, BGP: &v1alpha1.BGPAnnounce{Drain: tc.drain}}}})
			if !pool.Valid() {
				t.Fatalf("pool problems: %v", pool.Problems)
			}
			v := VIP(ip, nil, pool)
			an := Announcement(planner.Entry{Mode: planner.BGP, Nodes: []string{"n1"}}, v, pool, nil, func(string) netip.Addr { return netip.Addr{} }, nil, nil)
			if got := an.GetBgp().GetDrainByWeight(); got != tc.want {
				t.Errorf("drain_by_weight %v, want %v", got, tc.want)
			}
		})
	}
	bad := pools.DecodePool(&v1alpha1.IPPool{ObjectMeta: metav1.ObjectMeta{Name: "p"}, Spec: v1alpha1.IPPoolSpec{
		Addresses: []v1alpha1.AddressRange{"203.0.113.0/28"},
		Announce:  v1alpha1.Announce{Mode: v1alpha1.AnnounceBGP, BGP: &v1alpha1.BGPAnnounce{Drain: "Withdraw"}}}})
	if bad.Valid() || !strings.Contains(fmt.Sprint(bad.Problems), "spec.announce.bgp.drain") {
		t.Errorf("a drain mode the CRD would refuse gives problems %v; want one naming spec.announce.bgp.drain", bad.Problems)
	}
}

// TestAnAddressInNoPoolIsAnnouncedFromNoNode: an address whose pool was deleted under it (or
// shrank past it) used to be announced in L2 from every eligible node: a BGP address became an
// ARP answer on the node segment. It fails closed now, like an address of an invalid pool.
func TestAnAddressInNoPoolIsAnnouncedFromNoNode(t *testing.T) {
	ip := netip.MustParseAddr("203.0.113.1")
	v := VIP(ip, []Sharer{{Service: svc("a", false, "203.0.113.1")}}, nil)
	if v.NodeSelector == nil || v.NodeSelector.Matches(map[string]string{}) || v.NodeSelector.Matches(map[string]string{"kubernetes.io/hostname": "n1"}) {
		t.Errorf("an address in no pool may be announced by nodes: selector %v", v.NodeSelector)
	}
}

// TestAnAnnouncementSharesNothingTheAnnouncerChanges: the Services behind a VIP are copied into
// its announcement, which the agents' senders marshal while the announcer sorts and shrinks its
// own list in place.
func TestAnAnnouncementSharesNothingTheAnnouncerChanges(t *testing.T) {
	services := []string{"web/a", "web/b", "web/c"}
	v := planner.VIP{Addr: netip.MustParseAddr("203.0.113.1"), Mode: planner.L2}
	an := Announcement(planner.Entry{Mode: planner.L2, Nodes: []string{"n1"}}, v, nil, services, func(string) netip.Addr { return netip.Addr{} }, nil, nil)
	services = slices.DeleteFunc(services, func(s string) bool { return s == "web/a" })
	services[0] = "changed"
	if got := an.GetServices(); !slices.Equal(got, []string{"web/a", "web/b", "web/c"}) {
		t.Errorf("the announcement's Services changed with the announcer's list: %v", got)
	}
}
