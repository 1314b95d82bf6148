package failover

import (
	"maps"
	"slices"
	"time"
)

// View is what the heartbeats say of the peers at one moment. It is a snapshot: one decision
// reads one answer, and OnChange hands over the facts it is about instead of leaving the
// receiver to ask the monitor back. Of two views of one monitor, the greater Seq is the later.
type View struct {
	// Node is this node, always alive.
	Node string
	// Seq orders the views of one monitor.
	Seq uint64
	// Peers holds the peers that are alive, see this node, lapsed or were proven alive; a
	// peer not in it is none of these.
	Peers map[string]PeerView
}

// PeerView is what the heartbeats say of one peer.
type PeerView struct {
	// Alive: a peer not heard from yet counts as alive for Misses intervals after it was
	// added, unless it has no key; one heard but not proven alive counts so while its
	// heartbeats say it does not count this node alive (dissents). A departing peer never is
	// (Peer.Departing): heard or not, it answers nothing this node shares with it, so this
	// node neither yields to it nor waits for it.
	Alive bool
	// Sees: its heartbeats say it counts this node alive.
	Sees bool
	// Lapses: how many times its heartbeats showed it had stopped counting this node alive,
	// however briefly (it may have answered this node's VIPs meanwhile).
	Lapses uint64
	// Proven: when a heartbeat echoing one of this node's last proved it alive (zero: never,
	// since it became a peer).
	Proven time.Time
	// RestartingUntil: its last proven heartbeat said it is restarting (a planned exit) and it
	// is not back yet; it counts alive until then (zero: no such notice).
	RestartingUntil time.Time
}

// Alive reports whether node is alive; this node always is.
func (v View) Alive(node string) bool { return node == v.Node || v.Peers[node].Alive }

// Sees reports whether node's heartbeats say it counts this node alive.
func (v View) Sees(node string) bool { return v.Peers[node].Sees }

// Lapses reports how many times node's heartbeats showed it had stopped counting this node
// alive.
func (v View) Lapses(node string) uint64 { return v.Peers[node].Lapses }

// LastAlive returns when node was last proven alive by a heartbeat echoing one of this node's;
// false if it never was since it became a peer.
func (v View) LastAlive(node string) (time.Time, bool) {
	t := v.Peers[node].Proven
	return t, !t.IsZero()
}

// AliveNodes returns the peers that are alive, sorted.
func (v View) AliveNodes() []string {
	var out []string
	for _, n := range slices.Sorted(maps.Keys(v.Peers)) {
		if v.Peers[n].Alive {
			out = append(out, n)
		}
	}
	return out
}

// View returns what the heartbeats say now.
func (m *Monitor) View() View {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.viewLocked()
}

// viewLocked builds a view from the monitor's answers (copied: SetPeers changes them in
// place). The caller holds mu.
func (m *Monitor) viewLocked() View {
	v := View{Node: m.cfg.Node, Seq: m.seq, Peers: map[string]PeerView{}}
	for n, a := range m.alive {
		if p := m.peers[n]; a && (p == nil || !p.departing) {
			v.Peers[n] = PeerView{Alive: true}
		}
	}
	for n, s := range m.seesMe {
		if s {
			pv := v.Peers[n]
			pv.Sees = true
			v.Peers[n] = pv
		}
	}
	for n, l := range m.lapsed {
		pv := v.Peers[n]
		pv.Lapses = l
		v.Peers[n] = pv
	}
	for n, p := range m.peers {
		if p.proven {
			pv := v.Peers[n]
			pv.Proven = p.proof
			v.Peers[n] = pv
		}
		if !p.restartUntil.IsZero() && p.backSince.IsZero() && !p.departing {
			pv := v.Peers[n]
			pv.RestartingUntil = p.restartUntil
			v.Peers[n] = pv
		}
	}
	return v
}

// Restarting returns the peers whose last proven heartbeat said they are restarting and that
// are not back yet, with the end of their grace, as of now.
func (v View) Restarting(now time.Time) map[string]time.Time {
	out := map[string]time.Time{}
	for n, pv := range v.Peers {
		if pv.RestartingUntil.After(now) {
			out[n] = pv.RestartingUntil
		}
	}
	return out
}
