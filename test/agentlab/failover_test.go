package agentlab

import (
	"context"
	"net/netip"
	"path/filepath"
	"sort"
	"testing"
	"time"

	agentv1 "github.com/metalvip/metalvip/proto/metalvip/agent/v1"
	"github.com/metalvip/metalvip/test/lab"
)

// TestL2FailoverAmongAgents kills the owner of an L2 VIP (link down and agent killed) with no
// CCM anywhere, and measures the outage a client probing every 10 ms sees until the next
// candidate answers; then brings the node back and checks the hand-over back to it.
func TestL2FailoverAmongAgents(t *testing.T) {
	l := lab.New(t, lab.Options{Nodes: 3})
	tlsDir := pki(t, l.Nodes)
	var agents []*agent
	for _, n := range l.Nodes {
		agents = append(agents, startAgent(t, n, tlsDir, filepath.Join(t.TempDir(), "state")))
	}
	vip := netip.MustParseAddr("203.0.113.30")
	macs := map[string]string{}
	for _, n := range l.Nodes {
		macs[macOf(t, n)] = n.Name
	}
	gen := uint64(0)
	applyAll := func(order ...*lab.Host) {
		gen++
		for _, a := range agents {
			if a.proc != nil {
				select {
				case <-a.proc.Done():
					continue // dead
				default:
				}
			}
			a.apply(heartbeatsOn(t, desired(gen, l, l2Ann(vip.String(), order...)), a, agents))
		}
	}
	applyAll(l.Nodes[0], l.Nodes[1], l.Nodes[2])
	owner := func() string { return macs[whoAnswers(t, l.Client, vip)] }
	dump := func() {
		for _, a := range agents {
			st, err := a.client.GetState(context.Background(), &agentv1.GetStateRequest{})
			t.Logf("%s: %v problems %v %v", a.host.Name, st.GetAnnounced(), st.GetProblems(), err)
		}
	}
	t.Cleanup(func() {
		if t.Failed() {
			dump()
		}
	})
	eventually(t, 10*time.Second, "node1 answers", func() bool { return owner() == "node1" })

	const trials = 3
	var outages []time.Duration
	for trial := range trials {
		victim := agents[0]
		probe, err := l.Client.Probe(vip, 10*time.Millisecond, 3000)
		if err != nil {
			t.Fatal(err)
		}
		eventually(t, 5*time.Second, "the probe is answered", probe.Answered)
		killed := time.Now()
		if _, err := l.Nodes[0].Run(context.Background(), "ip", "link", "set", "eth0", "down"); err != nil {
			t.Fatal(err)
		}
		victim.proc.Kill()
		eventually(t, 5*time.Second, "the client is answered again", func() bool {
			return probe.Answered() && time.Since(killed) > 150*time.Millisecond
		})
		probe.Stop()
		outage, lost := probe.Outage(killed.Add(-50 * time.Millisecond))
		outages = append(outages, outage)
		t.Logf("trial %d: outage %s (%d probes lost); now answered by %s", trial, outage.Round(time.Millisecond), lost, owner())
		if got := owner(); got != "node2" {
			t.Errorf("after node1's death %s answers, want node2 (the next candidate)", got)
		}

		// node1 returns: it takes its VIP back in an ordered hand-over, never with two nodes
		// answering one request.
		if _, err := l.Nodes[0].Run(context.Background(), "ip", "link", "set", "eth0", "up"); err != nil {
			t.Fatal(err)
		}
		victim.start()
		victim.waitServing()
		deadline := time.Now().Add(10 * time.Second)
		for owner() != "node1" {
			if n := answerers(t, l.Client, vip); len(n) > 1 {
				t.Fatalf("two nodes answered one ARP request during the hand-over: %v", n)
			}
			if time.Now().After(deadline) {
				t.Fatal("node1 did not take its VIP back within 10s")
			}
		}
	}
	sort.Slice(outages, func(i, j int) bool { return outages[i] < outages[j] })
	t.Logf("L2 failover outage over %d trials: min %s, median %s, max %s", trials, outages[0], outages[len(outages)/2], outages[len(outages)-1])
	for _, o := range outages {
		if o > 5*time.Second {
			t.Errorf("outage %s over the 5s bound", o)
		}
	}
}
