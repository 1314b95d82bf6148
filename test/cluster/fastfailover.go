package cluster

import (
	"context"
	"net/netip"
	"time"

	agentv1 "github.com/metalvip/metalvip/proto/metalvip/agent/v1"
	"github.com/metalvip/metalvip/test/harness"
	"github.com/metalvip/metalvip/test/harness/probe"
	"github.com/metalvip/metalvip/test/harness/proc"
)

// ServeHTTP starts an HTTP server on port on every node (it answers on the VIPs too, with the
// node's name), for FailoverHTTP.
func (c *Cluster) ServeHTTP(port uint16) {
	c.T.Helper()
	for _, n := range c.Lab.Nodes {
		n.ServeHTTP(c.Root, port)
	}
}

// FailoverHTTP kills the node that answers vip while the client opens an HTTP connection to
// vip:port every interval (ServeHTTP must run), and returns that node, the outage seen (from
// the first attempt not answered to the first answered after it) and the nodes that answered,
// in order. The victim is the node the client reaches, not the one the agents say answers: a
// client's neighbour entry follows a takeover a moment later.
func (c *Cluster) FailoverHTTP(vip netip.Addr, port uint16, interval time.Duration) (victim string, outage time.Duration, by []string) {
	c.T.Helper()
	// An attempt not answered within 300 ms is lost: far above an answer's time on the lab's
	// bridge, far below TCP's first SYN retransmission (1 s), which a connect sent to the dead
	// node's MAC would wait for.
	prober, err := probe.StartHTTP(c.Lab.Client, netip.AddrPortFrom(vip, port), interval, 300*time.Millisecond, int(20*time.Second/interval))
	if err != nil {
		c.T.Fatalf("%v", err)
	}
	// The VIP's first candidate answers, steadily: a node revived just before takes its VIP
	// back from the next one when its peers hear it, which must not happen during the trial.
	harness.Eventually(c.T, 30*time.Second, "the first candidate answers the HTTP client steadily", func() bool {
		victim = prober.Steady(time.Second)
		return victim != "" && victim == c.firstCandidate(vip) && c.Owner(vip) == victim && prober.Steady(time.Second) == victim
	})
	killed := time.Now()
	c.Kill(victim)
	// Killing takes a moment (the link is set down by a command): the victim answers until
	// then. Another node must answer an attempt made after.
	down := time.Now()
	harness.Eventually(c.T, 5*time.Second, "another node answers the HTTP client", func() bool {
		by := prober.Outage(down).By
		return len(by) > 0 && by[len(by)-1] != victim && prober.Answered()
	})
	if err := prober.Stop(); err != nil {
		c.T.Fatalf("%v", err)
	}
	o := prober.Outage(killed.Add(-2 * interval))
	outage, by = o.Longest, o.By
	if outage > 5*time.Second {
		c.T.Errorf("outage %s over the 5s bound", outage)
	}
	// Between its answers and the last survivor's, others may answer for a moment (a survivor
	// that thought another dead hands the VIP over when it hears it): reported, not an error.
	if len(by) == 0 || by[len(by)-1] == victim {
		c.T.Errorf("%s died: HTTP answered by %v, want another node at the end", victim, by)
	}
	return victim, outage, by
}

// Trials are L2 failover trials as an HTTP client sees them (FailoverTrials).
type Trials struct {
	Outages []time.Duration
	// Moves counts, per trial, the moves among the survivors after the first took over (a
	// survivor handing the VIP to another): 0 when one survivor answered from then on.
	Moves []int
	// Discarded: trials not counted because another node answered at the kill already.
	Discarded int
}

// FailoverTrials runs n counted trials of FailoverHTTP, reviving the victim after each, and
// logs each with logf. A trial in which the victim did not answer the last attempts before the
// kill (a hand-over raced the start) is run again, at most n times in all.
func (c *Cluster) FailoverTrials(vip netip.Addr, port uint16, interval time.Duration, n int, logf func(format string, args ...any)) Trials {
	c.T.Helper()
	var tr Trials
	for len(tr.Outages) < n && tr.Discarded <= n {
		victim, d, by := c.FailoverHTTP(vip, port, interval)
		if len(by) == 0 || by[0] != victim {
			tr.Discarded++
			logf("trial not counted: %s died, but %v answered from just before", victim, by)
		} else {
			tr.Outages = append(tr.Outages, d)
			tr.Moves = append(tr.Moves, max(0, len(by)-2))
			logf("trial %d: %s died, outage %s, answered by %v", len(tr.Outages), victim, d.Round(time.Millisecond), by)
		}
		c.Revive(victim)
		a := c.Agents[victim]
		harness.Eventually(c.T, 30*time.Second, victim+" back and in touch with the CCM", func() bool {
			st, err := a.Client.GetState(context.Background(), &agentv1.GetStateRequest{})
			return err == nil && !st.GetRestored()
		})
	}
	if len(tr.Outages) < n {
		c.T.Fatalf("only %d of %d failover trials could be counted (%d not)", len(tr.Outages), n, tr.Discarded)
	}
	return tr
}

// AgentCost is what one agent's heartbeats and work cost over a window.
type AgentCost struct {
	Window time.Duration
	CPU    time.Duration // user+system of the agent process
	Sent   uint64        // heartbeats sent
	Peers  int           // nodes it exchanges heartbeats with
	VIPs   int           // VIPs it takes part in
}

// CPUShare is the agent's CPU as a share of one core.
func (a AgentCost) CPUShare() float64 { return a.CPU.Seconds() / a.Window.Seconds() }

// SentPerPeerPerSecond is the heartbeat packets it sent each peer per second.
func (a AgentCost) SentPerPeerPerSecond() float64 {
	if a.Peers == 0 {
		return 0
	}
	return float64(a.Sent) / float64(a.Peers) / a.Window.Seconds()
}

// MeasureAgent measures node's agent over window: its CPU (from /proc) and the heartbeats it
// sent (its own counters).
func (c *Cluster) MeasureAgent(node string, window time.Duration) AgentCost {
	c.T.Helper()
	a := c.Agents[node]
	state := func() *agentv1.GetStateResponse {
		st, err := a.Client.GetState(context.Background(), &agentv1.GetStateRequest{})
		if err != nil {
			c.T.Fatalf("%s GetState: %v", node, err)
		}
		return st
	}
	pid := a.Proc.Cmd.Process.Pid
	st0, cpu0, t0 := state(), c.processCPU(pid), time.Now()
	time.Sleep(window)
	st1, cpu1, t1 := state(), c.processCPU(pid), time.Now()
	return AgentCost{Window: t1.Sub(t0), CPU: cpu1 - cpu0, Sent: st1.GetHeartbeats().GetSent() - st0.GetHeartbeats().GetSent(),
		Peers: len(st1.GetState().GetHeartbeatPeers()), VIPs: len(st1.GetState().GetAnnouncements())}
}

// processCPU is a process's user and system CPU so far.
func (c *Cluster) processCPU(pid int) time.Duration {
	d, err := proc.CPU(pid)
	if err != nil {
		c.T.Fatalf("%v", err)
	}
	return d
}

// firstCandidate is the first of vip's ranked candidates, as the agents hold them; empty when
// no reachable agent holds it.
func (c *Cluster) firstCandidate(vip netip.Addr) string {
	for _, a := range c.Agents {
		st, err := a.Client.GetState(context.Background(), &agentv1.GetStateRequest{})
		if err != nil {
			continue
		}
		for _, an := range st.GetState().GetAnnouncements() {
			if cs := an.GetL2().GetCandidates(); an.GetVip() == vip.String() && len(cs) > 0 {
				return cs[0].GetNode()
			}
		}
	}
	return ""
}
