package failover

import (
	"fmt"
	"net/netip"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

var key = []byte("0123456789abcdef0123456789abcdef")

// freePort finds a UDP port free on 127.0.0.1 through 127.0.0.3.
func freePort(t *testing.T) uint16 {
	t.Helper()
	for p := uint16(20000 + time.Now().UnixNano()%20000); ; p++ {
		var ms []*Monitor
		ok := true
		for i := 1; i <= 3; i++ {
			m, err := New(Config{Node: "probe", Listen: netip.AddrPortFrom(netip.AddrFrom4([4]byte{127, 0, 0, byte(i)}), p)})
			if err != nil {
				ok = false
				break
			}
			ms = append(ms, m)
		}
		for _, m := range ms {
			m.Close()
		}
		if ok {
			return p
		}
	}
}

func start(t *testing.T, port uint16, n int, cfg func(i int, c *Config)) []*Monitor {
	t.Helper()
	var peers []Peer
	for i := range n {
		peers = append(peers, Peer{Node: fmt.Sprintf("node%d", i), Addr: netip.AddrFrom4([4]byte{127, 0, 0, byte(i + 1)})})
	}
	var ms []*Monitor
	for i := range n {
		c := Config{Node: peers[i].Node, Listen: netip.AddrPortFrom(peers[i].Addr, port), Interval: 20 * time.Millisecond}
		if cfg != nil {
			cfg(i, &c)
		}
		m, err := New(c)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { m.Close() })
		m.SetKeys([][]byte{key})
		m.SetPeers(peers)
		ms = append(ms, m)
	}
	return ms
}

func waitUntil(t *testing.T, timeout time.Duration, what string, cond func() bool) time.Duration {
	t.Helper()
	begin := time.Now()
	for !cond() {
		if time.Since(begin) > timeout {
			t.Fatalf("%s: not within %s", what, timeout)
		}
		time.Sleep(5 * time.Millisecond)
	}
	return time.Since(begin)
}

func TestNodesSeeEachOtherAndNoticeADeath(t *testing.T) {
	ms := start(t, freePort(t), 3, nil)
	waitUntil(t, 5*time.Second, "all alive and seeing each other", func() bool {
		for _, m := range ms {
			for _, o := range []string{"node0", "node1", "node2"} {
				if !m.Alive(o) || (o != m.cfg.Node && !m.Sees(o)) {
					return false
				}
			}
		}
		return true
	})
	ms[2].Close()
	took := waitUntil(t, 5*time.Second, "node2's death noticed", func() bool {
		return !ms[0].Alive("node2") && !ms[1].Alive("node2")
	})
	t.Logf("death noticed after %s (interval 20ms x 3)", took.Round(time.Millisecond))
	if got := ms[0].AliveNodes(); len(got) != 1 || got[0] != "node1" {
		t.Errorf("node0 sees %v alive", got)
	}
}

func TestANewPeerCountsAsAliveUntilItCouldHaveBeenHeard(t *testing.T) {
	m, err := New(Config{Node: "me", Listen: netip.MustParseAddrPort("127.0.0.1:0"), Interval: 50 * time.Millisecond, Misses: 3})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	m.SetKeys([][]byte{key})
	m.SetPeers([]Peer{{Node: "silent", Addr: netip.MustParseAddr("127.0.0.2")}})
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

func TestAWrongKeyIsNotAlive(t *testing.T) {
	ms := start(t, freePort(t), 2, nil)
	ms[1].SetKeys([][]byte{[]byte("another key entirely, 32 bytes!!")})
	time.Sleep(300 * time.Millisecond)
	if ms[0].Alive("node1") || ms[1].Alive("node0") {
		t.Error("nodes with different keys count each other alive")
	}
	// Rotation: node0 verifies with both keys and signs with the old one; node1 signs with the
	// new one and verifies with both. They see each other again.
	ms[0].SetKeys([][]byte{key, []byte("another key entirely, 32 bytes!!")})
	ms[1].SetKeys([][]byte{[]byte("another key entirely, 32 bytes!!"), key})
	waitUntil(t, 5*time.Second, "alive again during a key rotation", func() bool {
		return ms[0].Alive("node1") && ms[1].Alive("node0")
	})
}

// TestChangesShowOnlyAfterOnChange checks the ordering an ordered hand-over relies on: node0
// says it sees node1 only after its OnChange for node1's arrival has returned, even when that
// OnChange is slow (and node0's heartbeats meanwhile keep it alive).
func TestChangesShowOnlyAfterOnChange(t *testing.T) {
	var firstDone atomic.Bool
	ms := start(t, freePort(t), 2, func(i int, c *Config) {
		if i == 0 {
			c.OnChange = func() {
				if !firstDone.Load() {
					time.Sleep(200 * time.Millisecond) // ten intervals
					firstDone.Store(true)
				}
			}
		}
	})
	sawEarly := false
	waitUntil(t, 5*time.Second, "node1 sees that node0 sees it", func() bool {
		if ms[1].Sees("node0") && !firstDone.Load() {
			sawEarly = true
		}
		return ms[1].Sees("node0") && firstDone.Load()
	})
	if sawEarly {
		t.Error("node0's heartbeats showed node1 before node0's OnChange returned")
	}
	if !ms[1].Alive("node0") {
		t.Error("a slow OnChange on node0 made node1 take it for dead")
	}
}

func TestVerifyRefusesForgeriesAndReplays(t *testing.T) {
	m, err := New(Config{Node: "me", Listen: netip.MustParseAddrPort("127.0.0.1:0")})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	m.SetKeys([][]byte{key})
	m.SetPeers([]Peer{{Node: "peer", Addr: netip.MustParseAddr("127.0.0.2")}})
	from := netip.MustParseAddr("127.0.0.2")
	good := encode("peer", 1, 5, []string{"me"}, key)
	if _, err := m.verify(good, from); err != nil {
		t.Fatalf("a good heartbeat refused: %v", err)
	}
	for name, tc := range map[string]struct {
		b    []byte
		from netip.Addr
	}{
		"a replay":               {good, from},
		"an older sequence":      {encode("peer", 1, 4, nil, key), from},
		"another key":            {encode("peer", 1, 6, nil, []byte("nope")), from},
		"another source address": {encode("peer", 1, 7, nil, key), netip.MustParseAddr("127.0.0.9")},
		"an unknown node":        {encode("stranger", 1, 1, nil, key), from},
		"a truncated message":    {good[:20], from},
		"a flipped bit":          {func() []byte { b := append([]byte(nil), encode("peer", 1, 8, nil, key)...); b[3] ^= 1; return b }(), from},
	} {
		if _, err := m.verify(tc.b, tc.from); err == nil {
			t.Errorf("%s accepted", name)
		}
	}
	// A new boot of the peer starts its sequence again.
	if _, err := m.verify(encode("peer", 2, 1, nil, key), from); err != nil {
		t.Errorf("a rebooted peer's first heartbeat refused: %v", err)
	}
}

func FuzzDecode(f *testing.F) {
	f.Add(encode("node-a", 1, 2, []string{"node-b", "node-c"}, key))
	f.Add([]byte{1, 2, 3})
	f.Fuzz(func(t *testing.T, b []byte) {
		hb, err := decode(b, [][]byte{key})
		if err != nil {
			return
		}
		again := encode(hb.node, hb.boot, hb.seq, hb.sees, key)
		if string(again) != string(b) {
			t.Fatalf("decode/encode round trip differs")
		}
	})
}
