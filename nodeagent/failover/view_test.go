package failover

import (
	"net/netip"
	"sync"
	"testing"
	"time"
)

// TestOnChangeHandsOverTheViewItIsAbout: OnChange is given what the heartbeats said at the
// change (a silent peer alive at first, then dead), views are ordered by Seq, a view taken
// after SetPeers is later than the last one handed over, and a view is a copy that later
// changes do not touch.
func TestOnChangeHandsOverTheViewItIsAbout(t *testing.T) {
	var mu sync.Mutex
	var views []View
	m, err := New(Config{Node: "me", Listen: netip.AddrPortFrom(loop(1), freePort(t)), Interval: 20 * time.Millisecond, Misses: 2, Identity: memIdentity(t),
		OnChange: func(v View) { mu.Lock(); views = append(views, v); mu.Unlock() }})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	silent := Peer{Node: "silent", Addr: loop(2), PublicKeys: memIdentity(t).PublicKeys()}
	m.SetPeers([]Peer{silent})
	handed := func() []View { mu.Lock(); defer mu.Unlock(); return append([]View(nil), views...) }
	waitUntil(t, 5*time.Second, "the silent peer counted dead", func() bool {
		v := handed()
		return len(v) > 0 && !v[len(v)-1].Alive("silent")
	})
	got := handed()
	if !got[0].Alive("silent") || !got[0].Alive("me") || got[0].Sees("silent") {
		t.Errorf("first view: silent alive %v, me alive %v, silent sees me %v; want alive (not heard yet), alive, no",
			got[0].Alive("silent"), got[0].Alive("me"), got[0].Sees("silent"))
	}
	for i := 1; i < len(got); i++ {
		if got[i].Seq <= got[i-1].Seq {
			t.Errorf("view %d has Seq %d after %d; want a greater one", i, got[i].Seq, got[i-1].Seq)
		}
	}
	last := got[len(got)-1]
	if nodes := last.AliveNodes(); len(nodes) != 0 {
		t.Errorf("alive nodes in the last view %v; want none", nodes)
	}
	// Departing: a peer SetPeers marks departing is not alive in the view taken after it,
	// which is later than any handed over; the views handed over are untouched.
	silent.Departing = true
	other := Peer{Node: "new", Addr: loop(3), PublicKeys: memIdentity(t).PublicKeys()}
	m.SetPeers([]Peer{silent, other})
	now := m.View()
	if now.Seq <= last.Seq || now.Alive("silent") || !now.Alive("new") {
		t.Errorf("view after SetPeers: Seq %d (last handed %d), silent alive %v, new alive %v; want later, no, yes", now.Seq, last.Seq, now.Alive("silent"), now.Alive("new"))
	}
	if last.Alive("new") {
		t.Error("a view handed over changed after it was handed (new peer alive in it)")
	}
}
