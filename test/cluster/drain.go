package cluster

import (
	"context"
	"fmt"
	"net/netip"
	"slices"
	"sort"
	"strings"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/metalvip/metalvip/test/harness"
	"github.com/metalvip/metalvip/test/lab"
)

// Cordon sets or clears a node's spec.unschedulable, as kubectl cordon and uncordon do.
func (c *Cluster) Cordon(node string, on bool) {
	c.T.Helper()
	patch := fmt.Appendf(nil, `{"spec":{"unschedulable":%v}}`, on)
	if _, err := c.Srv.Client.CoreV1().Nodes().Patch(context.Background(), node, types.StrategicMergePatchType, patch, metav1.PatchOptions{}); err != nil {
		c.T.Fatalf("cordon %s: %v", node, err)
	}
}

// BGPDrain is what cordoning a node did to traffic through a BGP VIP: the remote client
// held long connections (checked by an echo every 100 ms) and opened a new one every 50 ms.
type BGPDrain struct {
	Victim string
	// HopGone: when the victim left the next hops of the router's kernel route (FRR's route
	// in the main table); Withdrawn: when FRR was first seen without the victim's path. 0:
	// not within the wait. LastSeen: when the last look that still found the path began, so
	// the withdrawal fell between LastSeen and Withdrawn (each look runs vtysh, which takes
	// tens of milliseconds and more on a busy machine).
	HopGone, Withdrawn, LastSeen time.Duration
	// Route is the router's kernel route Settle after the cordon; Path is FRR's view of the
	// victim's path then.
	Route, Path string
	// Settle: the new connections opened from Settle after the cordon until the withdrawal
	// (Late) and how many of them the victim served (LateOnVictim); before the cordon, the
	// victim served EarlyOnVictim of Early.
	Settle                    time.Duration
	Late, LateOnVictim        int
	Early, EarlyOnVictim      int
	News, FailedNews          int           // new connections after the cordon, and those that failed
	LastOnVictim              time.Duration // the last new connection the victim served, after the cordon
	LongOnVictim, LongOnOther int
	// Resets of long connections, on the victim and on the other nodes, seen before the
	// withdrawal and after it.
	ResetVictimBefore, ResetOthersBefore, ResetVictimAfter, ResetOthersAfter int
	Resets                                                                   []string // node@time after the cordon
}

// MeasureBGPDrain cordons victim while traffic flows to vip (long connections from the remote
// client), waits for FRR to lose the victim's path (at most delay+20 s), and counts what
// happened; the node is uncordoned at the end and the test waits until every node
// advertises again.
func (c *Cluster) MeasureBGPDrain(vip netip.Addr, victim string, long int, delay, settle time.Duration) BGPDrain {
	c.T.Helper()
	var victimAddr string
	every := []string{}
	for _, n := range c.Lab.Nodes {
		every = append(every, n.IPv4.String())
		if n.Name == victim {
			victimAddr = n.IPv4.String()
		}
	}
	slices.Sort(every)
	harness.Eventually(c.T, 60*time.Second, "every node in the next hops", func() bool { return slices.Equal(c.NextHops(vip), every) })
	tr := lab.StartTraffic(c.T, c.Lab.Remote, netip.AddrPortFrom(vip, 80), long)
	time.Sleep(2 * time.Second)
	d := BGPDrain{Victim: victim, Settle: settle}
	t0 := time.Now()
	c.Cordon(victim, true)
	for time.Since(t0) < delay+20*time.Second && d.Withdrawn == 0 {
		if d.HopGone == 0 && !slices.Contains(c.NextHops(vip), victimAddr) {
			d.HopGone = time.Since(t0)
		}
		looked := time.Since(t0)
		if out, err := c.Lab.Vtysh("show bgp ipv4 unicast " + vip.String()); err == nil {
			if strings.Contains(out, victimAddr+" from") {
				d.LastSeen = looked
			} else {
				d.Withdrawn = time.Since(t0)
			}
		}
		if d.Route == "" && time.Since(t0) >= settle {
			_, d.Route, _ = c.Lab.RouteWeights(vip.String())
			d.Path, _ = c.Lab.Vtysh("show bgp ipv4 unicast " + vip.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
	if d.HopGone == 0 {
		d.HopGone = d.Withdrawn
	}
	time.Sleep(time.Second)
	tr.Stop()

	withdrawnAt := t0.Add(d.Withdrawn)
	for _, nc := range tr.News {
		switch {
		case nc.At.Before(t0):
			d.Early++
			if nc.Server == victim {
				d.EarlyOnVictim++
			}
			continue
		case d.Withdrawn != 0 && nc.At.Sub(t0) >= settle && nc.At.Before(withdrawnAt):
			d.Late++
			if nc.Server == victim {
				d.LateOnVictim++
			}
		}
		d.News++
		if nc.Server == "" {
			d.FailedNews++
		}
		if nc.Server == victim {
			d.LastOnVictim = nc.At.Sub(t0)
		}
	}
	for i, lc := range tr.Long {
		onVictim := lc.Server == victim
		if onVictim {
			d.LongOnVictim++
		} else {
			d.LongOnOther++
		}
		at := tr.ResetAt[i]
		if at.IsZero() {
			continue
		}
		d.Resets = append(d.Resets, fmt.Sprintf("%s@%s", lc.Server, at.Sub(t0).Round(10*time.Millisecond)))
		// Before the withdrawal only when surely so: before the last look that still found
		// the path. A reset between that look and the first that did not came with the
		// withdrawal (the kernel's group changes after FRR's table), counted after it.
		before := d.Withdrawn == 0 || at.Before(t0.Add(d.LastSeen))
		switch {
		case onVictim && before:
			d.ResetVictimBefore++
		case onVictim:
			d.ResetVictimAfter++
		case before:
			d.ResetOthersBefore++
		default:
			d.ResetOthersAfter++
		}
	}
	sort.Strings(d.Resets)
	c.Cordon(victim, false)
	harness.Eventually(c.T, 60*time.Second, victim+" advertises again once uncordoned", func() bool { return slices.Equal(c.NextHops(vip), every) })
	return d
}

// String reads as one line of figures.
func (d BGPDrain) String() string {
	return fmt.Sprintf("%s out of the kernel's next hops %s after the cordon, withdrawn %s after (the path last seen at %s); new connections: %d after the cordon (%d failed), the last on %s at %s, "+
		"%d of %d on %s before the cordon, %d of %d from %s after it until the withdrawal; long connections %d on %s, %d on the others: reset before the withdrawal %d on %s, %d on the others, after it %d and %d: %v",
		d.Victim, d.HopGone.Round(time.Millisecond), d.Withdrawn.Round(time.Millisecond), d.LastSeen.Round(time.Millisecond), d.News, d.FailedNews, d.Victim, d.LastOnVictim.Round(time.Millisecond),
		d.EarlyOnVictim, d.Early, d.Victim, d.LateOnVictim, d.Late, d.Settle, d.LongOnVictim, d.Victim, d.LongOnOther,
		d.ResetVictimBefore, d.Victim, d.ResetOthersBefore, d.ResetVictimAfter, d.ResetOthersAfter, d.Resets)
}

// L2Drain is who answered ARP for an L2 VIP after its owner was cordoned, sampled (each ask
// waits for answers) until the drain's delay was over and a little after.
type L2Drain struct {
	// Made: the first answer of another node; Broken: the old owner's last answer.
	Made, Broken time.Duration
	// Samples taken; None of them answered by nobody, Two by two nodes or more (the overlap).
	Samples, None, Two int
}

// SampleL2Drain samples who answers ARP for vip from since until since+d.
func (c *Cluster) SampleL2Drain(vip netip.Addr, owner string, since time.Time, d time.Duration) L2Drain {
	var r L2Drain
	for time.Since(since) < d {
		got := c.Answerers(vip)
		r.Samples++
		switch {
		case len(got) == 0:
			r.None++
		case len(got) > 1:
			r.Two++
		}
		if r.Made == 0 && slices.ContainsFunc(got, func(n string) bool { return n != owner }) {
			r.Made = time.Since(since)
		}
		if slices.Contains(got, owner) {
			r.Broken = time.Since(since)
		}
	}
	return r
}
