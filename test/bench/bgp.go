package main

import (
	"context"
	"fmt"
	"math"
	"net/netip"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/metalvip/metalvip/api/v1alpha1"
	"github.com/metalvip/metalvip/test/cluster"
	"github.com/metalvip/metalvip/test/harness"
	"github.com/metalvip/metalvip/test/harness/figure"
	"github.com/metalvip/metalvip/test/harness/proc"
	"github.com/metalvip/metalvip/test/lab"
	"github.com/metalvip/metalvip/test/testenv"
)

// bgpWeighted measures weighted ECMP by endpoints: the router's kernel weights for endpoints
// 1/2/3 on three nodes, and how 5 rounds of 1,000 connections from the remote client split.
func bgpWeighted(m *testenv.Main, r *report, c *cluster.Cluster) {
	harness.Step("BGP: weighted ECMP by endpoints")
	pool := "weighted-" + c.NS
	createObject(m, c.Dyn, v1alpha1.IPPoolResource, pool, fmt.Sprintf(`{addresses: ["203.0.113.96/28"], autoAssign: false, serviceAllocation: {namespaces: [%s]}, announce: {mode: BGP, bgp: {weightByEndpoints: true}}}`, c.NS))
	vip := c.Service("weighted", cluster.Local, cluster.InPool(pool))
	c.Endpoints("weighted", "node1", "node2", "node2", "node3", "node3", "node3")
	hops := map[string]netip.Addr{}
	for _, n := range c.Lab.Nodes {
		hops[n.Name] = n.IPv4
	}
	var w map[netip.Addr]int
	var route string
	start := time.Now()
	harness.Eventually(m, 60*time.Second, "three weighted next hops", func() bool {
		var err error
		w, route, err = c.Lab.RouteWeights(vip.String())
		return err == nil && len(w) == 3 && w[hops["node1"]] > 1 && w[hops["node1"]] < w[hops["node3"]]
	})
	took := time.Since(start)
	total := 0
	for _, x := range w {
		total += x
	}
	rows := [][]string{{"round of 1,000", "node1 (1 endpoint)", "node2 (2)", "node3 (3)", "every node within ±10% of 1:2:3"}}
	rows = append(rows, []string{"kernel nexthop weight", fmt.Sprintf("%d (%.1f%%)", w[hops["node1"]], 100*float64(w[hops["node1"]])/float64(total)),
		fmt.Sprintf("%d (%.1f%%)", w[hops["node2"]], 100*float64(w[hops["node2"]])/float64(total)), fmt.Sprintf("%d (%.1f%%)", w[hops["node3"]], 100*float64(w[hops["node3"]])/float64(total)), ""})
	inTen := 0
	sum := map[string]int{}
	for i := range 5 {
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
		by, failed := c.Lab.Remote.Split(ctx, netip.AddrPortFrom(vip, 80), 1000)
		cancel()
		row := []string{fmt.Sprintf("%d", i+1)}
		all := failed == 0
		for k, n := range []string{"node1", "node2", "node3"} {
			sum[n] += by[n]
			ideal := float64(k+1) / 6
			share := float64(by[n]) / 1000
			all = all && math.Abs(share-ideal) <= 0.1*ideal
			row = append(row, fmt.Sprintf("%d (%.1f%%)", by[n], 100*share))
		}
		if all {
			inTen++
		}
		row = append(row, fmt.Sprint(all))
		rows = append(rows, row)
	}
	rows = append(rows, []string{"all 5,000", fmt.Sprintf("%.1f%%", float64(sum["node1"])/50), fmt.Sprintf("%.1f%%", float64(sum["node2"])/50), fmt.Sprintf("%.1f%%", float64(sum["node3"])/50), fmt.Sprintf("%d of 5 rounds", inTen)})
	r.add("BGP weighted ECMP by endpoints",
		fmt.Sprintf("In the lab: a pool with announce.bgp.weightByEndpoints, an externalTrafficPolicy Local Service with 1, 2 and 3 ready endpoints on node1, node2 and node3; each node advertises the link-bandwidth community (1 Mbit/s per endpoint) and FRR 8.4 (bgp bestpath bandwidth skip-missing) installs nexthop weights of 100 times each share, truncated; weights in the kernel %s after the endpoints were set:\n\n```\n%s\n```\n\nThen 5 rounds of 1,000 TCP connections, one after another, from the remote client behind the router to the VIP (the router hashes source and destination ports, fib_multipath_hash_policy 1); each node's server names itself. A round's split is binomial around the weights (about ±12 connections, one standard deviation, on node1), so a round within ±10%% of 1:2:3 on every node is likely, not certain; FRR's truncation alone puts the ideal at 16.2/33.3/50.5%%.", figure.Duration(took), route),
		rows)
}

// drainSetups are the router setups and drain modes measured side by side.
var drainSetups = []struct {
	name      string
	pool      string // "" for the lab's BGP pool (GRACEFUL_SHUTDOWN)
	resilient bool
}{
	{"plain ECMP, GracefulShutdown", "", false},
	{"plain ECMP, Weight", "drainw", false},
	{"resilient, GracefulShutdown", "", true},
	{"resilient, Weight", "drainw", true},
}

// bgpDrain measures drains: with the remote client holding 20 long connections and opening a
// new one every 50 ms through a BGP VIP, node1 is cordoned, for each router setup (plain
// hash-threshold ECMP, or a resilient next-hop group) and drain mode; and an L2 VIP's owner
// is cordoned while the on-link client probes it every 20 ms.
func bgpDrain(m *testenv.Main, r *report, c *cluster.Cluster, delay time.Duration) {
	harness.Step("drains: BGP by GRACEFUL_SHUTDOWN and by weight, plain and resilient ECMP; L2 make-before-break")
	createObject(m, c.Dyn, v1alpha1.IPPoolResource, "drainw-"+c.NS, fmt.Sprintf(`{addresses: ["203.0.113.112/28"], autoAssign: false, serviceAllocation: {namespaces: [%s]}, announce: {mode: BGP, bgp: {drain: Weight}}}`, c.NS))
	// BFD at 100 ms resets sessions when the shared machine stalls a daemon for 300 ms, which
	// would be measured as the drain's doing (as in test/e2e): off for the drains, back after.
	bfd := func(on bool) {
		patch := fmt.Appendf(nil, `{"spec":{"bfd":{"enabled":%v}}}`, on)
		if _, err := c.Dyn.Resource(v1alpha1.BGPPeerResource).Patch(context.Background(), "router-"+c.NS, types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
			m.Fatalf("%v", err)
		}
	}
	bfd(false)
	defer bfd(true)
	const settle = 2 * time.Second // the resilient group's idle timer (1 s) and a second
	var drains []cluster.BGPDrain
	var buckets string
	for i, s := range drainSetups {
		pool := "bgp-" + c.NS
		if s.pool != "" {
			pool = s.pool + "-" + c.NS
		}
		vip := c.Service(fmt.Sprintf("drain-bgp-%d", i), cluster.InPool(pool))
		var fib *lab.ResilientECMP
		if s.resilient {
			fib = c.Lab.StartResilientECMP(m, netip.PrefixFrom(vip, 32), lab.ResilientOptions{})
			fib.WaitHops(m, 3, 60*time.Second)
			buckets = fmt.Sprintf("%d buckets, idle timer %s", fib.Options.Buckets, fib.Options.IdleTimer)
		}
		d := c.MeasureBGPDrain(vip, "node1", 20, delay, settle)
		harness.Step("%s: %s", s.name, d)
		if fib != nil {
			if _, err := fib.Changes(); err != nil {
				m.Fatalf("the resilient group did not follow FRR's route: %v", err)
			}
			fib.Stop()
		}
		drains = append(drains, d)
	}
	rows := [][]string{{"measure"}}
	for _, s := range drainSetups {
		rows[0] = append(rows[0], s.name)
	}
	row := func(name string, f func(d cluster.BGPDrain) string) {
		out := []string{name}
		for _, d := range drains {
			out = append(out, f(d))
		}
		rows = append(rows, out)
	}
	row("node1 out of the kernel's next hops after the cordon", func(d cluster.BGPDrain) string { return figure.Duration(d.HopGone) })
	row("node1's path withdrawn after the cordon", func(d cluster.BGPDrain) string { return figure.Duration(d.Withdrawn) })
	row("new connections on node1: before the cordon", func(d cluster.BGPDrain) string {
		return fmt.Sprintf("%d of %d", d.EarlyOnVictim, d.Early)
	})
	row(fmt.Sprintf("new connections on node1: from %s after the cordon to the withdrawal", settle), func(d cluster.BGPDrain) string {
		return fmt.Sprintf("%d of %d", d.LateOnVictim, d.Late)
	})
	row("last new connection served by node1 after the cordon", func(d cluster.BGPDrain) string { return figure.Duration(d.LastOnVictim) })
	row("new connections after the cordon, failed", func(d cluster.BGPDrain) string { return fmt.Sprintf("%d, %d", d.News, d.FailedNews) })
	row("long connections on node1 reset before the withdrawal", func(d cluster.BGPDrain) string {
		return fmt.Sprintf("%d of %d", d.ResetVictimBefore, d.LongOnVictim)
	})
	row("long connections on other nodes reset before the withdrawal", func(d cluster.BGPDrain) string {
		return fmt.Sprintf("%d of %d", d.ResetOthersBefore, d.LongOnOther)
	})
	row("long connections reset after the withdrawal (node1, others)", func(d cluster.BGPDrain) string {
		return fmt.Sprintf("%d, %d", d.ResetVictimAfter, d.ResetOthersAfter)
	})
	var weightRoute string
	for i, s := range drainSetups {
		if s.pool != "" && weightRoute == "" {
			weightRoute = drains[i].Route
		}
	}
	bgpMethod := fmt.Sprintf("In the lab, with the CCM's default drain delay (%s); run on %s, load average %s. BGP: a Cluster-policy VIP advertised by three nodes (sessions without BFD, which a stalled daemon on this shared machine would reset); the remote client holds 20 long TCP connections (each checked by an echo every 100 ms) and opens a new one every 50 ms; node1 is cordoned; the same for each router setup and drain mode, each with its own VIP. "+
		"GracefulShutdown (the default): node1's routes get GRACEFUL_SHUTDOWN, which FRR turns into LOCAL_PREF 0, so node1 leaves the multipath at once. Weight (spec.announce.bgp.drain: Weight): node1 keeps its path with the least link bandwidth and the others advertise 100 times theirs; FRR installs weights of 100 times each share, so during the delay the router's route reads:\n\n```\n%s\n```\n\n"+
		"Plain ECMP: FRR 8.4 installs its route as a hash-threshold group, the only kind it makes (it has no resilient option for BGP routes, nor does any later FRR): any change of next hops or weights rehashes flows, node1's established connections go to nodes that reset them and some of the others' move too. "+
		"Resilient: the router forwards over a Linux resilient next-hop group (%s, unbalanced timer 0) that follows FRR's next hops and weights (test/lab, ResilientECMP), as a router with resilient hashing programs its FIB: a next hop that leaves gives its buckets to the others at once, a weight change moves only idle buckets. "+
		"Resets are counted when an echo fails, up to a second after the cause; new connections from %s after the cordon (the idle buckets have moved by then) until the withdrawal show where new flows go during the delay: node1 keeps the buckets its long connections keep busy, and its weight's share, about 1%%.",
		delay, time.Now().UTC().Format("2006-01-02 15:04 UTC"), proc.LoadAverage(), weightRoute, buckets, settle)
	l2vip := c.Service("drain-l2")
	var owner string
	harness.Eventually(m, 30*time.Second, "an owner", func() bool { owner = c.Owner(l2vip); return owner != "" })
	probe, err := c.Lab.Client.Probe(l2vip, 20*time.Millisecond, int((delay+10*time.Second)/(20*time.Millisecond)))
	if err != nil {
		m.Fatalf("%v", err)
	}
	harness.Eventually(m, 5*time.Second, "the probe is answered", probe.Answered)
	t1 := time.Now()
	c.Cordon(owner, true)
	d := c.SampleL2Drain(l2vip, owner, t1, delay+2*time.Second)
	time.Sleep(500 * time.Millisecond)
	probe.Stop()
	_, lost := probe.Outage(t1)
	c.Cordon(owner, false)

	r.add("Drains", bgpMethod, rows)
	r.add("Drains: L2", "The same run: the on-link client pings an L2 VIP every 20 ms (ICMP echo); the owner is cordoned; who answers ARP is sampled (each ask waits 100 ms).",
		[][]string{{"measure", "value"},
			{"new owner's first answer after the cordon", figure.Duration(d.Made)},
			{"old owner's last answer after the cordon", figure.Duration(d.Broken)},
			{"ARP samples with nobody answering / with both", fmt.Sprintf("%d / %d of %d", d.None, d.Two, d.Samples)},
			{"pings unanswered (every 20 ms)", fmt.Sprint(lost)},
		})
}
