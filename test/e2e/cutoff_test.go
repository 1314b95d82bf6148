package e2e

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/metalvip/metalvip/test/cluster"
	"github.com/metalvip/metalvip/test/harness"
	"github.com/metalvip/metalvip/test/kubeapi"
)

// TestANodeTheCCMCannotReachYieldsItsVIPs (issue 30, fault 1): an L2 VIP's owner that is
// alive but that the CCM cannot reach (TCP 7472 dropped on it, the heartbeats untouched: a
// filter that lets in only another CCM address, a clock behind the certificates) loses its
// candidacy; the VIP moves. The owner still holds its last state, and hears its peers, which
// keep heartbeating it as departing without ever counting it alive: it yields, so the VIP is
// answered by one node. Before, its peers dropped it, it heard no one, counted them dead and
// answered every VIP of its state beside their new owners (each ARP request, two replies).
func TestANodeTheCCMCannotReachYieldsItsVIPs(t *testing.T) {
	c := cluster.New(t, kubeapi.Get(t), cluster.Options{CCMBinary: ccmBinary, AgentBinary: agentBinary, ClientAddrs: 9})
	vip := c.Service("cut")
	shared := c.Service("cut-shared", cluster.InPool(c.PerClientPool("pc")))
	clients := c.NewClients(c.ClientAddrs())
	harness.Eventually(t, 30*time.Second, "every client answered by one node for "+shared.String(), func() bool {
		_, ok := clients.Owners(shared, 300*time.Millisecond)
		return ok
	})
	var owner string
	harness.Eventually(t, 30*time.Second, vip.String()+" answered", func() bool { owner = c.Owner(vip); return owner != "" })
	host := c.Agents[owner].Host
	const table = "metalvip-e2e-cutoff"
	cmd := host.Command(t.Context(), "nft", "-f", "-")
	cmd.Stdin = strings.NewReader(fmt.Sprintf("table inet %s {\n chain in {\n  type filter hook input priority 0; policy accept;\n  tcp dport 7472 drop\n }\n}\n", table))
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("nft on %s: %v: %s", owner, err, out)
	}
	t.Cleanup(func() { _, _ = host.Run(context.Background(), "nft", "delete", "table", "inet", table) })
	t.Logf("TCP 7472 dropped on %s, the owner of %s", owner, vip)

	// The CCM finds the agent unreachable (it probes an idle agent every 10 s) and moves the VIP.
	harness.Eventually(t, 60*time.Second, "another node answers "+vip.String(), func() bool {
		return slices.ContainsFunc(c.Answerers(vip), func(n string) bool { return n != owner })
	})
	time.Sleep(time.Second) // time for the owner to hear its peers, many times over
	// answerers asks who answers vip; a busy machine may answer later than Answerers waits, so
	// no answer is asked again, longer.
	answerers := func() []string {
		who := c.Answerers(vip)
		if len(who) == 0 {
			if o := c.Owner(vip); o != "" {
				who = []string{o}
			}
		}
		return who
	}
	for i := range 20 {
		if who := answerers(); len(who) != 1 {
			t.Fatalf("ARP request %d for %s answered by %v; want one node (%s cannot be reached by the CCM)", i, vip, who, owner)
		}
		time.Sleep(50 * time.Millisecond)
	}
	// The per-client VIP: the cut node answers no share; the others share every client.
	for i := range 5 {
		got := clients.Answerers(shared, 300*time.Millisecond)
		for _, a := range clients.Addrs {
			if len(got[a]) != 1 || got[a][0] == owner {
				t.Fatalf("round %d: client %s of per-client %s answered by %v; want one node, not %s (all: %v)", i, a, shared, got[a], owner, got)
			}
		}
	}

	t.Run("reachable again, the node is an ordinary candidate again and the VIP stays answered by one", func(t *testing.T) {
		if _, err := host.Run(t.Context(), "nft", "delete", "table", "inet", table); err != nil {
			t.Fatal(err)
		}
		harness.Eventually(t, 60*time.Second, owner+" a candidate again", func() bool {
			return strings.Contains(c.Announced("cut"), owner)
		})
		// The node is a candidate again, below the VIP's holder (the plan keeps it first: nothing
		// moves). The holder waits until the returning node's heartbeats show it sees the
		// holder, as for any candidate that may have been answering: for a heartbeat round or
		// so no node answers (clients keep their cached entry). Two nodes never answer at once.
		var silent time.Time // the first request no node answered
		var holder string
		harness.Eventually(t, 10*time.Second, vip.String()+" answered by one node", func() bool {
			asked := time.Now()
			who := c.Answerers(vip)
			if len(who) > 1 {
				t.Fatalf("once %s was a candidate again, an ARP request for %s was answered by %v", owner, vip, who)
			}
			if len(who) == 0 && silent.IsZero() {
				silent = asked
			}
			if len(who) == 1 {
				holder = who[0]
			}
			return len(who) == 1
		})
		if !silent.IsZero() {
			t.Logf("no node answered %s from a request %v before %s did", vip, time.Since(silent).Round(time.Millisecond), holder)
		}
		for i := range 20 {
			if who := answerers(); len(who) != 1 {
				t.Fatalf("ARP request %d for %s answered by %v; want one node", i, vip, who)
			}
			time.Sleep(50 * time.Millisecond)
		}
	})
}
