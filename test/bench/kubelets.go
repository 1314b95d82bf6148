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
	onKubelets      = flag.Bool("kubelets", true, "measure L2 failover on real kubelets too (test/kubecluster; needs make cluster-deps)")
	kubeletsTrials  = flag.Int("kubelets-trials", 10, "hard node kills on real kubelets")
	kubeletsOnly    = flag.Bool("kubelets-only", false, "only the real-kubelet failover and rolling update: their sections replace those of the same titles in -out, which keeps the rest")
	kubeletsSection = "L2 failover on real kubelets"
	egressTrials    = flag.Int("egress-trials", 5, "hard kills of the egress node on real kubelets")
	egressOnly      = flag.Bool("egress-only", false, "only egress's failover on real kubelets: its section replaces the one of the same title in -out, which keeps the rest")
	egressSection   = kubeletsSection + ": egress through the VIP"
)

// egressAlone measures egress's failover alone on a cluster of its own and writes its section
// into the report in place of the one of the same title.
func egressAlone(m *testenv.Main, r *report) {
	harness.Step("real kubelets: a cluster in the lab, metalvip from install.yaml, egress, %d hard kills of the egress node", *egressTrials)
	ctx := context.Background()
	images, err := kubecluster.Images()
	if err != nil {
		m.Fatalf("%v", err)
	}
	c := kubecluster.New(m, kubecluster.Options{Images: images})
	c.CloudConfig = kubecluster.EgressCloudConfig
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
	egressFailover(m, r, c)
	replaceSections(m, r)
}

// egressFailover deploys the egress workload on c (installed with kubecluster's
// EgressCloudConfig) and kills the egress node hard *egressTrials times, while a pod of the
// Service on each workload node opens a connection to a server behind the router every 20 ms.
func egressFailover(m *testenv.Main, r *report, c *kubecluster.Cluster) {
	ctx := context.Background()
	e, err := c.DeployEgress(ctx, m)
	if err != nil {
		m.Fatalf("egress workload: %v\n%s", err, c.Describe(ctx))
	}
	if err := e.WaitVIPAlone(time.Minute); err != nil {
		m.Fatalf("egress: %v\n%s", err, c.Describe(ctx))
	}
	var pauses, bgp []float64
	for i := range *egressTrials {
		f, err := e.KillEgressNode(ctx)
		if err != nil {
			m.Fatalf("egress trial %d: %v\n%s", i, err, c.Describe(ctx))
		}
		harness.Step("  egress trial %d: %s killed, the pod on %s paused %s (%s through the BGP address)", i, f.Victim, f.Survivor, f.Pause.Round(time.Millisecond), f.BGPPause.Round(time.Millisecond))
		pauses, bgp = append(pauses, float64(f.Pause)), append(bgp, float64(f.BGPPause))
	}
	if err := c.RemoveEgress(ctx); err != nil {
		m.Fatalf("egress: %v", err)
	}
	row := func(what string, xs []float64) []string {
		d := func(p float64) string { return figure.Duration(time.Duration(figure.Percentile(xs, p))) }
		return []string{what, d(50), d(99), figure.Duration(time.Duration(slices.Max(xs))), figure.Duration(time.Duration(slices.Min(xs)))}
	}
	r.addAfter(kubeletsSection, egressSection,
		fmt.Sprintf("A cluster of real kubelets as above (with -egress-only, one of its own without the HTTP workload), its CCM with egress.clusterCIDRs (docs/egress.md): a Deployment of two pods, one on each of node2 and node3, behind an L2 Service with metalvip.io/egress: \"true\" in a pool with spec.egress: Allow announced from those two nodes; each pod opens a new TCP connection to a server behind the router every 20 ms (each in its own goroutine, 1 s timeout), and the server records each connection's source address. The egress node (the one answering ARP for the VIP) dies hard as above; the figure is the longest pause between two connections from the VIP of the pod on the other node, which becomes the egress node: the heartbeats' detection (50 ms, 3 misses) and the agent's switch from routing its pod to the dead node to source-NATing it itself. Every connection of the surviving node's pods is checked: from the VIP (the egress Service's), from the node's address (another Service's pods on the same nodes). The same for a BGP address announced from both nodes (the router spreads the replies over both, BFD at 900 ms): the pause of the other node's pod of a Service of it that asks for egress (the victim is its egress node when it ranks first for the address; the announcers' heartbeats move the role, and replies the router still sends to the dead node are lost until BFD withdraws its route). %d trials. Target: under 300 ms.", *egressTrials),
		[][]string{{"address", "pause p50", "p99", "max", "min"}, row("L2", pauses), row("BGP", bgp)})
}

// kubeletsAlone measures the real-kubelet failover alone and writes its section into the
// report in place of the one of the same title.
func kubeletsAlone(m *testenv.Main, r *report) {
	kubeletFailover(r)
	replaceSections(m, r)
}

// kubeletFailover brings up a cluster of real kubelets, installs metalvip from install.yaml
// as pods, and kills the node answering for an L2 address (externalTrafficPolicy Local, a pod
// on each of two nodes) while the client probes it over HTTP every 20 ms; the section goes
// after the bare-process L2 failover's. The cluster is torn down before the next step.
func kubeletFailover(r *report) {
	harness.Step("real kubelets: a cluster in the lab, metalvip from install.yaml, %d hard node kills", *kubeletsTrials)
	m := testenv.NewMain("metalvip-bench-kubelets")
	defer m.Close()
	ctx := context.Background()
	images, err := kubecluster.Images()
	if err != nil {
		m.Fatalf("%v", err)
	}
	// The version the rollback goes to and the upgrade comes from (hack/previous.sh).
	prev, err := kubecluster.PreviousVersion()
	if err != nil {
		m.Fatalf("%v", err)
	}
	c := kubecluster.New(m, kubecluster.Options{Images: append(images, prev.Images...)})
	c.CloudConfig = kubecluster.EgressCloudConfig // egressFailover's
	empty := ""
	if err := c.Label(ctx, "node1", kubecluster.ControlPlaneLabel, &empty); err != nil {
		m.Fatalf("%v", err)
	}
	if err := kubecluster.Manifests.Install(ctx, c); err != nil {
		m.Fatalf("%v", err)
	}
	initialised, err := c.WaitInitialised(ctx, 2*time.Minute)
	if err != nil {
		m.Fatalf("%v\n%s", err, c.Describe(ctx))
	}
	agents, err := c.WaitAgents(ctx, 2*time.Minute)
	if err != nil {
		m.Fatalf("%v\n%s", err, c.Describe(ctx))
	}
	harness.Step("  cluster up in %s (control plane %s), nodes initialised %s after the install, agents Ready %s later",
		c.NodesReady.Round(time.Millisecond), c.ControlPlaneReady.Round(time.Millisecond), initialised.Round(time.Millisecond), agents.Round(time.Millisecond))
	w, err := c.DeployWorkload(ctx, "node2", "node3")
	if err != nil {
		m.Fatalf("%v\n%s", err, c.Describe(ctx))
	}
	vip := w.VIPs[kubecluster.ServiceL2Local]
	var outages, returns []float64
	lost := 0
	for i := range *kubeletsTrials {
		f, err := c.KillOwner(ctx, vip)
		if err != nil {
			m.Fatalf("trial %d: %v\n%s", i, err, c.Describe(ctx))
		}
		harness.Step("  trial %d: %s", i, f)
		outages = append(outages, float64(f.Outage))
		returns = append(returns, float64(f.Return))
		if f.Return > 0 {
			lost++
		}
	}
	d := func(xs []float64, p float64) string { return figure.Duration(time.Duration(figure.Percentile(xs, p))) }
	r.addAfter("L2 failover", kubeletsSection,
		fmt.Sprintf("In a cluster of real kubelets (test/kubecluster: containerd, kubelet --cloud-provider=external and kube-proxy in iptables mode on each of three node namespaces, bridge CNI; metalvip installed from manifests/install.yaml, its images imported into each node's containerd), an HTTP server Deployment on two nodes behind an L2 Service with externalTrafficPolicy Local. The node answering for the VIP dies hard (link down; its kubelet, containerd, kube-proxy, shims and containers, the agent pod's included, killed at once) while the client sends an HTTP GET every 20 ms, each on a new connection with a 250 ms timeout; the outage runs from the first unanswered GET to the first answered one, through the other node's agent, kube-proxy and pod. Each kill waits until the kube-proxy of every node running a ready pod reports a local endpoint on the Service's health check node port (kube-proxy routes a pod that has just become ready up to a second later; a kill in that window measures kube-proxy: 360-620 ms, see docs/announcing.md). The node is then revived (containerd, kubelet, kube-proxy started again) and the cluster settled (pods ready, the CCM reaching the agent) before the next trial; \"return\" is the longest outage while the node came back. %d trials. Bring-up: control plane ready %s, three nodes Ready %s, the CCM pod initialised them %s after the install, agents Ready %s later. Target: under 300 ms, as for the bare-process figure above.",
			*kubeletsTrials, c.ControlPlaneReady.Round(100*time.Millisecond), c.NodesReady.Round(100*time.Millisecond), initialised.Round(100*time.Millisecond), agents.Round(100*time.Millisecond)),
		[][]string{{"outage p50", "p99", "max", "min", "trials whose node's return cost traffic", "return max"},
			{d(outages, 50), d(outages, 99), figure.Duration(time.Duration(slices.Max(outages))), figure.Duration(time.Duration(slices.Min(outages))), fmt.Sprintf("%d of %d", lost, len(returns)), figure.Duration(time.Duration(slices.Max(returns)))}})
	egressFailover(m, r, c)
	rollingUpdates(m, c, w, prev, r)
}

// rollSection is the rolling update's section, after the real-kubelet failover's.
var rollSection = kubeletsSection + ": a rolling update of the agents"

// rollingUpdates measures a rolling update of the agents (kubectl rollout restart) as install.yaml
// runs them (a restart grace; the BGPPeer with graceful restart), a rollback to the previous
// version and the upgrade back (kubectl apply: the CCM and the agents roll at once), then the
// agents' rolling update as before issue 32 (no grace, no graceful restart), which the table
// shows first.
func rollingUpdates(m *testenv.Main, c *kubecluster.Cluster, w *kubecluster.Workload, prev kubecluster.Previous, r *report) {
	ctx := context.Background()
	measure := func(what string, roll func(context.Context) error) kubecluster.Roll {
		x, err := c.MeasureRoll(ctx, w, what, roll)
		if err != nil {
			m.Fatalf("%v\n%s", err, c.Describe(ctx))
		}
		harness.Step("  %s", x)
		return x
	}
	short := prev.Commit[:min(12, len(prev.Commit))]
	harness.Step("real kubelets: a rolling update of the agents with the restart grace and graceful restart, a rollback to %s and the upgrade back, the rolling update without", short)
	with := measure("with --restart-grace=20s (install.yaml) and gracefulRestart on the BGPPeer", c.RolloutRestartAgents)
	back := measure("a rollback to "+short+" (kubectl apply of its install.yaml)", func(ctx context.Context) error { return kubecluster.Manifests.Downgrade(ctx, c, prev) })
	up := measure("the upgrade from "+short+" to this tree (kubectl apply)", func(ctx context.Context) error { return kubecluster.Manifests.Upgrade(ctx, c) })
	if err := c.SetAgentRestartGrace(ctx, "0s"); err != nil {
		m.Fatalf("%v", err)
	}
	if err := c.SetRouterGracefulRestart(ctx, w, false); err != nil {
		m.Fatalf("%v", err)
	}
	without := measure("without (before issue 32: no restart grace, no graceful restart)", c.RolloutRestartAgents)
	row := func(name string, x kubecluster.Roll) []string {
		return []string{name, x.Took.Round(100 * time.Millisecond).String(),
			fmt.Sprintf("%d of %d", x.Probes[0].Lost, x.Probes[0].Sent), fmt.Sprintf("%d of %d", x.Probes[1].Lost, x.Probes[1].Sent),
			fmt.Sprintf("%d of %d", x.Broken[0], kubecluster.LongConns), fmt.Sprintf("%d of %d", x.Broken[1], kubecluster.LongConns),
			fmt.Sprintf("%d of %d", len(x.HopChanges), x.HopSamples),
			fmt.Sprintf("%d of %d (longest run %s)", len(x.ARPWrong), x.ARPAsked, figure.Duration(x.ARPWorst)),
			fmt.Sprint(len(x.Moved))}
	}
	r.addAfter(kubeletsSection, rollSection,
		"The same cluster, Deployment and Services as above: `kubectl rollout restart daemonset/metalvip-agent` (one node's agent at a time: SIGTERM, a new pod, Ready, the next) while the client sends an HTTP GET on a new connection every 20 ms (2 s timeout) to the L2 VIP (externalTrafficPolicy Cluster) and the remote client, behind the router, to the BGP VIP (Cluster, ECMP over the three nodes), each beside 20 long-lived keep-alive connections asked every 250 ms; the router's kernel route to the BGP VIP sampled every 50 ms; every ARP request for the two L2 VIPs on the wire and who answered it. Until 5 s after the rollout's end. A long connection breaks when its VIP's traffic reaches a node whose conntrack does not know it (a moved L2 VIP, a changed ECMP set). Today's build: the agents as install.yaml runs them (`--restart-grace=20s`, their Pod's name), the BGPPeer with `gracefulRestart: true`; before issue 32: the grace off and graceful restart off, as a build before it ran. The rollback and the upgrade: `kubectl apply --server-side` of the previous version's install.yaml (hack/previous.commit, "+short+", its images tagged :previous) and then of this tree's, which rolls the CCM's Deployment and the agents' DaemonSet at once.",
		[][]string{{"rollout", "took", "L2 probes lost", "BGP probes lost", "L2 long connections broken", "BGP long connections broken", "route samples with a next hop missing", "ARP requests answered by another node", "Moved Events"},
			row("the agents, before issue 32", without), row("the agents, today (install.yaml)", with),
			row("a rollback to "+short, back), row("the upgrade back from "+short, up)})
}
