package e2ecluster

import (
	"context"
	"fmt"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/metalvip/metalvip/test/harness/figure"
	"github.com/metalvip/metalvip/test/kubecluster"
)

// TestEgressOnRealKubelets is issue 33's acceptance: pods of a Service that asks for egress
// reach a server behind the router from the Service's address, on the egress node and on the
// other node, while another Service's pods keep their node's address; the same through a BGP
// address, whose replies the router spreads over both announcers; the egress node killed
// hard, new connections leave from the address again through the next candidate; the
// annotation removed, every rule and route the agents added is gone.
func TestEgressOnRealKubelets(t *testing.T) {
	c := cluster(t)
	ctx := context.Background()
	// The shipped heartbeat profile (the failover measured is the product's), and egress's
	// cluster ranges in the cloud-config.
	saved := c.Failover
	c.Failover, c.CloudConfig = nil, kubecluster.EgressCloudConfig
	empty := ""
	if err := c.Label(ctx, "node1", kubecluster.ControlPlaneLabel, &empty); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		c.Failover, c.CloudConfig = saved, ""
		if t.Failed() {
			c.LogFailure(ctx, t)
			out, _ := c.Kubectl(ctx, "-n", kubecluster.EgressNamespace, "logs", "-l", "app in (leaver,stayer)", "--tail", "20", "--prefix")
			t.Logf("client logs:\n%s", out)
		}
		if err := c.RemoveEgress(ctx); err != nil {
			t.Errorf("remove the egress workload: %v", err)
		}
		for _, n := range c.Nodes {
			_ = c.Label(ctx, n.Name, kubecluster.WorkloadLabel, nil)
		}
		if err := kubecluster.Manifests.Uninstall(ctx, c); err != nil {
			t.Errorf("uninstall: %v", err)
		}
		if err := c.ClearAgentState(); err != nil {
			t.Errorf("%v", err)
		}
		if err := c.Reregister(ctx); err != nil {
			t.Errorf("nodes joining anew: %v", err)
		}
	})
	if err := kubecluster.Manifests.Install(ctx, c); err != nil {
		t.Fatalf("install: %v", err)
	}
	if _, err := c.WaitInitialised(ctx, 2*time.Minute); err != nil {
		t.Fatal(err)
	}
	if _, err := c.WaitAgents(ctx, 2*time.Minute); err != nil {
		t.Fatal(err)
	}
	e, err := c.DeployEgress(ctx, t)
	if err != nil {
		t.Fatalf("egress workload: %v", err)
	}
	vip := e.VIP
	if _, err := c.WaitNextHops(e.BGPVIP, []string{"node2", "node3"}, 2*time.Minute); err != nil {
		t.Fatalf("the router's route to the BGP address %s: %v", e.BGPVIP, err)
	}

	ok := t.Run("the server sees only the VIPs from the egress Services' pods on both nodes; the other Service's pods keep their node's address", func(t *testing.T) {
		if err := e.WaitVIPAlone(time.Minute); err != nil {
			t.Fatal(err)
		}
		from := time.Now()
		time.Sleep(3 * time.Second)
		counts := map[string]int{}
		for _, s := range e.Server.Since(from, "") {
			f := strings.Fields(s.Line)
			if len(f) != 2 {
				t.Fatalf("a connection said %q", s.Line)
			}
			pod, node := f[0], f[1]
			if want := e.Want(s.Line); s.From != want {
				t.Fatalf("%s on %s came from %s, want %s", pod, node, s.From, want)
			}
			counts[strings.SplitN(pod, "-", 2)[0]+" on "+node]++
		}
		for _, k := range []string{"leaver on node2", "leaver on node3", "bgpleaver on node2", "bgpleaver on node3", "stayer on node2", "stayer on node3"} {
			if counts[k] < 50 {
				t.Fatalf("connections in 3 s: %v; want at least 50 from each of %s", counts, k)
			}
		}
		owner, _ := c.Owner(vip)
		cond, _ := c.Kubectl(ctx, "-n", kubecluster.EgressNamespace, "get", "service", "leaver", "-o", `jsonpath={.status.conditions[?(@.type=="metalvip.io/Egress")].message}`)
		t.Logf("3 s of connections: %v; ARP for %s answered by %s; the Service's Egress condition: %s", counts, vip, owner, cond)
		if !strings.Contains(cond, "leave from egress node") {
			t.Fatalf("Egress condition %q does not name the egress node", cond)
		}
	})
	t.Run("the BGP address: the router spreads the replies over both announcers, the other one sends them on to the egress node", func(t *testing.T) {
		cond, _ := c.Kubectl(ctx, "-n", kubecluster.EgressNamespace, "get", "service", "bgpleaver", "-o", `jsonpath={.status.conditions[?(@.type=="metalvip.io/Egress")].message}`)
		_, rest, found := strings.Cut(cond, "leave from egress node ")
		if !found {
			t.Fatalf("Egress condition %q does not name the egress node", cond)
		}
		egress := strings.Fields(rest)[0]
		other := map[string]string{"node2": "node3", "node3": "node2"}[egress]
		if other == "" {
			t.Fatalf("egress node %q is no workload node (condition %q)", egress, cond)
		}
		// The replies the other announcer passed on: its steering rules count them.
		steered := regexp.MustCompile(`tcp dport 49152-65534 counter packets ([0-9]+) `)
		var before int
		if m := steered.FindStringSubmatch(mustExec(t, c.Node(other), "nft", "list", "chain", "ip", "metalvip-egress", "prerouting")); m != nil {
			before, _ = strconv.Atoi(m[1])
		} else {
			t.Fatalf("%s has no steering rule for %s", other, e.BGPVIP)
		}
		// And none of them is lost: in 3 s, the BGP address's pods connect about as often
		// as the L2 address's (a lost reply costs a connection its 1-s timeout).
		from := time.Now()
		time.Sleep(3 * time.Second)
		counts := map[string]int{}
		for _, s := range e.Server.Since(from, "") {
			if f := strings.Fields(s.Line); len(f) == 2 {
				counts[strings.SplitN(f[0], "-", 2)[0]+" on "+f[1]]++
			}
		}
		m := steered.FindStringSubmatch(mustExec(t, c.Node(other), "nft", "list", "chain", "ip", "metalvip-egress", "prerouting"))
		after, _ := strconv.Atoi(m[1])
		if after <= before {
			t.Fatalf("%s passed on no reply in 3 s (counter %d, then %d)", other, before, after)
		}
		for _, n := range []string{"node2", "node3"} {
			if b, l := counts["bgpleaver on "+n], counts["leaver on "+n]; b < l*8/10 {
				t.Fatalf("in 3 s the BGP address's pod on %s connected %d times, the L2 address's %d: replies are lost (%v)", n, b, l, counts)
			}
		}
		t.Logf("3 s of connections: %v; %s passed on %d packets of replies", counts, other, after-before)
		hops, _ := c.NextHops(e.BGPVIP)
		t.Logf("%s routed by the router over %v; egress node %s; the condition: %s", e.BGPVIP, hops, egress, cond)
	})
	t.Run("egress in a pool that denies it: a Warning Event and a False condition, nothing else", func(t *testing.T) {
		if _, err := kubecluster.WaitFor(time.Minute, func() (bool, string) {
			out, _ := c.Kubectl(ctx, "-n", kubecluster.EgressNamespace, "get", "service", "denied", "-o", `jsonpath={.status.conditions[?(@.type=="metalvip.io/Egress")].reason}`)
			ev := c.EventsSince(ctx, kubecluster.EgressNamespace, "EgressRefused", time.Time{})
			return out == "EgressRefused" && len(ev) > 0, fmt.Sprintf("condition reason %q, Events %v", out, ev)
		}); err != nil {
			t.Fatal(err)
		}
		t.Logf("%v", c.EventsSince(ctx, kubecluster.EgressNamespace, "EgressRefused", time.Time{}))
	})
	if !ok {
		return
	}

	t.Run(fmt.Sprintf("the egress node killed hard, %d times: new connections leave from the VIP again through the next candidate", trials), func(t *testing.T) {
		var ms []float64
		for i := range trials {
			f, err := e.KillEgressNode(ctx)
			if err != nil {
				t.Fatalf("trial %d: %v", i+1, err)
			}
			t.Logf("trial %d: %s killed, the pod on %s paused %s between connections from %s (%s from the BGP address %s)",
				i+1, f.Victim, f.Survivor, f.Pause.Round(time.Millisecond), vip, f.BGPPause.Round(time.Millisecond), e.BGPVIP)
			if f.Pause > 5*time.Second || f.BGPPause > 5*time.Second {
				t.Fatalf("trial %d: %s without egress (%s through the BGP address)", i+1, f.Pause, f.BGPPause)
			}
			ms = append(ms, float64(f.Pause)/float64(time.Millisecond))
		}
		t.Logf("new connections from the VIP again after the egress node died, over %d trials: p50 %.0f ms, p99 %.0f ms (heartbeats every 50ms, dead after 3 misses)",
			trials, figure.Percentile(ms, 50), figure.Percentile(ms, 99))
	})

	t.Run("the annotation removed: every rule and route metalvip added is gone from every node, the pods leave as before", func(t *testing.T) {
		for _, svc := range []string{"leaver", "bgpleaver", "denied"} {
			if _, err := c.Kubectl(ctx, "-n", kubecluster.EgressNamespace, "annotate", "service", svc, "metalvip.io/egress-"); err != nil {
				t.Fatal(err)
			}
		}
		if _, err := kubecluster.WaitFor(time.Minute, func() (bool, string) {
			for _, n := range c.Nodes {
				if left := n.EgressLeft(); left != "" {
					return false, n.Name + ": " + left
				}
			}
			return true, ""
		}); err != nil {
			t.Fatal(err)
		}
		if _, err := kubecluster.WaitFor(30*time.Second, func() (bool, string) {
			srcs := e.Server.Since(time.Now().Add(-time.Second), "leaver-")
			bgp := e.Server.Since(time.Now().Add(-time.Second), "bgpleaver-")
			for _, s := range slices.Concat(srcs, bgp) {
				if s.From == vip || s.From == e.BGPVIP {
					return false, s.Line + " still leaves from a VIP"
				}
			}
			return len(srcs) > 10, fmt.Sprintf("%d connections in the last second", len(srcs))
		}); err != nil {
			t.Fatal(err)
		}
		cond, _ := c.Kubectl(ctx, "-n", kubecluster.EgressNamespace, "get", "service", "leaver", "-o", `jsonpath={.status.conditions[?(@.type=="metalvip.io/Egress")]}`)
		if cond != "" {
			t.Fatalf("the Egress condition stayed: %s", cond)
		}
	})
}

// mustExec runs a command on a node, failing the test when it fails.
func mustExec(t *testing.T, n *kubecluster.Node, name string, args ...string) string {
	t.Helper()
	out, err := n.Exec(name, args...)
	if err != nil {
		t.Fatal(err)
	}
	return out
}
