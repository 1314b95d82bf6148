package main

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/metalvip/metalvip/api/v1alpha1"
	"github.com/metalvip/metalvip/loadbalancer/pools"
	"github.com/metalvip/metalvip/test/cluster"
	"github.com/metalvip/metalvip/test/harness"
	"github.com/metalvip/metalvip/test/harness/figure"
	"github.com/metalvip/metalvip/test/testenv"
)

// virtualMACFailover measures L2 failover as a client that ignores gratuitous ARP sees it: its
// neighbour entry for the VIP is permanent, holding the VIP's virtual MAC.
func virtualMACFailover(m *testenv.Main, r *report, c *cluster.Cluster) {
	harness.Step("L2 failover with a virtual MAC, %d trials", *trials)
	ctx := context.Background()
	pool := "bench-vmac"
	c.Object(v1alpha1.IPPoolResource, pool, fmt.Sprintf(`{addresses: ["203.0.113.200-203.0.113.207"], autoAssign: false, serviceAllocation: {namespaces: [%s]}, announce: {l2: {virtualMAC: {scheme: Local}}}}`, c.NS))
	vip := c.Service("vmac", cluster.InPool(pool))
	mac := pools.VirtualMAC(v1alpha1.VirtualMACLocal, vip).String()
	harness.Eventually(m, 30*time.Second, "answered with the virtual MAC", func() bool {
		macs, err := c.Lab.Client.AskNeighbor(vip, 300*time.Millisecond, true)
		return err == nil && len(macs) == 1 && macs[0] == mac
	})
	if _, err := c.Lab.Client.Run(ctx, "ip", "neigh", "replace", vip.String(), "lladdr", mac, "dev", "eth0", "nud", "permanent"); err != nil {
		m.Fatalf("%v", err)
	}
	defer func() {
		_, _ = c.Lab.Client.Run(context.Background(), "ip", "neigh", "del", vip.String(), "dev", "eth0")
	}()
	outages := failoverTrials(c, vip)
	r.add("L2 failover with a virtual MAC",
		fmt.Sprintf("As L2 failover, for a VIP of a pool with announce.l2.virtualMAC (scheme Local, MAC %s), and a client whose neighbour entry for the VIP is permanent and holds that MAC: a client that ignores gratuitous ARP (appliances, some firewalls). Without a virtual MAC such a client stays on the dead node's MAC and is not answered at all after the failover (test/e2e shows it: 128 pings lost over 2.8 s, then the test stops); with it, the switch learns the MAC on the new owner's port from its first frame. test/e2e also captures the MAC at the switch's ports: frames from one node at a time, also when the old owner comes back. %d trials.", mac, *trials),
		[][]string{{"p50", "p99", "max", "min"}, {figure.Duration(time.Duration(figure.Percentile(outages, 50))), figure.Duration(time.Duration(figure.Percentile(outages, 99))), figure.Duration(time.Duration(slices.Max(outages))), figure.Duration(time.Duration(slices.Min(outages)))}})
}
