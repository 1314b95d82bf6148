package e2ecluster

import (
	"archive/tar"
	"compress/gzip"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/metalvip/metalvip/loadbalancer/report"
	"github.com/metalvip/metalvip/test/harness/probe"
	"github.com/metalvip/metalvip/test/kubecluster"
)

// trials is the number of hard node kills per install.
const trials = 5

// ccmTrials is the number of CCM pod replacements per install: a leader change that moved a
// VIP did so in about one run of three, so one replacement per run would miss it too often.
// METALVIP_CCM_TRIALS sets another (issue 30 asks for 20 in a row on a loaded machine).
// maxDouble bounds a run of ARP requests answered by another node than the owner while only
// the CCM is replaced: a starved agent's heartbeats late past the failover profile (150 ms)
// make a peer answer until they arrive; longer is no starvation.
const maxDouble = time.Second

func ccmTrials(t *testing.T) int {
	v := os.Getenv("METALVIP_CCM_TRIALS")
	if v == "" {
		return 3
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 1 {
		t.Fatalf("METALVIP_CCM_TRIALS=%q: want a count of at least 1", v)
	}
	return n
}

func TestInstallYAMLOnRealKubelets(t *testing.T) { checks(t, kubecluster.Manifests) }

func TestHelmChartOnRealKubelets(t *testing.T) { checks(t, kubecluster.Chart) }

// checks installs metalvip with inst and runs the acceptance of issue 21 on it, then removes
// it. The CCM runs on node1 (the one control-plane node), the workload on node2 and node3.
func checks(t *testing.T, inst kubecluster.Installer) {
	c := cluster(t)
	ctx := context.Background()
	empty := ""
	if err := c.Label(ctx, "node1", kubecluster.ControlPlaneLabel, &empty); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			c.LogFailure(ctx, t)
		}
		for _, n := range c.Nodes {
			_, _ = c.Kubectl(ctx, "uncordon", n.Name)
		}
		if err := c.RemoveWorkload(ctx); err != nil {
			t.Errorf("remove the workload: %v", err)
		}
		if err := inst.Uninstall(ctx, c); err != nil {
			t.Errorf("uninstall (%s): %v", inst.Name, err)
		}
		if err := c.ClearAgentState(); err != nil {
			t.Errorf("%v", err)
		}
		// The next install must initialise the nodes itself: they join anew.
		if err := c.Reregister(ctx); err != nil {
			t.Errorf("nodes joining anew: %v", err)
		}
	})

	// Before the install every node waits for a CCM: no provider ID, the uninitialized taint.
	nodes, err := c.Client.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range nodes.Items {
		tainted := slices.ContainsFunc(n.Spec.Taints, func(t corev1.Taint) bool { return t.Key == "node.cloudprovider.kubernetes.io/uninitialized" })
		if n.Spec.ProviderID != "" || !tainted {
			t.Fatalf("before the install, %s has provider ID %q and the uninitialized taint: %v", n.Name, n.Spec.ProviderID, tainted)
		}
	}

	start := time.Now()
	if err := inst.Install(ctx, c); err != nil {
		t.Fatalf("install (%s): %v", inst.Name, err)
	}
	t.Logf("%s applied in %s", inst.Name, time.Since(start).Round(time.Millisecond))
	if v := os.Getenv("METALVIP_CLUSTER_VERBOSE"); v != "" {
		// For diagnosis only: the agents and the CCM log at --v=N.
		for _, obj := range []string{"daemonset/" + kubecluster.AgentDaemonSet, "deployment/" + kubecluster.CCMDeployment} {
			if _, err := c.Kubectl(ctx, "-n", kubecluster.MetalvipNamespace, "patch", obj, "--type", "json", "-p",
				`[{"op":"add","path":"/spec/template/spec/containers/0/args/-","value":"--v=`+v+`"}]`); err != nil {
				t.Fatal(err)
			}
		}
	}

	ok := t.Run("the CCM pod initialises every node: provider ID set, uninitialized taint gone", func(t *testing.T) {
		d, err := c.WaitInitialised(ctx, 2*time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		ccm, err := c.PodsOn(ctx, kubecluster.MetalvipNamespace, kubecluster.CCMSelector, false)
		if err != nil {
			t.Fatal(err)
		}
		if len(ccm["node1"]) != 1 || len(ccm) != 1 {
			t.Fatalf("CCM pods by node: %v, want one on node1 (the control-plane node)", podNames(ccm))
		}
		t.Logf("nodes initialised %s after the install", d.Round(time.Millisecond))
	})
	ok = ok && t.Run("the agent DaemonSet is Ready on all three nodes", func(t *testing.T) {
		d, err := c.WaitAgents(ctx, 2*time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		agents, _ := c.PodsOn(ctx, kubecluster.MetalvipNamespace, kubecluster.AgentSelector, true)
		if len(agents) != len(c.Nodes) {
			t.Fatalf("ready agent pods by node: %v, want one on each of %d nodes", podNames(agents), len(c.Nodes))
		}
		t.Logf("agents Ready %s after the nodes were initialised", d.Round(time.Millisecond))
	})
	if !ok {
		return
	}
	t.Run("metrics over TLS: the CCM's and every agent's with the metrics reader's token; 401 without a token, 403 without the ClusterRole", func(t *testing.T) {
		checkMetrics(t, c, inst.Name == kubecluster.Chart.Name)
	})

	w, err := c.DeployWorkload(ctx, "node2", "node3")
	if err != nil {
		t.Fatalf("workload: %v", err)
	}
	t.Logf("workload up, addresses %v, %s after the install", w.VIPs, time.Since(start).Round(time.Millisecond))
	l2, l2Local, bgp, bgpLocal := w.VIPs[kubecluster.ServiceL2], w.VIPs[kubecluster.ServiceL2Local], w.VIPs[kubecluster.ServiceBGP], w.VIPs[kubecluster.ServiceBGPLocal]

	ok = t.Run("an L2 VIP answers HTTP from a pod, through kube-proxy", func(t *testing.T) {
		for _, vip := range []netip.Addr{l2, l2Local} {
			var body string
			if _, err := kubecluster.WaitFor(30*time.Second, func() (bool, string) {
				var err error
				body, err = probe.Get(c.Lab.Client, netip.AddrPortFrom(vip, 80), time.Second)
				return err == nil, fmt.Sprint(err)
			}); err != nil {
				t.Fatalf("%s: %v", vip, err)
			}
			if !servedByWorkload(body) {
				t.Fatalf("%s answered %q, not a pod of the workload on node2 or node3", vip, body)
			}
			owner, _ := c.Owner(vip)
			t.Logf("%s (ARP answered by %s) served by %q", vip, owner, body)
		}
	})
	ok = ok && t.Run("BGP VIPs answer the remote client; ETP Local next hops are exactly the nodes with a ready pod", func(t *testing.T) {
		if _, err := c.WaitNextHops(bgp, []string{"node1", "node2", "node3"}, time.Minute); err != nil {
			t.Fatalf("ETP Cluster %s: %v", bgp, err)
		}
		ready, err := c.ReadyWorkloadNodes(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := c.WaitNextHops(bgpLocal, ready, time.Minute); err != nil {
			t.Fatalf("ETP Local %s (pods ready on %v): %v", bgpLocal, ready, err)
		}
		// The routes can be there before kube-proxy on those nodes has the endpoints (it
		// rejects the connection until then): wait for it, as for the L2 addresses.
		for _, vip := range []netip.Addr{bgp, bgpLocal} {
			var body string
			if d, err := kubecluster.WaitFor(30*time.Second, func() (bool, string) {
				var err error
				body, err = probe.Get(c.Lab.Remote, netip.AddrPortFrom(vip, 80), 2*time.Second)
				return err == nil && servedByWorkload(body), fmt.Sprintf("%q, %v", body, err)
			}); err != nil {
				t.Fatalf("remote client to %s: %v", vip, err)
			} else {
				t.Logf("%s served the remote client by %q, %s after its next hops were right", vip, body, d.Round(time.Millisecond))
			}
		}
	})
	if !ok {
		return
	}
	t.Run("metalvipctl status: -o wide, -o yaml and --context against the cluster", func(t *testing.T) {
		current, err := c.Kubectl(ctx, "config", "current-context")
		if err != nil {
			t.Fatal(err)
		}
		wide, err := c.Metalvipctl(ctx, "status", "-o", "wide", "--context", strings.TrimSpace(current))
		if err != nil || !strings.Contains(wide, l2.String()) {
			t.Errorf("status -o wide: %v; want %s in it:\n%s", err, l2, wide)
		}
		yml, err := c.Metalvipctl(ctx, "status", "-o", "yaml", "--context", strings.TrimSpace(current))
		if err != nil || !strings.Contains(yml, l2.String()) || !strings.Contains(yml, "services:") {
			t.Errorf("status -o yaml: %v; want services and %s in it:\n%s", err, l2, yml)
		}
		if out, err := c.Metalvipctl(ctx, "status", "--context", "no-such-context"); err == nil {
			t.Errorf("status --context no-such-context succeeded:\n%s", out)
		}
	})

	t.Run("metalvipctl version: every agent's build and the CCM's, within the supported skew; -o yaml and --context work", func(t *testing.T) {
		out, err := c.Metalvipctl(ctx, "version", "-o", "json")
		if err != nil {
			t.Fatal(err)
		}
		var rep struct {
			CCM []struct {
				Version string
				Agents  int
			}
			Agents []struct {
				Node, Version, Skew, Error string
				AppliedBy                  *struct{ Version string }
			}
			Warnings []string
		}
		if err := json.Unmarshal([]byte(out), &rep); err != nil {
			t.Fatalf("%v:\n%s", err, out)
		}
		if len(rep.CCM) != 1 || rep.CCM[0].Agents != len(c.Nodes) || len(rep.Agents) != len(c.Nodes) || len(rep.Warnings) != 0 {
			t.Fatalf("one CCM build holding every agent's state, an answer from each of %d agents and no warning:\n%s", len(c.Nodes), out)
		}
		for _, a := range rep.Agents {
			if a.Error != "" || a.Version == "" || a.AppliedBy == nil || a.AppliedBy.Version != rep.CCM[0].Version || a.Skew != "ok" {
				t.Errorf("the agent of %s: %+v; want its build, the CCM's, skew ok", a.Node, a)
			}
		}
		current, err := c.Kubectl(ctx, "config", "current-context")
		if err != nil {
			t.Fatal(err)
		}
		yml, err := c.Metalvipctl(ctx, "version", "-o", "yaml", "--context", strings.TrimSpace(current))
		if err != nil || !strings.Contains(yml, "agents:") || !strings.Contains(yml, "skew: ok") {
			t.Errorf("-o yaml: %v\n%s", err, yml)
		}
		t.Logf("metalvipctl version:\n%s", out)
	})

	t.Run("metalvipctl sysdump: one bundle with the objects, every agent's state, every metalvip pod's log and metrics, and no key", func(t *testing.T) {
		bundle := filepath.Join(t.TempDir(), "bundle.tar.gz")
		if out, err := c.Metalvipctl(ctx, "sysdump", "--output", bundle, "--log-lines", "200"); err != nil {
			t.Fatalf("%v\n%s", err, out)
		}
		files, err := untarGz(bundle)
		if err != nil {
			t.Fatal(err)
		}
		var names []string
		for name := range files {
			names = append(names, name)
		}
		slices.Sort(names)
		want := []string{"versions.yaml", "ippools.yaml", "bgppeers.yaml", "serviceannouncements.yaml", "services.yaml", "nodes.yaml", "events-services.yaml", "events-nodes.yaml"}
		for _, n := range c.Nodes {
			want = append(want, "agents/"+n.Name+".json")
		}
		for _, w := range want {
			if _, ok := files["metalvip-sysdump/"+w]; !ok {
				t.Errorf("no %s in the bundle: %v", w, names)
			}
		}
		if e, ok := files["metalvip-sysdump/errors.txt"]; ok {
			t.Errorf("parts not collected:\n%s", e)
		}
		logs, metrics := 0, 0
		for name, b := range files {
			if strings.HasPrefix(name, "metalvip-sysdump/logs/") && len(b) > 0 {
				logs++
			}
			if strings.HasPrefix(name, "metalvip-sysdump/metrics/") && strings.Contains(string(b), "\nmetalvip_") {
				metrics++
			}
			for _, secret := range []string{"PRIVATE KEY"} {
				if strings.Contains(string(b), secret) {
					t.Errorf("%s holds %q", name, secret)
				}
			}
		}
		if logs < len(c.Nodes)+1 {
			t.Errorf("%d logs; want the CCM's and %d agents' at least: %v", logs, len(c.Nodes), names)
		}
		if metrics < len(c.Nodes)+1 {
			t.Errorf("%d metrics snapshots with metalvip's metrics; want the CCM's and %d agents' at least: %v", metrics, len(c.Nodes), names)
		}
		if svc := string(files["metalvip-sysdump/services.yaml"]); !strings.Contains(svc, l2.String()) {
			t.Errorf("services.yaml does not show %s", l2)
		}
	})

	n := ccmTrials(t)
	t.Run(fmt.Sprintf("the CCM pod deleted during traffic, %d times: a new one takes over, no probe fails, no address or owner changes, every ARP request answered by the owner alone", n), func(t *testing.T) {
		owners := map[netip.Addr]string{}
		for _, vip := range []netip.Addr{l2, l2Local} {
			if owners[vip], err = c.Owner(vip); err != nil || owners[vip] == "" {
				t.Fatalf("nobody answers for %s: %v", vip, err)
			}
		}
		// The wire's record: every request for the two L2 VIPs and who answered it. Two answers
		// to one request are a second node answering a VIP that did not move (a connection
		// reset when the client's neighbour entry changes mid-connection).
		vips := []netip.Addr{l2, l2Local}
		nodeOf, err := c.MACs()
		if err != nil {
			t.Fatal(err)
		}
		watch, err := c.Lab.Client.WatchNeighbors(vips, 20*time.Millisecond, n*120*1000/20)
		if err != nil {
			t.Fatal(err)
		}
		defer watch.Stop()
		for i := range n {
			before := leaseHolder(c)
			old, _ := c.PodsOn(ctx, kubecluster.MetalvipNamespace, kubecluster.CCMSelector, false)
			// 2 s per probe: a shared 2-core machine can stall an answer for a second.
			prober := startProbe(t, c, l2, 2*time.Second, 10000)
			at := time.Now()
			// The new CCM's logs say why if it moves a VIP; its predecessor's go with its pod.
			if _, err := c.Kubectl(ctx, "-n", kubecluster.MetalvipNamespace, "delete", "pod", "-l", kubecluster.CCMSelector, "--wait=false"); err != nil {
				stopProbe(t, prober)
				t.Fatal(err)
			}
			d, err := kubecluster.WaitFor(2*time.Minute, func() (bool, string) {
				h := leaseHolder(c)
				pods, _ := c.PodsOn(ctx, kubecluster.MetalvipNamespace, kubecluster.CCMSelector, false)
				fresh := len(pods["node1"]) == 1 && !slices.Contains(podNames(old)["node1"], pods["node1"][0].Name)
				return fresh && h != "" && h != before, fmt.Sprintf("lease held by %q (before %q), CCM pods %v", h, before, podNames(pods))
			})
			time.Sleep(3 * time.Second) // the new leader has pushed to every agent
			stopProbe(t, prober)
			if err != nil {
				t.Fatalf("trial %d: %v", i, err)
			}
			o := prober.Outage(at)
			t.Logf("trial %d: new CCM leader %s after the delete; %d of %d probes lost (longest outage %s)", i, d.Round(time.Millisecond), o.Lost, o.Sent, o.Longest)
			if o.Lost != 0 {
				t.Errorf("trial %d: %d of %d probes failed while the CCM was replaced (last error %s)", i, o.Lost, o.Sent, prober.LastError())
			}
			for vip, want := range owners {
				if got, err := c.Owner(vip); got != want {
					t.Errorf("trial %d: %s answered by %q (%v), by %s before: a leader change moved it", i, vip, got, err, want)
				}
			}
			for name, vip := range w.VIPs {
				s, err := c.Client.CoreV1().Services(kubecluster.WorkloadNamespace).Get(ctx, name, metav1.GetOptions{})
				if err != nil || len(s.Status.LoadBalancer.Ingress) != 1 || s.Status.LoadBalancer.Ingress[0].IP != vip.String() {
					t.Errorf("trial %d: %s: address changed from %s to %v (%v)", i, name, vip, ingressOf(s), err)
				}
			}
			if moved := c.EventsSince(ctx, kubecluster.WorkloadNamespace, report.ReasonMoved, at); len(moved) > 0 {
				t.Errorf("trial %d: VIPs moved while only the CCM was replaced:\n%s", i, strings.Join(moved, "\n"))
			}
			// Every request since the delete answered by the owner alone: a second node, or
			// another node alone (a failover and back), resets connections. A starved agent
			// (its heartbeats late past the failover profile's 150 ms) is a failure the
			// profile detects, and a short double answer its cost: reported; one longer
			// than maxDouble is not a starvation, and fails.
			asked, wrong, worst := kubecluster.ARPRecord(watch.Rounds(), at, vips, owners, nodeOf)
			t.Logf("trial %d: %d ARP requests for %v since the delete, %d answered by another node (the longest run %s)", i, asked, vips, len(wrong), worst.Round(time.Millisecond))
			if len(wrong) > 0 {
				t.Logf("trial %d: requests answered by another node than the owner while only the CCM was replaced; the first:\n%s", i, strings.Join(wrong[:min(len(wrong), 10)], "\n"))
			}
			if worst > maxDouble {
				t.Errorf("trial %d: another node answered an owner's VIP for %s in a row while only the CCM was replaced (more than %s)", i, worst.Round(time.Millisecond), maxDouble)
			}
			if t.Failed() {
				break // the failing leader's logs stay for the report
			}
		}
	})

	t.Run("a rolling update of the agents (rollout restart, --restart-grace from the manifests): no probe lost, no long connection broken, no VIP moves, the router's next hops unchanged", func(t *testing.T) {
		rollingUpdate(t, c, w, "a rolling update of the agents", c.RolloutRestartAgents)
	})

	t.Run(fmt.Sprintf("a node killed hard, %d times: the client's HTTP probe recovers through the next candidate", trials), func(t *testing.T) {
		var outages []time.Duration
		for i := range trials {
			f, err := c.KillOwner(ctx, l2Local)
			if err != nil {
				t.Fatalf("trial %d: %v", i, err)
			}
			t.Logf("trial %d: %s", i, f)
			outages = append(outages, f.Outage)
			if f.After == f.Victim || f.After == "" {
				t.Errorf("trial %d: after %s died, %q answers", i, f.Victim, f.After)
			}
			// Bounded generously: this suite runs a 1.5-s profile (main_test.go); make bench
			// measures the shipped one against its 300-ms target.
			if f.Outage > 5*time.Second {
				t.Errorf("trial %d: outage %s over 5 s", i, f.Outage)
			}
		}
		slices.Sort(outages)
		t.Logf("outages over %d trials: min %s, median %s, max %s (heartbeats every %s, dead after %d misses)", trials, outages[0], outages[len(outages)/2], outages[len(outages)-1], c.Failover.Interval, c.Failover.Misses)
	})

	t.Run("kube-proxy stopped on the L2 VIP's owner: a Warning DataPlaneNotReady names the node, the VIP moves and answers; kube-proxy back: DataPlaneReady, the node eligible again", func(t *testing.T) {
		owner, err := c.WaitOwner(l2, 30*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		n := c.Node(owner)
		since := time.Now()
		n.StopProxy()
		restarted := false
		defer func() {
			if !restarted {
				n.StartProxy()
			}
		}()
		// The agents' --data-plane-grace is 10 s (install.yaml and the chart).
		var warned []string
		d, err := kubecluster.WaitFor(time.Minute, func() (bool, string) {
			warned = c.EventsSince(ctx, "default", report.ReasonDataPlaneNotReady, since)
			return slices.ContainsFunc(warned, func(e string) bool { return strings.Contains(e, "Node/"+owner+":") }), fmt.Sprintf("DataPlaneNotReady Events %v", warned)
		})
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("%s after kube-proxy stopped on %s: %v", d.Round(time.Millisecond), owner, warned)
		var now string
		if _, err := kubecluster.WaitFor(time.Minute, func() (bool, string) {
			now, err = c.Owner(l2)
			return now != "" && now != owner, fmt.Sprintf("ARP for %s answered by %q (%v)", l2, now, err)
		}); err != nil {
			t.Fatalf("the VIP stays on %s, whose kube-proxy is stopped: %v", owner, err)
		}
		if _, err := kubecluster.WaitFor(30*time.Second, func() (bool, string) {
			body, err := probe.Get(c.Lab.Client, netip.AddrPortFrom(l2, 80), time.Second)
			return err == nil && servedByWorkload(body), fmt.Sprintf("%q, %v", body, err)
		}); err != nil {
			t.Fatalf("%s on %s: %v", l2, now, err)
		}
		// The condition follows the plan (written paced, after the agents): wait for it.
		if _, err := kubecluster.WaitFor(30*time.Second, func() (bool, string) {
			msg, err := c.Announced(ctx, l2)
			return err == nil && !strings.Contains(msg, owner), fmt.Sprintf("the Announced condition says %q (%v)", msg, err)
		}); err != nil {
			t.Errorf("the Announced condition still names %s: %v", owner, err)
		}
		back := time.Now()
		n.StartProxy()
		restarted = true
		if _, err := kubecluster.WaitFor(time.Minute, func() (bool, string) {
			evs := c.EventsSince(ctx, "default", report.ReasonDataPlaneReady, back)
			return slices.ContainsFunc(evs, func(e string) bool { return strings.Contains(e, "Node/"+owner+":") }), fmt.Sprintf("DataPlaneReady Events %v", evs)
		}); err != nil {
			t.Fatal(err)
		}
		t.Logf("the VIP moved to %s; kube-proxy back on %s", now, owner)
	})

	t.Run("a BGP ETP Local VIP's next hops follow the Deployment scaled and a pod deleted", func(t *testing.T) {
		follow := func(what string) {
			t.Helper()
			var ready []string
			d, err := kubecluster.WaitFor(time.Minute, func() (bool, string) {
				var err error
				if ready, err = c.ReadyWorkloadNodes(ctx); err != nil {
					return false, err.Error()
				}
				hops, err := c.NextHops(bgpLocal)
				if err != nil {
					return false, err.Error()
				}
				return slices.Equal(hops, ready), fmt.Sprintf("next hops %v, ready pods on %v", hops, ready)
			})
			if err != nil {
				t.Fatalf("%s: %v", what, err)
			}
			t.Logf("%s: next hops %v after %s", what, ready, d.Round(time.Millisecond))
		}
		if err := c.ScaleWorkload(ctx, 1); err != nil {
			t.Fatal(err)
		}
		follow("scaled to 1")
		if err := c.ScaleWorkload(ctx, 2); err != nil {
			t.Fatal(err)
		}
		follow("scaled back to 2")
		// The pod on node3 deleted while node3 is cordoned and node1 may take it: it moves.
		yes := "true"
		if err := c.Label(ctx, "node1", kubecluster.WorkloadLabel, &yes); err != nil {
			t.Fatal(err)
		}
		if _, err := c.Kubectl(ctx, "cordon", "node3"); err != nil {
			t.Fatal(err)
		}
		pods, _ := c.PodsOn(ctx, kubecluster.WorkloadNamespace, kubecluster.WorkloadSelector, false)
		for _, p := range pods["node3"] {
			if err := c.Client.CoreV1().Pods(kubecluster.WorkloadNamespace).Delete(ctx, p.Name, metav1.DeleteOptions{}); err != nil {
				t.Fatal(err)
			}
		}
		if _, err := kubecluster.WaitFor(time.Minute, func() (bool, string) {
			ready, _ := c.ReadyWorkloadNodes(ctx)
			return slices.Equal(ready, []string{"node1", "node2"}), fmt.Sprintf("ready pods on %v", ready)
		}); err != nil {
			t.Fatal(err)
		}
		follow("the pod on node3 deleted, its replacement on node1")
	})

	// Last, as it leaves the cluster on the same version as before: a rollback to the previous
	// version and the upgrade back, under traffic, as a user runs them.
	// kubectl apply rolls the CCM and the agents at once: a new leader that starts while an
	// agent is away restarting learns it from that agent's heartbeat peers (before, it counted
	// the agent unreachable, moved its VIP, and moved one back "to keep the nodes balanced").
	// node3, cordoned above, is draining: uncordoned first, and back in the BGP VIP's next hops.
	if _, err := c.Kubectl(ctx, "uncordon", "node3"); err != nil {
		t.Fatal(err)
	}
	if _, err := c.WaitNextHops(bgp, []string{"node1", "node2", "node3"}, time.Minute); err != nil {
		t.Fatalf("after the uncordon: %v", err)
	}
	time.Sleep(3 * time.Second)
	short := previous.Commit[:min(12, len(previous.Commit))]
	if t.Run(fmt.Sprintf("a rollback to the previous version (%s, %s): no probe lost, no long connection broken, no VIP moves, the router's next hops unchanged", short, inst.Name), func(t *testing.T) {
		rollingUpdate(t, c, w, "a rollback to "+short, func(ctx context.Context) error { return inst.Downgrade(ctx, c, previous) })
		checkImages(t, c, ":previous")
	}) {
		t.Run(fmt.Sprintf("an upgrade from the previous version (%s, %s) to this tree: the same", short, inst.Name), func(t *testing.T) {
			rollingUpdate(t, c, w, "an upgrade from "+short, func(ctx context.Context) error { return inst.Upgrade(ctx, c) })
			checkImages(t, c, ":v")
		})
	}
}

func servedByWorkload(body string) bool {
	f := strings.Fields(body)
	return len(f) == 2 && strings.HasPrefix(f[0], "web-") && (f[1] == "node1" || f[1] == "node2" || f[1] == "node3")
}

func podNames(byNode map[string][]corev1.Pod) map[string][]string {
	out := map[string][]string{}
	for n, ps := range byNode {
		for _, p := range ps {
			out[n] = append(out[n], p.Name)
		}
	}
	return out
}

func ingressOf(s *corev1.Service) []string {
	if s == nil {
		return nil
	}
	var out []string
	for _, in := range s.Status.LoadBalancer.Ingress {
		out = append(out, in.IP)
	}
	return out
}

// leaseHolder returns the holder of the CCM's leader-election Lease, or "".
func leaseHolder(c *kubecluster.Cluster) string {
	l, err := c.Client.CoordinationV1().Leases(kubecluster.MetalvipNamespace).Get(context.Background(), kubecluster.CCMDeployment, metav1.GetOptions{})
	if err != nil || l.Spec.HolderIdentity == nil {
		return ""
	}
	return *l.Spec.HolderIdentity
}

// startProbe starts the client's HTTP probe of vip, every kubecluster.ProbeInterval.
func startProbe(t *testing.T, c *kubecluster.Cluster, vip netip.Addr, timeout time.Duration, limit int) *probe.HTTP {
	t.Helper()
	p, err := probe.StartHTTP(c.Lab.Client, netip.AddrPortFrom(vip, 80), kubecluster.ProbeInterval, timeout, limit)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func stopProbe(t *testing.T, p *probe.HTTP) {
	t.Helper()
	if err := p.Stop(); err != nil {
		t.Errorf("HTTP probe: %v", err)
	}
}

// untarGz reads a gzipped tar's regular files by name.
func untarGz(file string) (map[string][]byte, error) {
	f, err := os.Open(file)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	zr, err := gzip.NewReader(f)
	if err != nil {
		return nil, err
	}
	tr := tar.NewReader(zr)
	out := map[string][]byte{}
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return out, nil
		}
		if err != nil {
			return nil, err
		}
		b, err := io.ReadAll(io.LimitReader(tr, 256<<20))
		if err != nil {
			return nil, err
		}
		out[h.Name] = b
	}
}

// checkImages fails unless every metalvip pod (the CCM's, the agents') runs an image whose tag
// starts with tag (":previous", or this tree's ":v...").
func checkImages(t *testing.T, c *kubecluster.Cluster, tag string) {
	t.Helper()
	ctx := context.Background()
	for _, sel := range []string{kubecluster.CCMSelector, kubecluster.AgentSelector} {
		pods, err := c.PodsOn(ctx, kubecluster.MetalvipNamespace, sel, true)
		if err != nil {
			t.Fatal(err)
		}
		n := 0
		for _, ps := range pods {
			for _, p := range ps {
				n++
				if img := p.Spec.Containers[0].Image; !strings.Contains(img, tag) {
					t.Errorf("pod %s runs %s, want a tag %s", p.Name, img, tag)
				}
			}
		}
		if n == 0 {
			t.Errorf("no ready pod for %s", sel)
		}
	}
}
