package e2ecluster

import (
	"context"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/metalvip/metalvip/loadbalancer/report"
	"github.com/metalvip/metalvip/test/harness/probe"
	"github.com/metalvip/metalvip/test/kubecluster"
)

// longConns is how many long-lived connections each VIP carries through an update (issue 32).
const longConns = 20

// rollingUpdate replaces every agent the way an upgrade does (roll, e.g. `kubectl rollout
// restart`, one node at a time, each old agent getting SIGTERM) while a client sends HTTP on a
// new connection every 20 ms to the L2 VIP and the remote client to the BGP ETP Cluster VIP,
// each beside 20 long-lived connections; and checks what no client may notice: no probe lost,
// no long connection broken, no L2 VIP answered by another node than its owner (beyond a
// starved agent's maxDouble), the router's next hops of the BGP VIP unchanged at every sample,
// no address changed, no Moved Event. It returns a line of figures for the log.
func rollingUpdate(t *testing.T, c *kubecluster.Cluster, w *kubecluster.Workload, what string, roll func(context.Context) error) string {
	t.Helper()
	ctx := context.Background()
	l2, bgp := w.VIPs[kubecluster.ServiceL2], w.VIPs[kubecluster.ServiceBGP]
	l2VIPs := []netip.Addr{l2, w.VIPs[kubecluster.ServiceL2Local]}
	owners := map[netip.Addr]string{}
	for _, vip := range l2VIPs {
		o, err := c.Owner(vip)
		if err != nil || o == "" {
			t.Fatalf("nobody answers for %s: %v", vip, err)
		}
		owners[vip] = o
	}
	hops, err := c.NextHops(bgp)
	if err != nil || len(hops) != len(c.Nodes) {
		t.Fatalf("the router's next hops of %s: %v (%v); want every node", bgp, hops, err)
	}
	nodeOf, err := c.MACs()
	if err != nil {
		t.Fatal(err)
	}
	watch, err := c.Lab.Client.WatchNeighbors(l2VIPs, 20*time.Millisecond, 10*60*1000/20)
	if err != nil {
		t.Fatal(err)
	}
	defer watch.Stop()

	// 2 s per probe: a shared 2-core machine can stall an answer for a second.
	l2Probe := startProbe(t, c, l2, 2*time.Second, 30000)
	bgpProbe, err := probe.StartHTTP(c.Lab.Remote, netip.AddrPortFrom(bgp, 80), kubecluster.ProbeInterval, 2*time.Second, 30000)
	if err != nil {
		stopProbe(t, l2Probe)
		t.Fatal(err)
	}
	var longs []*probe.Long
	for _, to := range []struct {
		ns  probe.Namespace
		vip netip.Addr
	}{{c.Lab.Client, l2}, {c.Lab.Remote, bgp}} {
		l, err := probe.StartLong(to.ns, netip.AddrPortFrom(to.vip, 80), longConns, 250*time.Millisecond, 2*time.Second, 4000)
		if err != nil {
			t.Fatal(err)
		}
		longs = append(longs, l)
	}

	// The router's route to the BGP VIP, sampled every 50 ms: any other set of next hops is a
	// change a flow's hash would see.
	var (
		mu      sync.Mutex
		samples int
		changed []string
	)
	stop, sampled := make(chan struct{}), make(chan struct{})
	at := time.Now()
	go func() {
		defer close(sampled)
		for range 20000 {
			select {
			case <-stop:
				return
			case <-time.After(50 * time.Millisecond):
			}
			got, err := c.NextHops(bgp)
			mu.Lock()
			samples++
			if err != nil || !slices.Equal(got, hops) {
				changed = append(changed, fmt.Sprintf("+%s: %v (%v)", time.Since(at).Round(time.Millisecond), got, err))
			}
			mu.Unlock()
		}
	}()

	rollErr := roll(ctx)
	rolled := time.Since(at)
	time.Sleep(5 * time.Second) // the last agent back among its peers, traffic steady
	close(stop)
	<-sampled
	stopProbe(t, l2Probe)
	stopProbe(t, bgpProbe)
	for _, l := range longs {
		l.Stop()
	}
	if rollErr != nil {
		t.Fatalf("%s: %v", what, rollErr)
	}

	var figures []string
	for _, p := range []struct {
		name string
		p    *probe.HTTP
	}{{"L2 " + l2.String(), l2Probe}, {"BGP " + bgp.String(), bgpProbe}} {
		o := p.p.Outage(at)
		figures = append(figures, fmt.Sprintf("%s: %d of %d probes lost (longest outage %s)", p.name, o.Lost, o.Sent, o.Longest))
		if o.Lost != 0 {
			t.Errorf("%s: %d of %d probes failed during %s (last error %s)", p.name, o.Lost, o.Sent, what, p.p.LastError())
		}
	}
	for i, l := range longs {
		n, first := l.Broken()
		figures = append(figures, fmt.Sprintf("%d of %d long connections to %s broken", n, l.Len(), []string{"L2", "BGP"}[i]))
		if n != 0 {
			t.Errorf("%d of %d long-lived connections broken during %s; the first: %s", n, l.Len(), what, first)
		}
		if n == 0 && l.Asked() < l.Len()*10 {
			t.Errorf("the long connections were asked only %d times: the record proves nothing", l.Asked())
		}
	}
	mu.Lock()
	figures = append(figures, fmt.Sprintf("%d of %d samples of the router's route with other next hops than %v", len(changed), samples, hops))
	if len(changed) > 0 {
		t.Errorf("the router's next hops of %s changed during %s: %s", bgp, what, strings.Join(changed[:min(len(changed), 10)], "; "))
	}
	mu.Unlock()
	for vip, want := range owners {
		if got, err := c.Owner(vip); got != want {
			t.Errorf("%s answered by %q (%v), by %s before %s", vip, got, err, want, what)
		}
	}
	for name, vip := range w.VIPs {
		s, err := c.Client.CoreV1().Services(kubecluster.WorkloadNamespace).Get(ctx, name, metav1.GetOptions{})
		if err != nil || len(s.Status.LoadBalancer.Ingress) != 1 || s.Status.LoadBalancer.Ingress[0].IP != vip.String() {
			t.Errorf("%s: address changed from %s to %v (%v)", name, vip, ingressOf(s), err)
		}
	}
	if moved := c.EventsSince(ctx, kubecluster.WorkloadNamespace, report.ReasonMoved, at); len(moved) > 0 {
		t.Errorf("VIPs moved during %s:\n%s", what, strings.Join(moved, "\n"))
	}
	asked, wrong, worst := arpRecord(watch.Rounds(), at, l2VIPs, owners, nodeOf)
	figures = append(figures, fmt.Sprintf("%d ARP requests for %v, %d answered by another node than the owner (longest run %s)", asked, l2VIPs, len(wrong), worst.Round(time.Millisecond)))
	if len(wrong) > 0 {
		t.Logf("ARP requests answered by another node than the owner during %s; the first:\n%s", what, strings.Join(wrong[:min(len(wrong), 10)], "\n"))
	}
	if worst > maxDouble {
		t.Errorf("another node answered an owner's VIP for %s in a row during %s (more than %s)", worst.Round(time.Millisecond), what, maxDouble)
	}
	return fmt.Sprintf("%s in %s: %s", what, rolled.Round(time.Millisecond), strings.Join(figures, "; "))
}

// rolloutRestartAgents is `kubectl rollout restart` of the agents' DaemonSet and the wait for
// its end: every agent replaced, one node at a time.
func rolloutRestartAgents(c *kubecluster.Cluster) func(context.Context) error {
	return func(ctx context.Context) error {
		if _, err := c.Kubectl(ctx, "-n", kubecluster.MetalvipNamespace, "rollout", "restart", "daemonset/"+kubecluster.AgentDaemonSet); err != nil {
			return err
		}
		_, err := c.Kubectl(ctx, "-n", kubecluster.MetalvipNamespace, "rollout", "status", "daemonset/"+kubecluster.AgentDaemonSet, "--timeout", "5m")
		return err
	}
}
