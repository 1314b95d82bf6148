package announcer

import (
	"strings"
	"testing"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/metalvip/metalvip/api/v1alpha1"
	"github.com/metalvip/metalvip/loadbalancer/planner"
	"github.com/metalvip/metalvip/loadbalancer/pools"
)

// TestAPoolsEligibleNodesAreSaidWithWhyNone: a pool's NodesEligible condition, over nodes as
// the planner knows them, without the rest of the announcer.
func TestAPoolsEligibleNodesAreSaidWithWhyNone(t *testing.T) {
	pool := func(sel map[string]v1alpha1.LabelValue, addrs ...v1alpha1.AddressRange) *pools.Pool {
		spec := v1alpha1.IPPoolSpec{Addresses: addrs}
		if sel != nil {
			spec.Announce.NodeSelector = &v1alpha1.LabelSelector{MatchLabels: sel}
		}
		return pools.DecodePool(&v1alpha1.IPPool{ObjectMeta: metav1.ObjectMeta{Name: "p", Generation: 4}, Spec: spec})
	}
	node := func(name, rack string) *v1.Node {
		return &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{"rack": rack}}}
	}
	nodes := []*v1.Node{node("node1", "a"), node("node2", "a"), node("node3", "b")}
	plan := func(excluded []string, unreachable ...string) func(*v1.Node) planner.Node {
		return func(n *v1.Node) planner.Node {
			pn := planner.Node{Name: n.Name, AgentReachable: true}
			for _, e := range excluded {
				pn.Excluded = pn.Excluded || e == n.Name
			}
			for _, u := range unreachable {
				pn.AgentReachable = pn.AgentReachable && u != n.Name
			}
			return pn
		}
	}
	for _, tc := range []struct {
		name    string
		pool    *pools.Pool
		plan    func(*v1.Node) planner.Node
		status  metav1.ConditionStatus
		reason  string
		message string // a part of it
	}{
		{"every node", pool(nil, "203.0.113.0/28"), plan(nil), metav1.ConditionTrue, "Eligible", "3 of 3 nodes may announce: node1, node2, node3"},
		{"the selected ones, one excluded", pool(map[string]v1alpha1.LabelValue{"rack": "a"}, "203.0.113.0/28"), plan([]string{"node2"}), metav1.ConditionTrue, "Eligible", "1 of 3 nodes may announce: node1; excluded"},
		{"no node matches", pool(map[string]v1alpha1.LabelValue{"rack": "c"}, "203.0.113.0/28"), plan(nil), metav1.ConditionFalse, "NoNodeMatches", "No node matches spec.announce.nodeSelector (3 nodes)"},
		{"matching nodes excluded or unreachable", pool(map[string]v1alpha1.LabelValue{"rack": "a"}, "203.0.113.0/28"), plan([]string{"node1", "node2"}), metav1.ConditionFalse, "NoEligibleNode", "excluded by the label"},
		{"unreachable agents", pool(nil, "203.0.113.0/28"), plan(nil, "node1", "node2", "node3"), metav1.ConditionFalse, "NoEligibleNode", "agent unreachable: node1, node2, node3"},
		{"an invalid pool fails closed", pool(nil, "not-an-address"), plan(nil), metav1.ConditionFalse, "InvalidSpec", "The pool is announced from no node"},
		{"kube-proxy not healthy on one", pool(nil, "203.0.113.0/28"), plan([]string{"node3"}), metav1.ConditionTrue, "Eligible", "2 of 3 nodes may announce: node1, node2; kube-proxy not healthy: node3"},
		{"kube-proxy not healthy on the selected ones", pool(map[string]v1alpha1.LabelValue{"rack": "b"}, "203.0.113.0/28"), plan([]string{"node3"}), metav1.ConditionFalse, "NoEligibleNode", "kube-proxy not healthy (DataPlaneNotReady Events on the nodes): node3"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			// node3's agent says its kube-proxy is not healthy, where the plan excludes it.
			c := eligibilityOf(tc.pool, nodes, tc.plan, func(n string) bool { return n == "node3" })
			if c.Type != PoolNodesEligible || c.ObservedGeneration != 4 || c.Status != tc.status || c.Reason != tc.reason || !strings.Contains(c.Message, tc.message) {
				t.Errorf("%s %s %s %q (generation %d); want %s %s containing %q", c.Type, c.Status, c.Reason, c.Message, c.ObservedGeneration, tc.status, tc.reason, tc.message)
			}
		})
	}
}

// TestANodesReachabilityConditionSaysWhatToCheck: the AgentReachable condition names the node,
// and when unreachable what to check, with the agents' port.
func TestANodesReachabilityConditionSaysWhatToCheck(t *testing.T) {
	for _, tc := range []struct {
		ok     bool
		status v1.ConditionStatus
		reason string
		says   []string
	}{
		{true, v1.ConditionTrue, "AgentReachable", []string{"reaches metalvip-agent on node7"}},
		{false, v1.ConditionFalse, "AgentUnreachable", []string{"cannot reach metalvip-agent on node7", "takes no new VIPs", "port 7472"}},
	} {
		status, reason, msg := reachability("node7", tc.ok, 7472)
		if status != tc.status || reason != tc.reason {
			t.Errorf("reachable %v: %s %s, want %s %s", tc.ok, status, reason, tc.status, tc.reason)
		}
		for _, s := range tc.says {
			if !strings.Contains(msg, s) {
				t.Errorf("reachable %v: %q does not say %q", tc.ok, msg, s)
			}
		}
	}
}
