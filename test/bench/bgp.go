package main

import (
	"context"
	"fmt"
	"math"
	"net/netip"
	"slices"
	"strings"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/metalvip/metalvip/api/v1alpha1"
	"github.com/metalvip/metalvip/test/cluster"
	"github.com/metalvip/metalvip/test/lab"
	"github.com/metalvip/metalvip/test/testenv"
)

// bgpWeighted measures weighted ECMP by endpoints: the router's kernel weights for endpoints
// 1/2/3 on three nodes, and how 5 rounds of 1,000 connections from the remote client split.
func bgpWeighted(m *testenv.Main, r *report, c *cluster.Cluster) {
	step("BGP: weighted ECMP by endpoints")
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
	cluster.Eventually(m, 60*time.Second, "three weighted next hops", func() bool {
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
		fmt.Sprintf("In the lab: a pool with announce.bgp.weightByEndpoints, an externalTrafficPolicy Local Service with 1, 2 and 3 ready endpoints on node1, node2 and node3; each node advertises the link-bandwidth community (1 Mbit/s per endpoint) and FRR 8.4 (bgp bestpath bandwidth skip-missing) installs nexthop weights of 100 times each share, truncated; weights in the kernel %s after the endpoints were set:\n\n```\n%s\n```\n\nThen 5 rounds of 1,000 TCP connections, one after another, from the remote client behind the router to the VIP (the router hashes source and destination ports, fib_multipath_hash_policy 1); each node's server names itself. A round's split is binomial around the weights (about ±12 connections, one standard deviation, on node1), so a round within ±10%% of 1:2:3 on every node is likely, not certain; FRR's truncation alone puts the ideal at 16.2/33.3/50.5%%.", dur(took), route),
		rows)
}

// bgpDrain measures a drain: with the remote client holding 20 long connections and opening a
// new one every 50 ms through a BGP VIP, node1 is cordoned; and an L2 VIP's owner is
// cordoned while the on-link client probes it every 20 ms.
func bgpDrain(m *testenv.Main, r *report, c *cluster.Cluster, delay time.Duration) {
	step("drains: BGP with GRACEFUL_SHUTDOWN, L2 make-before-break")
	ctx := context.Background()
	cordon := func(node string, on bool) {
		patch := fmt.Appendf(nil, `{"spec":{"unschedulable":%v}}`, on)
		if _, err := c.Srv.Client.CoreV1().Nodes().Patch(ctx, node, types.StrategicMergePatchType, patch, metav1.PatchOptions{}); err != nil {
			m.Fatalf("%v", err)
		}
	}
	every := []string{"198.51.100.11", "198.51.100.12", "198.51.100.13"}
	vip := c.Service("drain-bgp", cluster.InPool("bgp-"+c.NS))
	cluster.Eventually(m, 60*time.Second, "three next hops", func() bool { return slices.Equal(c.NextHops(vip), every) })
	tr := lab.StartTraffic(m, c.Lab.Remote, netip.AddrPortFrom(vip, 80), 20)
	time.Sleep(time.Second)
	t0 := time.Now()
	cordon("node1", true)
	var hopGone, withdrawn time.Duration
	for time.Since(t0) < delay+20*time.Second && (hopGone == 0 || withdrawn == 0) {
		if hopGone == 0 && !slices.Contains(c.NextHops(vip), "198.51.100.11") {
			hopGone = time.Since(t0)
		}
		if out, err := c.Lab.Vtysh("show bgp ipv4 unicast " + vip.String()); err == nil && withdrawn == 0 && !strings.Contains(out, "198.51.100.11 from") {
			withdrawn = time.Since(t0)
		}
		time.Sleep(20 * time.Millisecond)
	}
	time.Sleep(time.Second)
	tr.Stop()
	var lastOn time.Duration
	news, failed := 0, 0
	for _, nc := range tr.News {
		if nc.At.Before(t0) {
			continue
		}
		news++
		if nc.Server == "" {
			failed++
		}
		if nc.Server == "node1" {
			lastOn = nc.At.Sub(t0)
		}
	}
	onVictim, resetVictim, resetOthers, beforeWithdraw := 0, 0, 0, 0
	for i, lc := range tr.Long {
		if lc.Server == "node1" {
			onVictim++
		}
		if at := tr.ResetAt[i]; !at.IsZero() {
			if lc.Server == "node1" {
				resetVictim++
			} else {
				resetOthers++
			}
			if at.Sub(t0) < withdrawn {
				beforeWithdraw++
			}
		}
	}
	cordon("node1", false)
	cluster.Eventually(m, 60*time.Second, "node1 back", func() bool { return slices.Equal(c.NextHops(vip), every) })

	l2vip := c.Service("drain-l2")
	var owner string
	cluster.Eventually(m, 30*time.Second, "an owner", func() bool { owner = c.Owner(l2vip); return owner != "" })
	probe, err := c.Lab.Client.Probe(l2vip, 20*time.Millisecond, int((delay+10*time.Second)/(20*time.Millisecond)))
	if err != nil {
		m.Fatalf("%v", err)
	}
	cluster.Eventually(m, 5*time.Second, "the probe is answered", probe.Answered)
	t1 := time.Now()
	cordon(owner, true)
	none, two, samples := 0, 0, 0
	var made, broken time.Duration
	for time.Since(t1) < delay+2*time.Second {
		got := c.Answerers(l2vip)
		samples++
		switch {
		case len(got) == 0:
			none++
		case len(got) > 1:
			two++
		}
		if made == 0 && slices.ContainsFunc(got, func(n string) bool { return n != owner }) {
			made = time.Since(t1)
		}
		if slices.Contains(got, owner) {
			broken = time.Since(t1)
		}
	}
	time.Sleep(500 * time.Millisecond)
	probe.Stop()
	_, lost := probe.Outage(t1)
	cordon(owner, false)

	r.add("Drains",
		fmt.Sprintf("In the lab, with the CCM's default drain delay (%s). BGP: a Cluster-policy VIP advertised by three nodes; the remote client holds 20 long TCP connections (each checked by an echo every 100 ms) and opens a new one every 50 ms; node1 is cordoned. Its routes get GRACEFUL_SHUTDOWN, which FRR turns into LOCAL_PREF 0, so node1 leaves the kernel's next hops; the withdrawal follows after the delay. Stateless ECMP rehashes flows when the next hops change: node1's established connections go to nodes that reset them, and Linux's hash-threshold multipath moves some of the others' too, at the GRACEFUL_SHUTDOWN, not at the withdrawal (see docs/announcing.md, Drains). L2: the on-link client pings the owner of an L2 VIP every 20 ms; the owner is cordoned; who answers ARP is sampled (each ask waits 100 ms).", delay),
		[][]string{{"measure", "value"},
			{"BGP: node1 out of the kernel's next hops after the cordon", dur(hopGone)},
			{"BGP: node1's path withdrawn after the cordon", dur(withdrawn)},
			{"BGP: last new connection served by node1 after the cordon", dur(lastOn)},
			{"BGP: new connections after the cordon, failed", fmt.Sprintf("%d, %d", news, failed)},
			{"BGP: long connections on node1 reset", fmt.Sprintf("%d of %d", resetVictim, onVictim)},
			{"BGP: long connections on other nodes reset", fmt.Sprintf("%d of %d", resetOthers, 20-onVictim)},
			{"BGP: resets before the withdrawal", fmt.Sprint(beforeWithdraw)},
			{"L2: new owner's first answer after the cordon", dur(made)},
			{"L2: old owner's last answer after the cordon", dur(broken)},
			{"L2: ARP samples with nobody answering / with both", fmt.Sprintf("%d / %d of %d", none, two, samples)},
			{"L2: pings unanswered (every 20 ms)", fmt.Sprint(lost)},
		})
}
