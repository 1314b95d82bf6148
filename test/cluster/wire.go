package cluster

import (
	"context"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	agentv1 "github.com/metalvip/metalvip/proto/metalvip/agent/v1"
	"github.com/metalvip/metalvip/test/harness"
)

// Owner returns the node whose agent answers ARP or NDP for vip at the client, or "".
func (c *Cluster) Owner(vip netip.Addr) string {
	macs, err := c.Lab.Client.AskNeighbor(vip, 500*time.Millisecond, true)
	if err != nil {
		c.T.Fatalf("%v", err)
	}
	if len(macs) == 0 {
		return ""
	}
	if n, ok := c.MACs[macs[0]]; ok {
		return n
	}
	// A virtual MAC names no node: the agent that says it answers is the owner.
	if owners := c.ActiveOwners(vip); len(owners) == 1 {
		return owners[0]
	}
	return ""
}

// ActiveOwners returns the nodes whose agents say they answer vip (those that answer GetState
// within a second).
func (c *Cluster) ActiveOwners(vip netip.Addr) []string {
	var owners []string
	for name, a := range c.Agents {
		ctx, cancel := context.WithTimeout(c.ctx, time.Second)
		st, err := a.Client.GetState(ctx, &agentv1.GetStateRequest{})
		cancel()
		if err != nil {
			continue
		}
		for _, v := range st.GetAnnounced() {
			if v.GetVip() == vip.String() && v.GetActive() {
				owners = append(owners, name)
			}
		}
	}
	return owners
}

func (c *Cluster) WaitOwner(vip netip.Addr, want string, timeout time.Duration) {
	c.T.Helper()
	harness.Eventually(c.T, timeout, fmt.Sprintf("%s answered by %s", vip, want), func() bool { return c.Owner(vip) == want })
}

// Answerers asks for vip once by ARP (NDP for IPv6) from the client and returns every node that answered
// within 100 ms, sorted.
func (c *Cluster) Answerers(vip netip.Addr) []string {
	macs, err := c.Lab.Client.AskNeighbor(vip, 100*time.Millisecond, false)
	if err != nil {
		c.T.Fatalf("%v", err)
	}
	var out []string
	for _, m := range macs {
		out = append(out, c.MACs[m])
	}
	slices.Sort(out)
	return out
}

// NextHops returns the next hops of the router's kernel route to vip, sorted.
func (c *Cluster) NextHops(vip netip.Addr) []string {
	return c.Lab.NextHops(c.T, vip.String())
}

// kill takes a node off the segment (link down) and kills its agent: a node dying hard.
func (c *Cluster) Kill(node string) {
	c.T.Helper()
	a := c.Agents[node]
	if _, err := a.Host.Run(c.ctx, "ip", "link", "set", "eth0", "down"); err != nil {
		c.T.Fatalf("%v", err)
	}
	a.Proc.Kill()
}

// revive brings a killed node back: link up, agent started on its saved state.
func (c *Cluster) Revive(node string) {
	c.T.Helper()
	a := c.Agents[node]
	if _, err := a.Host.Run(c.ctx, "ip", "link", "set", "eth0", "up"); err != nil {
		c.T.Fatalf("%v", err)
	}
	// Link down removed the default route.
	_, _ = a.Host.Run(c.ctx, "ip", "route", "replace", "default", "via", "198.51.100.1")
	c.StartAgent(a)
}

// Failover kills victim while the client probes vip every 10 ms and returns the outage seen.
func (c *Cluster) Failover(vip netip.Addr, victim string) time.Duration {
	c.T.Helper()
	probe, err := c.Lab.Client.Probe(vip, 10*time.Millisecond, 6000)
	if err != nil {
		c.T.Fatalf("%v", err)
	}
	harness.Eventually(c.T, 5*time.Second, "the probe is answered before the kill", probe.Answered)
	killed := time.Now()
	c.Kill(victim)
	harness.Eventually(c.T, 5*time.Second, "the client is answered again", func() bool {
		return time.Since(killed) > 200*time.Millisecond && probe.Answered()
	})
	probe.Stop()
	d, _ := probe.Outage(killed.Add(-20 * time.Millisecond))
	if d > 5*time.Second {
		c.T.Errorf("outage %s over the 5s bound", d)
	}
	if now := c.Owner(vip); now == victim || now == "" {
		c.T.Errorf("after %s died, %q answers %s", victim, now, vip)
	}
	return d
}

func (c *Cluster) Owners(vips []netip.Addr) map[netip.Addr]string {
	out := map[netip.Addr]string{}
	for _, v := range vips {
		out[v] = c.Owner(v)
	}
	return out
}

func ValuesOf(m map[netip.Addr]string) []string {
	var out []string
	for _, v := range m {
		out = append(out, v)
	}
	return out
}

func SameOwners(a, b map[netip.Addr]string) bool {
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

// AgentMetrics scrapes node's agent's /metrics (port 7474, from inside the node) and returns
// the families by name.
func (c *Cluster) AgentMetrics(node string) (map[string]*dto.MetricFamily, error) {
	out, err := c.Agents[node].Host.Run(c.ctx, "curl", "-sf", "--max-time", "5", "http://127.0.0.1:7474/metrics")
	if err != nil {
		return nil, fmt.Errorf("scrape %s: %w: %s", node, err, out)
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	return p.TextToMetricFamilies(strings.NewReader(string(out)))
}

// MetricValue returns the value of the sample of family name whose labels include labels
// (name=value pairs); for a histogram, its count. ok is false without such a sample.
func MetricValue(fams map[string]*dto.MetricFamily, name string, labels ...string) (v float64, ok bool) {
	f := fams[name]
	if f == nil {
		return 0, false
	}
next:
	for _, m := range f.GetMetric() {
		for i := 0; i+1 < len(labels); i += 2 {
			if !slices.ContainsFunc(m.GetLabel(), func(l *dto.LabelPair) bool { return l.GetName() == labels[i] && l.GetValue() == labels[i+1] }) {
				continue next
			}
		}
		switch {
		case m.GetCounter() != nil:
			return m.GetCounter().GetValue(), true
		case m.GetGauge() != nil:
			return m.GetGauge().GetValue(), true
		case m.GetHistogram() != nil:
			return float64(m.GetHistogram().GetSampleCount()), true
		}
	}
	return 0, false
}
