package nodeagent

import (
	"net/netip"
	"slices"
	"strings"
	"sync"
	"testing"

	agentv1 "github.com/metalvip/metalvip/proto/metalvip/agent/v1"
)

// fakeEgress records the configurations the agent sets.
type fakeEgress struct {
	mu   sync.Mutex
	sets []EgressConfig
}

func (f *fakeEgress) Set(c EgressConfig) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.sets = append(f.sets, c)
	return nil
}

func (f *fakeEgress) Flows() map[netip.Addr]uint64 {
	return map[netip.Addr]uint64{netip.MustParseAddr("203.0.113.10"): 42}
}

func (f *fakeEgress) Close() error { return f.Set(EgressConfig{}) }

func (f *fakeEgress) Check() error { return nil }

func (f *fakeEgress) last() EgressConfig {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.sets[len(f.sets)-1]
}

func candidates(nodes ...string) []*agentv1.Candidate {
	var out []*agentv1.Candidate
	for _, n := range nodes {
		out = append(out, &agentv1.Candidate{Node: n, Address: map[string]string{"node-a": "198.51.100.11", "node-b": "198.51.100.12", "node-c": "198.51.100.13"}[n]})
	}
	return out
}

// TestEgressFollowsWhoAnswersTheVIP checks the agent's part in egress without heartbeats: the
// node that answers an L2 VIP source-NATs its own pods and the other nodes' to it; for a VIP
// another node answers, and for one this node is no candidate of, its pods are routed to the
// first candidate; a malformed item is left out and named; GetState says what it does.
func TestEgressFollowsWhoAnswersTheVIP(t *testing.T) {
	eg := &fakeEgress{}
	h := serve(t, t.TempDir(), func(o *Options) { o.Egress = eg })
	c := h.ccm(t)
	st := state(1, 1, l2VIP("203.0.113.10", "node-a", "node-b"), l2VIP("203.0.113.11", "node-b", "node-a"))
	for _, an := range st.Announcements {
		an.L2.Candidates = candidates(nodesOf(an.L2.Candidates)...)
	}
	cluster := []string{"198.18.0.0/15", "2001:db8:18::/48"}
	st.Egress = []*agentv1.Egress{
		{Vip: "203.0.113.10", Candidates: candidates("node-a", "node-b"), Sources: []string{"198.18.1.2"}, RemoteSources: []string{"198.18.2.2"}, ClusterCidrs: cluster},
		{Vip: "203.0.113.11", Candidates: candidates("node-b", "node-a"), Sources: []string{"198.18.1.3"}, ClusterCidrs: cluster},
		{Vip: "203.0.113.12", Candidates: candidates("node-c", "node-b"), Sources: []string{"198.18.1.4"}, ClusterCidrs: cluster},
		{Vip: "203.0.113.13", Candidates: candidates("node-b"), Sources: []string{"not an address"}, ClusterCidrs: cluster},
		{Vip: "203.0.113.14", Candidates: candidates("node-b"), Sources: []string{"198.18.1.5"}},
		// IPv6: routed to the gateway of the VIP's family; a candidate without one refuses.
		{Vip: "2001:db8:100::10", Candidates: candidates("node-b", "node-a"), Gateways: []string{"2001:db8:1::12", "2001:db8:1::11"}, Sources: []string{"2001:db8:18:1::2"}, ClusterCidrs: cluster},
		{Vip: "2001:db8:100::11", Candidates: candidates("node-c"), Sources: []string{"2001:db8:18:1::3"}, ClusterCidrs: cluster},
		{Vip: "2001:db8:100::12", Candidates: candidates("node-c"), Sources: []string{"198.18.1.6"}, ClusterCidrs: cluster},
		{Vip: "2001:db8:100::13", Candidates: candidates("node-c"), Sources: []string{"2001:db8:18:1::4"}, ClusterCidrs: []string{"198.18.0.0/15"}},
		// BGP: the egress node maps to the reply ports; another announcer steers the replies
		// (and routes its pods); a range the kernel cannot take is refused.
		{Vip: "203.0.113.20", Candidates: candidates("node-b", "node-a"), Sources: []string{"198.18.1.8"}, ClusterCidrs: cluster, ReplyPorts: &agentv1.PortRange{First: 49152, Last: 65534}},
		{Vip: "203.0.113.21", Candidates: candidates("node-a", "node-b"), Sources: []string{"198.18.1.9"}, ClusterCidrs: cluster, ReplyPorts: &agentv1.PortRange{First: 49152, Last: 65534}},
		{Vip: "203.0.113.22", Candidates: candidates("node-b", "node-a"), Sources: []string{"198.18.1.10"}, ClusterCidrs: cluster, ReplyPorts: &agentv1.PortRange{First: 49152, Last: 65535}},
		// A pod of an earlier item: left out.
		{Vip: "203.0.113.23", Candidates: candidates("node-b"), Sources: []string{"198.18.1.2"}, ClusterCidrs: cluster},
	}
	resp, err := c.Apply(ctx(t), &agentv1.ApplyRequest{State: st})
	if err != nil {
		t.Fatal(err)
	}
	problems := strings.Join(resp.GetProblems(), "\n")
	if !strings.Contains(problems, `egress[3] (203.0.113.13): sources: "not an address" is not an address of the VIP's family`) ||
		!strings.Contains(problems, "egress[4] (203.0.113.14): no cluster_cidrs") ||
		!strings.Contains(problems, `egress[7] (2001:db8:100::12): sources: "198.18.1.6" is not an address of the VIP's family`) ||
		!strings.Contains(problems, "egress[8] (2001:db8:100::13): no cluster_cidrs of the VIP's family") ||
		!strings.Contains(problems, "egress[11] (203.0.113.22): reply_ports 49152-65535") ||
		!strings.Contains(problems, "egress[12] (203.0.113.23): pod address 198.18.1.2 leaves from 203.0.113.10 already") {
		t.Errorf("problems %q: want the malformed items named", problems)
	}
	got := eg.last()
	want := EgressConfig{
		Cluster: []netip.Prefix{netip.MustParsePrefix("198.18.0.0/15"), netip.MustParsePrefix("2001:db8:18::/48")},
		SNAT: []EgressSNAT{
			{VIP: netip.MustParseAddr("203.0.113.10"), Sources: addrs("198.18.1.2", "198.18.2.2")},
			{VIP: netip.MustParseAddr("203.0.113.21"), Sources: addrs("198.18.1.9"), Ports: PortRange{49152, 65534}},
		},
		Route: []EgressRoute{
			{VIP: netip.MustParseAddr("203.0.113.11"), Via: netip.MustParseAddr("198.51.100.12"), Sources: addrs("198.18.1.3")},
			{VIP: netip.MustParseAddr("203.0.113.12"), Via: netip.MustParseAddr("198.51.100.13"), Sources: addrs("198.18.1.4")},
			{VIP: netip.MustParseAddr("2001:db8:100::10"), Via: netip.MustParseAddr("2001:db8:1::12"), Sources: addrs("2001:db8:18:1::2")},
			{VIP: netip.MustParseAddr("2001:db8:100::11"), Sources: addrs("2001:db8:18:1::3")}, // no Via: refused
			{VIP: netip.MustParseAddr("203.0.113.20"), Via: netip.MustParseAddr("198.51.100.12"), Sources: addrs("198.18.1.8")},
		},
		Steer: []EgressSteer{{VIP: netip.MustParseAddr("203.0.113.20"), Via: netip.MustParseAddr("198.51.100.12"), Ports: PortRange{49152, 65534}}},
	}
	if !sameEgress(got, want) {
		t.Errorf("egress set to %+v\nwant %+v", got, want)
	}
	gs, err := c.GetState(ctx(t), &agentv1.GetStateRequest{})
	if err != nil {
		t.Fatal(err)
	}
	var said []string
	for _, s := range gs.GetEgress() {
		said = append(said, s.GetVip()+" "+s.GetNode()+" "+map[bool]string{true: "active", false: "routed"}[s.GetActive()])
	}
	if !slices.Equal(said, []string{"203.0.113.10 node-a active", "203.0.113.11 node-b routed", "203.0.113.12 node-c routed", "2001:db8:100::10 node-b routed", "2001:db8:100::11 node-c routed", "203.0.113.20 node-b routed", "203.0.113.21 node-a active"}) || gs.GetEgress()[0].GetFlows() != 42 {
		t.Errorf("GetState egress %v", gs.GetEgress())
	}
	if p := gs.GetEgress()[4].GetProblem(); !strings.Contains(p, "the egress node node-c has no address of the VIP's family") {
		t.Errorf("GetState egress of 2001:db8:100::11: problem %q, want the missing address named", p)
	}

	// Egress gone from the state: nothing is set.
	st.Generation, st.Egress = 2, nil
	if _, err := c.Apply(ctx(t), &agentv1.ApplyRequest{State: st}); err != nil {
		t.Fatal(err)
	}
	if got := eg.last(); !got.empty() {
		t.Errorf("without egress in the state, set %+v", got)
	}
}

func nodesOf(cs []*agentv1.Candidate) []string {
	var out []string
	for _, c := range cs {
		out = append(out, c.GetNode())
	}
	return out
}

func addrs(ss ...string) []netip.Addr {
	var out []netip.Addr
	for _, s := range ss {
		out = append(out, netip.MustParseAddr(s))
	}
	return out
}

func sameEgress(a, b EgressConfig) bool {
	return slices.Equal(a.Cluster, b.Cluster) &&
		slices.EqualFunc(a.SNAT, b.SNAT, func(x, y EgressSNAT) bool {
			return x.VIP == y.VIP && x.Ports == y.Ports && slices.Equal(x.Sources, y.Sources)
		}) &&
		slices.Equal(a.Steer, b.Steer) &&
		slices.EqualFunc(a.Route, b.Route, func(x, y EgressRoute) bool {
			return x.VIP == y.VIP && x.Via == y.Via && slices.Equal(x.Sources, y.Sources)
		})
}
