package failover

import (
	"crypto/ecdh"
	"crypto/rand"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"
	"golang.org/x/net/ipv4"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// freePort finds a UDP port free on 127.0.0.1 through 127.0.0.4.
func freePort(t *testing.T) uint16 {
	t.Helper()
	for p := uint16(20000 + time.Now().UnixNano()%20000); ; p++ {
		var cs []*net.UDPConn
		ok := true
		for i := 1; i <= 4; i++ {
			c, err := net.ListenUDP("udp4", net.UDPAddrFromAddrPort(netip.AddrPortFrom(loop(i), p)))
			if err != nil {
				ok = false
				break
			}
			cs = append(cs, c)
		}
		for _, c := range cs {
			c.Close()
		}
		if ok {
			return p
		}
	}
}

func loop(i int) netip.Addr { return netip.AddrFrom4([4]byte{127, 0, 0, byte(i)}) }

func memIdentity(t testing.TB) *Identity {
	t.Helper()
	id, err := LoadIdentity("", time.Now())
	if err != nil {
		t.Fatal(err)
	}
	return id
}

// node is one monitor of a test cluster on loopback.
type node struct {
	name string
	addr netip.Addr
	id   *Identity
	m    *Monitor
}

func (n *node) peer() Peer { return Peer{Node: n.name, Addr: n.addr, PublicKeys: n.id.PublicKeys()} }

// cluster starts n monitors (node0 on 127.0.0.1, ...) that know each other's keys.
func cluster(t *testing.T, port uint16, n int, cfg func(i int, c *Config)) []*node {
	t.Helper()
	var nodes []*node
	for i := range n {
		nodes = append(nodes, &node{name: fmt.Sprintf("node%d", i), addr: loop(i + 1), id: memIdentity(t)})
	}
	for i, nd := range nodes {
		c := Config{Node: nd.name, Listen: netip.AddrPortFrom(nd.addr, port), Interval: 20 * time.Millisecond, Identity: nd.id}
		if cfg != nil {
			cfg(i, &c)
		}
		m, err := New(c)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { m.Close() })
		nd.m = m
	}
	for _, nd := range nodes {
		var peers []Peer
		for _, o := range nodes {
			peers = append(peers, o.peer())
		}
		nd.m.SetPeers(peers)
	}
	return nodes
}

func waitUntil(t *testing.T, timeout time.Duration, what string, cond func() bool) time.Duration {
	t.Helper()
	begin := time.Now()
	for !cond() {
		if time.Since(begin) > timeout {
			t.Fatalf("%s: not within %s", what, timeout)
		}
		time.Sleep(2 * time.Millisecond)
	}
	return time.Since(begin)
}

func allSeeEachOther(nodes []*node) bool {
	for _, a := range nodes {
		for _, b := range nodes {
			if a != b && (!a.m.Alive(b.name) || !a.m.Sees(b.name)) {
				return false
			}
		}
	}
	return true
}

func TestNodesSeeEachOtherAndNoticeADeath(t *testing.T) {
	nodes := cluster(t, freePort(t), 3, nil)
	waitUntil(t, 5*time.Second, "all alive and seeing each other", func() bool { return allSeeEachOther(nodes) })
	nodes[2].m.Close()
	took := waitUntil(t, 5*time.Second, "node2's death noticed", func() bool {
		return !nodes[0].m.Alive("node2") && !nodes[1].m.Alive("node2")
	})
	t.Logf("death noticed after %s (interval 20ms x 3)", took.Round(time.Millisecond))
	if got := nodes[0].m.AliveNodes(); !slices.Equal(got, []string{"node1"}) {
		t.Errorf("node0 sees %v alive", got)
	}
	if c := nodes[0].m.Counters(); c.Accepted == 0 || c.Sent == 0 || len(c.Refused) != 0 {
		t.Errorf("node0's counters %+v; want heartbeats sent and accepted, none refused", c)
	}
}

func TestANewPeerCountsAsAliveUntilItCouldHaveBeenHeard(t *testing.T) {
	m, err := New(Config{Node: "me", Listen: netip.MustParseAddrPort("127.0.0.1:0"), Interval: 50 * time.Millisecond, Misses: 3})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	m.SetPeers([]Peer{{Node: "silent", Addr: loop(2), PublicKeys: memIdentity(t).PublicKeys()}})
	// At once, before any tick: the agent decides who answers right after SetPeers.
	if !m.Alive("silent") || !slices.Contains(m.AliveNodes(), "silent") {
		t.Error("a peer just added counts as dead until the next tick")
	}
	time.Sleep(60 * time.Millisecond)
	if !m.Alive("silent") {
		t.Error("a peer added 60ms ago (grace 150ms) counts as dead")
	}
	waitUntil(t, 5*time.Second, "the silent peer declared dead after the grace", func() bool { return !m.Alive("silent") })
}

func TestAPeerWithoutAKeyCountsAsDead(t *testing.T) {
	m, err := New(Config{Node: "me", Listen: netip.MustParseAddrPort("127.0.0.1:0"), Interval: 20 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	for name, keys := range map[string][][]byte{
		"no key":             nil,
		"a key of 31 bytes":  {make([]byte, 31)},
		"a low-order point":  {make([]byte, 32)}, // all zero: no shared secret
		"only unusable keys": {[]byte("short"), make([]byte, 32)},
	} {
		t.Run(name, func(t *testing.T) {
			m.SetPeers([]Peer{{Node: "keyless", Addr: loop(2), PublicKeys: keys}})
			if m.Alive("keyless") {
				t.Error("a peer that cannot be heard counts as alive")
			}
			time.Sleep(30 * time.Millisecond)
			if m.Alive("keyless") {
				t.Error("a peer that cannot be heard counts as alive after a tick")
			}
		})
	}
}

// TestChangesShowOnlyAfterOnChange checks the ordering an ordered hand-over relies on: node0
// says it sees node1 only after its OnChange for node1's arrival has returned, even when that
// OnChange is slow (and node0's heartbeats meanwhile keep it alive).
func TestChangesShowOnlyAfterOnChange(t *testing.T) {
	var firstDone atomic.Bool
	nodes := cluster(t, freePort(t), 2, func(i int, c *Config) {
		if i == 0 {
			c.OnChange = func(View) {
				if !firstDone.Load() {
					time.Sleep(200 * time.Millisecond) // ten intervals
					firstDone.Store(true)
				}
			}
		}
	})
	sawEarly := false
	waitUntil(t, 5*time.Second, "node1 sees that node0 sees it", func() bool {
		if nodes[1].m.Sees("node0") && !firstDone.Load() {
			sawEarly = true
		}
		return nodes[1].m.Sees("node0") && firstDone.Load()
	})
	if sawEarly {
		t.Error("node0's heartbeats showed node1 before node0's OnChange returned")
	}
	if !nodes[1].m.Alive("node0") {
		t.Error("a slow OnChange on node0 made node1 take it for dead")
	}
}

// sender sends datagrams from an address of its own, with a chosen TTL.
type sender struct {
	c  *net.UDPConn
	pc *ipv4.PacketConn
}

func newSender(t *testing.T, from netip.Addr, ttl int) *sender {
	t.Helper()
	c, err := net.ListenUDP("udp4", net.UDPAddrFromAddrPort(netip.AddrPortFrom(from, 0)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	pc := ipv4.NewPacketConn(c)
	if err := pc.SetTTL(ttl); err != nil {
		t.Fatal(err)
	}
	return &sender{c, pc}
}

func (s *sender) send(t *testing.T, b []byte, to netip.AddrPort) {
	t.Helper()
	if _, err := s.c.WriteToUDPAddrPort(b, to); err != nil {
		t.Fatal(err)
	}
}

// recorder keeps what a monitor sent, by destination.
type recorder struct {
	mu   sync.Mutex
	sent map[netip.Addr][][]byte
}

func (r *recorder) hook(b []byte, to netip.AddrPort) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.sent == nil {
		r.sent = map[netip.Addr][][]byte{}
	}
	r.sent[to.Addr()] = append(r.sent[to.Addr()], slices.Clone(b))
}

func (r *recorder) to(a netip.Addr) [][]byte {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.sent[a])
}

// lastEcho returns the nonce of the latest heartbeat me sent to a peer: what a fresh heartbeat
// from that peer to me echoes.
func (r *recorder) lastEcho(t *testing.T, to netip.Addr) uint64 {
	t.Helper()
	sent := r.to(to)
	if len(sent) == 0 {
		t.Fatal("nothing sent yet")
	}
	f, err := parseFrame(sent[len(sent)-1])
	if err != nil {
		t.Fatal(err)
	}
	return f.nonce
}

// craft makes a heartbeat from a node with key identity from to the node me, signed with the
// pair key that signer derives (signer is from unless the test forges).
func craft(t *testing.T, signer *Identity, signerName string, from *Identity, me *Identity, meName string, f frame) []byte {
	t.Helper()
	mk := from.current()[0]
	theirs := me.current()[0]
	pub, err := ecdhPublic(theirs.pub)
	if err != nil {
		t.Fatal(err)
	}
	send, _, err := pairKeys(signer.current()[0].priv, pub, signerName, meName)
	if err != nil {
		t.Fatal(err)
	}
	f.from, f.to = mk.id, theirs.id
	return appendFrame(nil, f, newMAC(send))
}

// later is what an agent of a later heartbeat version would send from b to me: version 3, the
// fields of version 2 at their places, then ext, all under the MAC.
func later(t *testing.T, b *Identity, me *Identity, f frame, ext []byte) []byte {
	t.Helper()
	pub, err := ecdhPublic(me.current()[0].pub)
	if err != nil {
		t.Fatal(err)
	}
	send, _, err := pairKeys(b.current()[0].priv, pub, "b", "me")
	if err != nil {
		t.Fatal(err)
	}
	f.from, f.to = b.current()[0].id, me.current()[0].id
	body := append(appendBody(nil, version+1, f), ext...)
	mac := newMAC(send)
	mac.Write(body)
	return mac.Sum(body)
}

func ecdhPublic(b []byte) (*ecdh.PublicKey, error) { return ecdh.X25519().NewPublicKey(b) }

func TestEachCheckRefusesWhatItShouldAndCountsIt(t *testing.T) {
	port := freePort(t)
	meID, bID, cID := memIdentity(t), memIdentity(t), memIdentity(t)
	rec := &recorder{}
	me, err := New(Config{Node: "me", Listen: netip.AddrPortFrom(loop(1), port), Interval: 20 * time.Millisecond, Identity: meID, sent: rec.hook})
	if err != nil {
		t.Fatal(err)
	}
	defer me.Close()
	me.SetPeers([]Peer{
		{Node: "b", Addr: loop(2), PublicKeys: bID.PublicKeys()},
		{Node: "c", Addr: loop(3), PublicKeys: cID.PublicKeys()},
	})
	dst := netip.AddrPortFrom(loop(1), port)
	fromB := newSender(t, loop(2), 255)
	waitUntil(t, 2*time.Second, "me sends heartbeats", func() bool { return len(rec.to(loop(2))) > 0 && len(rec.to(loop(3))) > 0 })

	seq := uint64(100)
	good := func() []byte {
		seq++
		return craft(t, bID, "b", bID, meID, "me", frame{at: seqKey{1, seq}, echo: rec.lastEcho(t, loop(2))})
	}
	accepted := func() uint64 { return me.Counters().Accepted }
	expect := func(t *testing.T, reason string, b []byte, s *sender) {
		t.Helper()
		before := me.Counters()
		s.send(t, b, dst)
		waitUntil(t, 2*time.Second, "the refusal counted as "+reason, func() bool {
			return me.Counters().Refused[reason] > before.Refused[reason]
		})
		if after := me.Counters(); after.Accepted != before.Accepted {
			t.Errorf("a datagram refused as %s was also accepted", reason)
		}
	}
	t.Run("a well-made heartbeat is accepted", func(t *testing.T) {
		before := accepted()
		fromB.send(t, good(), dst)
		waitUntil(t, 2*time.Second, "accepted", func() bool { return accepted() > before })
	})
	t.Run("a later version's heartbeat, with fields this one does not know, is accepted", func(t *testing.T) {
		// A rolling update runs two versions side by side: neither may take the other for dead.
		before := accepted()
		seq++
		fromB.send(t, later(t, bID, meID, frame{at: seqKey{1, seq}, echo: rec.lastEcho(t, loop(2))}, []byte("new fields")), dst)
		waitUntil(t, 2*time.Second, "accepted", func() bool { return accepted() > before })
	})
	replayed := good()
	before := accepted()
	fromB.send(t, replayed, dst)
	waitUntil(t, 2*time.Second, "accepted", func() bool { return accepted() > before })
	for _, tc := range []struct {
		name, reason string
		b            func() []byte
		s            *sender
	}{
		{"a datagram of another size is refused", RefusedSize, func() []byte { return append(good(), 0) }, fromB},
		{"a datagram that crossed a router (TTL 64) is refused", RefusedTTL, good, newSender(t, loop(2), 64)},
		{"a datagram from an address that is no peer's is refused", RefusedSource, good, newSender(t, loop(4), 255)},
		{"a datagram of an earlier version is refused", RefusedVersion, func() []byte { b := good(); b[0] = 1; return b }, fromB},
		{"a datagram longer than any heartbeat is refused", RefusedSize, func() []byte {
			seq++
			return later(t, bID, meID, frame{at: seqKey{1, seq}, echo: rec.lastEcho(t, loop(2))}, make([]byte, maxFrameSize))
		}, fromB},
		{"a later version's heartbeat with a flipped bit in what this one does not read is refused", RefusedMAC, func() []byte {
			seq++
			b := later(t, bID, meID, frame{at: seqKey{1, seq}, echo: rec.lastEcho(t, loop(2))}, []byte("new fields"))
			b[bodySize+2] ^= 1
			return b
		}, fromB},
		{"a heartbeat made with a key the peer does not have is refused", RefusedKey, func() []byte {
			return craft(t, memIdentity(t), "b", memIdentity(t), meID, "me", frame{at: seqKey{1, 500}, echo: rec.lastEcho(t, loop(2))})
		}, fromB},
		{"a heartbeat seen before is refused", RefusedReplay, func() []byte { return replayed }, fromB},
		{"a heartbeat echoing a nonce me never sent is refused", RefusedStale, func() []byte {
			seq++
			return craft(t, bID, "b", bID, meID, "me", frame{at: seqKey{1, seq}, echo: 12345})
		}, fromB},
		{"a heartbeat echoing what me sent another peer is refused", RefusedStale, func() []byte {
			seq++
			return craft(t, bID, "b", bID, meID, "me", frame{at: seqKey{1, seq}, echo: rec.lastEcho(t, loop(3))})
		}, fromB},
		{"a node's own key used to forge another node's heartbeat is refused", RefusedMAC, func() []byte {
			// c holds only its own key: it derives its own pair key with me and claims to be b.
			seq++
			return craft(t, cID, "c", bID, meID, "me", frame{at: seqKey{1, seq}, echo: rec.lastEcho(t, loop(2))})
		}, fromB},
		{"a heartbeat with a flipped bit is refused", RefusedMAC, func() []byte { b := good(); b[41] ^= 1; return b }, fromB},
	} {
		t.Run(tc.name, func(t *testing.T) { expect(t, tc.reason, tc.b(), tc.s) })
	}
	t.Run("forged heartbeats with a fresh echo are each checked and refused, and b's own still count", func(t *testing.T) {
		// c, holding only its own key, derives its pair key with me and claims to be b, with
		// the best echo there is: they pass every pre-check.
		pub, err := ecdhPublic(meID.current()[0].pub)
		if err != nil {
			t.Fatal(err)
		}
		forge, _, err := pairKeys(cID.current()[0].priv, pub, "c", "me")
		if err != nil {
			t.Fatal(err)
		}
		before := me.Counters()
		e := rec.lastEcho(t, loop(2))
		var burst [][]byte
		for i := range 200 {
			f := frame{from: bID.current()[0].id, to: meID.current()[0].id, at: seqKey{1, seq + uint64(i) + 1}, echo: e}
			burst = append(burst, appendFrame(nil, f, newMAC(forge)))
		}
		seq += 201
		for _, b := range burst {
			fromB.send(t, b, dst)
		}
		fromB.send(t, good(), dst) // b's real one, right behind the burst
		waitUntil(t, 2*time.Second, "refusals counted", func() bool {
			return me.Counters().Refused[RefusedMAC]-before.Refused[RefusedMAC] == 200
		})
		waitUntil(t, 2*time.Second, "b's own heartbeat accepted", func() bool { return me.Counters().Accepted > before.Accepted })
	})
}

// TestReplaysKeepNoDeadNodeAlive captures b's heartbeats to me over three boots of b, kills b,
// and replays them all from b's address, mixing boots and orders, as fast as they go: me
// declares b dead within the usual bound nonetheless, whether me remembers b's last heartbeat
// or has restarted since (and remembers nothing).
func TestReplaysKeepNoDeadNodeAlive(t *testing.T) {
	port := freePort(t)
	const interval, misses = 20 * time.Millisecond, 3
	bDir, meDir := t.TempDir(), t.TempDir()
	startMe := func() (*Monitor, *Identity) {
		id, err := LoadIdentity(meDir, time.Now())
		if err != nil {
			t.Fatal(err)
		}
		m, err := New(Config{Node: "me", Listen: netip.AddrPortFrom(loop(1), port), Interval: interval, Misses: misses, Identity: id})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { m.Close() })
		return m, id
	}
	me, meID := startMe()
	var bID *Identity
	var captured [][]byte
	bootB := func() *Monitor {
		var err error
		if bID, err = LoadIdentity(bDir, time.Now()); err != nil {
			t.Fatal(err)
		}
		rec := &recorder{}
		b, err := New(Config{Node: "b", Listen: netip.AddrPortFrom(loop(2), port), Interval: interval, Misses: misses, Identity: bID, sent: rec.hook})
		if err != nil {
			t.Fatal(err)
		}
		b.SetPeers([]Peer{{Node: "me", Addr: loop(1), PublicKeys: meID.PublicKeys()}})
		me.SetPeers([]Peer{{Node: "b", Addr: loop(2), PublicKeys: bID.PublicKeys()}})
		waitUntil(t, 5*time.Second, "me hears b", func() bool { return me.Alive("b") && me.Sees("b") })
		time.Sleep(300 * time.Millisecond) // capture some
		captured = append(captured, rec.to(loop(1))...)
		return b
	}
	for range 2 {
		bootB().Close()
	}
	b := bootB()
	t.Logf("captured %d heartbeats of b over three boots", len(captured))

	replay := func(stop <-chan struct{}, n *atomic.Int64) {
		attacker := newSender(t, loop(2), 255)
		for round := 0; ; round++ {
			for i := range captured {
				j := i
				if round%2 == 1 {
					j = len(captured) - 1 - i
				}
				if j%2 == 1 {
					j = (j + len(captured)/2) % len(captured) // interleave the boots
				}
				select {
				case <-stop:
					return
				default:
				}
				_, _ = attacker.c.WriteToUDPAddrPort(captured[j], netip.AddrPortFrom(loop(1), port))
				if n.Add(1)%8 == 0 {
					time.Sleep(time.Millisecond)
				}
			}
		}
	}
	bound := time.Duration(misses+2) * interval * 3 // generous for a loaded machine
	underReplays := func(t *testing.T, me *Monitor, kill func()) {
		before := me.Counters()
		var n atomic.Int64
		stop := make(chan struct{})
		done := make(chan struct{})
		kill()
		go func() { defer close(done); replay(stop, &n) }()
		took := waitUntil(t, 5*time.Second, "b's death noticed under replays", func() bool { return !me.Alive("b") })
		time.Sleep(500 * time.Millisecond) // b stays dead while the replays go on
		close(stop)
		<-done
		after := me.Counters()
		refused := map[string]uint64{}
		for r, c := range after.Refused {
			refused[r] = c - before.Refused[r]
		}
		t.Logf("%d replays: b's death noticed after %s; refused %v", n.Load(), took.Round(time.Millisecond), refused)
		if me.Alive("b") {
			t.Error("replayed heartbeats brought b back to life")
		}
		if took > bound {
			t.Errorf("b's death took %s to notice under replays; the usual bound is %s", took, bound)
		}
		if got := after.Accepted - before.Accepted; got > 3 {
			t.Errorf("%d replayed heartbeats were counted for liveness", got)
		}
	}
	t.Run("me remembers b's last heartbeat", func(t *testing.T) {
		underReplays(t, me, func() { b.Close() })
	})
	t.Run("me restarted since and remembers nothing", func(t *testing.T) {
		me.Close()
		me2, meID2 := startMe()
		if meID2.Boot() <= meID.Boot() {
			t.Fatalf("me's boot went from %d to %d", meID.Boot(), meID2.Boot())
		}
		me2.SetPeers([]Peer{{Node: "b", Addr: loop(2), PublicKeys: bID.PublicKeys()}})
		underReplays(t, me2, func() {})
	})
}

func TestKeyRotationCausesNoFailover(t *testing.T) {
	port := freePort(t)
	nodes := cluster(t, port, 2, nil)
	a, b := nodes[0], nodes[1]
	waitUntil(t, 5*time.Second, "a and b see each other", func() bool { return allSeeEachOther(nodes) })
	var flaps atomic.Int64
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			select {
			case <-stop:
				return
			case <-time.After(2 * time.Millisecond):
				if !a.m.Alive(b.name) || !b.m.Alive(a.name) {
					flaps.Add(1)
				}
			}
		}
	}()
	oldKeys := b.id.PublicKeys()
	if ok, err := b.id.Rotate(time.Now()); !ok || err != nil {
		t.Fatalf("Rotate = %v, %v", ok, err)
	}
	if ok, _ := b.id.Rotate(time.Now()); ok {
		t.Error("a second rotation started before the first ended")
	}
	newKeys := b.id.PublicKeys()
	if len(newKeys) != 2 || string(newKeys[1]) != string(oldKeys[0]) {
		t.Fatalf("after Rotate b publishes %d keys; want the new then the old", len(newKeys))
	}
	time.Sleep(300 * time.Millisecond) // a does not know b's new key yet (the CCM is slow)
	if len(b.id.PublicKeys()) != 2 {
		t.Error("b retired its old key while a still used it")
	}
	a.m.SetPeers([]Peer{b.peer()}) // the CCM hands a b's new keys
	waitUntil(t, 5*time.Second, "b's rotation ends", func() bool { return len(b.id.PublicKeys()) == 1 })
	if string(b.id.PublicKeys()[0]) != string(newKeys[0]) {
		t.Error("b kept the old key and retired the new one")
	}
	a.m.SetPeers([]Peer{b.peer()}) // the CCM hands a b's key list without the old key
	time.Sleep(300 * time.Millisecond)
	close(stop)
	wg.Wait()
	if n := flaps.Load(); n > 0 {
		t.Errorf("a or b counted the other dead %d times during the rotation", n)
	}
	if !allSeeEachOther(nodes) {
		t.Error("a and b do not see each other after the rotation")
	}
}

func TestIdentityKeepsItsKeysAndCountsBoots(t *testing.T) {
	dir := t.TempDir()
	first, err := LoadIdentity(dir, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	second, err := LoadIdentity(dir, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	if first.Boot() != 1 || second.Boot() != 2 {
		t.Errorf("boots %d then %d; want 1 then 2", first.Boot(), second.Boot())
	}
	if !slices.EqualFunc(first.PublicKeys(), second.PublicKeys(), func(a, b []byte) bool { return string(a) == string(b) }) {
		t.Error("a restart changed the keys")
	}
	info, err := os.Stat(filepath.Join(dir, IdentityFile))
	if err != nil || info.Mode().Perm() != 0o600 {
		t.Errorf("identity file: %v, %v; want mode 0600", info, err)
	}
	for _, pub := range second.PublicKeys() {
		if len(pub) != 32 || ValidPublicKey(pub) != nil {
			t.Errorf("a public key of %d bytes that does not validate", len(pub))
		}
		if string(pub) == string(second.current()[0].priv.Bytes()) {
			t.Error("PublicKeys returns the private key")
		}
	}

	t.Run("a corrupt file is moved aside and a new key made", func(t *testing.T) {
		if err := os.WriteFile(filepath.Join(dir, IdentityFile), []byte(`{"boot": 7, "keys": [`), 0o600); err != nil {
			t.Fatal(err)
		}
		id, err := LoadIdentity(dir, time.Now())
		if err == nil || !strings.Contains(err.Error(), "moved to") {
			t.Errorf("LoadIdentity on a corrupt file: %v; want an error saying it was moved aside", err)
		}
		if id == nil || len(id.PublicKeys()) != 1 || string(id.PublicKeys()[0]) == string(second.PublicKeys()[0]) {
			t.Fatal("no new key after a corrupt file")
		}
		if _, err := os.Stat(filepath.Join(dir, IdentityFile+".corrupt")); err != nil {
			t.Errorf("the corrupt file was not kept aside: %v", err)
		}
		again, err := LoadIdentity(dir, time.Now())
		if err != nil || string(again.PublicKeys()[0]) != string(id.PublicKeys()[0]) || again.Boot() != id.Boot()+1 {
			t.Errorf("after recovery: %v, boot %d; want the new key kept and the boot counted", err, again.Boot())
		}
	})
}

// Issue 30, fault 3: a start whose boot counter could not be saved (a full or read-only
// disk) reuses the last boot's counter. Its heartbeats must still come after the last boot's,
// which its peers remember: with sequences from 0 they were refused as replays until they
// caught up, the node counted as dead, and both it and its standby answered its VIPs.
func TestAStartThatCouldNotSaveItsBootCounterStillSendsNewerHeartbeats(t *testing.T) {
	dir := t.TempDir()
	t0 := time.Now()
	if _, err := LoadIdentity(dir, t0); err != nil {
		t.Fatal(err)
	}
	saved, err := os.ReadFile(filepath.Join(dir, IdentityFile))
	if err != nil {
		t.Fatal(err)
	}
	last, err := LoadIdentity(dir, t0.Add(time.Second))
	if err != nil {
		t.Fatal(err)
	}
	var lastSent seqKey
	for range 100000 { // 100,000 heartbeats: over 16 minutes of 10 ms rounds
		lastSent = seqKey{last.Boot(), last.nextSeq()}
	}
	// The disk lost the save of that start: the next one reads the file as before it.
	if err := os.WriteFile(filepath.Join(dir, IdentityFile), saved, 0o600); err != nil {
		t.Fatal(err)
	}
	next, err := LoadIdentity(dir, t0.Add(2*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	if next.Boot() != last.Boot() {
		t.Fatalf("boot %d after %d; the test wants the counter reused", next.Boot(), last.Boot())
	}
	if first := (seqKey{next.Boot(), next.nextSeq()}); !first.after(lastSent) {
		t.Errorf("the first heartbeat of the next start %v is not after the last of the start before %v: peers refuse it as a replay", first, lastSent)
	}
}

func TestRotationIsDueByAge(t *testing.T) {
	now := time.Now()
	id, err := LoadIdentity("", now)
	if err != nil {
		t.Fatal(err)
	}
	if id.RotationDue(now.Add(time.Hour), 2*time.Hour) {
		t.Error("a key of 1h is due with a lifetime of 2h")
	}
	if !id.RotationDue(now.Add(3*time.Hour), 2*time.Hour) {
		t.Error("a key of 3h is not due with a lifetime of 2h")
	}
	if _, err := id.Rotate(now.Add(3 * time.Hour)); err != nil {
		t.Fatal(err)
	}
	if id.RotationDue(now.Add(10*time.Hour), 2*time.Hour) {
		t.Error("a new rotation is due while one is under way")
	}
}

func FuzzParseFrame(f *testing.F) {
	mac := newMAC(macKey{})
	f.Add(appendFrame(nil, frame{at: seqKey{1, 2}, nonce: 3, echo: 4, flags: flagAlive}, mac))
	f.Add([]byte{2, 3})
	f.Fuzz(func(t *testing.T, b []byte) {
		fr, err := parseFrame(b)
		if err != nil {
			return
		}
		if again := appendFrame(nil, fr, mac); string(again[:bodySize]) != string(b[:bodySize]) {
			t.Fatal("parse and append disagree")
		}
	})
}

// BenchmarkRefusingAFlood measures what one datagram of a flood costs the receive path: from a
// stranger's address, from a peer's address with random content, and forged so well that only
// the MAC refuses it (the worst case).
func BenchmarkRefusingAFlood(b *testing.B) {
	meID, peerID := memIdentity(b), memIdentity(b)
	m, err := New(Config{Node: "me", Listen: netip.MustParseAddrPort("127.0.0.1:0"), Identity: meID})
	if err != nil {
		b.Fatal(err)
	}
	defer m.Close()
	m.SetPeers([]Peer{{Node: "peer", Addr: loop(2), PublicKeys: peerID.PublicKeys()}})
	junk := make([]datagram, batch)
	for i := range junk {
		d := make([]byte, frameSize)
		_, _ = rand.Read(d)
		d[0] = version
		junk[i] = datagram{data: d, ttl: 255}
	}
	forged := make([]datagram, batch)
	for i := range forged {
		f := frame{from: peerID.current()[0].id, to: meID.current()[0].id, at: seqKey{1 << 50, uint64(i)}}
		forged[i] = datagram{data: appendFrame(nil, f, newMAC(macKey{})), from: loop(2), ttl: 255}
	}
	for _, tc := range []struct {
		name string
		dgs  []datagram
		from netip.Addr
	}{{"random from a stranger", junk, loop(9)}, {"random from a peer", junk, loop(2)}, {"forged, refused by the MAC", forged, loop(2)}} {
		b.Run(tc.name, func(b *testing.B) {
			for i := range tc.dgs {
				tc.dgs[i].from = tc.from
			}
			b.ReportAllocs()
			for b.Loop() {
				m.handle(tc.dgs, time.Now())
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*batch), "ns/datagram")
		})
	}
}

// A state names the same peers' keys in every Apply: SetPeers keeps the MAC keys derived with
// them (a scalar multiplication each), and drops those of a key the peer no longer has, even
// one with the same short id.
func TestSetPeersKeepsThePairsOfUnchangedKeys(t *testing.T) {
	m, err := New(Config{Node: "me", Listen: netip.MustParseAddrPort("127.0.0.1:0"), Interval: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	keyB, keyC := memIdentity(t).PublicKeys()[0], memIdentity(t).PublicKeys()[0]
	peers := []Peer{{Node: "b", Addr: loop(2), PublicKeys: [][]byte{keyB}}, {Node: "c", Addr: loop(3), PublicKeys: [][]byte{keyC}}}
	m.SetPeers(peers)
	pairOf := func(node string) *pair {
		m.mu.Lock()
		defer m.mu.Unlock()
		p := m.peers[node]
		return m.pairOf(p, m.id.current()[0], p.keys[0])
	}
	b, c := pairOf("b"), pairOf("c")
	if b == nil || c == nil {
		t.Fatal("no pair derived")
	}
	m.SetPeers(peers)
	if pairOf("b") != b || pairOf("c") != c {
		t.Error("SetPeers with the same keys derived the pairs again")
	}

	keyB2 := memIdentity(t).PublicKeys()[0]
	m.SetPeers([]Peer{{Node: "b", Addr: loop(2), PublicKeys: [][]byte{keyB2}}, peers[1]})
	if pairOf("b") == b {
		t.Error("b's pair kept after its key changed")
	}
	if pairOf("c") != c {
		t.Error("c's pair dropped when only b's key changed")
	}

	// The same short id, other bytes: the pair is not the old one's.
	b2 := pairOf("b")
	m.mu.Lock()
	forged := m.peers["b"].keys[0]
	m.mu.Unlock()
	other, err := ecdh.X25519().NewPublicKey(keyB)
	if err != nil {
		t.Fatal(err)
	}
	np := &peer{keys: []peerKey{{id: forged.id, pub: other}}, pairs: map[[2]keyID]*pair{}}
	m.mu.Lock()
	keepPairs(np, m.peers["b"], m.id.current())
	m.mu.Unlock()
	if len(np.pairs) != 0 {
		t.Errorf("a key with the same id and other bytes kept the pair %p (old %p)", np.pairs, b2)
	}

	m.SetPeers([]Peer{{Node: "b", Addr: loop(4), PublicKeys: [][]byte{keyB2}}, peers[1]})
	if pairOf("b") == b2 {
		t.Error("b's pair kept after its address changed")
	}
}

// Keys ValidPublicKey accepted are remembered; refused ones are checked again every time.
func TestValidPublicKeyRemembersOnlyAcceptedKeys(t *testing.T) {
	good := memIdentity(t).PublicKeys()[0]
	for range 2 {
		if err := ValidPublicKey(good); err != nil {
			t.Fatalf("a fresh key refused: %v", err)
		}
		if err := ValidPublicKey(make([]byte, 32)); err == nil {
			t.Fatal("the all-zero point accepted")
		}
		if err := ValidPublicKey(good[:31]); err == nil {
			t.Fatal("31 bytes accepted")
		}
	}
	if !validKeys.has([32]byte(good)) || validKeys.has([32]byte{}) {
		t.Error("the set of accepted keys is not what was accepted")
	}
	validKeys.mu.Lock()
	validKeys.m = make(map[[32]byte]struct{}, maxValidKeys)
	for i := range maxValidKeys {
		validKeys.m[[32]byte{byte(i), byte(i >> 8), 1}] = struct{}{}
	}
	validKeys.mu.Unlock()
	if err := ValidPublicKey(good); err != nil {
		t.Fatal(err)
	}
	validKeys.mu.Lock()
	n := len(validKeys.m)
	validKeys.mu.Unlock()
	if n > maxValidKeys {
		t.Errorf("%d keys remembered; at most %d", n, maxValidKeys)
	}
}

// BenchmarkSetPeersUnchanged is SetPeers with the same 200 peers of two keys each, as every
// Apply of a node in a large cluster calls it, the pairs of each peer's first key derived.
func BenchmarkSetPeersUnchanged(b *testing.B) {
	m, err := New(Config{Node: "me", Listen: netip.MustParseAddrPort("127.0.0.1:0"), Interval: time.Hour})
	if err != nil {
		b.Fatal(err)
	}
	defer m.Close()
	var peers []Peer
	for i := range 200 {
		id := memIdentity(b)
		if _, err := id.Rotate(time.Now()); err != nil {
			b.Fatal(err)
		}
		peers = append(peers, Peer{Node: fmt.Sprintf("n%d", i), Addr: netip.AddrFrom4([4]byte{127, 1, byte(i / 250), byte(i%250 + 1)}), PublicKeys: id.PublicKeys()})
	}
	m.SetPeers(peers)
	derive := func() {
		m.mu.Lock()
		defer m.mu.Unlock()
		for _, p := range m.peers {
			if m.pairOf(p, m.id.current()[0], p.keys[0]) == nil {
				b.Fatal("no pair")
			}
		}
	}
	derive()
	b.ReportAllocs()
	for b.Loop() {
		m.SetPeers(peers)
		derive()
	}
}

// A peer is dead misses intervals after it was last proven alive (or added), not at the first
// tick after that: the evaluator looks again when a live peer's time runs out. Ticks every
// 500 ms, 2 misses: a peer added right after a tick and never heard runs out 1 s later, a tick
// would see it 1.5 s later.
func TestAPeerIsDeadWhenItsTimeRunsOutNotAtTheNextTick(t *testing.T) {
	ticked := make(chan struct{}, 1)
	var mp atomic.Pointer[Monitor]
	died := make(chan time.Time, 1)
	lateDead := func(m *Monitor) bool {
		m.mu.Lock()
		defer m.mu.Unlock()
		return m.peers["late"] != nil && !m.alive["late"]
	}
	// A port of its own: heartbeats go to the peers on the listening port, and only sent ones
	// show in the hook.
	m, err := New(Config{Node: "me", Listen: netip.AddrPortFrom(loop(1), freePort(t)), Interval: 500 * time.Millisecond, Misses: 2,
		sent: func([]byte, netip.AddrPort) {
			select {
			case ticked <- struct{}{}:
			default:
			}
		},
		OnChange: func(View) {
			if m := mp.Load(); m != nil && lateDead(m) {
				select {
				case died <- time.Now():
				default:
				}
			}
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	mp.Store(m)
	early := Peer{Node: "early", Addr: loop(2), PublicKeys: memIdentity(t).PublicKeys()}
	m.SetPeers([]Peer{early}) // something to send to, so that the ticks show
	<-ticked
	<-ticked // a tick just now (the first may have been waiting in the channel)
	added := time.Now()
	m.SetPeers([]Peer{early, {Node: "late", Addr: loop(3), PublicKeys: memIdentity(t).PublicKeys()}})
	select {
	case at := <-died:
		if took := at.Sub(added); took < time.Second || took > 1250*time.Millisecond {
			t.Errorf("the silent peer counted as dead %s after it was added; want 1s (2 misses of 500ms), not 1.5s (the next tick)", took.Round(time.Millisecond))
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the silent peer never counted as dead")
	}
}

// A peer's lapse (it stopped counting this node alive, however briefly) reaches this node in
// the peer's next heartbeats even when none of them showed the lapse itself: the count in the
// flags changes. Seen in a CI run with 10 ms heartbeats: a standby took the owner for dead for
// 3 ms, answered its VIP, gave it back, and no heartbeat in between said so; the client kept
// the standby's MAC.
func TestALapseReachesThePeerThoughNoHeartbeatShowedIt(t *testing.T) {
	t.Run("this node's heartbeats count the times it stopped counting a peer alive", func(t *testing.T) {
		rec := &recorder{}
		m, err := New(Config{Node: "me", Listen: netip.AddrPortFrom(loop(1), freePort(t)), Interval: 10 * time.Millisecond, Misses: 2, Identity: memIdentity(t), sent: rec.hook})
		if err != nil {
			t.Fatal(err)
		}
		defer m.Close()
		// Never heard: alive for the first 20 ms, dead after, once.
		m.SetPeers([]Peer{{Node: "b", Addr: loop(2), PublicKeys: memIdentity(t).PublicKeys()}})
		lapses := func() []byte {
			var out []byte
			for _, b := range rec.to(loop(2)) {
				f, err := parseFrame(b)
				if err != nil {
					t.Fatal(err)
				}
				out = append(out, f.flags)
			}
			return slices.Compact(out)
		}
		waitUntil(t, 5*time.Second, "heartbeats after b's death", func() bool { l := lapses(); return len(l) > 0 && l[len(l)-1] == 1<<lapseShift })
		// Before the first evaluation a heartbeat shows nothing (0); then alive (1), then
		// dead with one lapse, for good.
		got := lapses()
		for i, f := range got {
			if f != 0 && f != flagAlive && (f != 1<<lapseShift || i != len(got)-1) {
				t.Errorf("flags of the heartbeats to b: %v; want 0 or alive (%d), then dead with one lapse (%d)", got, flagAlive, 1<<lapseShift)
				break
			}
		}
	})

	t.Run("a peer's changed count is a change, its first and an unchanged one are not", func(t *testing.T) {
		port := freePort(t)
		meID, bID := memIdentity(t), memIdentity(t)
		rec := &recorder{}
		var changes atomic.Int64
		me, err := New(Config{Node: "me", Listen: netip.AddrPortFrom(loop(1), port), Interval: 20 * time.Millisecond, Identity: meID, sent: rec.hook,
			OnChange: func(View) { changes.Add(1) }})
		if err != nil {
			t.Fatal(err)
		}
		defer me.Close()
		me.SetPeers([]Peer{{Node: "b", Addr: loop(2), PublicKeys: bID.PublicKeys()}})
		fromB := newSender(t, loop(2), 255)
		waitUntil(t, 2*time.Second, "me sends heartbeats", func() bool { return len(rec.to(loop(2))) > 0 })
		seq := uint64(0)
		send := func(lapses byte) {
			t.Helper()
			before := me.Counters().Accepted
			seq++
			fromB.send(t, craft(t, bID, "b", bID, meID, "me", frame{at: seqKey{1, seq}, echo: rec.lastEcho(t, loop(2)), flags: flagAlive | lapses<<lapseShift}), netip.AddrPortFrom(loop(1), port))
			waitUntil(t, 2*time.Second, "accepted", func() bool { return me.Counters().Accepted > before })
		}
		// What an older agent sends (no count), then the same: no lapse.
		send(0)
		send(0)
		waitUntil(t, 2*time.Second, "b alive and seeing me", func() bool { return me.Alive("b") && me.Sees("b") })
		if got := me.Lapses("b"); got != 0 {
			t.Errorf("lapses of b after two heartbeats with count 0: %d; want 0", got)
		}
		before := changes.Load()
		send(1)
		waitUntil(t, 2*time.Second, "the lapse counted", func() bool { return me.Lapses("b") == 1 })
		if changes.Load() == before {
			t.Error("OnChange did not run for b's lapse")
		}
		send(1)
		// The count wraps: 127 to 0 is a lapse too.
		send(127)
		send(0)
		waitUntil(t, 2*time.Second, "the lapses counted", func() bool { return me.Lapses("b") == 3 })
		if !me.Alive("b") || !me.Sees("b") {
			t.Error("b's lapses changed whether it is alive or sees me; want only the count")
		}
	})
}

// A departing peer (one the CCM cut off) hears this node as any peer does, but this node's
// heartbeats never show it alive: it counts this node alive and not seeing it, which is what
// makes it yield. Its own heartbeats are taken as any peer's, but this node never counts it
// alive: whatever its old state says, it answers nothing shared with this node.
func TestADepartingPeerHearsThisNodeButIsNeverShownAlive(t *testing.T) {
	nodes := cluster(t, freePort(t), 2, nil)
	kept, departing := nodes[0], nodes[1]
	waitUntil(t, 5*time.Second, "both see each other", func() bool { return allSeeEachOther(nodes) })
	p := departing.peer()
	p.Departing = true
	kept.m.SetPeers([]Peer{p})
	waitUntil(t, 5*time.Second, "the departing node no longer seen", func() bool { return !departing.m.Sees(kept.name) })
	time.Sleep(200 * time.Millisecond) // ten intervals: it stays so
	if !departing.m.Alive(kept.name) || departing.m.Sees(kept.name) {
		t.Errorf("the departing node: %s alive %v, sees it %v; want alive and not seeing it", kept.name, departing.m.Alive(kept.name), departing.m.Sees(kept.name))
	}
	if kept.m.Alive(departing.name) || !kept.m.Sees(departing.name) {
		t.Errorf("%s: the departing node alive %v, sees it %v; want not alive (it is neither yielded to nor waited for) though its heartbeats are taken", kept.name, kept.m.Alive(departing.name), kept.m.Sees(departing.name))
	}
	if slices.Contains(kept.m.AliveNodes(), departing.name) {
		t.Errorf("%s: AliveNodes %v counts the departing node (metalvip_agent_heartbeat_peers_alive would)", kept.name, kept.m.AliveNodes())
	}
	kept.m.SetPeers([]Peer{departing.peer()})
	waitUntil(t, 5*time.Second, "seen again once an ordinary peer", func() bool { return departing.m.Sees(kept.name) })
}

// Close returns without waiting for an OnChange under way, which may be waiting for a lock the
// caller of Close holds (the agent closes a monitor under its state lock, which OnChange
// takes); that OnChange is the last one, and Stopped says when it has returned.
func TestCloseDoesNotWaitForAnOnChangeUnderWay(t *testing.T) {
	entered, release := make(chan struct{}, 1), make(chan struct{})
	var calls atomic.Int64
	m, err := New(Config{Node: "me", Listen: netip.AddrPortFrom(loop(1), freePort(t)), Interval: 10 * time.Millisecond, Identity: memIdentity(t),
		OnChange: func(View) {
			calls.Add(1)
			select {
			case entered <- struct{}{}:
			default:
			}
			<-release
		}})
	if err != nil {
		t.Fatal(err)
	}
	m.SetPeers([]Peer{{Node: "b", Addr: loop(2), PublicKeys: memIdentity(t).PublicKeys()}})
	select {
	case <-entered:
	case <-time.After(5 * time.Second):
		t.Fatal("no OnChange for a new peer")
	}
	closed := make(chan error, 1)
	go func() { closed <- m.Close() }()
	select {
	case <-closed:
	case <-time.After(5 * time.Second):
		t.Fatal("Close waited for the OnChange under way")
	}
	select {
	case <-m.Stopped():
		t.Fatal("Stopped before the OnChange under way returned")
	default:
	}
	close(release)
	select {
	case <-m.Stopped():
	case <-time.After(5 * time.Second):
		t.Fatal("not Stopped after the last OnChange returned")
	}
	if n := calls.Load(); n != 1 {
		t.Errorf("%d OnChange calls; want the one under way at Close, none after", n)
	}
}

// TestAPeerHeardButUnableToProveThisNodeCountsAliveWhileItDissents: heartbeats lost one way
// (the soak's heartbeat-loss, a one-way filter) leave a peer that hears nothing of this node
// unable to echo its nonces. That peer counts this node dead and answers, as the first live
// candidate, the VIPs they share; this node must count it alive and not seeing it (so that it
// yields to it and waits for it) for as long as it hears it say so, not dead (then both would
// answer for as long as the loss lasts). A peer heard saying it does see this node, without
// proof, gains nothing: a heartbeat that proves nothing may make this node yield, never take
// over.
func TestAPeerHeardButUnableToProveThisNodeCountsAliveWhileItDissents(t *testing.T) {
	port := freePort(t)
	meID, bID := memIdentity(t), memIdentity(t)
	rec := &recorder{}
	// A deadline of 200 ms, so that a busy machine's pauses between the sends below never
	// outlast it.
	me, err := New(Config{Node: "me", Listen: netip.AddrPortFrom(loop(1), port), Interval: 20 * time.Millisecond, Misses: 10, Identity: meID, sent: rec.hook})
	if err != nil {
		t.Fatal(err)
	}
	defer me.Close()
	me.SetPeers([]Peer{{Node: "b", Addr: loop(2), PublicKeys: bID.PublicKeys()}})
	fromB := newSender(t, loop(2), 255)
	boot, seq := uint64(1), uint64(0)
	// b hears none of me: it echoes nothing, and says whether it counts me alive.
	send := func(flags byte) {
		t.Helper()
		before := me.Counters().Unproven
		seq++
		fromB.send(t, craft(t, bID, "b", bID, meID, "me", frame{at: seqKey{boot, seq}, flags: flags}), netip.AddrPortFrom(loop(1), port))
		waitUntil(t, 2*time.Second, "taken, unproven", func() bool { return me.Counters().Unproven > before })
	}
	// Past the grace of a peer not heard yet (a deadline), b says it does not see me: the
	// first heartbeat of its boot is no dissent (a starting peer's says nothing yet), the next is.
	waitUntil(t, 2*time.Second, "b dead, never heard", func() bool { return !me.Alive("b") })
	send(0)
	time.Sleep(20 * time.Millisecond) // an evaluation
	if me.Alive("b") {
		t.Fatal("b counts alive after the first heartbeat of its boot; want dead (a starting peer's first heartbeat is no dissent)")
	}
	send(0)
	waitUntil(t, 2*time.Second, "b, heard dissenting, alive and not seeing me", func() bool { return me.Alive("b") && !me.Sees("b") })
	for range 10 {
		send(0)
		if !me.Alive("b") || me.Sees("b") {
			t.Fatalf("b heard dissenting without proof: alive %v, sees me %v; want alive and not seeing me", me.Alive("b"), me.Sees("b"))
		}
		time.Sleep(20 * time.Millisecond)
	}
	// Silent: dead once a deadline passed since it was last heard.
	waitUntil(t, 2*time.Second, "b dead once no longer heard", func() bool { return !me.Alive("b") })
	// Heard saying it sees me, without proof: still dead.
	for range 5 {
		send(flagAlive)
		time.Sleep(20 * time.Millisecond)
		if me.Alive("b") {
			t.Fatal("b heard saying it sees me, without proof, counts alive; want dead (unproven heartbeats never keep a node alive)")
		}
	}
	// b restarts: the first heartbeat of its new boot is no dissent either.
	boot, seq = 2, 0
	send(0)
	time.Sleep(20 * time.Millisecond)
	if me.Alive("b") {
		t.Fatal("b counts alive after the first heartbeat of a new boot; want dead")
	}
	send(0)
	waitUntil(t, 2*time.Second, "b dissenting again", func() bool { return me.Alive("b") && !me.Sees("b") })
}
