package e2ecluster

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/metalvip/metalvip/test/kubecluster"
)

// rollingUpdate runs roll (an update of the agents or of the CCM, an upgrade, a rollback) under
// kubecluster.MeasureRoll's traffic and fails on what a client would notice: a probe lost, a
// long-lived connection broken, the router's next hops of the BGP VIP changed at any sample, an
// owner or an address changed, a Moved Event; an L2 VIP answered by another node than its
// owner fails beyond a starved agent's maxDouble, as for a CCM replacement.
func rollingUpdate(t *testing.T, c *kubecluster.Cluster, w *kubecluster.Workload, what string, roll func(context.Context) error) {
	t.Helper()
	start := time.Now()
	r, err := c.MeasureRoll(context.Background(), w, what, roll)
	t.Log(r)
	if err != nil {
		t.Fatal(err)
	}
	for i, name := range []string{"L2", "BGP"} {
		if r.Probes[i].Lost != 0 {
			t.Errorf("%s %s: %d of %d probes failed during %s (last error %s)", name, r.VIPs[i], r.Probes[i].Lost, r.Probes[i].Sent, what, r.ProbeErrs[i])
		}
		if r.Broken[i] != 0 {
			t.Errorf("%s %s: %d of %d long-lived connections broken during %s; the first: %s", name, r.VIPs[i], r.Broken[i], kubecluster.LongConns, what, r.FirstBroken[i])
		} else if r.Asked[i] < kubecluster.LongConns*10 {
			t.Errorf("%s %s: the long connections were asked only %d times: the record proves nothing", name, r.VIPs[i], r.Asked[i])
		}
	}
	if len(r.HopChanges) > 0 {
		t.Errorf("the router's next hops of %s changed during %s: %s", r.VIPs[1], what, strings.Join(r.HopChanges[:min(len(r.HopChanges), 10)], "; "))
	}
	for _, l := range [][]string{r.OwnersChanged, r.AddressesChanged, r.Moved} {
		if len(l) > 0 {
			t.Errorf("after %s:\n%s", what, strings.Join(l, "\n"))
		}
	}
	if t.Failed() {
		for i, name := range []string{"L2", "BGP"} {
			if len(r.Breaks[i]) > 0 {
				t.Logf("%s long connections broken:\n%s", name, strings.Join(r.Breaks[i], "\n"))
			}
		}
		t.Logf("metalvip pods meanwhile:\n%s", strings.Join(r.Timeline, "\n"))
		for pod, log := range r.Logs {
			t.Logf("%s's log during %s:\n%s", pod, what, log)
		}
		t.Logf("the router's session and BFD events during %s:\n%s", what, routerEvents(c, start))
	}
	if len(r.ARPWrong) > 0 {
		t.Logf("ARP requests answered by another node than the owner during %s; the first:\n%s", what, strings.Join(r.ARPWrong[:min(len(r.ARPWrong), 10)], "\n"))
	}
	if r.ARPWorst > maxDouble {
		t.Errorf("another node answered an owner's VIP for %s in a row during %s (more than %s)", r.ARPWorst, what, maxDouble)
	}
}

// routerEvents is the router's FRR log since start without the lines of a session's setup
// that say nothing of its fate (capabilities, update groups, flags).
func routerEvents(c *kubecluster.Cluster, start time.Time) string {
	noise := []string{"Update Group Hash", "OPEN has", "rcv OPEN w/", "rcvd OPEN w/", "hostname", "PEER_FLAG_", "afi/safi", "routeadv timer", "keepalive timer", "sessions updated"}
	var keep []string
	for _, line := range strings.Split(c.Lab.RouterLog(start, 1<<20), "\n") {
		if !slices.ContainsFunc(noise, func(n string) bool { return strings.Contains(line, n) }) {
			keep = append(keep, line)
		}
	}
	return strings.Join(keep[max(0, len(keep)-300):], "\n")
}
