package main

import (
	"context"
	"flag"
	"fmt"
	"slices"
	"time"

	"github.com/metalvip/metalvip/test/harness"
	"github.com/metalvip/metalvip/test/harness/figure"
	"github.com/metalvip/metalvip/test/kubecluster"
	"github.com/metalvip/metalvip/test/testenv"
)

var (
	freshOnly   = flag.Bool("fresh-only", false, "only the takeover just after a pod became ready, on real kubelets: its section replaces the one of the same title in -out")
	freshTrials = flag.Int("fresh-trials", 10, "hard node kills of each kind in the takeover-after-a-fresh-pod measurement")
)

var freshSection = kubeletsSection + ": a takeover just after a pod became ready"

// freshAlone measures the takeover after a fresh pod alone and writes its section in place of
// the one of the same title.
func freshAlone(m *testenv.Main, r *report) {
	kubeletFresh(r)
	replaceSections(m, r)
}

// kubeletFresh measures what a takeover costs when a standby's pod has just become ready
// (its kube-proxy may not have written the pod's rules yet) against one when every
// kube-proxy serves: four nodes, the CCM on node1, the workload's pod on each of node2,
// node3 and node4 behind an L2 Service with externalTrafficPolicy Local.
func kubeletFresh(r *report) {
	harness.Step("real kubelets: a takeover 0-2 s after a standby's pod became ready, and one when every kube-proxy serves, %d kills each", *freshTrials)
	m := testenv.NewMain("metalvip-bench-fresh")
	defer m.Close()
	ctx := context.Background()
	images, err := kubecluster.Images()
	if err != nil {
		m.Fatalf("%v", err)
	}
	c := kubecluster.New(m, kubecluster.Options{Nodes: 4, Images: images})
	empty := ""
	if err := c.Label(ctx, "node1", kubecluster.ControlPlaneLabel, &empty); err != nil {
		m.Fatalf("%v", err)
	}
	if err := kubecluster.Manifests.Install(ctx, c); err != nil {
		m.Fatalf("%v", err)
	}
	if _, err := c.WaitInitialised(ctx, 2*time.Minute); err != nil {
		m.Fatalf("%v\n%s", err, c.Describe(ctx))
	}
	if _, err := c.WaitAgents(ctx, 2*time.Minute); err != nil {
		m.Fatalf("%v\n%s", err, c.Describe(ctx))
	}
	workers := []string{"node2", "node3", "node4"}
	w, err := c.DeployWorkload(ctx, workers...)
	if err != nil {
		m.Fatalf("%v\n%s", err, c.Describe(ctx))
	}
	if err := c.ScaleWorkload(ctx, len(workers)); err != nil {
		m.Fatalf("%v\n%s", err, c.Describe(ctx))
	}
	vip := w.VIPs[kubecluster.ServiceL2Local]

	// One of the two standbys gets a new pod; the owner dies 0 to 1.6 s after it is Ready (in
	// steps of 400 ms), while that node's kube-proxy may still be writing the rules.
	killFresh := func(i int) (kubecluster.Failover, string, error) {
		kind := ""
		delay := time.Duration(i%5) * 400 * time.Millisecond
		f, err := c.KillOwnerAfter(ctx, vip, func(owner string) (time.Time, error) {
			others := slices.DeleteFunc(slices.Clone(workers), func(n string) bool { return n == owner })
			node := others[i%len(others)]
			ready, err := c.FreshPod(ctx, node)
			kind = fmt.Sprintf("fresh pod on %s, kill %s after it was Ready", node, delay)
			return ready.Add(delay), err
		})
		return f, kind, err
	}
	var fresh, settled, unchecked []float64
	for i := range 2 * *freshTrials {
		var kind string
		var f kubecluster.Failover
		if i%2 == 0 {
			f, kind, err = killFresh(i / 2)
		} else {
			kind = "every kube-proxy serving"
			f, err = c.KillOwner(ctx, vip)
		}
		if err != nil {
			m.Fatalf("trial %d (%s): %v\n%s", i, kind, err, c.Describe(ctx))
		}
		harness.Step("  trial %d (%s): %s", i, kind, f)
		if i%2 == 0 {
			fresh = append(fresh, float64(f.Outage))
		} else {
			settled = append(settled, float64(f.Outage))
		}
	}
	// The same fresh kills with agents that do not ask kube-proxy (as before issue 31).
	if err := c.UncheckKubeProxy(ctx); err != nil {
		m.Fatalf("%v\n%s", err, c.Describe(ctx))
	}
	time.Sleep(5 * time.Second)
	for i := range *freshTrials {
		f, kind, err := killFresh(i)
		if err != nil {
			m.Fatalf("unchecked trial %d (%s): %v\n%s", i, kind, err, c.Describe(ctx))
		}
		harness.Step("  unchecked trial %d (%s): %s", i, kind, f)
		unchecked = append(unchecked, float64(f.Outage))
	}
	d := func(xs []float64, p float64) string { return figure.Duration(time.Duration(figure.Percentile(xs, p))) }
	row := func(what string, xs []float64) []string {
		return []string{what, d(xs, 50), d(xs, 99), figure.Duration(time.Duration(slices.Max(xs))), figure.Duration(time.Duration(slices.Min(xs))), fmt.Sprint(len(xs))}
	}
	r.addAfter(kubeletsSection, freshSection,
		fmt.Sprintf("Four nodes of real kubelets (test/kubecluster, install.yaml: the agents ask kube-proxy, `--kube-proxy-healthz`), the CCM on node1, a pod of the HTTP server on each of node2, node3 and node4 behind an L2 Service with externalTrafficPolicy Local (candidates: those three). Trials alternate. Fresh: the pod on one of the two standbys is deleted, and the owner is killed hard 0, 0.4, 0.8, 1.2 or 1.6 s after its replacement is Ready, when that node's kube-proxy may not have written its rules yet (it drops the Service's traffic until then: before this check a takeover by it cost 360-620 ms). Serving: the owner is killed once every kube-proxy says on the Service's health check node port that it serves its pod. The client sends an HTTP GET every 20 ms on a new connection (250 ms timeout); the outage runs from the first unanswered GET to the first answered one. The killed node is revived and settled before the next trial. %d trials each; then the fresh kills again with the agents' `--kube-proxy-healthz` removed (as before issue 31).", *freshTrials),
		[][]string{{"kill", "outage p50", "p99", "max", "min", "trials"}, row("0-1.6 s after a standby's pod became Ready", fresh), row("every kube-proxy serving", settled),
			row("0-1.6 s after, agents not asking kube-proxy", unchecked)})
}
