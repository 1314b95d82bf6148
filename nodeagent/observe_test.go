package nodeagent

import (
	"net/netip"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/metalvip/metalvip/nodeagent/failover"
	agentv1 "github.com/metalvip/metalvip/proto/metalvip/agent/v1"
)

type recordedObserver struct {
	mu       sync.Mutex
	applied  []int
	tookOver map[netip.Addr][]time.Duration
	released []netip.Addr
}

func (o *recordedObserver) Applied(refused int) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.applied = append(o.applied, refused)
}

func (o *recordedObserver) TookOver(vip netip.Addr, after time.Duration) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.tookOver[vip] = append(o.tookOver[vip], after)
}

func (o *recordedObserver) Released(vip netip.Addr) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.released = append(o.released, vip)
}

func (o *recordedObserver) HeartbeatRTT(time.Duration) {}

func TestTheObserverDatesATakeoverFromTheDeadOwnersLastSign(t *testing.T) {
	obs := &recordedObserver{tookOver: map[netip.Addr][]time.Duration{}}
	live := &switchLiveness{alive: map[string]bool{"node-b": true}, sees: map[string]bool{"node-b": true}, last: map[string]time.Time{}}
	h := serve(t, t.TempDir(), func(o *Options) {
		o.Observer = obs
		o.NewLiveness = func(c failover.Config) (Liveness, error) {
			live.mu.Lock()
			live.onChange = c.OnChange
			live.mu.Unlock()
			return live, nil
		}
	})
	c := h.ccm(t)
	vip, fresh := netip.MustParseAddr("203.0.113.10"), netip.MustParseAddr("203.0.113.11")
	st := withPeers(h, state(1, 1, withCandidates(vip.String(), "node-b", "node-a"), withCandidates(fresh.String(), "node-a", "node-b")), "node-b")
	if _, err := c.Apply(ctx(t), &agentv1.ApplyRequest{State: st}); err != nil {
		t.Fatal(err)
	}
	t.Run("a VIP this node is first for is a takeover with no death before it", func(t *testing.T) {
		obs.mu.Lock()
		defer obs.mu.Unlock()
		if got := obs.tookOver[fresh]; !slices.Equal(got, []time.Duration{0}) {
			t.Errorf("took over %s: %v; want once, after no death", fresh, got)
		}
		if len(obs.tookOver[vip]) != 0 {
			t.Errorf("took over %s while node-b answers: %v", vip, obs.tookOver[vip])
		}
		if !slices.Equal(obs.applied, []int{0}) {
			t.Errorf("applies: %v; want one with nothing refused", obs.applied)
		}
	})
	t.Run("the dead owner's last sign of life dates the takeover", func(t *testing.T) {
		live.mu.Lock()
		live.last["node-b"] = time.Now().Add(-150 * time.Millisecond)
		live.mu.Unlock()
		live.set("node-b", false, false)
		obs.mu.Lock()
		defer obs.mu.Unlock()
		got := obs.tookOver[vip]
		if len(got) != 1 || got[0] < 150*time.Millisecond || got[0] > 5*time.Second {
			t.Errorf("took over %s: %v; want once, at least 150 ms after node-b's last sign", vip, got)
		}
	})
	t.Run("the owner's return is a release", func(t *testing.T) {
		live.set("node-b", true, true)
		obs.mu.Lock()
		defer obs.mu.Unlock()
		if !slices.Equal(obs.released, []netip.Addr{vip}) {
			t.Errorf("released: %v; want %s", obs.released, vip)
		}
	})
	t.Run("the gauges count what the node answers and stands by for", func(t *testing.T) {
		g := h.agent.Gauges()
		if g.L2Answered != 1 || g.L2Standby != 1 || g.HeartbeatPeers != 1 || g.Generation != 1 {
			t.Errorf("gauges %+v; want 1 answered, 1 standby, 1 heartbeat peer, generation 1", g)
		}
		if err := h.agent.Healthy(time.Second); err != nil {
			t.Errorf("healthy agent: %v", err)
		}
	})
	t.Run("an agent stuck holding its lock is not healthy", func(t *testing.T) {
		h.agent.mu.Lock()
		err := h.agent.Healthy(50 * time.Millisecond)
		h.agent.mu.Unlock()
		if err == nil {
			t.Error("Healthy with the lock held: nil; want stuck")
		}
		if err := h.agent.Healthy(time.Second); err != nil {
			t.Errorf("once the lock is free: %v", err)
		}
	})
}

func TestANodeWithoutARouterIDSaysSoWhenBGPIsUsed(t *testing.T) {
	h := serve(t, t.TempDir(), func(o *Options) { o.RouterID = netip.Addr{} })
	c := h.ccm(t)
	st := state(1, 1, bgpVIP("203.0.113.20"))
	st.Bgp.RouterId = ""
	resp, err := c.Apply(ctx(t), &agentv1.ApplyRequest{State: st})
	if err != nil {
		t.Fatal(err)
	}
	if !slices.ContainsFunc(resp.GetProblems(), func(p string) bool { return strings.Contains(p, "--router-id") }) {
		t.Errorf("problems %v; want one naming --router-id", resp.GetProblems())
	}
}
