package e2e

import (
	"context"
	"net/netip"
	"slices"
	"testing"
	"time"

	"github.com/metalvip/metalvip/test/cluster"
	"github.com/metalvip/metalvip/test/harness"
	"github.com/metalvip/metalvip/test/kubeapi"
	"github.com/metalvip/metalvip/test/lab"
)

// TestOtherRouters (issue 31) runs metalvip whole against a second router implementation
// (GoBGP) and in iBGP (FRR and GoBGP): a Cluster-policy BGP VIP gets every node as next hop
// (ECMP), an externalTrafficPolicy Local one exactly the nodes with endpoints, following
// them; a node whose link fails leaves the ECMP set within BFD's time (the router's hold
// time is 9 s).
func TestOtherRouters(t *testing.T) {
	for _, tc := range []struct {
		name   string
		router string
		ibgp   bool
	}{
		{"gobgp router ebgp", lab.RouterGoBGP, false},
		{"gobgp router ibgp", lab.RouterGoBGP, true},
		{"frr router ibgp", lab.RouterFRR, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := cluster.New(t, kubeapi.Get(t), cluster.Options{CCMBinary: ccmBinary, AgentBinary: agentBinary, Router: tc.router, IBGP: tc.ibgp})
			everywhere := c.Service("cluster-bgp", cluster.InPool("bgp-"+c.NS))
			harness.Eventually(t, 60*time.Second, "a Cluster-policy BGP VIP has every node as next hop", func() bool {
				return slices.Equal(c.NextHops(everywhere), []string{"198.51.100.11", "198.51.100.12", "198.51.100.13"})
			})
			local := c.Service("local-bgp", cluster.Local, cluster.InPool("bgp-"+c.NS))
			c.Endpoints("local-bgp", "node1", "node3")
			harness.Eventually(t, 60*time.Second, "an ETP Local VIP's next hops are the endpoint nodes", func() bool {
				return slices.Equal(c.NextHops(local), []string{"198.51.100.11", "198.51.100.13"})
			})
			c.Endpoints("local-bgp", "node2", "node3")
			harness.Eventually(t, 60*time.Second, "an ETP Local VIP's next hops follow the endpoints", func() bool {
				return slices.Equal(c.NextHops(local), []string{"198.51.100.12", "198.51.100.13"})
			})

			// BFD must be up at the router, or the cut below would wait for the hold timer.
			harness.Eventually(t, 30*time.Second, "the router's BFD sessions with the three nodes are up", func() bool {
				up, err := c.Lab.RouterBFDUp()
				return err == nil && up[netip.MustParseAddr("198.51.100.11")] && up[netip.MustParseAddr("198.51.100.12")] && up[netip.MustParseAddr("198.51.100.13")]
			})
			start := time.Now()
			if _, err := c.Lab.Switch.Run(context.Background(), "ip", "link", "set", "p-node3", "down"); err != nil {
				t.Fatal(err)
			}
			gone := func() bool {
				return slices.Equal(c.NextHops(everywhere), []string{"198.51.100.11", "198.51.100.12"}) &&
					slices.Equal(c.NextHops(local), []string{"198.51.100.12"})
			}
			for !gone() && time.Since(start) < 5*time.Second {
				time.Sleep(10 * time.Millisecond)
			}
			if !gone() {
				t.Fatalf("node3's link is down for %s and the next hops are %v (Cluster) and %v (Local); the router:\n%s",
					time.Since(start).Round(time.Millisecond), c.NextHops(everywhere), c.NextHops(local), c.Lab.RouterLog(start, 60))
			}
			t.Logf("node3's link down to its next hops gone: %s", time.Since(start).Round(time.Millisecond))
		})
	}
}

// TestUnnumbered (issue 31): metalvip whole over BGP unnumbered: a BGPPeer with interface
// (no address) gives each node a session with FRR over its link-local point-to-point link;
// the sessions come up (the BGPPeer's status says 3/3), a Cluster-policy VIP is routed over
// the three links and reaches a node from behind the router, and an ETP Local VIP only over
// the links of the nodes with endpoints.
func TestUnnumbered(t *testing.T) {
	c := cluster.New(t, kubeapi.Get(t), cluster.Options{CCMBinary: ccmBinary, AgentBinary: agentBinary, Unnumbered: true})
	links := func(nodes ...string) []string {
		var out []string
		for _, n := range nodes {
			out = append(out, "un-"+n)
		}
		return out
	}
	devices := func(vip netip.Addr) []string {
		devs, err := c.Lab.RouteDevices(vip.String())
		if err != nil {
			t.Logf("%v", err)
		}
		return devs
	}
	start := time.Now()
	everywhere := c.Service("cluster-bgp", cluster.InPool("bgp-"+c.NS))
	harness.Eventually(t, 60*time.Second, "a Cluster-policy BGP VIP is routed over the three unnumbered links", func() bool {
		return slices.Equal(devices(everywhere), links("node1", "node2", "node3"))
	})
	t.Logf("a VIP routed over three unnumbered sessions %s after the Service was made", time.Since(start).Round(time.Millisecond))
	harness.Eventually(t, 60*time.Second, "the BGPPeer's status says Established 3/3", func() bool {
		return peerStatus(t, c, "router-"+c.NS).Sessions == "Established 3/3"
	})
	if out, err := c.Lab.Remote.Run(context.Background(), "ping", "-c", "1", "-W", "2", everywhere.String()); err != nil {
		t.Errorf("the remote host cannot reach %s over the unnumbered links: %v: %s", everywhere, err, out)
	}

	local := c.Service("local-bgp", cluster.Local, cluster.InPool("bgp-"+c.NS))
	c.Endpoints("local-bgp", "node1", "node3")
	harness.Eventually(t, 60*time.Second, "an ETP Local VIP is routed over the endpoint nodes' links", func() bool {
		return slices.Equal(devices(local), links("node1", "node3"))
	})
}
