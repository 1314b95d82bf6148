package e2ecluster

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/metalvip/metalvip/test/harness/figure"
	"github.com/metalvip/metalvip/test/kubecluster"
)

// TestEgressOnRealKubelets is issue 33's acceptance: pods of a Service that asks for egress
// reach a server behind the router from the Service's address, on the egress node and on the
// other node, while another Service's pods keep their node's address; the egress node killed
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

	ok := t.Run("the server sees only the VIP from the egress Service's pods on both nodes; the other Service's pods keep their node's address", func(t *testing.T) {
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
			want := vip
			if strings.HasPrefix(pod, "stayer-") {
				want = e.NodeAddr[node]
			}
			if s.From != want {
				t.Fatalf("%s on %s came from %s, want %s", pod, node, s.From, want)
			}
			counts[strings.SplitN(pod, "-", 2)[0]+" on "+node]++
		}
		for _, k := range []string{"leaver on node2", "leaver on node3", "stayer on node2", "stayer on node3"} {
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
			t.Logf("trial %d: %s killed, the pod on %s paused %s between connections from %s", i+1, f.Victim, f.Survivor, f.Pause.Round(time.Millisecond), vip)
			if f.Pause > 5*time.Second {
				t.Fatalf("trial %d: %s without egress", i+1, f.Pause)
			}
			ms = append(ms, float64(f.Pause)/float64(time.Millisecond))
		}
		t.Logf("new connections from the VIP again after the egress node died, over %d trials: p50 %.0f ms, p99 %.0f ms (heartbeats every 50ms, dead after 3 misses)",
			trials, figure.Percentile(ms, 50), figure.Percentile(ms, 99))
	})

	t.Run("the annotation removed: every rule and route metalvip added is gone from every node, the pods leave as before", func(t *testing.T) {
		for _, svc := range []string{"leaver", "denied"} {
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
			for _, s := range srcs {
				if s.From == vip {
					return false, s.Line + " still leaves from the VIP"
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
