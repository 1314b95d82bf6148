package nodeagent

import (
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/metalvip/metalvip/nodeagent/failover"
	agentv1 "github.com/metalvip/metalvip/proto/metalvip/agent/v1"
)

// fakeLiveness records what the agent asks of the heartbeat exchange and says every peer is
// alive and sees this node.
type fakeLiveness struct {
	mu      sync.Mutex
	cfg     failover.Config
	peers   []failover.Peer
	seq     uint64
	restart []time.Duration // the graces Restarting was given
	// restarting: peers the view says are restarting, until when
	restarting map[string]time.Time
}

func (f *fakeLiveness) SetPeers(p []failover.Peer) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.peers = slices.Clone(p)
	f.seq++
}

func (f *fakeLiveness) View() failover.View {
	f.mu.Lock()
	defer f.mu.Unlock()
	v := failover.View{Node: f.cfg.Node, Seq: f.seq, Peers: map[string]failover.PeerView{}}
	for _, p := range f.peers {
		v.Peers[p.Node] = failover.PeerView{Alive: true, Sees: true, RestartingUntil: f.restarting[p.Node]}
	}
	return v
}
func (f *fakeLiveness) Restarting(grace time.Duration) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.restart = append(f.restart, grace)
}

func (f *fakeLiveness) Counters() failover.Counters {
	return failover.Counters{Sent: 3, Accepted: 2, Refused: map[string]uint64{failover.RefusedMAC: 1}}
}
func (f *fakeLiveness) Close() error { return nil }

func withCandidates(vip string, cands ...string) *agentv1.Announcement {
	an := l2VIP(vip)
	for i, c := range cands {
		an.L2.Candidates = append(an.L2.Candidates, &agentv1.Candidate{Node: c, Address: netip.AddrFrom4([4]byte{198, 51, 100, byte(11 + i)}).String()})
	}
	return an
}

// The departing peers of a state (nodes the CCM cut off) are heartbeated as departing; so is a
// candidate the state also says departing (the CCM reaches it again, but it does not hold the
// CCM's state yet); a departing peer without an address is left out (it cannot be sent to).
func TestDepartingPeersAreHeartbeatedAsDeparting(t *testing.T) {
	var f *fakeLiveness
	h := serve(t, t.TempDir(), func(o *Options) {
		o.NewLiveness = func(c failover.Config) (Liveness, error) { f = &fakeLiveness{cfg: c}; return f, nil }
	})
	key := h.agent.identity.PublicKeys()[0]
	st := state(1, 1, withCandidates("203.0.113.10", "node-a", "node-b"))
	st.HeartbeatPeers = []*agentv1.HeartbeatPeer{
		{Node: "node-b", Address: "198.51.100.12", PublicKeys: [][]byte{key}, Departing: true},
		{Node: "node-x", Address: "198.51.100.19", PublicKeys: [][]byte{key}, Departing: true},
		{Node: "node-y", PublicKeys: [][]byte{key}, Departing: true},
	}
	if _, err := h.ccm(t).Apply(ctx(t), &agentv1.ApplyRequest{State: st}); err != nil {
		t.Fatal(err)
	}
	if f == nil {
		t.Fatal("no heartbeats started")
	}
	f.mu.Lock()
	peers := slices.Clone(f.peers)
	f.mu.Unlock()
	slices.SortFunc(peers, func(x, y failover.Peer) int { return strings.Compare(x.Node, y.Node) })
	var got []string
	for _, p := range peers {
		got = append(got, fmt.Sprintf("%s@%s departing=%v", p.Node, p.Addr, p.Departing))
	}
	want := []string{"node-b@198.51.100.12 departing=true", "node-x@198.51.100.19 departing=true"}
	if !slices.Equal(got, want) {
		t.Errorf("heartbeat peers %v; want %v", got, want)
	}
}

func TestHeartbeatsRunWithThePeersKeysFromTheState(t *testing.T) {
	var started []*fakeLiveness
	h := serve(t, t.TempDir(), func(o *Options) {
		o.NewLiveness = func(c failover.Config) (Liveness, error) {
			f := &fakeLiveness{cfg: c}
			started = append(started, f)
			return f, nil
		}
	})
	keyB := h.agent.identity.PublicKeys()[0] // any valid X25519 key will do
	st := state(1, 1, withCandidates("203.0.113.10", "node-a", "node-b", "node-c"))
	st.HeartbeatPeers = []*agentv1.HeartbeatPeer{
		{Node: "node-b", Address: "198.51.100.12", PublicKeys: [][]byte{keyB}},
		{Node: "node-c", Address: "198.51.100.13", PublicKeys: [][]byte{[]byte("not a key")}},
	}
	resp, err := h.ccm(t).Apply(ctx(t), &agentv1.ApplyRequest{State: st})
	if err != nil {
		t.Fatal(err)
	}
	if len(started) != 1 {
		t.Fatalf("%d heartbeat exchanges started; want 1", len(started))
	}
	f := started[0]
	if f.cfg.Listen != netip.MustParseAddrPort("198.51.100.11:7473") || f.cfg.Identity != h.agent.identity {
		t.Errorf("heartbeats on %s with identity %p; want this node's candidate address and its own identity", f.cfg.Listen, f.cfg.Identity)
	}
	f.mu.Lock()
	peers := f.peers
	f.mu.Unlock()
	slices.SortFunc(peers, func(x, y failover.Peer) int { return strings.Compare(x.Node, y.Node) })
	if len(peers) != 2 || peers[0].Node != "node-b" || len(peers[0].PublicKeys) != 1 || peers[1].Node != "node-c" || len(peers[1].PublicKeys) != 0 {
		t.Errorf("peers %+v; want node-b with its key and node-c without (its key is not one)", peers)
	}
	if !slices.ContainsFunc(resp.GetProblems(), func(p string) bool { return strings.Contains(p, "heartbeat_peers[1].public_keys[0]") }) {
		t.Errorf("problems %v; want the unusable key of node-c named", resp.GetProblems())
	}
	got, err := h.ccm(t).GetState(ctx(t), &agentv1.GetStateRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if hb := got.GetHeartbeats(); hb.GetSent() != 3 || hb.GetAccepted() != 2 || hb.GetRefused()[failover.RefusedMAC] != 1 {
		t.Errorf("GetState heartbeat counters %v; want the monitor's", hb)
	}

	t.Run("a state with no heartbeat peers runs no heartbeats: first candidates answer", func(t *testing.T) {
		st := state(1, 2, withCandidates("203.0.113.10", "node-b", "node-a"))
		//lint:ignore SA1019 the shared key of an older CCM starts nothing
		st.L2 = &agentv1.L2Options{HeartbeatKeys: [][]byte{[]byte("the shared key of the first wave!")}}
		if _, err := h.ccm(t).Apply(ctx(t), &agentv1.ApplyRequest{State: st}); err != nil {
			t.Fatal(err)
		}
		if len(started) != 1 {
			t.Errorf("the shared key started heartbeats")
		}
		if got := h.l2.last(); len(got) != 0 {
			t.Errorf("the second candidate answers %v without heartbeats", got)
		}
	})
}

// A VIP this node keeps answering while another candidate's liveness changes is announced
// again (l2.VIP.Again raised): that candidate may have taken this node for dead and answered
// meanwhile, drawing clients that would otherwise stay with it until the next refresh. Seen in
// the lab under load: a standby that missed the owner's heartbeats answered, gave the VIP back,
// and the client kept the standby's MAC for 30 s; and again (a CI run, the fast profile) with a
// lapse of 3 ms, too short for any of the standby's heartbeats to show it: only its lapse count
// (failover.Monitor.Lapses) told the owner.
func TestAKeptVIPIsAnnouncedAgainWhenACandidatesLivenessChanges(t *testing.T) {
	h, _, _, live := vmacHarness(t, "", 0)
	live.alive["node-b"], live.sees["node-b"] = true, true
	st := withPeers(h, state(1, 1, withCandidates("203.0.113.10", "node-a", "node-b"), withCandidates("203.0.113.11", "node-b", "node-a")), "node-b")
	if _, err := h.ccm(t).Apply(ctx(t), &agentv1.ApplyRequest{State: st}); err != nil {
		t.Fatal(err)
	}
	again := func() map[netip.Addr]uint64 {
		out := map[netip.Addr]uint64{}
		for _, v := range h.l2.last() {
			out[v.Addr] = v.Again
		}
		return out
	}
	first, second := netip.MustParseAddr("203.0.113.10"), netip.MustParseAddr("203.0.113.11")
	if got := again(); len(got) != 1 || got[first] != 0 {
		t.Fatalf("answering %v; want %s alone, not announced again yet", got, first)
	}
	for i, step := range []struct {
		what        string
		alive, sees bool
		lapse       bool
		want        map[netip.Addr]uint64
	}{
		// node-a then waits for node-b to release (ownership.go), and answers anew after: a
		// takeover, announced as every takeover is, with Again unchanged.
		{"node-b stops seeing node-a (it took node-a for dead)", true, false, false, map[netip.Addr]uint64{}},
		{"node-b sees node-a again", true, true, false, map[netip.Addr]uint64{first: 0}},
		{"node-b dies: node-a answers both, the kept one announced again", false, false, false, map[netip.Addr]uint64{first: 1, second: 0}},
		{"node-b returns and sees node-a: the kept one announced again", true, true, false, map[netip.Addr]uint64{first: 2}},
		{"node-b took node-a for dead for a moment its heartbeats did not show: announced again", true, true, true, map[netip.Addr]uint64{first: 3}},
		{"nothing changed: not announced again", true, true, false, map[netip.Addr]uint64{first: 3}},
	} {
		if step.lapse {
			live.lapse("node-b")
		} else {
			live.set("node-b", step.alive, step.sees)
		}
		if got := again(); !maps.Equal(got, step.want) {
			t.Errorf("step %d, %s: answering with Again %v; want %v", i, step.what, got, step.want)
		}
	}
}

// Issue 32: a planned restart tells the heartbeat peers (Restarting) and the CCM (an Event on
// its Watch streams) before the agent stops, with the grace bounded; a draining node tells
// neither and hands over.
func TestARestartTellsThePeersAndTheCCMUnlessDraining(t *testing.T) {
	for _, tc := range []struct {
		name     string
		draining bool
		grace    time.Duration
		want     time.Duration // 0: nothing told
	}{
		{"a restart", false, 10 * time.Second, 10 * time.Second},
		{"a grace beyond the bound", false, time.Hour, failover.MaxRestartGrace},
		{"a draining node", true, 10 * time.Second, 0},
		{"no grace", false, 0, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var f *fakeLiveness
			h := serve(t, t.TempDir(), func(o *Options) {
				o.NewLiveness = func(c failover.Config) (Liveness, error) { f = &fakeLiveness{cfg: c}; return f, nil }
			})
			st := state(1, 1, withCandidates("203.0.113.10", "node-a", "node-b"))
			st.HeartbeatPeers = []*agentv1.HeartbeatPeer{{Node: "node-b", Address: "198.51.100.12", PublicKeys: [][]byte{h.agent.identity.PublicKeys()[0]}}}
			st.Draining = tc.draining
			if _, err := h.ccm(t).Apply(ctx(t), &agentv1.ApplyRequest{State: st}); err != nil {
				t.Fatal(err)
			}
			w, err := h.ccm(t).Watch(ctx(t), &agentv1.WatchRequest{})
			if err != nil {
				t.Fatal(err)
			}
			if _, err := w.Header(); err != nil {
				t.Fatal(err)
			}
			if err := h.agent.Restart(ctx(t), tc.grace); err != nil {
				t.Fatal(err)
			}
			var told []*agentv1.Event
			for {
				resp, err := w.Recv()
				if err != nil {
					break // the agent closed the stream
				}
				if resp.GetEvent().GetKind() == agentv1.Event_KIND_RESTARTING {
					told = append(told, resp.GetEvent())
				}
			}
			if f == nil {
				t.Fatal("no heartbeats started")
			}
			f.mu.Lock()
			restart := slices.Clone(f.restart)
			f.mu.Unlock()
			if tc.want == 0 {
				if len(restart) != 0 || len(told) != 0 {
					t.Errorf("peers told %v, the CCM %v; want nothing told", restart, told)
				}
				if resp, err := h.ccm(t).GetState(ctx(t), &agentv1.GetStateRequest{}); err != nil || len(resp.GetRestarting()) != 0 {
					t.Errorf("GetState says %v restart (err %v); want none", resp.GetRestarting(), err)
				}
				return
			}
			if !slices.Equal(restart, []time.Duration{tc.want}) {
				t.Errorf("peers told a restart grace of %v; want [%s]", restart, tc.want)
			}
			if len(told) != 1 || time.Duration(told[0].GetRestartGraceMillis())*time.Millisecond != tc.want {
				t.Errorf("the CCM's Watch got %v; want one KIND_RESTARTING of %s", told, tc.want)
			}
			// Until it exits, GetState says so too: to a CCM that starts leading meanwhile.
			resp, err := h.ccm(t).GetState(ctx(t), &agentv1.GetStateRequest{})
			if err != nil {
				t.Fatal(err)
			}
			if n := resp.GetRestarting(); len(n) != 1 || n[0].GetNode() != "node-a" || left(n[0]) > tc.want || left(n[0]) < tc.want-5*time.Second {
				t.Errorf("GetState says %v restart; want node-a with about %s left", n, tc.want)
			}
		})
	}
}

func left(n *agentv1.RestartNotice) time.Duration {
	return time.Duration(n.GetGraceLeftMillis()) * time.Millisecond
}

// Issue 32: GetState lists the heartbeat peers that said they are restarting, with the grace
// left: a CCM that starts leading while a peer is away learns it there, not from the peer.
func TestGetStateSaysWhichPeersAreRestarting(t *testing.T) {
	var f *fakeLiveness
	h := serve(t, t.TempDir(), func(o *Options) {
		o.NewLiveness = func(c failover.Config) (Liveness, error) {
			f = &fakeLiveness{cfg: c, restarting: map[string]time.Time{"node-b": time.Now().Add(20 * time.Second), "node-c": time.Now().Add(-time.Second)}}
			return f, nil
		}
	})
	st := state(1, 1, withCandidates("203.0.113.10", "node-a", "node-b", "node-c"))
	for i, n := range []string{"node-b", "node-c"} {
		st.HeartbeatPeers = append(st.HeartbeatPeers, &agentv1.HeartbeatPeer{Node: n, Address: fmt.Sprintf("198.51.100.%d", 12+i), PublicKeys: [][]byte{h.agent.identity.PublicKeys()[0]}})
	}
	if _, err := h.ccm(t).Apply(ctx(t), &agentv1.ApplyRequest{State: st}); err != nil {
		t.Fatal(err)
	}
	resp, err := h.ccm(t).GetState(ctx(t), &agentv1.GetStateRequest{})
	if err != nil {
		t.Fatal(err)
	}
	// node-c's grace is over: not said.
	if n := resp.GetRestarting(); len(n) != 1 || n[0].GetNode() != "node-b" || left(n[0]) > 20*time.Second || left(n[0]) < 15*time.Second {
		t.Errorf("GetState says %v restart; want node-b alone, with about 20 s left", n)
	}
}
