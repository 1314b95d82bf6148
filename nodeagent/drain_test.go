package nodeagent

import (
	"net/netip"
	"slices"
	"testing"

	"github.com/metalvip/metalvip/nodeagent/bgp"
	agentv1 "github.com/metalvip/metalvip/proto/metalvip/agent/v1"
)

func TestBGPRoutesCarryTheNodesWeightTheAggregatesAndTheDrain(t *testing.T) {
	h := serve(t, t.TempDir())
	c := h.ccm(t)
	weighted := bgpVIP("203.0.113.20")
	weighted.Bgp.Weights = []*agentv1.NodeWeight{{Node: "node-a", Endpoints: 3}, {Node: "node-b", Endpoints: 1}}
	unweighted := bgpVIP("203.0.113.21")
	routes := h.routesByPrefix
	gen := uint64(0)
	for _, step := range []struct {
		name     string
		draining bool
		prefixes []string
	}{
		{"a node advertises its own weight and the ClusterIP range", false, []string{"203.0.113.192/27"}},
		{"a draining node adds GRACEFUL_SHUTDOWN to every route", true, []string{"203.0.113.192/27"}},
		{"a prefix that is not a CIDR is left out alone", false, []string{"203.0.113.192/27", "203.0.113.7/24"}},
	} {
		gen++
		t.Run(step.name, func(t *testing.T) {
			st := state(1, gen, weighted, unweighted)
			st.Draining = step.draining
			st.Bgp.Prefixes = step.prefixes
			resp, err := c.Apply(ctx(t), &agentv1.ApplyRequest{State: st})
			if err != nil || len(resp.GetRefused()) != 0 {
				t.Fatalf("Apply = %v, %v", resp, err)
			}
			got := routes()
			if len(got) != 3 {
				t.Fatalf("routes %v, want two VIPs and one aggregate", got)
			}
			if w := got[netip.MustParsePrefix("203.0.113.20/32")].Weight; w != 3 {
				t.Errorf("weighted VIP has weight %d, want node-a's 3", w)
			}
			if w := got[netip.MustParsePrefix("203.0.113.21/32")].Weight; w != 0 {
				t.Errorf("unweighted VIP has weight %d", w)
			}
			for p, r := range got {
				if r.GracefulShutdown != step.draining {
					t.Errorf("%s: graceful shutdown %v, want %v", p, r.GracefulShutdown, step.draining)
				}
			}
			if _, ok := got[netip.MustParsePrefix("203.0.113.192/27")]; !ok {
				t.Errorf("the aggregate is not advertised: %v", got)
			}
			if len(step.prefixes) > 1 && len(resp.GetProblems()) == 0 {
				t.Errorf("the bad prefix left no problem")
			}
		})
	}
}

func TestADrainingOwnerKeepsAnsweringBehindTheNewOne(t *testing.T) {
	h := serve(t, t.TempDir())
	c := h.ccm(t)
	vip := netip.MustParseAddr("203.0.113.10")
	apply := func(gen uint64, draining bool, cands ...string) {
		t.Helper()
		st := state(1, gen, l2VIP(vip.String(), cands...))
		st.Draining = draining
		if _, err := c.Apply(ctx(t), &agentv1.ApplyRequest{State: st}); err != nil {
			t.Fatal(err)
		}
	}
	answers := func() (bool, bool) {
		for _, v := range h.l2.last() {
			if v.Addr == vip {
				// A share of one member: answers every client, announces nothing.
				return true, v.Share == nil
			}
		}
		return false, false
	}
	apply(1, false, "node-a", "node-b")
	if on, announced := answers(); !on || !announced {
		t.Fatalf("the first candidate does not answer and announce")
	}
	apply(2, true, "node-b", "node-a")
	if on, announced := answers(); !on || announced {
		t.Errorf("draining behind node-b: answers %v, announces %v; want answering without gratuitous ARP", on, announced)
	}
	apply(3, true, "node-b")
	if on, _ := answers(); on {
		t.Errorf("still answering once off the candidates")
	}
	apply(4, true, "node-b", "node-a")
	if on, _ := answers(); on {
		t.Errorf("a draining standby took the VIP: only an owner lingers")
	}
	apply(5, false, "node-b", "node-a")
	if on, _ := answers(); on {
		t.Errorf("a standby that is not draining answers")
	}
}

func TestADrainByWeightKeepsThePathWithTheLeastWeightAndNoGracefulShutdown(t *testing.T) {
	h := serve(t, t.TempDir())
	c := h.ccm(t)
	byWeight := bgpVIP("203.0.113.30")
	byWeight.Bgp.DrainByWeight = true
	byWeight.Bgp.Weights = []*agentv1.NodeWeight{{Node: "node-a", Endpoints: 3}, {Node: "node-b", Endpoints: 1}}
	byWeightUnweighted := bgpVIP("203.0.113.31")
	byWeightUnweighted.Bgp.DrainByWeight = true
	byShutdown := bgpVIP("203.0.113.32")
	type want struct {
		weight uint32
		gshut  bool
	}
	gen := uint64(0)
	for _, step := range []struct {
		name     string
		draining bool
		want     map[string]want
	}{
		{"a node that is not draining scales its weight, and advertises one without endpoints weighting", false, map[string]want{
			"203.0.113.30/32": {3 * drainWeightScale, false},
			"203.0.113.31/32": {drainWeightScale, false},
			"203.0.113.32/32": {0, false},
		}},
		{"a draining node advertises weight 1 without GRACEFUL_SHUTDOWN where the pool drains by weight", true, map[string]want{
			"203.0.113.30/32": {1, false},
			"203.0.113.31/32": {1, false},
			"203.0.113.32/32": {0, true},
		}},
		{"the weights come back when the drain ends", false, map[string]want{
			"203.0.113.30/32": {3 * drainWeightScale, false},
			"203.0.113.31/32": {drainWeightScale, false},
			"203.0.113.32/32": {0, false},
		}},
	} {
		gen++
		t.Run(step.name, func(t *testing.T) {
			st := state(1, gen, byWeight, byWeightUnweighted, byShutdown)
			st.Draining = step.draining
			resp, err := c.Apply(ctx(t), &agentv1.ApplyRequest{State: st})
			if err != nil || len(resp.GetRefused()) != 0 {
				t.Fatalf("Apply = %v, %v", resp, err)
			}
			h.bgp.mu.Lock()
			got := map[string]want{}
			for _, r := range h.bgp.routes {
				got[r.Prefix.String()] = want{r.Weight, r.GracefulShutdown}
			}
			h.bgp.mu.Unlock()
			for p, w := range step.want {
				if got[p] != w {
					t.Errorf("%s: weight %d, graceful shutdown %v; want %d, %v", p, got[p].weight, got[p].gshut, w.weight, w.gshut)
				}
			}
		})
	}
}

func TestDrainByWeightStaysWithinTheLargestWeight(t *testing.T) {
	for _, tc := range []struct {
		name  string
		in    bgp.Route
		wantW uint32
	}{
		{"a node without a weight gets the scale", bgp.Route{}, drainWeightScale},
		{"a weight is multiplied by the scale", bgp.Route{Weight: 7}, 7 * drainWeightScale},
		{"a weight whose product passes the largest is capped", bgp.Route{Weight: bgp.MaxWeight}, bgp.MaxWeight},
		{"a draining route gets 1 whatever its weight", bgp.Route{Weight: bgp.MaxWeight, GracefulShutdown: true}, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := tc.in
			drainByWeight(&r)
			if r.Weight != tc.wantW || r.GracefulShutdown {
				t.Errorf("weight %d, graceful shutdown %v; want %d, false", r.Weight, r.GracefulShutdown, tc.wantW)
			}
		})
	}
}

// TestVIPsOfOneAggregateMakeOneRoute: VIPs whose announcements give an aggregate length are
// advertised as the aggregate that holds them, one route however many of them the node has,
// with the communities of all and the higher LOCAL_PREF; it goes when the last of them does.
// A length longer than the address is refused with that VIP alone.
func TestVIPsOfOneAggregateMakeOneRoute(t *testing.T) {
	h := serve(t, t.TempDir())
	c := h.ccm(t)
	agg := func(vip string, l uint32, community string, pref uint32) *agentv1.Announcement {
		an := bgpVIP(vip)
		an.Bgp.AggregateLength, an.Bgp.Communities, an.Bgp.LocalPref = l, []string{community}, pref
		return an
	}
	routes := h.routesByPrefix
	a28 := netip.MustParsePrefix("203.0.113.64/28")
	st := state(1, 1, agg("203.0.113.65", 28, "64496:1", 100), agg("203.0.113.66", 28, "64496:2", 200), bgpVIP("203.0.113.20"), agg("203.0.113.21", 33, "64496:3", 0))
	resp, err := c.Apply(ctx(t), &agentv1.ApplyRequest{State: st})
	if err != nil {
		t.Fatal(err)
	}
	if rf := resp.GetRefused(); len(rf) != 1 || rf[0].GetKey() != "203.0.113.21" || rf[0].GetField() != "announcements[3].bgp.aggregate_length" {
		t.Errorf("refused %v; want 203.0.113.21's aggregate length alone", rf)
	}
	got := routes()
	if r, ok := got[a28]; len(got) != 2 || !ok || !slices.Equal(r.Communities, []string{"64496:1", "64496:2"}) || r.LocalPref != 200 {
		t.Errorf("routes %v; want %s with both communities and LOCAL_PREF 200, and 203.0.113.20/32", got, a28)
	}
	if _, ok := got[netip.MustParsePrefix("203.0.113.20/32")]; !ok {
		t.Errorf("routes %v; the host route of 203.0.113.20 is missing", got)
	}
	st = state(1, 2, agg("203.0.113.66", 28, "64496:2", 200))
	if _, err := c.Apply(ctx(t), &agentv1.ApplyRequest{State: st}); err != nil {
		t.Fatal(err)
	}
	if got := routes(); len(got) != 1 || got[a28].LocalPref != 200 || !slices.Equal(got[a28].Communities, []string{"64496:2"}) {
		t.Errorf("routes %v; want the aggregate alone, of 203.0.113.66", got)
	}
	if _, err := c.Apply(ctx(t), &agentv1.ApplyRequest{State: state(1, 3)}); err != nil {
		t.Fatal(err)
	}
	if got := routes(); len(got) != 0 {
		t.Errorf("routes %v; want none once its last VIP is gone", got)
	}
}

// routesByPrefix is what the agent gives its BGP speaker now, by prefix.
func (h *harness) routesByPrefix() map[netip.Prefix]bgp.Route {
	h.bgp.mu.Lock()
	defer h.bgp.mu.Unlock()
	out := map[netip.Prefix]bgp.Route{}
	for _, r := range h.bgp.routes {
		out[r.Prefix] = r
	}
	return out
}
