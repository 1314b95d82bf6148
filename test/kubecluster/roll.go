package kubecluster

import (
	"context"
	"fmt"
	"io"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/metalvip/metalvip/loadbalancer/report"
	"github.com/metalvip/metalvip/test/harness/probe"
	"github.com/metalvip/metalvip/test/lab"
)

// LongConns is how many long-lived connections each VIP carries through a rolling update.
const LongConns = 20

// Roll is what the clients saw of a rolling update (MeasureRoll): the L2 VIP's probe from the
// client and the BGP ETP Cluster VIP's from the remote client, each beside LongConns long-lived
// connections; the router's next hops of the BGP VIP; the ARP requests for the L2 VIPs on the
// wire; what the API says afterwards.
type Roll struct {
	What string
	Took time.Duration // the roll itself: from its start until it said it was done
	VIPs [2]netip.Addr // L2, BGP
	// Probes: a GET on a new connection every ProbeInterval, per VIP.
	Probes    [2]probe.Outage
	ProbeErrs [2]string
	// Broken long connections per VIP, the first one's when and why, and how often they
	// were asked again.
	Broken      [2]int
	FirstBroken [2]string
	Breaks      [2][]string
	Asked       [2]int
	// Timeline is what happened to the metalvip pods meanwhile (polled every 250 ms): when
	// each was being deleted, when each new one became ready, and on which node.
	Timeline []string
	// Logs are the metalvip pods' logs from the roll's start (followed, so that a replaced
	// pod's last words are kept), by pod.
	Logs map[string]string
	// Hops are the router's next hops of the BGP VIP before; HopChanges the samples (every
	// 50 ms) that differed, of HopSamples.
	Hops       []string
	HopSamples int
	HopChanges []string
	// ARP: requests for the L2 VIPs, those answered by another node than the owner (or by
	// two), and the longest run of such requests in a row.
	ARPAsked int
	ARPWrong []string
	ARPWorst time.Duration
	// After the roll: L2 VIPs answered by another node than before, Services whose address
	// changed, Moved Events.
	OwnersChanged    []string
	AddressesChanged []string
	Moved            []string
}

// String is the figures in one line.
func (r Roll) String() string {
	var f []string
	for i, name := range []string{"L2", "BGP"} {
		f = append(f, fmt.Sprintf("%s %s: %d of %d probes lost (longest outage %s), %d of %d long connections broken", name, r.VIPs[i], r.Probes[i].Lost, r.Probes[i].Sent, r.Probes[i].Longest, r.Broken[i], LongConns))
	}
	f = append(f, fmt.Sprintf("%d of %d samples of the router's route with other next hops than %v", len(r.HopChanges), r.HopSamples, r.Hops))
	f = append(f, fmt.Sprintf("%d ARP requests for the L2 VIPs, %d answered by another node than the owner (longest run %s)", r.ARPAsked, len(r.ARPWrong), r.ARPWorst.Round(time.Millisecond)))
	f = append(f, fmt.Sprintf("%d owners changed, %d addresses changed, %d Moved Events", len(r.OwnersChanged), len(r.AddressesChanged), len(r.Moved)))
	return fmt.Sprintf("%s in %s: %s", r.What, r.Took.Round(time.Millisecond), strings.Join(f, "; "))
}

// MeasureRoll runs roll (a rolling update of the agents, of the CCM, an upgrade) while the
// client sends HTTP on a new connection every ProbeInterval to the L2 VIP and the remote client
// to the BGP ETP Cluster VIP, each beside LongConns long-lived connections, and records what
// they saw until 5 s after roll returned. It judges nothing: the caller does. An error is
// the roll's own or the measurement's.
func (c *Cluster) MeasureRoll(ctx context.Context, w *Workload, what string, roll func(context.Context) error) (Roll, error) {
	r := Roll{What: what, VIPs: [2]netip.Addr{w.VIPs[ServiceL2], w.VIPs[ServiceBGP]}}
	l2VIPs := []netip.Addr{w.VIPs[ServiceL2], w.VIPs[ServiceL2Local]}
	owners := map[netip.Addr]string{}
	for _, vip := range l2VIPs {
		o, err := c.Owner(vip)
		if err != nil || o == "" {
			return r, fmt.Errorf("nobody answers for %s: %v", vip, err)
		}
		owners[vip] = o
	}
	bgp := r.VIPs[1]
	var err error
	if r.Hops, err = c.NextHops(bgp); err != nil || len(r.Hops) != len(c.Nodes) {
		return r, fmt.Errorf("the router's next hops of %s: %v (%v); want every node", bgp, r.Hops, err)
	}
	nodeOf, err := c.MACs()
	if err != nil {
		return r, err
	}
	watch, err := c.Lab.Client.WatchNeighbors(l2VIPs, 20*time.Millisecond, 10*60*1000/20)
	if err != nil {
		return r, err
	}
	defer watch.Stop()

	// 2 s per probe: a shared 2-core machine can stall an answer for a second.
	var probes [2]*probe.HTTP
	var longs [2]*probe.Long
	defer func() {
		for i := range 2 {
			if probes[i] != nil {
				_ = probes[i].Stop()
			}
			if longs[i] != nil {
				longs[i].Stop()
			}
		}
	}()
	for i, from := range []*lab.Host{c.Lab.Client, c.Lab.Remote} {
		to := netip.AddrPortFrom(r.VIPs[i], 80)
		if probes[i], err = probe.StartHTTP(from, to, ProbeInterval, 2*time.Second, 30000); err != nil {
			return r, err
		}
		if longs[i], err = probe.StartLong(from, to, LongConns, 250*time.Millisecond, 2*time.Second, 4000); err != nil {
			return r, err
		}
	}

	// The router's route to the BGP VIP, sampled every 50 ms: any other set of next hops is a
	// change a flow's hash would see.
	var mu sync.Mutex
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
			r.HopSamples++
			if err != nil || !slices.Equal(got, r.Hops) {
				r.HopChanges = append(r.HopChanges, fmt.Sprintf("+%s: %v (%v)", time.Since(at).Round(time.Millisecond), got, err))
			}
			mu.Unlock()
		}
	}()
	timelineDone := make(chan struct{})
	logs := newPodLogs(c, at)
	go func() {
		defer close(timelineDone)
		c.podTimeline(stop, &mu, &r.Timeline, logs.follow)
	}()
	rollErr := roll(ctx)
	r.Took = time.Since(at)
	time.Sleep(5 * time.Second) // the last one back among its peers, traffic steady
	close(stop)
	<-sampled
	<-timelineDone
	r.Logs = logs.stop()
	for i := range 2 {
		if err := probes[i].Stop(); err != nil {
			return r, fmt.Errorf("probe of %s: %w", r.VIPs[i], err)
		}
		r.Probes[i], r.ProbeErrs[i] = probes[i].Outage(at), probes[i].LastError()
		longs[i].Stop()
		r.Broken[i], r.FirstBroken[i] = longs[i].Broken()
		r.Breaks[i] = longs[i].Breaks()
		r.Asked[i] = longs[i].Asked()
	}
	if rollErr != nil {
		return r, fmt.Errorf("%s: %w", what, rollErr)
	}
	for vip, want := range owners {
		if got, err := c.Owner(vip); got != want {
			r.OwnersChanged = append(r.OwnersChanged, fmt.Sprintf("%s answered by %q (%v), by %s before", vip, got, err, want))
		}
	}
	for name, vip := range w.VIPs {
		s, err := c.Client.CoreV1().Services(WorkloadNamespace).Get(ctx, name, metav1.GetOptions{})
		if err != nil || len(s.Status.LoadBalancer.Ingress) != 1 || s.Status.LoadBalancer.Ingress[0].IP != vip.String() {
			r.AddressesChanged = append(r.AddressesChanged, fmt.Sprintf("%s: %s before, now %v (%v)", name, vip, s.Status.LoadBalancer.Ingress, err))
		}
	}
	r.Moved = c.EventsSince(ctx, WorkloadNamespace, report.ReasonMoved, at)
	r.ARPAsked, r.ARPWrong, r.ARPWorst = ARPRecord(watch.Rounds(), at, l2VIPs, owners, nodeOf)
	return r, nil
}

// ARPRecord reads the wire's record of ARP requests for vips since at: how many were asked, the
// requests answered by another node than the VIP's owner (or by two), and the longest run of
// such requests in a row. By MAC, not by answers: the client's kernel and Owner ask from the
// same address, and their answers count in the round too.
func ARPRecord(rounds []lab.NeighborRound, at time.Time, vips []netip.Addr, owners map[netip.Addr]string, nodeOf map[string]string) (asked int, wrong []string, worst time.Duration) {
	since := map[netip.Addr]time.Time{} // VIP -> the first of its rounds in a run answered by another node
	for _, r := range rounds {
		if r.At.Before(at) || !slices.Contains(vips, r.VIP) {
			continue
		}
		asked++
		var by []string
		other := false
		for _, m := range r.MACs {
			by = append(by, m+" ("+nodeOf[m]+")")
			other = other || nodeOf[m] != owners[r.VIP]
		}
		if len(r.MACs) >= 2 || other {
			wrong = append(wrong, fmt.Sprintf("%s at +%s: %d answers, by %v (owner %s)", r.VIP, r.At.Sub(at).Round(time.Millisecond), r.Replies, by, owners[r.VIP]))
			if since[r.VIP].IsZero() {
				since[r.VIP] = r.At
			}
			continue
		}
		if from := since[r.VIP]; !from.IsZero() {
			worst = max(worst, r.At.Sub(from))
			delete(since, r.VIP)
		}
	}
	for _, from := range since {
		worst = max(worst, time.Since(from))
	}
	return asked, wrong, worst
}

// RolloutRestartAgents is `kubectl rollout restart` of the agents' DaemonSet and the wait for
// its end: every agent replaced, one node at a time.
func (c *Cluster) RolloutRestartAgents(ctx context.Context) error {
	if _, err := c.Kubectl(ctx, "-n", MetalvipNamespace, "rollout", "restart", "daemonset/"+AgentDaemonSet); err != nil {
		return err
	}
	_, err := c.Kubectl(ctx, "-n", MetalvipNamespace, "rollout", "status", "daemonset/"+AgentDaemonSet, "--timeout", "5m")
	return err
}

// SetAgentRestartGrace sets the agents' --restart-grace (e.g. "0s": off, as before issue 32)
// and waits for the rolling update that follows.
func (c *Cluster) SetAgentRestartGrace(ctx context.Context, grace string) error {
	ds, err := c.Client.AppsV1().DaemonSets(MetalvipNamespace).Get(ctx, AgentDaemonSet, metav1.GetOptions{})
	if err != nil {
		return err
	}
	args := ds.Spec.Template.Spec.Containers[0].Args
	i := slices.IndexFunc(args, func(a string) bool { return strings.HasPrefix(a, "--restart-grace=") })
	if i < 0 {
		return fmt.Errorf("the agents run without --restart-grace: %v", args)
	}
	args[i] = "--restart-grace=" + grace
	if _, err := c.Client.AppsV1().DaemonSets(MetalvipNamespace).Update(ctx, ds, metav1.UpdateOptions{}); err != nil {
		return err
	}
	_, err = c.Kubectl(ctx, "-n", MetalvipNamespace, "rollout", "status", "daemonset/"+AgentDaemonSet, "--timeout", "5m")
	return err
}

// UncheckKubeProxy removes the agents' --kube-proxy-healthz and --data-plane-grace (they no
// longer ask kube-proxy, as before issue 31) and waits for the rolling update that follows.
func (c *Cluster) UncheckKubeProxy(ctx context.Context) error {
	ds, err := c.Client.AppsV1().DaemonSets(MetalvipNamespace).Get(ctx, AgentDaemonSet, metav1.GetOptions{})
	if err != nil {
		return err
	}
	ctr := &ds.Spec.Template.Spec.Containers[0]
	n := len(ctr.Args)
	ctr.Args = slices.DeleteFunc(ctr.Args, func(a string) bool {
		return strings.HasPrefix(a, "--kube-proxy-healthz=") || strings.HasPrefix(a, "--data-plane-grace=")
	})
	if len(ctr.Args) == n {
		return fmt.Errorf("the agents do not ask kube-proxy: %v", ctr.Args)
	}
	if _, err := c.Client.AppsV1().DaemonSets(MetalvipNamespace).Update(ctx, ds, metav1.UpdateOptions{}); err != nil {
		return err
	}
	_, err = c.Kubectl(ctx, "-n", MetalvipNamespace, "rollout", "status", "daemonset/"+AgentDaemonSet, "--timeout", "5m")
	return err
}

// SetRouterGracefulRestart turns graceful restart on the workload's BGPPeer on or off and
// waits until the router routes the BGP VIP through every node again (the sessions restart
// to negotiate it), with 5 s to settle.
func (c *Cluster) SetRouterGracefulRestart(ctx context.Context, w *Workload, on bool) error {
	if _, err := c.Kubectl(ctx, "patch", "bgppeer", "router", "--type", "merge", "-p", fmt.Sprintf(`{"spec":{"gracefulRestart":%t}}`, on)); err != nil {
		return err
	}
	var every []string
	for _, n := range c.Nodes {
		every = append(every, n.Name)
	}
	time.Sleep(3 * time.Second) // the agents have the new peer and reset their sessions
	if _, err := c.WaitNextHops(w.VIPs[ServiceBGP], every, 2*time.Minute); err != nil {
		return err
	}
	time.Sleep(5 * time.Second)
	return nil
}

// podTimeline records, until stop, when each metalvip pod began being deleted, when each
// became ready, and when each was gone, polling every 250 ms (at most 10 minutes).
func (c *Cluster) podTimeline(stop <-chan struct{}, mu *sync.Mutex, out *[]string, saw func(pod string)) {
	seen := map[string]string{} // pod -> its last state
	for range 2400 {
		select {
		case <-stop:
			return
		case <-time.After(250 * time.Millisecond):
		}
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		pods, err := c.Client.CoreV1().Pods(MetalvipNamespace).List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/part-of=metalvip"})
		cancel()
		if err != nil {
			continue
		}
		now := time.Now().Format("15:04:05.000")
		present := map[string]bool{}
		for _, p := range pods.Items {
			present[p.Name] = true
			saw(p.Name)
			state := "pending"
			for _, cond := range p.Status.Conditions {
				if cond.Type == "Ready" && cond.Status == "True" {
					state = "ready"
				}
			}
			if p.DeletionTimestamp != nil {
				state = "deleting"
			}
			if seen[p.Name] != state {
				seen[p.Name] = state
				mu.Lock()
				*out = append(*out, fmt.Sprintf("%s %s on %s: %s", now, p.Name, p.Spec.NodeName, state))
				mu.Unlock()
			}
		}
		for name := range seen {
			if !present[name] {
				delete(seen, name)
				mu.Lock()
				*out = append(*out, fmt.Sprintf("%s %s: gone", now, name))
				mu.Unlock()
			}
		}
	}
}

// podLogs follows the logs of every metalvip pod it is told of, from since on.
type podLogs struct {
	c      *Cluster
	since  time.Time
	ctx    context.Context
	cancel context.CancelFunc
	mu     sync.Mutex
	bufs   map[string]*strings.Builder
	wg     sync.WaitGroup
}

func newPodLogs(c *Cluster, since time.Time) *podLogs {
	ctx, cancel := context.WithCancel(context.Background())
	return &podLogs{c: c, since: since, ctx: ctx, cancel: cancel, bufs: map[string]*strings.Builder{}}
}

// follow starts following pod's log (once per pod; its container may not be running yet,
// so it retries for a while).
func (l *podLogs) follow(pod string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if _, ok := l.bufs[pod]; ok {
		return
	}
	b := &strings.Builder{}
	l.bufs[pod] = b
	l.wg.Add(1)
	go func() {
		defer l.wg.Done()
		for range 40 {
			req := l.c.Client.CoreV1().Pods(MetalvipNamespace).GetLogs(pod, &corev1.PodLogOptions{Follow: true, SinceTime: &metav1.Time{Time: l.since}})
			rc, err := req.Stream(l.ctx)
			if err != nil {
				select {
				case <-l.ctx.Done():
					return
				case <-time.After(250 * time.Millisecond):
					continue
				}
			}
			data, _ := io.ReadAll(rc)
			rc.Close()
			l.mu.Lock()
			b.Write(data)
			l.mu.Unlock()
			return
		}
	}()
}

// stop ends the following (a little later, so that the last lines arrive) and returns the
// logs by pod.
func (l *podLogs) stop() map[string]string {
	time.Sleep(500 * time.Millisecond)
	l.cancel()
	l.wg.Wait()
	l.mu.Lock()
	defer l.mu.Unlock()
	out := map[string]string{}
	for pod, b := range l.bufs {
		out[pod] = b.String()
	}
	return out
}
