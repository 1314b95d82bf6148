package agentlab

import (
	"context"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/metalvip/metalvip/test/lab"
)

// TestHeartbeatsLostOneWayMakeNoDoubleAnswer drops, for 3 s each, the heartbeats of the VIP's
// owner (node1) one way and then the other, in node1's namespace, while the client asks for
// the VIP every 20 ms. A node that hears nothing of its peer counts it dead and answers as the
// first live candidate; the other hears it, unable to prove it alive (its heartbeats echo
// nothing), saying it does not count this node alive: it must count it alive and yield to it,
// not count it dead and answer beside it for as long as the loss lasts (before, two nodes
// answered each request throughout). Once the loss ends, node1 answers alone again.
func TestHeartbeatsLostOneWayMakeNoDoubleAnswer(t *testing.T) {
	l := lab.New(t, lab.Options{Nodes: 2})
	vip := netip.MustParseAddr("203.0.113.44")
	heartbeatCluster(t, l, l.Nodes, vip)
	mac1 := l.Nodes[0].MAC(t)
	const held = 3 * time.Second
	for _, dir := range []struct{ name, chain, match string }{
		{"node1's heartbeats to node2 lost", "output", "udp sport 7473"},
		{"node2's heartbeats to node1 lost", "input", "udp dport 7473"},
	} {
		t.Run(dir.name, func(t *testing.T) {
			probe := probeARP(t, l.Client, vip, probeEvery, int((held+3*time.Second)/probeEvery))
			rules := "table inet metalvip-oneway {\n chain c {\n  type filter hook " + dir.chain + " priority 0; policy accept;\n  " + dir.match + " drop\n }\n}\n"
			cmd := l.Nodes[0].Command(context.Background(), "nft", "-f", "-")
			cmd.Stdin = strings.NewReader(rules)
			if out, err := cmd.CombinedOutput(); err != nil {
				t.Fatalf("nft: %v: %s", err, out)
			}
			start := time.Now()
			healed := false
			heal := func() {
				if !healed {
					healed = true
					_, _ = l.Nodes[0].Run(context.Background(), "nft", "delete", "table", "inet", "metalvip-oneway")
				}
			}
			defer heal()
			time.Sleep(held)
			heal()
			end := time.Now()
			time.Sleep(3 * time.Second)
			probe.Stop()
			during, after := probe.count(start, end), probe.count(end.Add(time.Second), time.Now())
			t.Logf("during the loss: %s", during)
			t.Logf("from 1 s after it: %s", after)
			if during.LongestDouble > failoverInterval {
				t.Errorf("two nodes answered the VIP for %s during a one-way heartbeat loss, longer than a failover interval (%s)", during.LongestDouble, failoverInterval)
			}
			if after.Double > 0 || after.Unanswered > 0 || after.ByMAC[mac1] != after.Requests || after.Requests < 50 {
				t.Errorf("after the loss: %s; want node1 (%s) alone answering every request", after, mac1)
			}
		})
	}
}
