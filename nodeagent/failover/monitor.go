// Package failover tells an agent which other candidate nodes are alive, by authenticated UDP
// heartbeats over the data-plane network, every few tens of milliseconds. It decides nothing
// about VIPs (the agent ranks candidates); it only answers "is node X alive" and "does node X
// see me", the two facts an ordered hand-over needs. The CCM is not in this loop.
//
// A heartbeat carries the sender's node name, a boot id and a sequence number (so replays are
// refused), the names of the nodes whose heartbeats the sender receives, and an HMAC-SHA256 over
// all of it with a key the CCM distributes. A node counts as alive while its heartbeats arrive;
// Misses intervals without one and it is dead.
package failover

import (
	"bytes"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"sync"
	"time"

	"k8s.io/klog/v2"
)

// Peer is another node to exchange heartbeats with.
type Peer struct {
	Node string
	Addr netip.Addr
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
	// OnChange is called, never concurrently, after the set of alive nodes, or of the nodes
	// that see this one, changed; the
	// heartbeats this node sends show the change only after OnChange returns, so a node that
	// stops answering for a VIP in OnChange has stopped before its peers learn that it sees
	// the new node.
	OnChange func()
}

// Monitor exchanges heartbeats with peers.
type Monitor struct {
	cfg    Config
	conn   *net.UDPConn
	bootID uint64

	mu        sync.Mutex
	keys      [][]byte
	peers     map[string]netip.Addr
	added     map[string]time.Time // when each peer was added
	last      map[string]time.Time // last valid heartbeat per node
	lastSeq   map[string]seqKey    // replay protection
	sees      map[string][]string  // whom each peer says it sees
	alive     map[string]bool      // as OnChange last saw it
	newPeers  bool                 // SetPeers added a peer since the last evaluation
	seesMe    map[string]bool      // peers whose heartbeats list this node, as OnChange last saw it
	announced []string             // alive nodes this node's heartbeats show
	seq       uint64

	kick chan struct{} // asks the evaluator to run
	stop chan struct{}
	wg   sync.WaitGroup
}

type seqKey struct{ boot, seq uint64 }

// New opens the heartbeat socket. Call SetKeys and SetPeers, then the monitor runs until Close.
func New(cfg Config) (*Monitor, error) {
	if cfg.Interval <= 0 {
		cfg.Interval = 50 * time.Millisecond
	}
	if cfg.Misses <= 0 {
		cfg.Misses = 3
	}
	if cfg.OnChange == nil {
		cfg.OnChange = func() {}
	}
	conn, err := net.ListenUDP("udp", net.UDPAddrFromAddrPort(cfg.Listen))
	if err != nil {
		return nil, fmt.Errorf("heartbeat socket on %s: %w", cfg.Listen, err)
	}
	var b [8]byte
	_, _ = rand.Read(b[:])
	m := &Monitor{
		cfg: cfg, conn: conn, bootID: binary.BigEndian.Uint64(b[:]),
		peers: map[string]netip.Addr{}, added: map[string]time.Time{}, last: map[string]time.Time{}, lastSeq: map[string]seqKey{},
		sees: map[string][]string{}, alive: map[string]bool{}, seesMe: map[string]bool{},
		kick: make(chan struct{}, 1), stop: make(chan struct{}),
	}
	// Sending, receiving and evaluating run apart, so that a slow OnChange delays no
	// heartbeat (peers would take this node for dead).
	m.wg.Add(3)
	go m.receive()
	go m.tick()
	go m.evaluator()
	return m, nil
}

// SetKeys sets the HMAC keys: the first signs, any verifies (so keys can be rotated).
func (m *Monitor) SetKeys(keys [][]byte) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.keys = nil
	for _, k := range keys {
		if len(k) > 0 {
			m.keys = append(m.keys, bytes.Clone(k))
		}
	}
}

// SetPeers sets the nodes to exchange heartbeats with. It does not call OnChange.
func (m *Monitor) SetPeers(peers []Peer) {
	m.mu.Lock()
	now := time.Now()
	next := map[string]netip.Addr{}
	for _, p := range peers {
		if p.Node != m.cfg.Node && p.Addr.IsValid() {
			next[p.Node] = p.Addr.Unmap()
			if _, known := m.added[p.Node]; !known {
				m.added[p.Node] = now
				// Alive from now, not from the next tick: the caller decides at once, and a
				// peer it has not had the time to hear must not look dead (every candidate of
				// a new VIP would answer until the tick).
				m.alive[p.Node] = true
				m.newPeers = true
			}
		}
	}
	for n := range m.peers {
		if _, ok := next[n]; !ok {
			delete(m.added, n)
			delete(m.last, n)
			delete(m.sees, n)
			delete(m.lastSeq, n)
		}
	}
	m.peers = next
	m.mu.Unlock()
	// The next tick evaluates: evaluating here would call OnChange from the caller's
	// goroutine, which may hold the lock OnChange needs.
}

// Alive reports whether a node is alive; this node always is. A peer not heard from yet counts
// as alive for Misses intervals after it was added.
func (m *Monitor) Alive(node string) bool {
	if node == m.cfg.Node {
		return true
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.alive[node]
}

// Sees reports whether node's latest heartbeat says it receives this node's heartbeats.
func (m *Monitor) Sees(node string) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	return slices.Contains(m.sees[node], m.cfg.Node)
}

// AliveNodes returns the alive peers, sorted.
func (m *Monitor) AliveNodes() []string {
	m.mu.Lock()
	defer m.mu.Unlock()
	var out []string
	for n, a := range m.alive {
		if a {
			out = append(out, n)
		}
	}
	slices.Sort(out)
	return out
}

// Close stops the monitor.
func (m *Monitor) Close() error {
	select {
	case <-m.stop:
		return nil
	default:
	}
	close(m.stop)
	err := m.conn.Close()
	m.wg.Wait()
	return err
}

func (m *Monitor) tick() {
	defer m.wg.Done()
	t := time.NewTicker(m.cfg.Interval)
	defer t.Stop()
	for {
		select {
		case <-m.stop:
			return
		case <-t.C:
			m.send()
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

func (m *Monitor) evaluator() {
	defer m.wg.Done()
	for {
		select {
		case <-m.stop:
			return
		case <-m.kick:
			m.evaluate(time.Now())
		}
	}
}

// send sends one heartbeat to every peer.
func (m *Monitor) send() {
	m.mu.Lock()
	if len(m.keys) == 0 || len(m.peers) == 0 {
		m.mu.Unlock()
		return
	}
	m.seq++
	msg := encode(m.cfg.Node, m.bootID, m.seq, m.announced, m.keys[0])
	dsts := make([]netip.Addr, 0, len(m.peers))
	for _, a := range m.peers {
		dsts = append(dsts, a)
	}
	m.mu.Unlock()
	for _, a := range dsts {
		if _, err := m.conn.WriteToUDPAddrPort(msg, netip.AddrPortFrom(a, m.cfg.Listen.Port())); err != nil {
			klog.V(4).InfoS("Heartbeat send failed", "to", a, "err", err)
		}
	}
}

func (m *Monitor) receive() {
	defer m.wg.Done()
	buf := make([]byte, 65536)
	for {
		n, from, err := m.conn.ReadFromUDPAddrPort(buf)
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			continue
		}
		hb, err := m.verify(buf[:n], from.Addr().Unmap())
		if err != nil {
			klog.V(4).InfoS("Heartbeat refused", "from", from, "err", err)
			continue
		}
		m.mu.Lock()
		m.last[hb.node] = time.Now()
		m.sees[hb.node] = hb.sees
		m.mu.Unlock()
		m.poke()
	}
}

// verify authenticates a heartbeat: a known peer, from its address, signed with a known key,
// newer than the last one from it.
func (m *Monitor) verify(b []byte, from netip.Addr) (heartbeat, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	hb, err := decode(b, m.keys)
	if err != nil {
		return heartbeat{}, err
	}
	addr, ok := m.peers[hb.node]
	if !ok {
		return heartbeat{}, fmt.Errorf("%s is not a peer", hb.node)
	}
	if addr != from {
		return heartbeat{}, fmt.Errorf("%s's heartbeat came from %s, not %s", hb.node, from, addr)
	}
	if last, ok := m.lastSeq[hb.node]; ok && last.boot == hb.boot && hb.seq <= last.seq {
		return heartbeat{}, fmt.Errorf("replayed or reordered heartbeat %d of %s", hb.seq, hb.node)
	}
	m.lastSeq[hb.node] = seqKey{hb.boot, hb.seq}
	return hb, nil
}

// evaluate recomputes who is alive and, on a change, calls OnChange before the heartbeats show
// it. It runs only on the evaluator goroutine, so OnChange is never called concurrently.
func (m *Monitor) evaluate(now time.Time) {
	deadline := time.Duration(m.cfg.Misses) * m.cfg.Interval
	m.mu.Lock()
	next := map[string]bool{}
	for n := range m.peers {
		t, heard := m.last[n]
		switch {
		case heard && now.Sub(t) <= deadline:
			next[n] = true
		case !heard && now.Sub(m.added[n]) <= deadline:
			// Not heard from yet: a node that just started (or just learnt of a peer) must not
			// take a VIP over from a peer it has not had the time to hear.
			next[n] = true
		}
	}
	seesMe := map[string]bool{}
	for n := range next {
		if slices.Contains(m.sees[n], m.cfg.Node) {
			seesMe[n] = true
		}
	}
	// New peers count as a change though SetPeers made them alive already: OnChange runs
	// before this node's heartbeats show them, as for any other change.
	changed := !sameSet(next, m.alive) || !sameSet(seesMe, m.seesMe) || m.newPeers
	m.alive, m.seesMe, m.newPeers = next, seesMe, false
	m.mu.Unlock()
	if changed {
		m.cfg.OnChange()
	}
	m.mu.Lock()
	m.announced = m.announced[:0]
	for n := range next {
		m.announced = append(m.announced, n)
	}
	slices.Sort(m.announced)
	m.mu.Unlock()
}

func sameSet(a, b map[string]bool) bool {
	if len(a) != len(b) {
		return false
	}
	for k := range a {
		if !b[k] {
			return false
		}
	}
	return true
}

type heartbeat struct {
	node      string
	boot, seq uint64
	sees      []string
}

const version = 1

// encode lays a heartbeat out as: version, boot id, sequence, node name, count and names of the
// nodes seen, HMAC-SHA256 of everything before it.
func encode(node string, boot, seq uint64, sees []string, key []byte) []byte {
	b := []byte{version}
	b = binary.BigEndian.AppendUint64(b, boot)
	b = binary.BigEndian.AppendUint64(b, seq)
	b = appendString(b, node)
	b = binary.BigEndian.AppendUint16(b, uint16(len(sees)))
	for _, s := range sees {
		b = appendString(b, s)
	}
	mac := hmac.New(sha256.New, key)
	mac.Write(b)
	return mac.Sum(b)
}

func appendString(b []byte, s string) []byte {
	if len(s) > 255 {
		s = s[:255]
	}
	b = append(b, byte(len(s)))
	return append(b, s...)
}

var errFormat = errors.New("malformed heartbeat")

func decode(b []byte, keys [][]byte) (heartbeat, error) {
	if len(b) < 1+8+8+1+2+sha256.Size {
		return heartbeat{}, errFormat
	}
	body, sum := b[:len(b)-sha256.Size], b[len(b)-sha256.Size:]
	ok := false
	for _, k := range keys {
		mac := hmac.New(sha256.New, k)
		mac.Write(body)
		if hmac.Equal(mac.Sum(nil), sum) {
			ok = true
			break
		}
	}
	if !ok {
		return heartbeat{}, errors.New("bad signature")
	}
	if body[0] != version {
		return heartbeat{}, fmt.Errorf("heartbeat version %d", body[0])
	}
	hb := heartbeat{boot: binary.BigEndian.Uint64(body[1:9]), seq: binary.BigEndian.Uint64(body[9:17])}
	rest := body[17:]
	var err error
	if hb.node, rest, err = readString(rest); err != nil {
		return heartbeat{}, err
	}
	if len(rest) < 2 {
		return heartbeat{}, errFormat
	}
	n := int(binary.BigEndian.Uint16(rest))
	rest = rest[2:]
	for range n {
		var s string
		if s, rest, err = readString(rest); err != nil {
			return heartbeat{}, err
		}
		hb.sees = append(hb.sees, s)
	}
	if len(rest) != 0 {
		return heartbeat{}, errFormat
	}
	return hb, nil
}

func readString(b []byte) (string, []byte, error) {
	if len(b) < 1 || len(b) < 1+int(b[0]) {
		return "", nil, errFormat
	}
	return string(b[1 : 1+int(b[0])]), b[1+int(b[0]):], nil
}
