package failover

import (
	"net/netip"
	"testing"
	"time"
)

// restartPair starts node a (127.0.0.1) and node b (127.0.0.2, its identity kept in dir so
// that a second start is its next boot), interval 20 ms, 3 misses, and waits until they see
// each other.
func restartPair(t *testing.T, port uint16, dir string) (a, b *Monitor, bID *Identity, peers func(*Identity) []Peer) {
	t.Helper()
	aID := memIdentity(t)
	var err error
	if bID, err = LoadIdentity(dir, time.Now()); err != nil {
		t.Fatal(err)
	}
	peers = func(b *Identity) []Peer {
		return []Peer{
			{Node: "a", Addr: loop(1), PublicKeys: aID.PublicKeys()},
			{Node: "b", Addr: loop(2), PublicKeys: b.PublicKeys()},
		}
	}
	if a, err = New(Config{Node: "a", Listen: netip.AddrPortFrom(loop(1), port), Interval: 20 * time.Millisecond, Identity: aID}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { a.Close() })
	if b, err = New(Config{Node: "b", Listen: netip.AddrPortFrom(loop(2), port), Interval: 20 * time.Millisecond, Identity: bID}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	a.SetPeers(peers(bID))
	b.SetPeers(peers(bID))
	waitUntil(t, 5*time.Second, "a and b see each other", func() bool {
		return a.Alive("b") && a.Sees("b") && b.Alive("a") && b.Sees("a")
	})
	return a, b, bID, peers
}

// deadFor records, every 2 ms until stop, whether a counts b dead, and returns the first time it
// did (zero: never).
func watchDeath(a *Monitor, stop <-chan struct{}) <-chan time.Time {
	out := make(chan time.Time, 1)
	go func() {
		var first time.Time
		defer func() { out <- first }()
		t := time.NewTicker(2 * time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-stop:
				return
			case <-t.C:
				if first.IsZero() && !a.Alive("b") {
					first = time.Now()
				}
			}
		}
	}()
	return out
}

// Issue 32: a planned agent restart moves nothing. A node that says it is restarting counts
// alive for the grace it gave (its VIPs wait for it: moving them away and back resets every
// connection twice), and no longer than that if it does not come back.
func TestAPeerThatSaysItIsRestartingCountsAliveForItsGrace(t *testing.T) {
	a, b, _, _ := restartPair(t, freePort(t), t.TempDir())
	const grace = 600 * time.Millisecond
	b.Restarting(grace)
	exited := time.Now()
	b.Close()
	// What a's GetState tells a CCM that starts leading meanwhile: b restarts, until about
	// the end of its grace.
	waitUntil(t, time.Second, "a's view says b is restarting", func() bool { return a.View().Restarting(time.Now())["b"].After(exited) })
	if until := a.View().Restarting(time.Now())["b"]; until.Sub(exited) > grace+100*time.Millisecond {
		t.Errorf("a's view has b restarting until %s after its exit; its grace is %s", until.Sub(exited), grace)
	}
	waitUntil(t, 5*time.Second, "b counted dead once its grace ran out", func() bool { return !a.Alive("b") })
	held := time.Since(exited)
	if r := a.View().Restarting(time.Now()); len(r) > 0 {
		t.Errorf("a's view still says %v restart after the grace ran out", r)
	}
	t.Logf("b counted alive %s after its exit (grace %s, deadline without it 60ms)", held.Round(time.Millisecond), grace)
	// The grace runs from the proof of b's last heartbeat, which is at most an interval before
	// its exit: well over the 60 ms deadline, never past the grace and a few ticks.
	if held < grace-100*time.Millisecond || held > grace+2*time.Second {
		t.Errorf("b counted alive for %s after it exited; want about its grace of %s", held, grace)
	}
}

func TestARestartingPeerBackSoonerEndsItsGraceAndNeverCountsDead(t *testing.T) {
	port := freePort(t)
	dir := t.TempDir()
	a, b, bID, peers := restartPair(t, port, dir)
	stop := make(chan struct{})
	dead := watchDeath(a, stop)
	b.Restarting(MaxRestartGrace)
	b.Close()
	time.Sleep(300 * time.Millisecond) // five deadlines: dead without the notice
	next, err := LoadIdentity(dir, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	if next.Boot() != bID.Boot()+1 {
		t.Fatalf("boot %d after %d", next.Boot(), bID.Boot())
	}
	b2, err := New(Config{Node: "b", Listen: netip.AddrPortFrom(loop(2), port), Interval: 20 * time.Millisecond, Identity: next})
	if err != nil {
		t.Fatal(err)
	}
	defer b2.Close()
	b2.SetPeers(peers(next))
	waitUntil(t, 5*time.Second, "a and the restarted b see each other", func() bool { return a.Sees("b") && b2.Sees("a") })
	// Back: no longer said to be restarting, although a still holds it alive ReturnSettle.
	waitUntil(t, time.Second, "a's view no longer says b is restarting", func() bool { return len(a.View().Restarting(time.Now())) == 0 })
	// Back: the grace is over, so b's next exit without a notice is a death found at once.
	waitUntil(t, 5*time.Second, "a's view of b without the restart grace", func() bool {
		a.mu.Lock()
		defer a.mu.Unlock()
		return a.peers["b"].restartUntil.IsZero()
	})
	close(stop)
	if at := <-dead; !at.IsZero() {
		t.Fatalf("a counted b dead during its restart, at %s", at.Format(time.StampMicro))
	}
	b2.Close()
	took := waitUntil(t, 5*time.Second, "b's exit without a notice found", func() bool { return !a.Alive("b") })
	if took > 2*time.Second {
		t.Errorf("b's death found after %s; want about the 60 ms deadline, the grace ended when b came back", took)
	}
}

func TestAnExitWithoutANoticeIsADeath(t *testing.T) {
	a, b, _, _ := restartPair(t, freePort(t), t.TempDir())
	b.Close()
	took := waitUntil(t, 5*time.Second, "b's death found", func() bool { return !a.Alive("b") })
	if took > time.Second {
		t.Errorf("b's death found after %s; want about the 60 ms deadline", took)
	}
}

// meAndB starts the monitor "me" (127.0.0.1) with one peer "b" (127.0.0.2) whose heartbeats
// the test crafts and sends from fromB; rec sees what me sends.
func meAndB(t *testing.T) (me *Monitor, meID, bID *Identity, rec *recorder, fromB *sender, dst netip.AddrPort) {
	t.Helper()
	port := freePort(t)
	meID, bID = memIdentity(t), memIdentity(t)
	rec = &recorder{}
	me, err := New(Config{Node: "me", Listen: netip.AddrPortFrom(loop(1), port), Interval: 20 * time.Millisecond, Identity: meID, sent: rec.hook})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { me.Close() })
	me.SetPeers([]Peer{{Node: "b", Addr: loop(2), PublicKeys: bID.PublicKeys()}})
	fromB = newSender(t, loop(2), 255)
	waitUntil(t, 2*time.Second, "me sends heartbeats", func() bool { return len(rec.to(loop(2))) > 0 })
	return me, meID, bID, rec, fromB, netip.AddrPortFrom(loop(1), port)
}

// A notice beyond MaxRestartGrace holds a peer alive for MaxRestartGrace only; one in a
// heartbeat that proves nothing (no fresh echo) holds nothing.
func TestARestartNoticeIsBoundedAndCountsOnlyWhenProven(t *testing.T) {
	me, meID, bID, rec, fromB, dst := meAndB(t)
	restartUntil := func() time.Time {
		me.mu.Lock()
		defer me.mu.Unlock()
		return me.peers["b"].restartUntil
	}
	accepted := func() uint64 { return me.Counters().Accepted + me.Counters().Unproven }

	before := accepted()
	fromB.send(t, craft(t, bID, "b", bID, meID, "me", frame{at: seqKey{1, 1}, restart: 65535}), dst)
	waitUntil(t, 2*time.Second, "the unproven heartbeat taken", func() bool { return accepted() > before })
	if u := restartUntil(); !u.IsZero() {
		t.Errorf("a notice in a heartbeat echoing nothing holds b until %s", u)
	}

	before = accepted()
	sent := time.Now()
	fromB.send(t, craft(t, bID, "b", bID, meID, "me", frame{at: seqKey{1, 2}, echo: rec.lastEcho(t, loop(2)), restart: 65535}), dst)
	waitUntil(t, 2*time.Second, "the proven heartbeat taken", func() bool { return accepted() > before })
	u := restartUntil()
	if u.IsZero() || u.Sub(sent) > MaxRestartGrace+time.Second || u.Sub(sent) < MaxRestartGrace-time.Second {
		t.Errorf("a notice of 65.5 s holds b until %s after it was sent; want MaxRestartGrace (%s)", u.Sub(sent), MaxRestartGrace)
	}
	if !me.Alive("b") {
		t.Error("b, restarting, counts dead")
	}

	// Back (a heartbeat without the notice): held ReturnSettle more at most, so that a freshly
	// started agent's uneven first heartbeats move nothing; a heartbeat past that ends it.
	before = accepted()
	back := time.Now()
	fromB.send(t, craft(t, bID, "b", bID, meID, "me", frame{at: seqKey{1, 3}, echo: rec.lastEcho(t, loop(2))}), dst)
	waitUntil(t, 2*time.Second, "the proven heartbeat without a notice taken", func() bool { return accepted() > before })
	if u := restartUntil(); u.IsZero() || u.Sub(back) > ReturnSettle+time.Second {
		t.Errorf("a proven heartbeat without a notice holds b until %s after it; want at most ReturnSettle (%s)", u.Sub(back), ReturnSettle)
	}
	time.Sleep(time.Until(back.Add(ReturnSettle + 100*time.Millisecond)))
	before = accepted()
	fromB.send(t, craft(t, bID, "b", bID, meID, "me", frame{at: seqKey{1, 4}, echo: rec.lastEcho(t, loop(2))}), dst)
	waitUntil(t, 2*time.Second, "the proven heartbeat past the settling taken", func() bool { return accepted() > before })
	if u := restartUntil(); !u.IsZero() {
		t.Errorf("a proven heartbeat %s after the return left b held until %s", ReturnSettle, u)
	}
}

// A heartbeat of version 2, as an agent of the release before sends it during a rolling
// update, is taken, and one of this version is taken by version 2's rules (it is a later
// version to them): exercised by TestEachCheckRefusesWhatItShouldAndCountsIt's later().
func TestAVersion2HeartbeatIsTaken(t *testing.T) {
	me, meID, bID, rec, fromB, dst := meAndB(t)
	pub, err := ecdhPublic(meID.current()[0].pub)
	if err != nil {
		t.Fatal(err)
	}
	send, _, err := pairKeys(bID.current()[0].priv, pub, "b", "me")
	if err != nil {
		t.Fatal(err)
	}
	f := frame{from: bID.current()[0].id, to: meID.current()[0].id, at: seqKey{1, 1}, echo: rec.lastEcho(t, loop(2)), flags: flagAlive}
	body := appendBody(nil, 2, f)
	mac := newMAC(send)
	mac.Write(body)
	b := mac.Sum(body)
	if len(b) != frameSizeV2 {
		t.Fatalf("a version 2 heartbeat of %d bytes; want %d", len(b), frameSizeV2)
	}
	fromB.send(t, b, dst)
	waitUntil(t, 2*time.Second, "the version 2 heartbeat accepted", func() bool { return me.Counters().Accepted > 0 })
	if !me.Sees("b") {
		t.Error("a version 2 heartbeat saying b sees me is not read so")
	}
}
