// Package e2e runs metalvip whole in the lab (test/cluster) and checks the failure model of
// docs/design.md on the wire.
package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"net/netip"
	"os/exec"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"

	agentv1 "github.com/metalvip/metalvip/proto/metalvip/agent/v1"
	"github.com/metalvip/metalvip/test/cluster"
	"github.com/metalvip/metalvip/test/harness"
	"github.com/metalvip/metalvip/test/kubeapi"
	"github.com/metalvip/metalvip/test/testenv"
)

// ctlStatus is what `metalvipctl status` prints over the kubeconfig kc; it fails t if the
// command fails.
func ctlStatus(t *testing.T, kc string) string {
	t.Helper()
	out, err := exec.Command(ctlBinary, "status", "--kubeconfig", kc).CombinedOutput()
	if err != nil {
		t.Fatalf("metalvipctl status: %v\n%s", err, out)
	}
	return string(out)
}

func lineWith(text, sub string) string {
	for _, l := range strings.Split(text, "\n") {
		if strings.Contains(l, sub) {
			return l
		}
	}
	return ""
}

var ccmBinary, agentBinary, ctlBinary string

func TestMain(m *testing.M) {
	bins, cleanup := testenv.BuildMain("metalvip-e2e", "./cmd/metalvip-cloud-controller-manager", "./cmd/metalvip-agent", "./cmd/metalvipctl")
	ccmBinary, agentBinary, ctlBinary = bins[0], bins[1], bins[2]
	testenv.LabLock("test/e2e") // after the build: only the tests run one package at a time
	kubeapi.Main(m, cleanup)
}

// TestAnnouncing runs the planner and failover acceptance on one cluster, step by step.
func TestAnnouncing(t *testing.T) {
	c := cluster.New(t, kubeapi.Get(t), cluster.Options{CCMBinary: ccmBinary, AgentBinary: agentBinary})
	ctx := context.Background()

	var vips []netip.Addr
	t.Run("six L2 Services spread two per node, as planned", func(t *testing.T) {
		c.T = t
		for i := range 6 {
			vips = append(vips, c.Service(fmt.Sprintf("web-%d", i)))
		}
		perNode := map[string]int{}
		harness.Eventually(t, 30*time.Second, "every VIP answered, two per node", func() bool {
			clear(perNode)
			for _, v := range vips {
				perNode[c.Owner(v)]++
			}
			return perNode["node1"] == 2 && perNode["node2"] == 2 && perNode["node3"] == 2
		})
		// The answering node is the one the plan named, as the Service's condition says.
		for i, v := range vips {
			want := c.Owner(v)
			harness.Eventually(t, 10*time.Second, "the Service's Announced condition names the answering node", func() bool {
				return strings.Contains(c.Announced(fmt.Sprintf("web-%d", i)), v.String()+" (L2): "+want)
			})
		}
		// And the client reaches each VIP.
		for _, v := range vips {
			if err := c.Lab.Client.Ping(ctx, v, 1); err != nil {
				t.Errorf("client cannot reach %s: %v", v, err)
			}
		}
	})

	t.Run("metalvipctl status shows pools, Services, announcing nodes and agents", func(t *testing.T) {
		c.T = t
		kc := c.Srv.Kubeconfig(t, nil)
		var table string
		harness.Eventually(t, 30*time.Second, "status names the pool and announcing node of every web Service", func() bool {
			out := ctlStatus(t, kc)
			table = out
			for i, v := range vips {
				line := lineWith(out, fmt.Sprintf("%s/web-%d ", c.NS, i))
				if !strings.Contains(line, v.String()) || !strings.Contains(line, "l2-"+c.NS) || !strings.Contains(line, c.Owner(v)) {
					return false
				}
			}
			return strings.Contains(out, "l2-"+c.NS) && strings.Count(out, "reachable") >= 3
		})
		t.Logf("metalvipctl status:\n%s", table)
		out, err := exec.Command(ctlBinary, "status", "--kubeconfig", kc, "-o", "json").Output()
		if err != nil {
			t.Fatal(err)
		}
		var st struct {
			Pools    []struct{ Name string }
			Services []struct {
				Name        string
				Addresses   []string
				AnnouncedBy string
			}
			Agents []struct{ Node, Agent string }
		}
		if err := json.Unmarshal(out, &st); err != nil {
			t.Fatalf("status -o json: %v\n%s", err, out)
		}
		if len(st.Agents) != 3 || st.Agents[0].Agent != "reachable" || len(st.Services) < 6 {
			t.Errorf("status -o json: %+v", st)
		}

		// Events expire (an hour by default): status reads the Services' conditions and the
		// Nodes', so it shows the same with none left.
		if err := c.Srv.Client.CoreV1().Events(c.NS).DeleteCollection(ctx, metav1.DeleteOptions{}, metav1.ListOptions{}); err != nil {
			t.Fatal(err)
		}
		if err := c.Srv.Client.CoreV1().Events("default").DeleteCollection(ctx, metav1.DeleteOptions{}, metav1.ListOptions{}); err != nil {
			t.Fatal(err)
		}
		if l, _ := c.Srv.Client.CoreV1().Events(c.NS).List(ctx, metav1.ListOptions{}); len(l.Items) != 0 {
			t.Fatalf("%d Events left", len(l.Items))
		}
		status := ctlStatus(t, kc)
		for i, v := range vips {
			line := lineWith(status, fmt.Sprintf("%s/web-%d ", c.NS, i))
			if !strings.Contains(line, v.String()) || !strings.Contains(line, c.Owner(v)) {
				t.Errorf("with no Event left, status says %q for %s (answered by %s)", line, v, c.Owner(v))
			}
		}
		if strings.Count(status, "reachable") < 3 {
			t.Errorf("with no Event left, status shows no agent reachable:\n%s", status)
		}
		svc, err := c.Srv.Client.CoreV1().Services(c.NS).Get(ctx, "web-0", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		y, _ := yaml.Marshal(svc.Status)
		if !strings.Contains(string(y), "type: metalvip.io/Announced") || !strings.Contains(string(y), c.Owner(vips[0])) {
			t.Errorf("web-0's status does not show the Announced condition naming %s:\n%s", c.Owner(vips[0]), y)
		}
		t.Logf("metalvipctl status with every Event deleted:\n%s\nweb-0 status:\n%s", status, y)
	})

	t.Run("externalTrafficPolicy Local follows the endpoints", func(t *testing.T) {
		c.T = t
		l2 := c.Service("local-l2", cluster.Local)
		c.Endpoints("local-l2", "node3")
		c.WaitOwner(l2, "node3", 30*time.Second)
		c.Endpoints("local-l2", "node2")
		c.WaitOwner(l2, "node2", 30*time.Second)

		bgp := c.Service("local-bgp", cluster.Local, cluster.InPool("bgp-"+c.NS))
		c.Endpoints("local-bgp", "node1", "node3")
		harness.Eventually(t, 60*time.Second, "BGP next hops are the endpoint nodes", func() bool {
			return slices.Equal(c.NextHops(bgp), []string{"198.51.100.11", "198.51.100.13"})
		})
		c.Endpoints("local-bgp", "node2")
		harness.Eventually(t, 60*time.Second, "BGP next hops follow the endpoints", func() bool {
			return slices.Equal(c.NextHops(bgp), []string{"198.51.100.12"})
		})
		everywhere := c.Service("cluster-bgp", cluster.InPool("bgp-"+c.NS))
		harness.Eventually(t, 60*time.Second, "a Cluster-policy BGP VIP is advertised by every node", func() bool {
			return slices.Equal(c.NextHops(everywhere), []string{"198.51.100.11", "198.51.100.12", "198.51.100.13"})
		})
	})

	t.Run("a CCM restart during traffic changes nothing", func(t *testing.T) {
		c.T = t
		vip := vips[0]
		before := c.Owners(vips)
		probe, err := c.Lab.Client.Probe(vip, 10*time.Millisecond, 3000)
		if err != nil {
			t.Fatal(err)
		}
		harness.Eventually(t, 5*time.Second, "the probe is answered", probe.Answered)
		st, err := c.Agents["node1"].Client.GetState(ctx, &agentv1.GetStateRequest{})
		if err != nil || st.GetTerm() == 0 {
			t.Fatalf("node1's agent holds no term: %v %v", st, err)
		}
		oldTerm := st.GetTerm()
		start := time.Now()
		c.CCM.Stop(10 * time.Second)
		c.StartCCM()
		// Wait until the new CCM has pushed its (higher) term to every agent: the term comes
		// from the Lease, which the new CCM's start counts.
		harness.Eventually(t, 30*time.Second, "every agent took the new CCM's term", func() bool {
			for _, a := range c.Agents {
				st, err := a.Client.GetState(ctx, &agentv1.GetStateRequest{})
				if err != nil || st.GetTerm() <= oldTerm {
					return false
				}
			}
			return true
		})
		time.Sleep(time.Second)
		probe.Stop()
		if _, lost := probe.Outage(start); lost != 0 {
			t.Errorf("%d probes lost across the CCM restart", lost)
		}
		if after := c.Owners(vips); !cluster.SameOwners(before, after) {
			t.Errorf("announcements changed across the CCM restart: %v -> %v", before, after)
		}
	})

	var outages []time.Duration
	t.Run("the owner dies: the next candidate answers (10 trials)", func(t *testing.T) {
		c.T = t
		vip := vips[0]
		for trial := range 10 {
			victim := c.Owner(vip)
			if victim == "" {
				t.Fatalf("trial %d: nobody answers %s", trial, vip)
			}
			before := map[string]float64{}
			if trial == 0 {
				for name := range c.Agents {
					fams, err := c.AgentMetrics(name)
					if err != nil {
						t.Fatalf("%v", err)
					}
					before[name], _ = cluster.MetricValue(fams, "metalvip_agent_takeover_seconds")
				}
			}
			d := c.Failover(vip, victim)
			outages = append(outages, d)
			t.Logf("trial %d: %s died, outage %s, %s answers now", trial, victim, d.Round(time.Millisecond), c.Owner(vip))
			if trial == 0 {
				checkTakeoverMetrics(t, c, c.Owner(vip), before[c.Owner(vip)])
			}
			c.Revive(victim)
			// Settle: the revived node's agent is reachable again before the next trial.
			harness.Eventually(t, 60*time.Second, "the revived agent is back in the plan", func() bool {
				st, err := c.Agents[victim].Client.GetState(ctx, &agentv1.GetStateRequest{})
				return err == nil && !st.GetRestored() && len(c.Owners(vips)) == len(vips) && !slices.Contains(cluster.ValuesOf(c.Owners(vips)), "")
			})
		}
		sorted := slices.Clone(outages)
		sort.Slice(sorted, func(i, j int) bool { return sorted[i] < sorted[j] })
		p50, p99 := sorted[len(sorted)/2], sorted[(len(sorted)*99+99)/100-1]
		t.Logf("L2 failover, node death to traffic restored at the client, %d trials: p50 %s, p99 %s, max %s",
			len(sorted), p50.Round(time.Millisecond), p99.Round(time.Millisecond), sorted[len(sorted)-1].Round(time.Millisecond))
	})

	t.Run("failover needs no CCM", func(t *testing.T) {
		c.T = t
		vip := vips[1]
		c.CCM.Stop(10 * time.Second)
		victim := c.Owner(vip)
		d := c.Failover(vip, victim)
		t.Logf("with the CCM stopped, %s died: outage %s, %s answers now", victim, d.Round(time.Millisecond), c.Owner(vip))
		c.Revive(victim)
		c.StartCCM()
	})
}

// checkTakeoverMetrics checks that node's agent counted the takeover it just made after a
// death, with its duration, and that its health and readiness endpoints answer.
func checkTakeoverMetrics(t *testing.T, c *cluster.Cluster, node string, before float64) {
	t.Helper()
	fams, err := c.AgentMetrics(node)
	if err != nil {
		t.Fatalf("%v", err)
	}
	n, ok := cluster.MetricValue(fams, "metalvip_agent_takeover_seconds")
	if !ok || n < before+1 {
		t.Errorf("%s: metalvip_agent_takeover_seconds counts %v takeovers after a death (before the kill: %v); want one more", node, n, before)
	}
	h := fams["metalvip_agent_takeover_seconds"].GetMetric()[0].GetHistogram()
	if mean := h.GetSampleSum() / float64(h.GetSampleCount()); !(mean > 0 && mean < 5) {
		t.Errorf("%s: takeovers took %.3f s on average; want between 0 and the 5 s bound", node, mean)
	}
	if tk, ok := cluster.MetricValue(fams, "metalvip_agent_failovers_total", "direction", "took_over"); !ok || tk < 1 {
		t.Errorf("%s: metalvip_agent_failovers_total{direction=took_over} = %v", node, tk)
	}
	if a, ok := cluster.MetricValue(fams, "metalvip_agent_vips", "state", "answered"); !ok || a < 1 {
		t.Errorf("%s: metalvip_agent_vips{state=answered} = %v; it answers at least the VIP it took", node, a)
	}
	t.Logf("%s's metrics after the takeover: %v takeovers after a death, %.1f ms on average", node, n, 1000*h.GetSampleSum()/float64(h.GetSampleCount()))
	for _, path := range []string{"/healthz", "/readyz"} {
		if out, err := c.Agents[node].Host.Run(context.Background(), "curl", "-sf", "--max-time", "10", "http://127.0.0.1:7474"+path); err != nil {
			t.Errorf("%s %s: %v %s", node, path, err, out)
		}
	}
}
