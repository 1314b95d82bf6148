package main

import (
	"net/netip"
	"slices"
	"strings"
	"sync"
	"time"

	agentv1 "github.com/metalvip/metalvip/proto/metalvip/agent/v1"
)

// tracker follows what every simulated agent holds, from the states that land on it, and says
// when the fleet has converged: every expected VIP is held by exactly its candidates, each of
// them holding the same ranked list, that list as long as wanted and naming no dead node, no
// other VIP is held, and every live agent holds a state of the current term. It keeps the
// count of VIPs that are not so up to date on every landing (a landing costs what changed in
// it), so checking convergence costs nothing.
type tracker struct {
	mu     sync.Mutex
	want   int // candidates per VIP
	agents map[string]*agentHold
	vips   map[netip.Addr]*vipHold
	// expected VIPs; nil until known (every Service allocated).
	expected map[netip.Addr]bool
	notOK    int // VIPs held or expected that are not as they should be
	minTerm  uint64
	stale    int // live agents whose state is older than minTerm
	dead     map[string]bool

	lands       []landing
	lastAt      time.Time // the latest landing's time
	watch       string    // the node last killed: landings say whether they drop it
	convergedAt time.Time // when notOK and stale last became 0; zero while not converged
}

type agentHold struct {
	term  uint64
	held  map[netip.Addr]string // VIP -> its candidates, joined by ","
	peers int                   // the nodes it exchanges heartbeats with
}

type vipHold struct {
	by map[string]string // agent -> the candidates it holds
	ok bool
}

// landing is one state an agent took.
type landing struct {
	agent string
	at    time.Time
	term  uint64
	// For the node last killed: whether the agent held a VIP with it among the candidates
	// before this landing, and whether it no longer does.
	held, dropped bool
}

func newTracker(want int) *tracker {
	return &tracker{want: want, agents: map[string]*agentHold{}, vips: map[netip.Addr]*vipHold{}, dead: map[string]bool{}}
}

// addAgent makes an agent known (holding nothing, so stale) before its first landing.
func (t *tracker) addAgent(name string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.agents[name] == nil {
		t.agents[name] = &agentHold{held: map[netip.Addr]string{}}
		t.recount()
		t.settle(time.Now())
	}
}

// expect sets the VIPs that should be held.
func (t *tracker) expect(vips []netip.Addr) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.expected = make(map[netip.Addr]bool, len(vips))
	for _, v := range vips {
		t.expected[v] = true
	}
	t.recount()
	t.settle(time.Now())
}

// requireTerm makes states older than term count as not converged (a CCM restart).
func (t *tracker) requireTerm(term uint64) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.minTerm = term
	t.recount()
	t.settle(time.Now())
}

// maxTerm is the highest term any agent holds.
func (t *tracker) maxTerm() uint64 {
	t.mu.Lock()
	defer t.mu.Unlock()
	var m uint64
	for _, a := range t.agents {
		m = max(m, a.term)
	}
	return m
}

// kill takes an agent out: what it holds no longer counts, and it must be no VIP's candidate.
func (t *tracker) kill(name string, at time.Time) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.dead[name] = true
	t.watch = name
	if a := t.agents[name]; a != nil {
		for vip := range a.held {
			delete(t.vips[vip].by, name)
		}
		a.held = map[netip.Addr]string{}
	}
	t.recount()
	t.settle(at)
}

// revive counts the agent again; it holds nothing until a state lands on it.
func (t *tracker) revive(name string, at time.Time) {
	t.mu.Lock()
	defer t.mu.Unlock()
	delete(t.dead, name)
	if a := t.agents[name]; a != nil {
		// What it restored from its disk is not a landing: it must be pushed a state.
		a.term, a.held = 0, map[netip.Addr]string{}
	}
	t.recount()
	t.settle(at)
}

// landed records a state that an agent took at at.
func (t *tracker) landed(name string, st *agentv1.DesiredState, at time.Time) {
	next := map[netip.Addr]string{}
	for _, an := range st.GetAnnouncements() {
		vip, err := netip.ParseAddr(an.GetVip())
		if err != nil {
			continue
		}
		var cands []string
		for _, c := range an.GetL2().GetCandidates() {
			cands = append(cands, c.GetNode())
		}
		next[vip] = strings.Join(cands, ",")
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.dead[name] {
		return
	}
	a := t.agents[name]
	if a == nil {
		a = &agentHold{held: map[netip.Addr]string{}}
		t.agents[name] = a
	}
	l := landing{agent: name, at: at, term: st.GetTerm()}
	if t.watch != "" {
		l.held = holdsNode(a.held, t.watch)
		l.dropped = !holdsNode(next, t.watch)
	}
	wasStale := t.isStale(a)
	a.term = st.GetTerm()
	if nowStale := t.isStale(a); wasStale != nowStale {
		if nowStale {
			t.stale++
		} else {
			t.stale--
		}
	}
	for vip, c := range a.held {
		if next[vip] != c {
			delete(t.vip(vip).by, name)
			t.check(vip)
		}
	}
	for vip, c := range next {
		if a.held[vip] != c {
			t.vip(vip).by[name] = c
			t.check(vip)
		}
	}
	a.held = next
	a.peers = len(st.GetHeartbeatPeers())
	t.lands = append(t.lands, l)
	if at.After(t.lastAt) {
		t.lastAt = at
	}
	t.settle(at)
}

func holdsNode(held map[netip.Addr]string, node string) bool {
	for _, c := range held {
		if slices.Contains(strings.Split(c, ","), node) {
			return true
		}
	}
	return false
}

func (t *tracker) vip(v netip.Addr) *vipHold {
	h := t.vips[v]
	if h == nil {
		h = &vipHold{by: map[string]string{}}
		t.vips[v] = h
	}
	return h
}

func (t *tracker) isStale(a *agentHold) bool { return a.term < max(t.minTerm, 1) }

// good says whether a VIP is as it should be.
func (t *tracker) good(v netip.Addr, h *vipHold) bool {
	if t.expected == nil || !t.expected[v] {
		return len(h.by) == 0
	}
	if len(h.by) != t.want {
		return false
	}
	var list string
	for _, c := range h.by {
		if list == "" {
			list = c
		} else if c != list {
			return false
		}
	}
	cands := strings.Split(list, ",")
	if len(cands) != t.want {
		return false
	}
	for _, c := range cands {
		if _, ok := h.by[c]; !ok || t.dead[c] {
			return false
		}
	}
	return true
}

// check recomputes one VIP and the count of those not good.
func (t *tracker) check(v netip.Addr) {
	h := t.vip(v)
	ok := t.good(v, h)
	if ok != h.ok {
		if ok {
			t.notOK--
		} else {
			t.notOK++
		}
		h.ok = ok
	}
}

// recount recomputes everything (a change of what is expected, of the dead, of the term).
func (t *tracker) recount() {
	for v := range t.expected {
		t.vip(v)
	}
	t.notOK = 0
	for v, h := range t.vips {
		h.ok = t.good(v, h)
		if !h.ok {
			t.notOK++
		}
	}
	t.stale = 0
	for name, a := range t.agents {
		if !t.dead[name] && t.isStale(a) {
			t.stale++
		}
	}
}

func (t *tracker) settle(at time.Time) {
	switch {
	case t.notOK > 0 || t.stale > 0 || t.expected == nil:
		t.convergedAt = time.Time{}
	case t.convergedAt.IsZero():
		t.convergedAt = at
	}
}

// converged returns when the fleet converged, zero while it has not.
func (t *tracker) converged() time.Time {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.convergedAt
}

// status says how far the fleet is from converged.
func (t *tracker) status() (notOK, stale int) {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.notOK, t.stale
}

// since returns the landings at or after from.
func (t *tracker) since(from time.Time) []landing {
	t.mu.Lock()
	defer t.mu.Unlock()
	var out []landing
	for _, l := range t.lands {
		if !l.at.Before(from) {
			out = append(out, l)
		}
	}
	return out
}

// lastLanding is when the last state landed.
func (t *tracker) lastLanding() time.Time {
	t.mu.Lock()
	defer t.mu.Unlock()
	// Kept on landing: scanning every landing, under the lock the agents' Applies take, every
	// 50 ms held their answers back once there were tens of thousands.
	return t.lastAt
}

// holders returns the live agents holding a VIP with node among its candidates.
func (t *tracker) holders(node string) []string {
	t.mu.Lock()
	defer t.mu.Unlock()
	var out []string
	for name, a := range t.agents {
		if name != node && !t.dead[name] && holdsNode(a.held, node) {
			out = append(out, name)
		}
	}
	slices.Sort(out)
	return out
}

// holdsNow reports whether agent holds node among a VIP's candidates now.
func (t *tracker) holdsNow(agent, node string) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	a := t.agents[agent]
	return a != nil && holdsNode(a.held, node)
}

// primaries counts the VIPs each agent is the first candidate of.
func (t *tracker) primaries() map[string]int {
	t.mu.Lock()
	defer t.mu.Unlock()
	out := map[string]int{}
	for name, a := range t.agents {
		for _, c := range a.held {
			if first, _, _ := strings.Cut(c, ","); first == name {
				out[name]++
			}
		}
	}
	return out
}

// peers returns, per live agent, the number of nodes it exchanges heartbeats with, sorted.
func (t *tracker) peers() []int {
	t.mu.Lock()
	defer t.mu.Unlock()
	var out []int
	for name, a := range t.agents {
		if !t.dead[name] {
			out = append(out, a.peers)
		}
	}
	slices.Sort(out)
	return out
}
