package e2e

import (
	"context"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/metalvip/metalvip/api/v1alpha1"
	agentv1 "github.com/metalvip/metalvip/proto/metalvip/agent/v1"
	"github.com/metalvip/metalvip/test/cluster"
	"github.com/metalvip/metalvip/test/harness"
	"github.com/metalvip/metalvip/test/kubeapi"
	"github.com/metalvip/metalvip/test/lab"
)

func newCluster(t *testing.T) *cluster.Cluster {
	return cluster.New(t, kubeapi.Get(t), cluster.Options{CCMBinary: ccmBinary, AgentBinary: agentBinary})
}

// spreadVIPs creates n L2 Services and waits until each is answered.
func spreadVIPs(t *testing.T, c *cluster.Cluster, n int) []netip.Addr {
	var vips []netip.Addr
	for i := range n {
		vips = append(vips, c.Service(fmt.Sprintf("svc-%d", i)))
	}
	harness.Eventually(t, 30*time.Second, "every VIP answered", func() bool {
		return !slices.Contains(cluster.ValuesOf(c.Owners(vips)), "")
	})
	return vips
}

// An agent crash resumes from its saved state and disturbs no VIP of another node.
func TestAgentCrashDisturbsNoOtherNode(t *testing.T) {
	c := newCluster(t)
	vips := spreadVIPs(t, c, 6)
	owners := c.Owners(vips)
	var other netip.Addr
	for v, o := range owners {
		if o != "node3" {
			other = v
			break
		}
	}
	probe, err := c.Lab.Client.Probe(other, 10*time.Millisecond, 3000)
	if err != nil {
		t.Fatal(err)
	}
	harness.Eventually(t, 5*time.Second, "the probe is answered", probe.Answered)
	start := time.Now()
	a := c.Agents["node3"]
	a.Proc.Kill()
	time.Sleep(500 * time.Millisecond)
	c.StartAgent(a)
	back := time.Now()
	harness.Eventually(t, 30*time.Second, "node3's agent is back and in touch with the CCM", func() bool {
		st, err := a.Client.GetState(context.Background(), &agentv1.GetStateRequest{})
		return err == nil && !st.GetRestored()
	})
	t.Logf("node3's agent had the CCM's state %s after it started again", time.Since(back).Round(10*time.Millisecond))
	harness.Eventually(t, 30*time.Second, "every VIP answered again", func() bool {
		return !slices.Contains(cluster.ValuesOf(c.Owners(vips)), "")
	})
	probe.Stop()
	if _, lost := probe.Outage(start); lost != 0 {
		t.Errorf("%d probes to %s (owned by %s) lost while node3's agent crashed and restarted", lost, other, owners[other])
	}
}

// Two CCM replicas with leader election: stopping the leader hands over to the other, and the
// data plane does not move. Agents take the new leader's higher term.
func TestLeaderChangeMovesNothing(t *testing.T) {
	c := newCluster(t)
	c.CCM.Stop(10 * time.Second) // replaced by two elected replicas
	le := []string{"--leader-elect=true", "--leader-elect-lease-duration=4s", "--leader-elect-renew-deadline=3s", "--leader-elect-retry-period=500ms"}
	first := c.StartCCMReplica("ccm-a", le...)
	time.Sleep(time.Second) // let a win
	second := c.StartCCMReplica("ccm-b", le...)
	vips := spreadVIPs(t, c, 6)
	before := c.Owners(vips)
	term := func() uint64 {
		st, err := c.Agents["node1"].Client.GetState(context.Background(), &agentv1.GetStateRequest{})
		if err != nil {
			return 0
		}
		return st.GetTerm()
	}
	harness.Eventually(t, 30*time.Second, "the agents have the leader's term", func() bool { return term() != 0 })
	oldTerm := term()
	leader, standby := first, second
	if !strings.Contains(first.Output(), "Announcing through the agents") {
		leader, standby = second, first
	}
	probe, err := c.Lab.Client.Probe(vips[0], 10*time.Millisecond, 6000)
	if err != nil {
		t.Fatal(err)
	}
	harness.Eventually(t, 5*time.Second, "the probe is answered", probe.Answered)
	start := time.Now()
	leader.Stop(10 * time.Second)
	harness.Eventually(t, 60*time.Second, "the standby leads and the agents take its term", func() bool {
		return strings.Contains(standby.Output(), "Announcing through the agents") && term() > oldTerm
	})
	// A Service created now is served by the new leader.
	newVIP := c.Service("after-change")
	harness.Eventually(t, 30*time.Second, "the new leader's VIP is answered", func() bool { return c.Owner(newVIP) != "" })
	probe.Stop()
	if _, lost := probe.Outage(start); lost != 0 {
		t.Errorf("%d probes lost across the leader change", lost)
	}
	if after := c.Owners(vips); !cluster.SameOwners(before, after) {
		t.Errorf("owners changed across the leader change: %v -> %v", before, after)
	}
	// The new leader planned from what the three agents held.
	if line := lineWith(standby.Output(), "Learnt what the agents announce"); !strings.Contains(line, "agents=3") {
		t.Errorf("the new leader did not learn from the three agents: %q", line)
	}
	t.Logf("term %d -> %d", oldTerm, term())
}

// A partition between two candidate nodes may make both answer while it lasts; when it heals,
// exactly one answers again.
func TestPartitionConvergesWhenHealed(t *testing.T) {
	c := newCluster(t)
	vip := c.Service("web")
	harness.Eventually(t, 30*time.Second, "answered", func() bool { return c.Owner(vip) != "" })
	owner := c.Owner(vip)
	// Cut the owner off from every other node (heartbeats), not from the client.
	ctx := context.Background()
	type cutRoute struct {
		on *lab.Host
		to string
	}
	var cut []cutRoute
	o := c.Agents[owner].Host
	for _, n := range c.Lab.Nodes {
		if n.Name != owner {
			cut = append(cut, cutRoute{o, n.IPv4.String()}, cutRoute{n, o.IPv4.String()})
		}
	}
	for _, k := range cut {
		if _, err := k.on.Run(ctx, "ip", "route", "add", "blackhole", k.to+"/32"); err != nil {
			t.Fatal(err)
		}
	}
	harness.Eventually(t, 10*time.Second, "another node takes over on its side of the partition", func() bool {
		return len(c.Answerers(vip)) >= 2 || c.Owner(vip) != owner
	})
	t.Logf("during the partition %v answer", c.Answerers(vip))
	for _, k := range cut {
		if _, err := k.on.Run(ctx, "ip", "route", "del", "blackhole", k.to+"/32"); err != nil {
			t.Fatal(err)
		}
	}
	took := harness.Eventually(t, 10*time.Second, "one node answers after healing", func() bool {
		for range 5 {
			if len(c.Answerers(vip)) != 1 {
				return false
			}
		}
		return true
	})
	t.Logf("converged %s after healing; %s answers", took.Round(time.Millisecond), c.Owner(vip))
}

// A router restart: sessions come back and the routes are advertised again.
func TestRouterRestart(t *testing.T) {
	c := newCluster(t)
	vip := c.Service("bgp", cluster.InPool("bgp-"+c.NS))
	all := []string{"198.51.100.11", "198.51.100.12", "198.51.100.13"}
	harness.Eventually(t, 60*time.Second, "three next hops", func() bool { return slices.Equal(c.NextHops(vip), all) })
	if err := c.Lab.RestartRouter(); err != nil {
		t.Fatal(err)
	}
	took := harness.Eventually(t, 60*time.Second, "three next hops after the router restart", func() bool {
		return slices.Equal(c.NextHops(vip), all)
	})
	t.Logf("routes back %s after the router restarted (redial every 5s)", took.Round(time.Millisecond))
}

// Bad pools are refused or reported, and disturb nothing else.
func TestInvalidOverlappingAndExhaustedPools(t *testing.T) {
	c := newCluster(t)
	vip := c.Service("before")
	harness.Eventually(t, 30*time.Second, "answered", func() bool { return c.Owner(vip) != "" })

	// Invalid: refused by the API server.
	bad := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": v1alpha1.GroupVersion.String(), "kind": "IPPool",
		"metadata": map[string]any{"name": "bad-" + c.NS},
		"spec":     map[string]any{"addresses": []any{"203.0.113.9-203.0.113.1"}},
	}}
	if _, err := c.Dyn.Resource(v1alpha1.IPPoolResource).Create(context.Background(), bad, metav1.CreateOptions{}); err == nil || !strings.Contains(err.Error(), "reversed") {
		t.Errorf("a reversed range: %v", err)
	}
	// Overlapping the cluster's L2 pool: reported on the younger pool; nothing moves.
	c.Object(v1alpha1.IPPoolResource, "overlap-"+c.NS, fmt.Sprintf(`{addresses: ["203.0.113.0/28"], serviceAllocation: {namespaces: [%s]}}`, c.NS))
	harness.Eventually(t, 30*time.Second, "the overlap reported", func() bool {
		u, err := c.Dyn.Resource(v1alpha1.IPPoolResource).Get(context.Background(), "overlap-"+c.NS, metav1.GetOptions{})
		if err != nil {
			return false
		}
		conds, _, _ := unstructured.NestedSlice(u.Object, "status", "conditions")
		for _, x := range conds {
			m := x.(map[string]any)
			if m["type"] == "Ready" && m["status"] == "False" && m["reason"] == "Overlaps" {
				return true
			}
		}
		return false
	})
	if o := c.Owner(vip); o == "" {
		t.Error("the existing VIP stopped answering when an overlapping pool appeared")
	}
	// Exhausted: a one-address pool, the second Service waits with a Warning.
	c.Object(v1alpha1.IPPoolResource, "one-"+c.NS, fmt.Sprintf(`{addresses: ["203.0.113.200/32"], autoAssign: false, serviceAllocation: {namespaces: [%s]}}`, c.NS))
	first := c.Service("first-of-one", cluster.InPool("one-"+c.NS))
	if first != netip.MustParseAddr("203.0.113.200") {
		t.Errorf("first Service of the one-address pool got %s", first)
	}
	c.ServiceNoWait("second-of-one", cluster.InPool("one-"+c.NS))
	harness.Eventually(t, 30*time.Second, "the pending Service is told", func() bool {
		return strings.Contains(c.Events("second-of-one", "PoolExhausted"), "one-"+c.NS)
	})
	if err := c.Srv.Client.CoreV1().Services(c.NS).Delete(context.Background(), "first-of-one", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	harness.Eventually(t, 30*time.Second, "the waiting Service gets the freed address and it answers", func() bool {
		s, err := c.Srv.Client.CoreV1().Services(c.NS).Get(context.Background(), "second-of-one", metav1.GetOptions{})
		return err == nil && len(s.Status.LoadBalancer.Ingress) == 1 && c.Owner(first) != ""
	})
}
