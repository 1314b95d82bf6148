package nodeagent

import (
	"errors"
	"fmt"
	"net"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/metalvip/metalvip/nodeagent/failover"
	"github.com/metalvip/metalvip/nodeagent/l2"
	agentv1 "github.com/metalvip/metalvip/proto/metalvip/agent/v1"
)

// events is one ordered log of what the speaker and the MAC filter were told.
type events struct {
	mu  sync.Mutex
	log []string
}

func (e *events) add(format string, args ...any) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.log = append(e.log, fmt.Sprintf(format, args...))
}

func (e *events) take() []string {
	e.mu.Lock()
	defer e.mu.Unlock()
	out := e.log
	e.log = nil
	return out
}

// fakeMACFilter records what it is set to, in the shared log; fail makes Set fail.
type fakeMACFilter struct {
	ev   *events
	mu   sync.Mutex
	fail error
}

func (f *fakeMACFilter) Set(want map[string][]net.HardwareAddr) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	var parts []string
	for ifname, macs := range want {
		for _, m := range macs {
			parts = append(parts, ifname+"/"+m.String())
		}
	}
	slices.Sort(parts)
	f.ev.add("filter %v", slices.Compact(parts))
	return f.fail
}
func (f *fakeMACFilter) Check() error { return nil }
func (f *fakeMACFilter) Close() error {
	f.ev.add("filter closed")
	return nil
}

// loggedL2 is the fake speaker, logging each Set's VIPs with their MACs.
type loggedL2 struct {
	*fakeL2
	ev *events
}

func (l loggedL2) Set(vips []l2.VIP) error {
	var parts []string
	for _, v := range vips {
		parts = append(parts, v.Addr.String()+"@"+v.MAC.String())
	}
	l.ev.add("speaker %v", parts)
	return l.fakeL2.Set(vips)
}

func (l loggedL2) Close() error {
	l.ev.add("speaker closed")
	return nil
}

// switchLiveness is a heartbeat exchange whose facts a test sets; last dates each peer's last
// proof of life.
type switchLiveness struct {
	mu       sync.Mutex
	alive    map[string]bool
	sees     map[string]bool
	lapses   map[string]uint64
	last     map[string]time.Time
	seq      uint64
	onChange func(failover.View)
}

func (s *switchLiveness) View() failover.View {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.viewLocked()
}

func (s *switchLiveness) viewLocked() failover.View {
	v := failover.View{Node: "node-a", Seq: s.seq, Peers: map[string]failover.PeerView{}}
	for _, facts := range []map[string]bool{s.alive, s.sees} {
		for n := range facts {
			v.Peers[n] = failover.PeerView{Alive: s.alive[n], Sees: s.sees[n], Lapses: s.lapses[n], Proven: s.last[n]}
		}
	}
	for n, l := range s.lapses {
		v.Peers[n] = failover.PeerView{Alive: s.alive[n], Sees: s.sees[n], Lapses: l, Proven: s.last[n]}
	}
	return v
}

func (s *switchLiveness) SetPeers([]failover.Peer) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.seq++
}
func (s *switchLiveness) Restarting(time.Duration) {}

func (s *switchLiveness) Counters() failover.Counters { return failover.Counters{} }
func (s *switchLiveness) Close() error                { return nil }

// set changes what the heartbeats say of node and tells the agent, as the monitor would.
func (s *switchLiveness) set(node string, alive, sees bool) {
	s.change(func() { s.alive[node], s.sees[node] = alive, sees })
}

// lapse counts a lapse of node's (it took this node for dead for a moment no heartbeat
// showed) and tells the agent, as the monitor would.
func (s *switchLiveness) lapse(node string) {
	s.change(func() {
		if s.lapses == nil {
			s.lapses = map[string]uint64{}
		}
		s.lapses[node]++
	})
}

// change makes a change and hands the view after it to the agent, outside the lock.
func (s *switchLiveness) change(f func()) {
	s.mu.Lock()
	f()
	s.seq++
	v, fn := s.viewLocked(), s.onChange
	s.mu.Unlock()
	fn(v)
}

const vmacA = "02:00:cb:00:71:0a"

func vmacVIP(vip, mac string, cands ...string) *agentv1.Announcement {
	an := withCandidates(vip, cands...)
	an.L2.VirtualMac = mac
	return an
}

// vmacHarness serves node-a with the logging fakes, heartbeats on, its state in dir (a new
// one when ""), holding off a restored state for holdOff (0: the default).
func vmacHarness(t *testing.T, dir string, holdOff time.Duration) (*harness, *events, *fakeMACFilter, *switchLiveness) {
	t.Helper()
	if dir == "" {
		dir = t.TempDir()
	}
	ev := &events{}
	filter := &fakeMACFilter{ev: ev}
	live := &switchLiveness{alive: map[string]bool{}, sees: map[string]bool{}}
	var fl *fakeL2
	h := serve(t, dir, func(o *Options) {
		o.HearPeerTimeout = holdOff
		fl = o.L2.(*fakeL2)
		o.L2 = loggedL2{fl, ev}
		o.MACFilter = filter
		o.NewLiveness = func(c failover.Config) (Liveness, error) {
			live.mu.Lock()
			live.onChange = c.OnChange
			live.mu.Unlock()
			return live, nil
		}
	})
	h.l2 = fl
	return h, ev, filter, live
}

// withPeers names peers as heartbeat peers, each with a valid key (node-a's own will do).
func withPeers(h *harness, st *agentv1.DesiredState, peers ...string) *agentv1.DesiredState {
	for i, p := range peers {
		st.HeartbeatPeers = append(st.HeartbeatPeers, &agentv1.HeartbeatPeer{Node: p, Address: fmt.Sprintf("198.51.100.%d", 12+i), PublicKeys: h.agent.identity.PublicKeys()})
	}
	return st
}

func TestAVirtualMACIsReceivedBeforeItIsUsedAndUntilAfter(t *testing.T) {
	h, ev, filter, live := vmacHarness(t, "", 0)
	c := h.ccm(t)
	if got := ev.take(); !slices.Equal(got, []string{"filter []"}) {
		t.Errorf("at start, with no state: %v; want the filter emptied of what a crashed run left", got)
	}
	// node-a ranks second: node-b answers while alive.
	live.alive["node-b"], live.sees["node-b"] = true, true
	st := withPeers(h, state(1, 1, vmacVIP("203.0.113.10", vmacA, "node-b", "node-a"), withCandidates("203.0.113.11", "node-b", "node-a")), "node-b")
	if _, err := c.Apply(ctx(t), &agentv1.ApplyRequest{State: st}); err != nil {
		t.Fatal(err)
	}
	if got := ev.take(); !slices.Equal(got, []string{"filter []", "speaker []", "filter []"}) {
		t.Errorf("standing by: %v; want nothing received, nothing answered", got)
	}

	t.Run("on takeover the MAC is received before the speaker first sends from it", func(t *testing.T) {
		live.set("node-b", false, false)
		want := []string{"filter [eth0/" + vmacA + "]", "speaker [203.0.113.10@" + vmacA + " 203.0.113.11@]", "filter [eth0/" + vmacA + "]"}
		if got := ev.take(); !slices.Equal(got, want) {
			t.Errorf("takeover: %v; want %v", got, want)
		}
		st, err := c.GetState(ctx(t), &agentv1.GetStateRequest{})
		if err != nil {
			t.Fatal(err)
		}
		for _, v := range st.GetAnnounced() {
			if v.GetVip() == "203.0.113.10" && (!v.GetActive() || !strings.Contains(v.GetReason(), "virtual MAC "+vmacA)) {
				t.Errorf("GetState: %v; want it active, saying its virtual MAC", v)
			}
		}
	})
	t.Run("when the higher one returns the speaker stops before the MAC is let go", func(t *testing.T) {
		live.set("node-b", true, false)
		want := []string{"filter [eth0/" + vmacA + "]", "speaker []", "filter []"}
		if got := ev.take(); !slices.Equal(got, want) {
			t.Errorf("release: %v; want %v", got, want)
		}
	})
	t.Run("a MAC the node cannot receive is answered with the interface's own, and the problem said", func(t *testing.T) {
		filter.mu.Lock()
		filter.fail = errors.New("nftables: operation not permitted")
		filter.mu.Unlock()
		live.set("node-b", false, false)
		got := ev.take()
		if len(got) < 2 || got[1] != "speaker [203.0.113.10@ 203.0.113.11@]" {
			t.Errorf("with the filter failing: %v; want the VIP answered without its virtual MAC", got)
		}
		st, err := c.GetState(ctx(t), &agentv1.GetStateRequest{})
		if err != nil {
			t.Fatal(err)
		}
		if p := strings.Join(st.GetProblems(), "; "); !strings.Contains(p, "virtual MACs: nftables: operation not permitted; answering with the interfaces' own MACs") {
			t.Errorf("problems %q; want the filter's error and what the node does meanwhile", p)
		}
		filter.mu.Lock()
		filter.fail = nil
		filter.mu.Unlock()
		// The next change (here the retry's apply) puts the MAC back.
		h.agent.applyMu.Lock()
		h.agent.mu.Lock()
		h.agent.applyLocked(ctx(t))
		h.agent.mu.Unlock()
		h.agent.applyMu.Unlock()
		if got := ev.take(); !slices.Contains(got, "speaker [203.0.113.10@"+vmacA+" 203.0.113.11@]") {
			t.Errorf("after the filter recovered: %v; want the virtual MAC back", got)
		}
	})
	t.Run("at stop the speaker closes before the MAC is let go", func(t *testing.T) {
		if err := h.agent.Close(ctx(t)); err != nil {
			t.Fatal(err)
		}
		if got := ev.take(); !slices.Equal(got, []string{"speaker closed", "filter closed"}) {
			t.Errorf("stop: %v", got)
		}
	})
}

func TestAVirtualMACItCannotUseIsRefusedAlone(t *testing.T) {
	perClient := vmacVIP("203.0.113.21", "02:00:cb:00:71:15", "node-a")
	perClient.L2.PerClient = true
	for _, tc := range []struct {
		name  string
		an    *agentv1.Announcement
		field string
		says  string
	}{
		{"a MAC that is no MAC", vmacVIP("203.0.113.21", "02:00:cb", "node-a"), "announcements[2].l2.virtual_mac", "is not an Ethernet address; give six bytes"},
		{"an EUI-64", vmacVIP("203.0.113.21", "02:00:00:00:00:00:00:01", "node-a"), "announcements[2].l2.virtual_mac", "is not an Ethernet address"},
		{"a multicast MAC", vmacVIP("203.0.113.21", "01:00:5e:00:00:01", "node-a"), "announcements[2].l2.virtual_mac", "is not a unicast Ethernet address"},
		{"the zero MAC", vmacVIP("203.0.113.21", "00:00:00:00:00:00", "node-a"), "announcements[2].l2.virtual_mac", "is not a unicast Ethernet address"},
		{"a MAC with per-client spreading", perClient, "announcements[2].l2.virtual_mac", "give one or the other"},
		{"the MAC of another VIP", vmacVIP("203.0.113.21", "02:00:CB:00:71:0A", "node-a"), "announcements[2].l2.virtual_mac", "is also the MAC of announcements[0] (203.0.113.10)"},
	} {
		t.Run(tc.name+" is refused alone", func(t *testing.T) {
			h, _, _, _ := vmacHarness(t, "", 0)
			st := state(1, 1, vmacVIP("203.0.113.10", vmacA, "node-a"), bgpVIP("203.0.113.20"), tc.an)
			resp, err := h.ccm(t).Apply(ctx(t), &agentv1.ApplyRequest{State: st})
			if err != nil {
				t.Fatal(err)
			}
			if r := resp.GetRefused(); len(r) != 1 || r[0].GetField() != tc.field || r[0].GetKey() != "203.0.113.21" || !strings.Contains(r[0].GetReason(), tc.says) {
				t.Errorf("refused %v; want %s of 203.0.113.21, saying %q", r, tc.field, tc.says)
			}
			if l := h.l2.last(); len(l) != 1 || l[0].MAC.String() != vmacA {
				t.Errorf("the speaker has %v; want the good VIP alone, with its MAC", l)
			}
		})
	}
}

// restoredHarness saves a state in which node-a ranks first for 203.0.113.10 and node-b
// second, then starts node-a again on it, with node-b silent (its state may no longer name
// node-a: it sends it nothing).
func restoredHarness(t *testing.T, holdOff time.Duration) (*harness, *switchLiveness) {
	t.Helper()
	dir := t.TempDir()
	first, _, _, _ := vmacHarness(t, dir, 0)
	st := withPeers(first, state(1, 1, vmacVIP("203.0.113.10", vmacA, "node-a", "node-b")), "node-b")
	if _, err := first.ccm(t).Apply(ctx(t), &agentv1.ApplyRequest{State: st}); err != nil {
		t.Fatal(err)
	}
	if err := first.agent.Close(ctx(t)); err != nil {
		t.Fatal(err)
	}
	h, _, _, live := vmacHarness(t, dir, holdOff)
	return h, live
}

func answering(h *harness) bool {
	l := h.l2.last()
	return len(l) == 1 && l[0].MAC.String() == vmacA
}

func TestARestartedNodeWaitsToHearItsPeersBeforeItAnswers(t *testing.T) {
	t.Run("a peer heard since the start lets it answer", func(t *testing.T) {
		h, live := restoredHarness(t, time.Hour)
		if answering(h) {
			t.Fatal("node-a answers at once, from a saved state, with node-b unheard")
		}
		st, err := h.ccm(t).GetState(ctx(t), &agentv1.GetStateRequest{})
		if err != nil {
			t.Fatal(err)
		}
		if r := st.GetAnnounced()[0].GetReason(); !strings.Contains(r, "just started and hears none of its peers: waiting up to") {
			t.Errorf("reason %q; want it to say why it waits", r)
		}
		live.set("node-b", true, true)
		if !answering(h) {
			t.Errorf("node-a does not answer though node-b shows it sees it: %v", h.l2.last())
		}
	})
	t.Run("a new state from the CCM does not end the wait: the peer may not have its own yet", func(t *testing.T) {
		h, live := restoredHarness(t, time.Hour)
		st := withPeers(h, state(1, 2, vmacVIP("203.0.113.10", vmacA, "node-a", "node-b"), withCandidates("203.0.113.11", "node-a")), "node-b")
		if _, err := h.ccm(t).Apply(ctx(t), &agentv1.ApplyRequest{State: st}); err != nil {
			t.Fatal(err)
		}
		if l := h.l2.last(); len(l) != 1 || l[0].Addr.String() != "203.0.113.11" {
			t.Errorf("after the CCM's state node-a answers %v; want the VIP node-b has no part in alone", l)
		}
		live.set("node-b", true, true)
		if l := h.l2.last(); len(l) != 2 {
			t.Errorf("node-a answers %v once node-b is heard; want both VIPs", l)
		}
	})
	t.Run("the hold-off's end lets it answer without the CCM", func(t *testing.T) {
		h, _ := restoredHarness(t, 50*time.Millisecond)
		deadline := time.Now().Add(5 * time.Second)
		for !answering(h) {
			if time.Now().After(deadline) {
				t.Fatalf("node-a does not answer 5 s after its hold-off: %v", h.l2.last())
			}
			time.Sleep(10 * time.Millisecond)
		}
	})
}

func TestAPlanMovingAVirtualMACWaitsForTheNodeItMovesFrom(t *testing.T) {
	for _, tc := range []struct {
		name  string
		mac   string
		dies  bool
		waits bool
	}{
		{"a VIP with a virtual MAC moved by the plan is answered after a detection time", vmacA, false, true},
		{"a VIP without one is answered at once, as before", "", false, false},
		{"a VIP with a virtual MAC whose node died is answered at once", vmacA, true, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h, _, _, live := vmacHarness(t, "", 0)
			live.alive["node-b"], live.sees["node-b"] = true, true
			c := h.ccm(t)
			st := withPeers(h, state(1, 1, vmacVIP("203.0.113.10", tc.mac, "node-b", "node-a")), "node-b")
			if _, err := c.Apply(ctx(t), &agentv1.ApplyRequest{State: st}); err != nil {
				t.Fatal(err)
			}
			if len(h.l2.last()) != 0 {
				t.Fatal("node-a answers while it stands by for node-b")
			}
			if tc.dies {
				live.set("node-b", false, false)
			} else {
				st = withPeers(h, state(1, 2, vmacVIP("203.0.113.10", tc.mac, "node-a", "node-b")), "node-b")
				if _, err := c.Apply(ctx(t), &agentv1.ApplyRequest{State: st}); err != nil {
					t.Fatal(err)
				}
			}
			moved := time.Now()
			if got := len(h.l2.last()) == 1; got == tc.waits {
				t.Errorf("answering at once: %v; want %v", got, !tc.waits)
			}
			if !tc.waits {
				return
			}
			got, err := c.GetState(ctx(t), &agentv1.GetStateRequest{})
			if err != nil {
				t.Fatal(err)
			}
			if r := got.GetAnnounced()[0].GetReason(); !strings.Contains(r, "the plan moved it here from node-b, which is alive") {
				t.Errorf("reason %q; want it to say why it waits", r)
			}
			for len(h.l2.last()) != 1 {
				if time.Since(moved) > 5*time.Second {
					t.Fatal("node-a does not answer 5 s after the plan gave it the VIP")
				}
				time.Sleep(5 * time.Millisecond)
			}
			if d := time.Since(moved); d < 100*time.Millisecond {
				t.Errorf("answered %s after the move; want a detection time (150 ms) for node-b to stop", d)
			}
		})
	}
}
