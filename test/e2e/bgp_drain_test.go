package e2e

import (
	"context"
	"fmt"
	"net/netip"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/metalvip/metalvip/api/v1alpha1"
	"github.com/metalvip/metalvip/test/cluster"
	"github.com/metalvip/metalvip/test/harness"
	"github.com/metalvip/metalvip/test/kubeapi"
	"github.com/metalvip/metalvip/test/lab"
)

const drainDelay = 5 * time.Second

// drainSettle is when, after a cordon, the router's resilient group has moved the drained
// node's idle buckets: its idle timer (1 s) and a second's margin.
const drainSettle = 2 * time.Second

// TestDrain: cordoning a node moves new BGP connections off it within the drain delay, by
// GRACEFUL_SHUTDOWN through a router with plain ECMP (established connections measured), and
// by weight through a router with resilient hashing with no established connection reset
// before the withdrawal; and an L2 VIP moves off its cordoned owner with no probe unanswered.
func TestDrain(t *testing.T) {
	c := cluster.New(t, kubeapi.Get(t), cluster.Options{CCMBinary: ccmBinary, AgentBinary: agentBinary,
		CloudConfig: fmt.Sprintf("drain:\n  delay: %s\n", drainDelay)})
	for _, n := range c.Lab.Nodes {
		n.ServeName(t, 80)
	}
	// BFD at 100 ms resets sessions when the shared machine stalls a daemon for 300 ms, which
	// would be measured as the drain's doing: this test runs its sessions without it.
	patch := []byte(`{"spec":{"bfd":{"enabled":false}}}`)
	if _, err := c.Dyn.Resource(v1alpha1.BGPPeerResource).Patch(context.Background(), "router-"+c.NS, types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}

	t.Run("BGP with GRACEFUL_SHUTDOWN: new connections leave the cordoned node within the delay", func(t *testing.T) {
		c.T = t
		vip := c.Service("drain-bgp", cluster.InPool("bgp-"+c.NS))
		d := c.MeasureBGPDrain(vip, "node1", 20, drainDelay, drainSettle)
		t.Logf("BGP drain by GRACEFUL_SHUTDOWN, plain ECMP (delay %s): %s", drainDelay, d)
		t.Logf("FRR %s after the cordon:\n%s", drainSettle, d.Path)
		if d.Withdrawn == 0 {
			t.Fatalf("node1's path was not withdrawn within %s", drainDelay+20*time.Second)
		}
		if d.LastOnVictim >= drainDelay {
			t.Errorf("a new connection reached node1 %s after the cordon, past the %s delay", d.LastOnVictim.Round(time.Millisecond), drainDelay)
		}
		if !strings.Contains(d.Path, "graceful-shutdown") && !strings.Contains(d.Path, "65535:0") {
			t.Errorf("node1's path did not carry GRACEFUL_SHUTDOWN during the delay")
		}
		if d.Withdrawn < drainDelay-time.Second {
			t.Errorf("withdrawn %s after the cordon, before the %s delay", d.Withdrawn, drainDelay)
		}
	})

	t.Run("BGP by weight through resilient hashing: no established connection resets before the withdrawal", func(t *testing.T) {
		c.T = t
		pool := "drainw-" + c.NS
		c.Object(v1alpha1.IPPoolResource, pool, fmt.Sprintf(`{addresses: ["203.0.113.112/28"], autoAssign: false, serviceAllocation: {namespaces: [%s]}, announce: {mode: BGP, bgp: {drain: Weight}}}`, c.NS))
		vip := c.Service("drain-weight", cluster.InPool(pool))
		fib := c.Lab.StartResilientECMP(t, netip.PrefixFrom(vip, 32), lab.ResilientOptions{})
		// Connections opened before the group takes over would be rehashed by it.
		fib.WaitHops(t, 3, 60*time.Second)
		d := c.MeasureBGPDrain(vip, "node1", 20, drainDelay, drainSettle)
		changes, ferr := fib.Changes()
		t.Logf("BGP drain by weight, resilient hashing (delay %s, %d buckets, idle timer %s): %s", drainDelay, fib.Options.Buckets, fib.Options.IdleTimer, d)
		t.Logf("router's kernel route %s after the cordon: %s", drainSettle, d.Route)
		for _, ch := range changes {
			t.Logf("resilient group at %s: %s", ch.At.Format("15:04:05.000"), ch.Group)
		}
		if ferr != nil {
			t.Fatalf("following FRR's route: %v", ferr)
		}
		if d.Withdrawn == 0 {
			t.Fatalf("node1's path was not withdrawn within %s", drainDelay+20*time.Second)
		}
		if d.Withdrawn < drainDelay-time.Second {
			t.Errorf("withdrawn %s after the cordon, before the %s delay", d.Withdrawn, drainDelay)
		}
		if n := d.ResetVictimBefore + d.ResetOthersBefore; n != 0 {
			t.Errorf("%d established connections reset before the withdrawal (%d on node1): %v", n, d.ResetVictimBefore, d.Resets)
		}
		if d.ResetOthersAfter != 0 {
			t.Errorf("%d established connections on the other nodes reset after the withdrawal: %v", d.ResetOthersAfter, d.Resets)
		}
		// node1 keeps the buckets its long connections keep busy (about 7 of 512) and its
		// weight's share (about 1%): new connections go there rarely, not never.
		if d.Late == 0 || d.LateOnVictim*10 > d.Late {
			t.Errorf("node1 served %d of the %d new connections opened from %s after the cordon until the withdrawal; want at most a tenth (it served %d of %d before the cordon)",
				d.LateOnVictim, d.Late, drainSettle, d.EarlyOnVictim, d.Early)
		}
		if strings.Contains(d.Path, "graceful-shutdown") || strings.Contains(d.Path, "65535:0") {
			t.Errorf("node1's path carried GRACEFUL_SHUTDOWN in drain mode Weight:\n%s", d.Path)
		}
	})

	t.Run("L2: the cordoned owner's VIP moves with no probe unanswered", func(t *testing.T) {
		c.T = t
		vip := c.Service("drain-l2")
		var owner string
		harness.Eventually(t, 30*time.Second, "an owner", func() bool { owner = c.Owner(vip); return owner != "" })
		probe, err := c.Lab.Client.Probe(vip, 20*time.Millisecond, 2000)
		if err != nil {
			t.Fatal(err)
		}
		harness.Eventually(t, 5*time.Second, "the probe is answered", probe.Answered)
		t0 := time.Now()
		c.Cordon(owner, true)
		// Who answers ARP, sampled (each ask waits 100 ms for answers) until the delay is over.
		d := c.SampleL2Drain(vip, owner, t0, drainDelay+2*time.Second)
		made, broken := d.Made, d.Broken // the new owner's first answer, the old one's last
		time.Sleep(500 * time.Millisecond)
		probe.Stop()
		_, lost := probe.Outage(t0)
		now := c.Owner(vip)
		t.Logf("L2 drain of %s (delay %s): %s answers from %s after the cordon, %s last answered at %s; %d probes every 20 ms unanswered; ARP sampled %d times: %d with nobody answering, %d with two answering (the overlap)",
			owner, drainDelay, now, made.Round(time.Millisecond), owner, broken.Round(time.Millisecond), lost, d.Samples, d.None, d.Two)
		if made == 0 || broken < made {
			t.Errorf("break before make: the new owner first answered at %s, the old one last at %s", made, broken)
		}
		if now == owner || now == "" {
			t.Errorf("the VIP is answered by %q after the drain", now)
		}
		if lost != 0 {
			t.Errorf("%d probes unanswered", lost)
		}
		if d.None != 0 {
			t.Errorf("%d ARP samples with nobody answering", d.None)
		}
		c.Cordon(owner, false)
	})
}
