package e2e

import (
	"context"
	"fmt"
	"net/netip"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/metalvip/metalvip/api/v1alpha1"
	"github.com/metalvip/metalvip/test/cluster"
	"github.com/metalvip/metalvip/test/kubeapi"
	"github.com/metalvip/metalvip/test/lab"
)

const drainDelay = 5 * time.Second

func cordon(t *testing.T, c *cluster.Cluster, node string, on bool) {
	t.Helper()
	patch := fmt.Appendf(nil, `{"spec":{"unschedulable":%v}}`, on)
	if _, err := c.Srv.Client.CoreV1().Nodes().Patch(context.Background(), node, types.StrategicMergePatchType, patch, metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
}

// TestDrain: cordoning a node moves new BGP connections off it within the drain delay
// (GRACEFUL_SHUTDOWN first, the withdrawal after the delay), with the established ones
// measured; and an L2 VIP moves off its cordoned owner with no probe unanswered.
func TestDrain(t *testing.T) {
	c := cluster.New(t, kubeapi.Get(t), cluster.Options{CCMBinary: ccmBinary, AgentBinary: agentBinary,
		CloudConfig: fmt.Sprintf("drain:\n  delay: %s\n", drainDelay)})
	for _, n := range c.Lab.Nodes {
		n.ServeName(t, 80)
	}
	every := []string{"198.51.100.11", "198.51.100.12", "198.51.100.13"}
	// BFD at 100 ms resets sessions when the shared machine stalls a daemon for 300 ms, which
	// would be measured as the drain's doing: this test runs its sessions without it.
	patch := []byte(`{"spec":{"bfd":{"enabled":false}}}`)
	if _, err := c.Dyn.Resource(v1alpha1.BGPPeerResource).Patch(context.Background(), "router-"+c.NS, types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}

	t.Run("BGP: new connections leave the cordoned node within the delay", func(t *testing.T) {
		c.T = t
		vip := c.Service("drain-bgp", cluster.InPool("bgp-"+c.NS))
		cluster.Eventually(t, 60*time.Second, "three next hops", func() bool { return slices.Equal(c.NextHops(vip), every) })
		tr := lab.StartTraffic(t, c.Lab.Remote, netip.AddrPortFrom(vip, 80), 20)
		before := map[string]int{}
		for _, lc := range tr.Long {
			before[lc.Server]++
		}
		victim := "node1"
		time.Sleep(time.Second)
		t0 := time.Now()
		cordon(t, c, victim, true)
		// The kernel route: when node1 leaves the next hops (GRACEFUL_SHUTDOWN makes FRR
		// prefer the others), and when FRR's table loses node1's path (the withdrawal).
		var hopGone, withdrawn time.Duration
		var gshut string
		deadline := time.Now().Add(drainDelay + 20*time.Second)
		for time.Now().Before(deadline) && (hopGone == 0 || withdrawn == 0) {
			if hopGone == 0 && !slices.Contains(c.NextHops(vip), "198.51.100.11") {
				hopGone = time.Since(t0)
				gshut, _ = c.Lab.Vtysh("show bgp ipv4 unicast " + vip.String())
			}
			if out, err := c.Lab.Vtysh("show bgp ipv4 unicast " + vip.String()); err == nil && withdrawn == 0 && !strings.Contains(out, "198.51.100.11 from") {
				withdrawn = time.Since(t0)
			}
			time.Sleep(20 * time.Millisecond)
		}
		time.Sleep(time.Second)
		tr.Stop()

		if hopGone == 0 || withdrawn == 0 {
			t.Fatalf("node1 left the next hops after %s, its path withdrawn after %s (0: not within %s)", hopGone, withdrawn, drainDelay+20*time.Second)
		}
		// New connections: the last one node1 served after the cordon.
		var lastOnVictim time.Duration
		newAfter, failedNew := 0, 0
		for _, nc := range tr.News {
			if nc.At.Before(t0) {
				continue
			}
			newAfter++
			if nc.Server == "" {
				failedNew++
			}
			if nc.Server == victim {
				lastOnVictim = nc.At.Sub(t0)
			}
		}
		if lastOnVictim >= drainDelay {
			t.Errorf("a new connection reached %s %s after the cordon, past the %s delay", victim, lastOnVictim.Round(time.Millisecond), drainDelay)
		}
		// Established connections: which were reset, and when.
		var resets []string
		resetBeforeWithdraw, resetOfVictim := 0, 0
		for i, lc := range tr.Long {
			if at := tr.ResetAt[i]; !at.IsZero() {
				resets = append(resets, fmt.Sprintf("%s@%s", lc.Server, at.Sub(t0).Round(10*time.Millisecond)))
				if at.Sub(t0) < withdrawn {
					resetBeforeWithdraw++
				}
				if lc.Server == victim {
					resetOfVictim++
				}
			}
		}
		sort.Strings(resets)
		t.Logf("BGP drain of %s (delay %s): next hop gone from the router's kernel route %s after the cordon (GRACEFUL_SHUTDOWN), path withdrawn %s after; "+
			"%d new connections after the cordon (%d failed), the last on %s at %s; long connections by node %v: %d of 20 reset (%d on %s, %d before the withdrawal): %v",
			victim, drainDelay, hopGone.Round(time.Millisecond), withdrawn.Round(time.Millisecond), newAfter, failedNew, victim, lastOnVictim.Round(time.Millisecond),
			before, len(resets), resetOfVictim, victim, resetBeforeWithdraw, resets)
		t.Logf("FRR as node1 left the next hops:\n%s", gshut)
		if !strings.Contains(gshut, "graceful-shutdown") && !strings.Contains(gshut, "65535:0") {
			t.Errorf("node1's path did not carry GRACEFUL_SHUTDOWN when it left the next hops")
		}
		if withdrawn < drainDelay-time.Second {
			t.Errorf("withdrawn %s after the cordon, before the %s delay", withdrawn, drainDelay)
		}
		cordon(t, c, victim, false)
		cluster.Eventually(t, 60*time.Second, "node1 advertises again once uncordoned", func() bool { return slices.Equal(c.NextHops(vip), every) })
	})

	t.Run("L2: the cordoned owner's VIP moves with no probe unanswered", func(t *testing.T) {
		c.T = t
		vip := c.Service("drain-l2")
		var owner string
		cluster.Eventually(t, 30*time.Second, "an owner", func() bool { owner = c.Owner(vip); return owner != "" })
		probe, err := c.Lab.Client.Probe(vip, 20*time.Millisecond, 2000)
		if err != nil {
			t.Fatal(err)
		}
		cluster.Eventually(t, 5*time.Second, "the probe is answered", probe.Answered)
		t0 := time.Now()
		cordon(t, c, owner, true)
		// Who answers ARP, sampled (each ask waits 100 ms for answers) until the delay is over.
		none, two, samples := 0, 0, 0
		var made, broken time.Duration // the new owner's first answer, the old one's last
		for time.Since(t0) < drainDelay+2*time.Second {
			got := c.Answerers(vip)
			samples++
			switch {
			case len(got) == 0:
				none++
			case len(got) > 1:
				two++
			}
			if made == 0 && slices.ContainsFunc(got, func(n string) bool { return n != owner }) {
				made = time.Since(t0)
			}
			if slices.Contains(got, owner) {
				broken = time.Since(t0)
			}
		}
		time.Sleep(500 * time.Millisecond)
		probe.Stop()
		_, lost := probe.Outage(t0)
		now := c.Owner(vip)
		t.Logf("L2 drain of %s (delay %s): %s answers from %s after the cordon, %s last answered at %s; %d probes every 20 ms unanswered; ARP sampled %d times: %d with nobody answering, %d with two answering (the overlap)",
			owner, drainDelay, now, made.Round(time.Millisecond), owner, broken.Round(time.Millisecond), lost, samples, none, two)
		if made == 0 || broken < made {
			t.Errorf("break before make: the new owner first answered at %s, the old one last at %s", made, broken)
		}
		if now == owner || now == "" {
			t.Errorf("the VIP is answered by %q after the drain", now)
		}
		if lost != 0 {
			t.Errorf("%d probes unanswered", lost)
		}
		if none != 0 {
			t.Errorf("%d ARP samples with nobody answering", none)
		}
		cordon(t, c, owner, false)
	})
}
