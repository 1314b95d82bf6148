package e2e

import (
	"fmt"
	"net/netip"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"

	agentv1 "github.com/metalvip/metalvip/proto/metalvip/agent/v1"
)

// TestAnnouncing runs the planner and failover acceptance on one cluster, step by step.
func TestAnnouncing(t *testing.T) {
	c := newCluster(t)

	var vips []netip.Addr
	t.Run("six L2 Services spread two per node, as planned", func(t *testing.T) {
		c.t = t
		for i := range 6 {
			vips = append(vips, c.service(fmt.Sprintf("web-%d", i)))
		}
		perNode := map[string]int{}
		eventually(t, 30*time.Second, "every VIP answered, two per node", func() bool {
			clear(perNode)
			for _, v := range vips {
				perNode[c.owner(v)]++
			}
			return perNode["node1"] == 2 && perNode["node2"] == 2 && perNode["node3"] == 2
		})
		// The answering node is the one the plan named, as the Service's Event says.
		for i, v := range vips {
			want := c.owner(v)
			eventually(t, 10*time.Second, "the plan's Event names the answering node", func() bool {
				return strings.Contains(c.events(fmt.Sprintf("web-%d", i), "Announced"), "answered by "+want)
			})
		}
		// And the client reaches each VIP.
		for _, v := range vips {
			if err := c.lab.Client.Ping(c.ctx, v, 1); err != nil {
				t.Errorf("client cannot reach %s: %v", v, err)
			}
		}
	})

	t.Run("externalTrafficPolicy Local follows the endpoints", func(t *testing.T) {
		c.t = t
		l2 := c.service("local-l2", local)
		c.endpoints("local-l2", "node3")
		c.waitOwner(l2, "node3", 30*time.Second)
		c.endpoints("local-l2", "node2")
		c.waitOwner(l2, "node2", 30*time.Second)

		bgp := c.service("local-bgp", local, inPool("bgp-"+c.ns))
		c.endpoints("local-bgp", "node1", "node3")
		eventually(t, 60*time.Second, "BGP next hops are the endpoint nodes", func() bool {
			return slices.Equal(c.nextHops(bgp), []string{"198.51.100.11", "198.51.100.13"})
		})
		c.endpoints("local-bgp", "node2")
		eventually(t, 60*time.Second, "BGP next hops follow the endpoints", func() bool {
			return slices.Equal(c.nextHops(bgp), []string{"198.51.100.12"})
		})
		cluster := c.service("cluster-bgp", inPool("bgp-"+c.ns))
		eventually(t, 60*time.Second, "a Cluster-policy BGP VIP is advertised by every node", func() bool {
			return slices.Equal(c.nextHops(cluster), []string{"198.51.100.11", "198.51.100.12", "198.51.100.13"})
		})
	})

	t.Run("a CCM restart during traffic changes nothing", func(t *testing.T) {
		c.t = t
		vip := vips[0]
		before := c.owners(vips)
		probe, err := c.lab.Client.Probe(vip, 10*time.Millisecond, 3000)
		if err != nil {
			t.Fatal(err)
		}
		eventually(t, 5*time.Second, "the probe is answered", probe.Answered)
		start := time.Now()
		c.ccm.Stop(10 * time.Second)
		c.startCCM()
		// Wait until the new CCM has pushed its (higher) term to every agent.
		eventually(t, 30*time.Second, "every agent took the new CCM's term", func() bool {
			for _, a := range c.agents {
				st, err := a.client.GetState(c.ctx, &agentv1.GetStateRequest{})
				if err != nil || st.GetTerm() == 0 || time.UnixMicro(int64(st.GetTerm())).Before(start) {
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
		if after := c.owners(vips); !maps2Equal(before, after) {
			t.Errorf("announcements changed across the CCM restart: %v -> %v", before, after)
		}
	})

	var outages []time.Duration
	t.Run("the owner dies: the next candidate answers (10 trials)", func(t *testing.T) {
		c.t = t
		vip := vips[0]
		for trial := range 10 {
			victim := c.owner(vip)
			if victim == "" {
				t.Fatalf("trial %d: nobody answers %s", trial, vip)
			}
			d := c.failover(vip, victim)
			outages = append(outages, d)
			t.Logf("trial %d: %s died, outage %s, %s answers now", trial, victim, d.Round(time.Millisecond), c.owner(vip))
			c.revive(victim)
			// Settle: the revived node's agent is reachable again before the next trial.
			eventually(t, 60*time.Second, "the revived agent is back in the plan", func() bool {
				st, err := c.agents[victim].client.GetState(c.ctx, &agentv1.GetStateRequest{})
				return err == nil && !st.GetRestored() && len(c.owners(vips)) == len(vips) && !slices.Contains(valuesOf(c.owners(vips)), "")
			})
		}
		sorted := slices.Clone(outages)
		sort.Slice(sorted, func(i, j int) bool { return sorted[i] < sorted[j] })
		p50, p99 := sorted[len(sorted)/2], sorted[(len(sorted)*99+99)/100-1]
		t.Logf("L2 failover, node death to traffic restored at the client, %d trials: p50 %s, p99 %s, max %s",
			len(sorted), p50.Round(time.Millisecond), p99.Round(time.Millisecond), sorted[len(sorted)-1].Round(time.Millisecond))
	})

	t.Run("failover needs no CCM", func(t *testing.T) {
		c.t = t
		vip := vips[1]
		c.ccm.Stop(10 * time.Second)
		victim := c.owner(vip)
		d := c.failover(vip, victim)
		t.Logf("with the CCM stopped, %s died: outage %s, %s answers now", victim, d.Round(time.Millisecond), c.owner(vip))
		c.revive(victim)
		c.startCCM()
	})
}

// failover kills victim while the client probes vip every 10 ms and returns the outage seen.
func (c *cluster) failover(vip netip.Addr, victim string) time.Duration {
	c.t.Helper()
	probe, err := c.lab.Client.Probe(vip, 10*time.Millisecond, 6000)
	if err != nil {
		c.t.Fatal(err)
	}
	eventually(c.t, 5*time.Second, "the probe is answered before the kill", probe.Answered)
	killed := time.Now()
	c.kill(victim)
	eventually(c.t, 5*time.Second, "the client is answered again", func() bool {
		return time.Since(killed) > 200*time.Millisecond && probe.Answered()
	})
	probe.Stop()
	d, _ := probe.Outage(killed.Add(-20 * time.Millisecond))
	if d > 5*time.Second {
		c.t.Errorf("outage %s over the 5s bound", d)
	}
	if now := c.owner(vip); now == victim || now == "" {
		c.t.Errorf("after %s died, %q answers %s", victim, now, vip)
	}
	return d
}

func (c *cluster) owners(vips []netip.Addr) map[netip.Addr]string {
	out := map[netip.Addr]string{}
	for _, v := range vips {
		out[v] = c.owner(v)
	}
	return out
}

func valuesOf(m map[netip.Addr]string) []string {
	var out []string
	for _, v := range m {
		out = append(out, v)
	}
	return out
}

func maps2Equal(a, b map[netip.Addr]string) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if b[k] != v {
			return false
		}
	}
	return true
}

// events returns the messages of a Service's Events of reason, one a line.
func (c *cluster) events(name, reason string) string {
	l, err := c.srv.Client.CoreV1().Events(c.ns).List(c.ctx, metav1.ListOptions{
		FieldSelector: fields.Set{"involvedObject.name": name, "reason": reason}.String(),
	})
	if err != nil {
		return ""
	}
	var b strings.Builder
	for _, e := range l.Items {
		b.WriteString(e.Message + "\n")
	}
	return b.String()
}
