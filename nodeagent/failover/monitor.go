// Package failover tells an agent which other candidate nodes are alive, by authenticated UDP
// heartbeats over the data-plane network, every few tens of milliseconds. It decides nothing
// about VIPs (the agent ranks candidates); it answers "is node X alive" and "does node X see
// me", the two facts an ordered hand-over needs, and hands them over as a View on each
// change. The CCM is not in this loop. It touches nothing but its own socket and its identity
// file.
//
// A heartbeat from A to B is signed with the MAC key of the pair A→B (from A's and B's X25519
// keys, Identity), so no node speaks for another, and counts for liveness only when it echoes
// the nonce of one of B's recent heartbeats to A, so a replayed one keeps no dead node alive.
// Why a peer that says it does not see this node still counts alive: PeerView.Alive. The order
// of the checks on a datagram, and why no per-source budget: Monitor.handle.
package failover

import (
	"crypto/ecdh"
	"fmt"
	"hash"
	"maps"
	"net/netip"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"k8s.io/klog/v2"
)

// Peer is another node to exchange heartbeats with.
type Peer struct {
	Node string
	Addr netip.Addr
	// PublicKeys are the peer's heartbeat keys as its agent reported them, newest first. A
	// peer without a usable key cannot be heard: it counts as dead.
	PublicKeys [][]byte
	// Departing: a node the CCM dropped from the candidate lists this node shares with it
	// (it cannot reach its agent). Heartbeats are exchanged with it as with any peer, but they
	// never show it alive: it still hears this node, and so yields the VIPs this node shared
	// with it (the ordered hand-over waits for this node to see it).
	Departing bool
}

// Config configures a Monitor.
type Config struct {
	// Node is this node's name.
	Node string
	// Listen is the local data-plane address and port heartbeats are sent from and received on.
	Listen netip.AddrPort
	// Interval between heartbeats; 0 means 50 ms.
	Interval time.Duration
	// Misses is how many intervals without a heartbeat make a node dead; 0 means 3.
	Misses int
	// Identity holds this node's keys and boot counter; nil makes one in memory (tests).
	Identity *Identity
	// OnChange is called, never concurrently, after the set of alive nodes, or of the nodes
	// that see this one, changed, with what the heartbeats say now; the heartbeats this node
	// sends show the change only after OnChange returns, so a node that stops answering for
	// a VIP in OnChange has stopped before its peers learn that it sees the new node. A view
	// SetPeers made meanwhile (Monitor.View) may be later: see View.Seq.
	OnChange func(View)
	// OnRTT, when set, is given the round trip of each heartbeat that echoes one this node
	// sent: the time from sending it to hearing the echo (metrics). It is called with the
	// monitor locked: it must not block or call the monitor.
	OnRTT func(time.Duration)

	// sent, when set (tests), sees every heartbeat this monitor sends.
	sent func(b []byte, to netip.AddrPort)
}

// Refusal reasons, in the order the checks run.
const (
	RefusedSize    = "size"    // not the size of a heartbeat
	RefusedTTL     = "ttl"     // arrived with a TTL (hop limit) under 255: not from the segment
	RefusedSource  = "source"  // not from the address of a peer
	RefusedVersion = "version" // a heartbeat of an earlier version than this one takes
	RefusedKey     = "key"     // made with a key the peer does not have, or this node does not
	RefusedReplay  = "replay"  // not newer than the last verified from that peer and key
	RefusedStale   = "stale"   // echoes no nonce this node sent that peer recently
	RefusedMAC     = "mac"     // the MAC does not verify: forged or damaged
)

var reasons = []string{RefusedSize, RefusedTTL, RefusedSource, RefusedVersion, RefusedKey, RefusedReplay, RefusedStale, RefusedMAC}

// Counters count the heartbeats of a Monitor.
type Counters struct {
	Sent uint64
	// Accepted heartbeats verified and counted for liveness; Unproven verified but echoing
	// nothing recent (the sender had not heard this node yet), so not counted.
	Accepted, Unproven uint64
	// Refused by reason (the Refused* constants).
	Refused map[string]uint64
	// Stalls: times this node found it had not run for more than two intervals (starved of
	// CPU, paused); after each, no peer alive before counts as dead for a deadline.
	Stalls uint64
}

const (
	sendRing        = 16 // this node's recent heartbeats to each peer, to check echoes against
	maxEchoAgeRatio = 2  // an echo older than deadline + this many intervals is stale
	// stallRatio: an evaluation more than this many intervals after the one before means
	// this node itself did not run (starved of CPU, a paused VM, a stopped process); every
	// tick asks for one.
	stallRatio = 2
)

// Monitor exchanges heartbeats with peers.
type Monitor struct {
	cfg  Config
	id   *Identity
	conn *hbConn

	mu        sync.Mutex
	peers     map[string]*peer
	byAddr    map[netip.Addr]*peer
	alive     map[string]bool   // as OnChange last saw it
	seesMe    map[string]bool   // peers whose heartbeats say they count this node alive
	lapsed    map[string]uint64 // per peer, its lapses as OnChange last saw them (Lapses)
	newPeers  bool              // SetPeers added a peer since the last evaluation
	seq       uint64            // counts the changes of the above: View.Seq
	announced map[string]bool   // alive nodes this node's heartbeats show
	evaluated time.Time         // the last evaluation
	resumed   time.Time         // when this node last ran again after a stall
	stalledAt time.Time         // and the evaluation before it: when it stopped running
	stalls    atomic.Uint64
	restart   uint16 // what this node's heartbeats say in their restart field (Restarting)

	sent, accepted, unproven atomic.Uint64
	refused                  [8]atomic.Uint64 // by index in reasons

	kick     chan struct{}
	stop     chan struct{}
	wg       sync.WaitGroup // receive and tick
	evalDone chan struct{}  // closed when the evaluator has returned
}

type sentHeartbeat struct {
	nonce uint64
	at    time.Time
}

type peer struct {
	node  string
	addr  netip.Addr
	keys  []peerKey // newest first
	added time.Time

	pairs    map[[2]keyID]*pair // (mine, theirs)
	last     map[keyID]seqKey   // per key of the peer: the highest (boot, seq) verified
	verified time.Time          // the last verified heartbeat
	echo     uint64             // what this node echoes back: the peer's latest verified nonce
	usesMine keyID              // the key of this node the peer last used
	usesOK   bool
	proof    time.Time // the peer was alive then, by a fresh echo
	proven   bool
	sees     bool   // the last proven heartbeat says the peer counts this node alive
	dissent  bool   // the last verified heartbeat, proven or not, says it does not (dissents)
	boot     uint64 // the boot counter of the last verified heartbeat
	// restartUntil: the peer's last proven heartbeat said it was restarting; it counts alive
	// until then. A proven heartbeat without the notice (its next boot's, once it is back)
	// shortens it to ReturnSettle after that heartbeat (backSince), and the next proven
	// heartbeat past that ends it.
	restartUntil time.Time
	backSince    time.Time
	// departing: this node's heartbeats never show the peer alive (Peer.Departing)
	departing bool

	// lapses counts the times this node stopped counting the peer alive (its heartbeats show
	// it modulo lapseModulo); theirLapses is the count the peer's latest heartbeat showed, and
	// lapsed how many times that count changed: the peer stopped counting this node alive.
	lapses      uint8
	theirLapses uint8
	heardLapses bool
	lapsed      uint64

	sent  [sendRing]sentHeartbeat // this node's recent heartbeats to the peer
	sentN int
}

type peerKey struct {
	id  keyID
	pub *ecdh.PublicKey
}

// pair holds the MACs of a pair of keys, one per direction. Each is used under Monitor.mu only.
type pair struct {
	send, recv hash.Hash
	sum        [macSize]byte
}

// New opens the heartbeat socket. Call SetPeers, then the monitor runs until Close.
func New(cfg Config) (*Monitor, error) {
	if cfg.Interval <= 0 {
		cfg.Interval = 50 * time.Millisecond
	}
	if cfg.Misses <= 0 {
		cfg.Misses = 3
	}
	if cfg.OnChange == nil {
		cfg.OnChange = func(View) {}
	}
	id := cfg.Identity
	if id == nil {
		var err error
		if id, err = LoadIdentity("", time.Now()); err != nil {
			return nil, err
		}
	}
	conn, err := listen(cfg.Listen)
	if err != nil {
		return nil, fmt.Errorf("heartbeat socket on %s: %w", cfg.Listen, err)
	}
	m := &Monitor{
		cfg: cfg, id: id, conn: conn,
		peers: map[string]*peer{}, byAddr: map[netip.Addr]*peer{},
		alive: map[string]bool{}, seesMe: map[string]bool{}, lapsed: map[string]uint64{}, announced: map[string]bool{},
		kick: make(chan struct{}, 1), stop: make(chan struct{}), evalDone: make(chan struct{}),
	}
	// Sending, receiving and evaluating run apart, so that a slow OnChange delays no
	// heartbeat (peers would take this node for dead).
	m.wg.Add(2)
	go m.receive()
	go m.tick()
	go func() {
		defer close(m.evalDone)
		m.evaluator()
	}()
	return m, nil
}

// SetPeers sets the nodes to exchange heartbeats with. It does not call OnChange. Keys that
// are not usable are left out; a peer left with none counts as dead.
func (m *Monitor) SetPeers(peers []Peer) {
	m.mu.Lock()
	defer m.mu.Unlock()
	now := time.Now()
	mine := m.id.current()
	next := map[string]*peer{}
	for _, p := range peers {
		if p.Node == m.cfg.Node || !p.Addr.IsValid() || next[p.Node] != nil {
			continue
		}
		addr := p.Addr.Unmap()
		old := m.peers[p.Node]
		np := &peer{node: p.Node, addr: addr, added: now, pairs: map[[2]keyID]*pair{}, last: map[keyID]seqKey{}}
		if old != nil && old.addr == addr {
			*np = *old
			np.keys, np.pairs = nil, map[[2]keyID]*pair{}
		}
		for _, b := range p.PublicKeys {
			if pub, ok := usableKey(b); ok {
				np.keys = append(np.keys, peerKey{id: idOf(b), pub: pub})
			}
		}
		np.departing = p.Departing
		if old != nil && old.addr == addr {
			keepPairs(np, old, mine)
		}
		for id := range np.last {
			if !slices.ContainsFunc(np.keys, func(k peerKey) bool { return k.id == id }) {
				delete(np.last, id)
			}
		}
		if old == nil || old.addr != addr {
			// Alive from now, not from the next tick: the caller decides at once, and a peer
			// it has not had the time to hear must not look dead (every candidate of a new
			// VIP would answer until the tick).
			if len(np.keys) > 0 {
				m.alive[p.Node] = true
			} else {
				delete(m.alive, p.Node)
			}
			m.newPeers = true
		}
		next[p.Node] = np
	}
	m.peers = next
	m.seq++
	m.byAddr = make(map[netip.Addr]*peer, len(next))
	for _, p := range next {
		m.byAddr[p.addr] = p
	}
	for n := range m.alive {
		if next[n] == nil {
			delete(m.alive, n)
		}
	}
	// The next tick evaluates: evaluating here would call OnChange from the caller's
	// goroutine, which may hold the lock OnChange needs.
}

// keepPairs gives np the MAC keys old derived with the peer's keys np still has and this
// node's keys it still has (mine): a state names the same keys again, and deriving a pair is
// a scalar multiplication. A peer's key is the same only by its bytes, not its short id.
func keepPairs(np, old *peer, mine []*ownKey) {
	for k, pr := range old.pairs {
		if !slices.ContainsFunc(mine, func(o *ownKey) bool { return o.id == k[0] }) {
			continue
		}
		i := slices.IndexFunc(old.keys, func(pk peerKey) bool { return pk.id == k[1] })
		if i < 0 {
			continue
		}
		if slices.ContainsFunc(np.keys, func(pk peerKey) bool { return pk.id == k[1] && pk.pub.Equal(old.keys[i].pub) }) {
			np.pairs[k] = pr
		}
	}
}

// pairOf returns the MAC keys of this node's key mine with the peer's key theirs, derived once.
func (m *Monitor) pairOf(p *peer, mine *ownKey, theirs peerKey) *pair {
	k := [2]keyID{mine.id, theirs.id}
	if pr := p.pairs[k]; pr != nil {
		return pr
	}
	send, recv, err := pairKeys(mine.priv, theirs.pub, m.cfg.Node, p.node)
	if err != nil {
		return nil // a low-order key: no pair can be made with it
	}
	pr := &pair{send: newMAC(send), recv: newMAC(recv)}
	p.pairs[k] = pr
	return pr
}

// Alive reports whether node is alive (View.Alive); this node always is.
func (m *Monitor) Alive(node string) bool { return m.View().Alive(node) }

// Sees reports whether node's latest heartbeat says it counts this node alive (View.Sees).
func (m *Monitor) Sees(node string) bool { return m.View().Sees(node) }

// Lapses returns how many times node's heartbeats showed that it had stopped counting this
// node alive, as OnChange last saw it (View.Lapses).
func (m *Monitor) Lapses(node string) uint64 { return m.View().Lapses(node) }

// LastAlive returns when node was last proven alive (View.LastAlive).
func (m *Monitor) LastAlive(node string) (time.Time, bool) { return m.View().LastAlive(node) }

// AliveNodes returns the peers Alive counts, sorted (View.AliveNodes).
func (m *Monitor) AliveNodes() []string { return m.View().AliveNodes() }

// Counters returns what the monitor sent, took and refused.
func (m *Monitor) Counters() Counters {
	c := Counters{Sent: m.sent.Load(), Accepted: m.accepted.Load(), Unproven: m.unproven.Load(), Stalls: m.stalls.Load(), Refused: map[string]uint64{}}
	for i, r := range reasons {
		if n := m.refused[i].Load(); n > 0 {
			c.Refused[r] = n
		}
	}
	return c
}

// Close stops the monitor: no heartbeat is sent or taken once it returns, and its port is
// free. It does not wait for an OnChange under way (which may wait for a lock the caller of
// Close holds); that one is the last, and Stopped says when it has returned.
func (m *Monitor) Close() error {
	select {
	case <-m.stop:
		return nil
	default:
	}
	close(m.stop)
	err := m.conn.close()
	m.wg.Wait()
	return err
}

// MaxRestartGrace bounds how long a peer that said it is restarting counts alive without a
// heartbeat: a node whose agent does not come back loses its VIPs at most this late.
const MaxRestartGrace = 30 * time.Second

// ReturnSettle is how long a peer back from a planned restart still counts alive without a
// heartbeat (within its grace): a freshly started agent on a busy node sends its first
// heartbeats unevenly, and a gap then would move its VIPs away and back, the very moves the
// restart was planned to avoid. Measured on a loaded 2-core machine: gaps of 150-450 ms in the
// first 2.2 s after the return.
const ReturnSettle = 5 * time.Second

// restartBurst is how many heartbeats Restarting sends at once, restartGap apart: one lost
// datagram must not make a peer take over.
const (
	restartBurst = 3
	restartGap   = 5 * time.Millisecond
)

// Restarting makes this node's heartbeats say that it is about to restart and will be back
// within grace (MaxRestartGrace at most; 0 withdraws the notice), and sends them to every peer
// at once: a peer that takes one keeps counting this node alive for the grace, so that the VIPs
// it answers wait for it instead of moving away and back, unless it comes back sooner (a
// heartbeat of its next boot, proven, ends the grace). Only a proven heartbeat (one echoing a
// nonce the receiver sent recently) carries the notice: no capture can replay it. Call it just
// before a planned exit; the peers of agents of heartbeat version 2 do not read it and take
// over as from any exit.
func (m *Monitor) Restarting(grace time.Duration) {
	ms := min(max(grace, 0), MaxRestartGrace).Milliseconds()
	m.mu.Lock()
	m.restart = uint16(ms)
	m.mu.Unlock()
	for i := range restartBurst {
		if i > 0 {
			time.Sleep(restartGap)
		}
		m.send(time.Now())
	}
}

// Stopped is closed once the monitor is closed and its last OnChange has returned.
func (m *Monitor) Stopped() <-chan struct{} { return m.evalDone }

func (m *Monitor) tick() {
	defer m.wg.Done()
	t := time.NewTicker(m.cfg.Interval)
	defer t.Stop()
	for {
		select {
		case <-m.stop:
			return
		case <-t.C:
			m.send(time.Now())
			m.poke()
		}
	}
}

func (m *Monitor) poke() {
	select {
	case m.kick <- struct{}{}:
	default:
	}
}

// evaluator decides who is alive at every tick and heartbeat received, and also at the moment
// a live peer's proof runs out: a dead node is declared misses intervals after its last proof,
// not up to one tick later.
func (m *Monitor) evaluator() {
	expiry := time.NewTimer(time.Hour)
	defer expiry.Stop()
	for {
		select {
		case <-m.stop:
			return
		case <-m.kick:
		case <-expiry.C:
		}
		select {
		case <-m.stop:
			return // closed meanwhile: no OnChange after Close but one under way
		default:
		}
		now := time.Now()
		next := m.evaluate(now)
		wait := time.Hour
		if !next.IsZero() {
			// Just past it: evaluate counts a proof exactly deadline old as alive.
			wait = max(next.Sub(now), 0) + expirySlack
		}
		expiry.Reset(wait)
	}
}

// expirySlack is how long after a peer's proof runs out the evaluator looks again.
const expirySlack = 200 * time.Microsecond

// Indexes of reasons, for the counters.
const (
	iSize = iota
	iTTL
	iSource
	iVersion
	iKey
	iReplay
	iStale
	iMAC
)

// evaluate recomputes who is alive and, on a change, calls OnChange before the heartbeats show
// it. It runs only on the evaluator goroutine, so OnChange is never called concurrently. It
// also ends a key rotation once every peer uses this node's newest key.
//
// A node that was itself not running cannot tell a dead peer from one whose heartbeats wait
// unread in its socket, or whose echoes are of heartbeats this node sent late: after such a
// stall, a peer that was alive when this node stopped running (its last proof within a
// deadline of then) stays alive for a deadline after the wake, time for fresh proof to arrive.
// Only proof from before the stall counts, so stalls that follow each other keep no dead peer
// alive: a peer that is really dead is found at most a deadline (and the stall) late. A standby
// that woke and took over from an owner as alive as itself would move the VIP twice.
//
// It returns the earliest time at which a peer alive now would stop being so without a
// fresh heartbeat (zero when none is alive).
func (m *Monitor) evaluate(now time.Time) time.Time {
	deadline := m.deadline()
	mine := m.id.current()
	m.mu.Lock()
	if !m.evaluated.IsZero() && now.Sub(m.evaluated) > stallRatio*m.cfg.Interval {
		m.resumed, m.stalledAt = now, m.evaluated
		m.stalls.Add(1)
		klog.V(4).InfoS("This node did not run for a while: peers alive before count as alive until fresh heartbeats could arrive", "stalled", now.Sub(m.evaluated).Round(time.Millisecond), "grace", deadline)
	}
	m.evaluated = now
	waking := !m.resumed.IsZero() && now.Sub(m.resumed) <= deadline
	next := map[string]bool{}
	seesMe := map[string]bool{}
	lapsed := map[string]uint64{}
	var expires time.Time
	rotated := len(mine) > 1
	for n, p := range m.peers {
		dissenting := dissents(p, now, deadline)
		switch {
		case len(p.keys) == 0:
			// Cannot be heard: dead.
		case p.proven && now.Sub(p.proof) <= deadline:
			next[n] = true
		case !p.proven && now.Sub(p.added) <= deadline:
			// Not heard from yet: a node that just started (or just learnt of a peer) must not
			// take a VIP over from a peer it has not had the time to hear.
			next[n] = true
		case waking && m.alive[n] && (p.proven && m.stalledAt.Sub(p.proof) <= deadline || !p.proven && m.stalledAt.Sub(p.added) <= deadline):
			next[n] = true
		case dissenting:
			next[n] = true
		case now.Before(p.restartUntil):
			// Restarting (a planned exit): its VIPs wait for it, moving them twice would reset
			// every connection to them (Restarting).
			next[n] = true
		}
		if next[n] && p.proven && p.sees && !p.dissent {
			seesMe[n] = true
		}
		if p.lapsed > 0 {
			lapsed[n] = p.lapsed
		}
		if next[n] {
			at := p.added.Add(deadline)
			if p.proven {
				at = p.proof.Add(deadline)
			}
			if dissenting && p.verified.Add(deadline).After(at) {
				at = p.verified.Add(deadline)
			}
			if p.restartUntil.After(at) {
				at = p.restartUntil
			}
			if at.After(now) && (expires.IsZero() || at.Before(expires)) {
				expires = at
			}
		}
		if len(p.keys) > 0 && (!p.usesOK || p.usesMine != mine[0].id) {
			rotated = false
		}
	}
	// New peers count as a change though SetPeers made them alive already: OnChange runs
	// before this node's heartbeats show them, as for any other change.
	changed := !sameSet(next, m.alive) || !sameSet(seesMe, m.seesMe) || !maps.Equal(lapsed, m.lapsed) || m.newPeers
	m.alive, m.seesMe, m.lapsed, m.newPeers = next, seesMe, lapsed, false
	var view View
	if changed {
		m.seq++
		view = m.viewLocked()
	}
	m.mu.Unlock()
	if changed {
		m.cfg.OnChange(view)
	}
	m.mu.Lock()
	for n := range m.announced {
		if p := m.peers[n]; p != nil && !next[n] {
			p.lapses++
		}
	}
	m.announced = next
	m.mu.Unlock()
	if rotated {
		if err := m.id.retire(mine[0].id); err != nil {
			klog.ErrorS(err, "Cannot save the heartbeat keys after retiring the old one")
		} else {
			klog.InfoS("Heartbeat key rotation done: every peer uses the new key")
		}
	}
	return expires
}

// dissents reports whether a peer without fresh proof is still heard, its heartbeats saying it
// does not count this node alive: heartbeats lost one way (or mostly one way) leave it unable
// to prove this node or to be proven, and it then answers, as the first live candidate, the
// VIPs it shares with this node. It counts alive while heard, so that this node yields to it
// and waits for it (owns), never answering beside it; counting it dead, both would answer for
// as long as the loss lasts. Believing it errs only towards answering less: a heartbeat that
// does not prove its sender alive may make this node yield, never take over.
func dissents(p *peer, now time.Time, deadline time.Duration) bool {
	return p.dissent && p.verified.After(p.added) && now.Sub(p.verified) <= deadline
}

func sameSet(a, b map[string]bool) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if v != b[k] {
			return false
		}
	}
	return true
}
