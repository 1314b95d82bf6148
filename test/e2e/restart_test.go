package e2e

import (
	"context"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/metalvip/metalvip/api/v1alpha1"
	"github.com/metalvip/metalvip/loadbalancer/report"
	"github.com/metalvip/metalvip/test/cluster"
	"github.com/metalvip/metalvip/test/harness"
	"github.com/metalvip/metalvip/test/kubeapi"
)

// TestAPlannedAgentRestartMovesNoVIP (issue 32): an agent stopped with SIGTERM and started
// again 2 s later, as a DaemonSet's rolling update does, with --restart-grace. L2: its VIP is
// answered by no other node at any moment (its peers hold it, the CCM does not count the agent
// unreachable), nothing is moved or replanned, and the same node answers it once back. Before,
// the VIP moved to another node and back: each move resets the connections of ETP Cluster
// Services and changes what the clients' neighbour caches say. BGP, with graceful restart on
// the BGPPeer: the router's route to the VIP keeps every node's next hop at every moment.
func TestAPlannedAgentRestartMovesNoVIP(t *testing.T) {
	c := cluster.New(t, kubeapi.Get(t), cluster.Options{CCMBinary: ccmBinary, AgentBinary: agentBinary,
		AgentArgs: []string{"--restart-grace", "20s"}})
	// The router keeps a restarting node's routes only where graceful restart was negotiated.
	patch := []byte(`{"spec":{"gracefulRestart":true}}`)
	if _, err := c.Dyn.Resource(v1alpha1.BGPPeerResource).Patch(context.Background(), "router-"+c.NS, types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Run("L2: no other node answers the owner's VIP", func(t *testing.T) {
		c.T = t
		l2PlannedRestart(t, c, false)
	})
	// A rolling update of install.yaml restarts the CCM and the agents at once: the new
	// leader never gets the Event of an agent already away; the agent's peers tell it.
	t.Run("L2: the same while the CCM restarts and a new leader starts with the agent away", func(t *testing.T) {
		c.T = t
		l2PlannedRestart(t, c, true)
	})
	t.Run("BGP: the router keeps every next hop", func(t *testing.T) {
		c.T = t
		bgpPlannedRestart(t, c)
	})
}

// l2PlannedRestart restarts the agent of the VIP's owner (SIGTERM, started again 2 s later);
// withCCM restarts the CCM too, while the agent is away, and starts the agent again only once
// the new CCM has learnt what the agents hold.
func l2PlannedRestart(t *testing.T, c *cluster.Cluster, withCCM bool) {
	svc := "restart"
	if withCCM {
		svc = "restart-with-ccm"
	}
	vip := c.Service(svc)
	var owner string
	harness.Eventually(t, 30*time.Second, vip.String()+" answered", func() bool { owner = c.Owner(vip); return owner != "" })
	var announced string
	harness.Eventually(t, 30*time.Second, svc+"'s Announced condition written", func() bool { announced = c.Announced(svc); return announced != "" })
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
	if withCCM {
		c.CCM.Stop(10 * time.Second)
		c.StartCCM()
		logBefore = 0
		harness.Eventually(t, 30*time.Second, "the new CCM learnt what the agents hold", func() bool {
			return strings.Contains(c.CCM.Output(), "Learnt what the agents announce")
		})
		if !strings.Contains(c.CCM.Output(), `node="`+owner+`" grace=`) {
			t.Errorf("the new CCM did not take %s's restart from its peers", owner)
		}
	}
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
	if got := c.Announced(svc); got != announced {
		t.Errorf("the Announced condition changed during the restart: %q, before %q", got, announced)
	}
	if moved := c.Events(svc, report.ReasonMoved); moved != "" {
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

// bgpPlannedRestart restarts the agent of one of a BGP VIP's nodes (SIGTERM, started again 2 s
// later) while sampling the router's route to the VIP; every sample must go through every node.
func bgpPlannedRestart(t *testing.T, c *cluster.Cluster) {
	vip := c.Service("restart-bgp", cluster.InPool("bgp-"+c.NS))
	var every []string
	for _, n := range c.Lab.Nodes {
		every = append(every, n.IPv4.String())
	}
	slices.Sort(every)
	harness.Eventually(t, 60*time.Second, "every node in the next hops of "+vip.String(), func() bool { return slices.Equal(c.NextHops(vip), every) })
	// Sessions just (re)configured for graceful restart settle, and BFD comes up on them.
	time.Sleep(3 * time.Second)
	victim := c.Lab.Nodes[1].Name
	logBefore := len(c.CCM.Output())

	var (
		mu      sync.Mutex
		samples int
		short   []string
	)
	at := time.Now()
	stop, done := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(done)
		for i := 0; i < 100000; i++ {
			select {
			case <-stop:
				return
			default:
			}
			hops, err := c.Lab.RouteNextHops(vip.String())
			mu.Lock()
			samples++
			if err != nil || !slices.Equal(hops, every) {
				short = append(short, fmt.Sprintf("+%s: %v (%v)", time.Since(at).Round(time.Millisecond), hops, err))
			}
			mu.Unlock()
			time.Sleep(20 * time.Millisecond)
		}
	}()
	a := c.Agents[victim]
	a.Proc.Stop(10 * time.Second) // SIGTERM, as the kubelet sends
	stopped := time.Since(at)
	time.Sleep(2 * time.Second)
	c.StartAgent(a)
	// Back: its session up again and its routes announced anew (the End-of-RIB ends the
	// router's stale marks), with a margin during which nothing may change.
	harness.Eventually(t, 30*time.Second, victim+"'s agent announcing "+vip.String()+" again", func() bool {
		return slices.Contains(c.ActiveOwners(vip), victim)
	})
	time.Sleep(5 * time.Second)
	close(stop)
	<-done
	mu.Lock()
	defer mu.Unlock()
	t.Logf("%s's agent stopped %s after SIGTERM, started again 2 s later; %d samples of the router's route to %s over %s, %d without every node's next hop", victim, stopped.Round(time.Millisecond), samples, vip, time.Since(at).Round(time.Millisecond), len(short))
	if len(short) > 0 {
		t.Errorf("the router's route to %s lost a next hop during %s's planned restart: %s", vip, victim, strings.Join(short[:min(len(short), 10)], "; "))
	}
	if samples < 100 {
		t.Errorf("only %d samples of the router's route; the record proves nothing", samples)
	}
	if moved := c.Events("restart-bgp", report.ReasonMoved); moved != "" {
		t.Errorf("Moved Events during a planned restart:\n%s", moved)
	}
	for l := range strings.SplitSeq(c.CCM.Output()[logBefore:], "\n") {
		if strings.Contains(l, "Agent unreachable") && strings.Contains(l, `node="`+victim+`"`) {
			t.Errorf("the CCM counted %s unreachable during its planned restart: %s", victim, l)
		}
	}
}
