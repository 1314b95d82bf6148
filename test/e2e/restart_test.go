package e2e

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/metalvip/metalvip/loadbalancer/report"
	"github.com/metalvip/metalvip/test/cluster"
	"github.com/metalvip/metalvip/test/harness"
	"github.com/metalvip/metalvip/test/kubeapi"
)

// TestAPlannedAgentRestartMovesNoVIP (issue 32): an agent stopped with SIGTERM and started
// again 2 s later, as a DaemonSet's rolling update does, with --restart-grace: its L2 VIP is
// answered by no other node at any moment (its peers hold it, the CCM does not count the agent
// unreachable), nothing is moved or replanned, and the same node answers it once back. Before,
// the VIP moved to another node and back: each move resets the connections of ETP Cluster
// Services and changes what the clients' neighbour caches say.
func TestAPlannedAgentRestartMovesNoVIP(t *testing.T) {
	c := cluster.New(t, kubeapi.Get(t), cluster.Options{CCMBinary: ccmBinary, AgentBinary: agentBinary,
		AgentArgs: []string{"--restart-grace", "20s"}})
	vip := c.Service("restart")
	var owner string
	harness.Eventually(t, 30*time.Second, vip.String()+" answered", func() bool { owner = c.Owner(vip); return owner != "" })
	announced := c.Announced("restart")
	watch, err := c.Lab.Client.WatchNeighbors([]netip.Addr{vip}, 20*time.Millisecond, 60*1000/20)
	if err != nil {
		t.Fatal(err)
	}
	defer watch.Stop()
	logBefore := len(c.CCM.Output())
	at := time.Now()
	a := c.Agents[owner]
	a.Proc.Stop(10 * time.Second) // SIGTERM, as the kubelet sends
	stopped := time.Since(at)
	time.Sleep(2 * time.Second)
	c.StartAgent(a)
	back := harness.Eventually(t, 20*time.Second, owner+" answers "+vip.String()+" again", func() bool {
		who := c.Answerers(vip)
		return len(who) == 1 && who[0] == owner
	})
	time.Sleep(time.Second) // the CCM has had time to act on the restart, had it counted it
	watch.Stop()
	t.Logf("%s's agent stopped %s after SIGTERM, started again 2 s later, answering %s again %s after that", owner, stopped.Round(time.Millisecond), vip, back.Round(time.Millisecond))

	unanswered, other := 0, []string(nil)
	rounds := 0
	for _, r := range watch.Rounds() {
		if r.At.Before(at) {
			continue
		}
		rounds++
		if len(r.MACs) == 0 {
			unanswered++
		}
		for _, m := range r.MACs {
			if n := c.MACs[m]; n != owner {
				other = append(other, fmt.Sprintf("+%s by %s (%s)", r.At.Sub(at).Round(time.Millisecond), n, m))
			}
		}
	}
	t.Logf("%d ARP requests for %s since the SIGTERM, %d unanswered (the agent away), %d answered by another node", rounds, vip, unanswered, len(other))
	if len(other) > 0 {
		t.Errorf("another node answered %s during %s's planned restart (a move and back): %s", vip, owner, strings.Join(other[:min(len(other), 10)], "; "))
	}
	if rounds < 100 {
		t.Errorf("only %d ARP requests watched; the record proves nothing", rounds)
	}
	if got := c.Announced("restart"); got != announced {
		t.Errorf("the Announced condition changed during the restart: %q, before %q", got, announced)
	}
	if moved := c.Events("restart", report.ReasonMoved); moved != "" {
		t.Errorf("Moved Events during a planned restart:\n%s", moved)
	}
	for l := range strings.SplitSeq(c.CCM.Output()[logBefore:], "\n") {
		if strings.Contains(l, "Agent unreachable") && strings.Contains(l, `node="`+owner+`"`) {
			t.Errorf("the CCM counted %s unreachable during its planned restart: %s", owner, l)
		}
	}
	if !slices.Contains(c.ActiveOwners(vip), owner) {
		t.Errorf("%s's agent does not say it answers %s after its restart", owner, vip)
	}
}
