package l2

import (
	"fmt"
	"net"
	"net/netip"
	"slices"
	"testing"
	"time"

	"github.com/mdlayher/arp"
	"pgregory.net/rapid"
)

// The speaker learns only from requests for the per-client VIPs it is a candidate of, and
// only sane senders.
func TestLearnsOnlyFromRequestsForItsPerClientVIPs(t *testing.T) {
	multicast := net.HardwareAddr{0x01, 0x00, 0x5e, 0, 0, 1}
	for _, tc := range []struct {
		name  string
		send  func(n *fakeNode)
		learn bool
	}{
		{"a request for a per-client VIP teaches its sender", func(n *fakeNode) { n.ask(vip4, clientIP, clientMAC) }, true},
		{"a request for an ordinary VIP teaches nothing", func(n *fakeNode) { n.ask(otherVIP4, clientIP, clientMAC) }, false},
		{"a request for a VIP the node is no candidate of teaches nothing", func(n *fakeNode) {
			n.ask(netip.MustParseAddr("203.0.113.99"), clientIP, clientMAC)
		}, false},
		{"a reply teaches nothing", func(n *fakeNode) {
			p, _ := arp.NewPacket(arp.OperationReply, clientMAC, clientIP, nodeMAC, vip4)
			n.deliverARP("eth0", p, clientMAC)
		}, false},
		{"a gratuitous request for the VIP itself teaches nothing", func(n *fakeNode) { n.ask(vip4, vip4, clientMAC) }, false},
		{"an ARP probe from no address teaches nothing", func(n *fakeNode) { n.ask(vip4, netip.IPv4Unspecified(), clientMAC) }, false},
		{"a sender naming another MAC than its frame's is not learnt", func(n *fakeNode) {
			n.askOn("eth0", vip4, clientIP, clientMAC, node2MAC)
		}, false},
		{"a multicast sender MAC is not learnt", func(n *fakeNode) { n.ask(vip4, clientIP, multicast) }, false},
		{"a broadcast sender address is not learnt", func(n *fakeNode) { n.ask(vip4, netip.MustParseAddr("255.255.255.255"), clientMAC) }, false},
		{"a solicitation for a per-client VIP teaches its sender", func(n *fakeNode) { n.solicit(vip6, client6, clientMAC, 255) }, true},
		{"a routed solicitation (hop limit under 255) teaches nothing", func(n *fakeNode) { n.solicit(vip6, client6, clientMAC, 64) }, false},
		{"duplicate address detection teaches nothing", func(n *fakeNode) { n.solicit(vip6, netip.IPv6Unspecified(), clientMAC, 255) }, false},
		{"a solicitation without a source link-layer address teaches nothing", func(n *fakeNode) { n.solicit(vip6, client6, nil, 255) }, false},
		{"a solicitation for an ordinary IPv6 VIP teaches nothing", func(n *fakeNode) { n.solicit(otherVIP6, client6, clientMAC, 255) }, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			n := newFakeNode(t, Options{Burst: 1})
			n.set(perClient(vip4, "node-a", members...), VIP{Addr: otherVIP4, Interfaces: []string{"eth0"}},
				perClient(vip6, "node-a", members...), VIP{Addr: otherVIP6, Interfaces: []string{"eth0"}})
			tc.send(n)
			known := 0
			for _, v := range []netip.Addr{vip4, otherVIP4, vip6, otherVIP6, netip.MustParseAddr("203.0.113.99")} {
				k, _ := n.s.Clients(v)
				known += k
			}
			if tc.learn != (known == 1) || known > 1 {
				t.Errorf("%d clients known; want learnt %v", known, tc.learn)
			}
		})
	}
}

func TestForgetsTheClientsOfVIPsNoLongerPerClient(t *testing.T) {
	n := newFakeNode(t, Options{Burst: 1})
	n.set(perClient(vip4, "node-a", members...), perClient(otherVIP4, "node-a", members...))
	n.ask(vip4, clientIP, clientMAC)
	n.ask(otherVIP4, clientIP, clientMAC)
	n.set(perClient(vip4, "node-a", members...), VIP{Addr: otherVIP4, Interfaces: []string{"eth0"}})
	if k, _ := n.s.Clients(otherVIP4); k != 0 {
		t.Errorf("%d clients kept for a VIP now answered for everyone; want none", k)
	}
	if k, _ := n.s.Clients(vip4); k != 1 {
		t.Errorf("%d clients of the VIP still per client; want 1", k)
	}
}

// table returns a client table on a fake clock with lim (other limits out of the way).
func table(lim ClientLimits) (*clientTable, *fakeClock) {
	if lim.NewPerSecond == 0 {
		lim.NewPerSecond, lim.NewBurst = 1<<30, 1<<30
	}
	if lim.PerMACPerSecond == 0 {
		lim.PerMACPerSecond = 1 << 30
	}
	if lim.PerIPPerSecond == 0 {
		lim.PerIPPerSecond = 1 << 30
	}
	c := newFakeClock()
	return newClientTable(lim, c.Now), c
}

// addrN is the i-th address of 198.18.0.0/15, the range kept for benchmarks (RFC 2544).
func addrN(i int) netip.Addr {
	return netip.AddrFrom4([4]byte{198, 18 + byte(i>>16&1), byte(i >> 8), byte(i)})
}

func macN(i int) [6]byte {
	return [6]byte{0x02, 0xaa, byte(i >> 24), byte(i >> 16), byte(i >> 8), byte(i)}
}

func seen(i int) sighting {
	return sighting{vip: vip4, ip: addrN(i), at: station{mac: macN(i), iface: "eth0"}}
}

func keptIPs(t *clientTable) []netip.Addr {
	cs, _ := t.kept()
	var out []netip.Addr
	for _, c := range cs {
		out = append(out, c.IP)
	}
	return out
}

func TestProbationEvictsItsLeastRecentlySeenClient(t *testing.T) {
	tb, _ := table(ClientLimits{Protected: 10, Probation: 2})
	for i := range 3 {
		tb.see(seen(i))
	}
	for i, want := range []bool{false, true, true} {
		if got := tb.byVIP[vip4][addrN(i)] != nil; got != want {
			t.Errorf("client %d known %v; want %v (only the two most recent)", i, got, want)
		}
	}
	if got := tb.statsNow().Evicted; got != 1 {
		t.Errorf("Evicted = %d; want 1", got)
	}
}

func TestProtectedDemotesItsLeastRecentlySeenClient(t *testing.T) {
	tb, _ := table(ClientLimits{Protected: 2, Probation: 10})
	for _, i := range []int{0, 1} { // promote 0 and 1
		tb.see(seen(i))
		tb.see(seen(i))
	}
	tb.see(seen(0)) // 0 is now the most recent
	tb.see(seen(2))
	tb.see(seen(2)) // 2 promoted: 1, the least recent, goes back to probation
	if got := keptIPs(tb); !slices.Equal(got, []netip.Addr{addrN(2), addrN(0)}) {
		t.Errorf("protected %v; want %v then %v", got, addrN(2), addrN(0))
	}
	if e := tb.byVIP[vip4][addrN(1)]; e == nil || e.seg != probation {
		t.Errorf("client 1 %+v; want it demoted to probation, not forgotten", e)
	}
}

// The flood the table is built for: one-shot senders in any number evict no client that
// asked twice.
func TestOneShotFloodEvictsNoClientThatAskedTwice(t *testing.T) {
	tb, _ := table(ClientLimits{Protected: 200, Probation: 50})
	for i := range 100 {
		tb.see(seen(i))
		tb.see(seen(i))
	}
	_, ver := tb.kept()
	for i := 1000; i < 13000; i++ {
		tb.see(seen(i))
	}
	got := keptIPs(tb)
	if len(got) != 100 {
		t.Fatalf("%d of 100 clients kept after 12,000 one-shot senders", len(got))
	}
	for i := range 100 {
		if !slices.Contains(got, addrN(i)) {
			t.Errorf("client %d evicted by the flood", i)
		}
	}
	if k, _ := tb.count(vip4, func(netip.Addr) bool { return true }); k != 150 {
		t.Errorf("%d clients known; want the 100 and a full probation of 50", k)
	}
	if _, v := tb.kept(); v != ver {
		t.Errorf("the flood changed the kept clients' version (%d to %d): it would be saved", ver, v)
	}
}

func TestPerSourceRateLimits(t *testing.T) {
	t.Run("a MAC that sends more than its limit in a second is not heard beyond it", func(t *testing.T) {
		tb, clock := table(ClientLimits{PerMACPerSecond: 10})
		var verdicts []verdict
		for i := range 15 {
			s := seen(i)
			s.at.mac = macN(7)
			verdicts = append(verdicts, tb.see(s))
		}
		if n := count(verdicts, throttled); n != 5 {
			t.Errorf("%d of 15 sightings from one MAC throttled; want 5 (limit 10)", n)
		}
		clock.Add(time.Second)
		s := seen(99)
		s.at.mac = macN(7)
		if v := tb.see(s); v != learnt {
			t.Errorf("the next second: %v; want heard again", v)
		}
	})
	t.Run("an address claimed by more MACs than its limit in a second is not heard beyond it", func(t *testing.T) {
		tb, _ := table(ClientLimits{PerIPPerSecond: 10})
		var verdicts []verdict
		for i := range 15 {
			s := seen(1)
			s.at.mac = macN(100 + i)
			verdicts = append(verdicts, tb.see(s))
		}
		if n := count(verdicts, throttled); n != 5 {
			t.Errorf("%d of 15 claims on one address throttled; want 5 (limit 10)", n)
		}
	})
	t.Run("a client confirming its own MAC is heard though its address is over its limit", func(t *testing.T) {
		tb, _ := table(ClientLimits{PerIPPerSecond: 3})
		tb.see(seen(1))
		for i := range 10 { // a forger claims the address from other MACs
			s := seen(1)
			s.at.mac = macN(100 + i)
			tb.see(s)
		}
		if v := tb.see(seen(1)); v != refreshed {
			t.Errorf("the client itself: %v; want refreshed", v)
		}
	})
}

func TestAdmissionBudgetBoundsHowFastNewClientsAreLearnt(t *testing.T) {
	tb, clock := table(ClientLimits{NewPerSecond: 10, NewBurst: 20, Protected: 1000, Probation: 1000})
	learned := func(from, to int) int {
		n := 0
		for i := from; i < to; i++ {
			if tb.see(seen(i)) == learnt {
				n++
			}
		}
		return n
	}
	if n := learned(0, 100); n != 20 {
		t.Errorf("%d of 100 new senders at once learnt; want the burst of 20", n)
	}
	clock.Add(time.Second)
	if n := learned(100, 200); n != 10 {
		t.Errorf("%d learnt a second later; want 10", n)
	}
	if v := tb.see(seen(0)); v != refreshed {
		t.Errorf("a known client over the budget: %v; want refreshed (the budget is for new ones)", v)
	}
}

func TestMACChangeNeedsConsistentSightings(t *testing.T) {
	lim := ClientLimits{MoveSightings: 3, MoveAfter: time.Minute}
	forged := station{mac: macN(666), iface: "eth0"}
	claim := func(tb *clientTable) verdict {
		s := seen(1)
		s.at = forged
		return tb.see(s)
	}
	macOf := func(tb *clientTable) [6]byte { return tb.byVIP[vip4][addrN(1)].at.mac }

	t.Run("many claims within the hold are not believed", func(t *testing.T) {
		tb, clock := table(lim)
		tb.see(seen(1))
		tb.see(seen(1))
		for range 50 {
			clock.Add(time.Second / 2)
			if v := claim(tb); v != moveHeld {
				t.Fatalf("claim: %v; want held", v)
			}
		}
		if macOf(tb) != macN(1) {
			t.Error("the MAC changed within the hold")
		}
	})
	t.Run("fewer claims than needed are not believed, however far apart", func(t *testing.T) {
		tb, clock := table(lim)
		tb.see(seen(1))
		claim(tb)
		clock.Add(time.Hour)
		if v := claim(tb); v != moveHeld || macOf(tb) != macN(1) {
			t.Errorf("second claim an hour on: %v; want held with 3 needed", v)
		}
	})
	t.Run("the client asking in between keeps its MAC", func(t *testing.T) {
		tb, clock := table(lim)
		tb.see(seen(1))
		for range 10 {
			claim(tb)
			clock.Add(40 * time.Second)
			claim(tb)
			tb.see(seen(1)) // the real client, every 40 s
			clock.Add(40 * time.Second)
		}
		if macOf(tb) != macN(1) {
			t.Error("a forger moved a client that keeps asking")
		}
	})
	t.Run("a new MAC seen enough over the hold, the old one silent, is believed", func(t *testing.T) {
		tb, clock := table(lim)
		tb.see(seen(1))
		tb.see(seen(1))
		_, ver := tb.kept()
		claim(tb)
		clock.Add(30 * time.Second)
		claim(tb)
		clock.Add(30 * time.Second)
		if v := claim(tb); v != moved {
			t.Fatalf("third claim a minute on: %v; want moved", v)
		}
		if macOf(tb) != forged.mac {
			t.Error("the MAC did not change")
		}
		if _, v := tb.kept(); v == ver {
			t.Error("a kept client moved without a new version: it would not be saved")
		}
	})
}

func TestRememberKeepsTheSavedOrderAndRoom(t *testing.T) {
	tb, _ := table(ClientLimits{Protected: 3})
	mac := func(i int) net.HardwareAddr { m := macN(i); return m[:] }
	tb.remember([]Client{
		{VIP: vip4, IP: addrN(1), MAC: mac(1), Interface: "eth0"},
		{VIP: vip4, IP: addrN(2), MAC: net.HardwareAddr{0x01, 0, 0x5e, 0, 0, 1}, Interface: "eth0"}, // multicast: skipped
		{VIP: vip4, IP: addrN(3), MAC: mac(3), Interface: ""},                                       // no interface: skipped
		{VIP: vip4, IP: addrN(4), MAC: mac(4), Interface: "eth0"},
		{VIP: vip4, IP: addrN(5), MAC: mac(5), Interface: "eth0"},
		{VIP: vip4, IP: addrN(6), MAC: mac(6), Interface: "eth0"}, // no room
	})
	if got := keptIPs(tb); !slices.Equal(got, []netip.Addr{addrN(1), addrN(4), addrN(5)}) {
		t.Errorf("remembered %v; want the first three sane ones in their order", got)
	}
}

func count(vs []verdict, v verdict) int {
	n := 0
	for _, x := range vs {
		if x == v {
			n++
		}
	}
	return n
}

// checkInvariants fails unless the table's maps and lists agree and the segments are within
// their sizes.
func checkInvariants(t rapid.TB, tb *clientTable) {
	inMap := 0
	for vip, m := range tb.byVIP {
		if len(m) == 0 {
			t.Fatalf("empty map kept for %s", vip)
		}
		inMap += len(m)
	}
	inLists := 0
	for seg := range tb.segs {
		l := &tb.segs[seg]
		n := 0
		var prev *clientEntry
		for e := l.head; e != nil; e = e.next {
			if e.prev != prev || e.seg != segment(seg) || tb.byVIP[e.vip][e.ip] != e {
				t.Fatalf("segment %d: entry %s/%s out of place", seg, e.vip, e.ip)
			}
			prev = e
			n++
		}
		if n != l.n || l.tail != prev {
			t.Fatalf("segment %d counts %d, holds %d", seg, l.n, n)
		}
		inLists += n
	}
	if inLists != inMap {
		t.Fatalf("%d clients in the lists, %d in the maps", inLists, inMap)
	}
	if tb.segs[protected].n > tb.lim.Protected || tb.segs[probation].n > tb.lim.Probation {
		t.Fatalf("segments %d and %d over %d and %d", tb.segs[protected].n, tb.segs[probation].n, tb.lim.Protected, tb.lim.Probation)
	}
}

// Whatever is heard, the table stays consistent and within its bounds, and a client that
// keeps asking (here: at least once every probation-size sightings of others) stays known.
func TestTableInvariantsHoldWhateverIsHeard(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		lim := ClientLimits{
			Protected:       rapid.IntRange(1, 20).Draw(t, "protected"),
			Probation:       rapid.IntRange(1, 20).Draw(t, "probation"),
			PerMACPerSecond: rapid.IntRange(1, 50).Draw(t, "perMAC"),
			PerIPPerSecond:  rapid.IntRange(1, 50).Draw(t, "perIP"),
			NewPerSecond:    rapid.IntRange(1, 50).Draw(t, "newPerSecond"),
			NewBurst:        rapid.IntRange(1, 50).Draw(t, "newBurst"),
			MoveSightings:   rapid.IntRange(1, 4).Draw(t, "moveSightings"),
			MoveAfter:       time.Duration(rapid.IntRange(0, 10).Draw(t, "moveAfterSeconds")) * time.Second,
		}
		clock := newFakeClock()
		tb := newClientTable(lim, clock.Now)
		vips := []netip.Addr{vip4, otherVIP4}
		lastVer := uint64(0)
		for i := range rapid.IntRange(1, 400).Draw(t, "steps") {
			switch rapid.IntRange(0, 9).Draw(t, fmt.Sprint("op", i)) {
			case 0:
				clock.Add(time.Duration(rapid.IntRange(0, 3000).Draw(t, "ms")) * time.Millisecond)
			case 1:
				keep := rapid.Bool().Draw(t, "keepOther")
				tb.keepOnly(func(v netip.Addr) bool { return v == vip4 || keep })
			default:
				ip := rapid.IntRange(0, 60).Draw(t, "ip")
				tb.see(sighting{
					vip: rapid.SampledFrom(vips).Draw(t, "vip"), ip: addrN(ip),
					at: station{mac: macN(rapid.IntRange(0, 60).Draw(t, "mac")), iface: rapid.SampledFrom([]string{"eth0", "eth1"}).Draw(t, "iface")},
				})
			}
			checkInvariants(t, tb)
			if _, v := tb.kept(); v < lastVer {
				t.Fatalf("version went back from %d to %d", lastVer, v)
			} else {
				lastVer = v
			}
		}
	})
}

// A client that asked twice is never evicted by any number of senders that ask once, in any
// order with its own requests, whatever the limits.
func TestNoOneShotSenderEvictsAKeptClient(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		protectedSize := rapid.IntRange(1, 30).Draw(t, "protected")
		tb, clock := table(ClientLimits{Protected: protectedSize, Probation: rapid.IntRange(1, 30).Draw(t, "probation")})
		real := rapid.IntRange(1, protectedSize).Draw(t, "real")
		for i := range real {
			tb.see(seen(i))
			tb.see(seen(i))
		}
		fresh := 1000
		for i := range rapid.IntRange(0, 500).Draw(t, "steps") {
			if rapid.IntRange(0, 4).Draw(t, fmt.Sprint("op", i)) == 0 {
				tb.see(seen(rapid.IntRange(0, real-1).Draw(t, "again")))
				clock.Add(time.Millisecond)
				continue
			}
			tb.see(seen(fresh))
			fresh++
		}
		for i := range real {
			if e := tb.byVIP[vip4][addrN(i)]; e == nil || e.seg != protected {
				t.Fatalf("kept client %d evicted or demoted by one-shot senders", i)
			}
		}
	})
}
