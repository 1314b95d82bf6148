package agentlab

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/mdlayher/arp"
	"github.com/mdlayher/ethernet"

	"github.com/metalvip/metalvip/internal/rendezvous"
	agentv1 "github.com/metalvip/metalvip/proto/metalvip/agent/v1"
	"github.com/metalvip/metalvip/test/harness"
	"github.com/metalvip/metalvip/test/harness/pki"
	"github.com/metalvip/metalvip/test/harness/proc"
	"github.com/metalvip/metalvip/test/lab"
)

// TestPerClientTableKeepsRealClientsThroughAFlood runs a per-client VIP answered by three
// agents, with 100 real clients on the segment (each its own MAC and address) that keep
// asking (every 250 ms), and floods the segment with 12,000 forged ARP requests for the VIP at
// the highest rate one socket sends: from random addresses and MACs, from random MACs
// claiming the real clients' addresses, and from one MAC claiming each of them again and
// again. The real clients fall silent when the flood ends. Every real client must still be
// in every agent's table (its saved file, which keeps the clients that asked more than once)
// at its real MAC; then a node dies and each of its real clients must be told by its new
// owner, at its real MAC, and none at a forged one. It reports the agents'
// memory and the file sizes before, during and after the flood.
func TestPerClientTableKeepsRealClientsThroughAFlood(t *testing.T) {
	const realClients, randomForged, claimsForged, repeatForged = 100, 10000, 1000, 1000
	l := lab.New(t, lab.Options{Nodes: 3})
	agents := startAgents(t, l.Nodes)
	names := map[string]string{} // node MAC to name
	for _, n := range l.Nodes {
		names[n.MAC(t)] = n.Name
	}
	vip := netip.MustParseAddr("203.0.113.40")
	state := func(gen uint64, candidates ...*lab.Host) *agentv1.DesiredState {
		an := l2Ann(vip.String(), candidates...)
		an.L2.PerClient = true
		return &agentv1.DesiredState{Term: 1, Generation: gen, Announcements: []*agentv1.Announcement{an}}
	}
	for _, a := range agents {
		a.apply(state(1, l.Nodes...))
	}

	clients, err := l.Client.AddLinkClients(l.SpareAddrs()[:realClients])
	if err != nil {
		t.Fatal(err)
	}
	heard := listenAll(clients, vip, names)
	stopTalking := talk(t, clients, vip, 250*time.Millisecond)

	all := []string{"node1", "node2", "node3"}
	owner := map[netip.Addr]string{}
	for _, c := range clients {
		owner[c.Addr] = rendezvous.Owner(c.Addr, all)
	}
	harness.Eventually(t, 15*time.Second, "every real client answered by its owner alone", func() bool {
		for _, c := range clients {
			if got := heard.nodesSince(c.Addr, time.Time{}); len(got) != 1 || got[0] != owner[c.Addr] {
				return false
			}
		}
		return true
	})
	missing := func(a *agent) []string {
		kept := savedClients(t, a)
		var out []string
		for _, c := range clients {
			if kept[c.Addr] != c.MAC.String() {
				out = append(out, fmt.Sprintf("%s (kept at %q)", c.Addr, kept[c.Addr]))
			}
		}
		return out
	}
	harness.Eventually(t, 15*time.Second, "every agent keeps the 100 real clients", func() bool {
		for _, a := range agents {
			if len(missing(a)) > 0 {
				return false
			}
		}
		return true
	})

	before := sample(t, agents, vip)
	arpBefore := arpRequests(t, agents)

	// The flood, while the real clients keep asking.
	seed := uint64(time.Now().UnixNano())
	packets := forgeries(t, rand.New(rand.NewPCG(seed, 1)), vip, clients, randomForged, claimsForged, repeatForged)
	peak := watchPeaks(agents)
	took, err := l.Control.ForgeARP(packets)
	// From here on the real clients are silent (as real ones are between cache refreshes,
	// tens of seconds): what they left in the tables is what the flood left of them.
	stopTalking()
	if err != nil {
		t.Fatal(err)
	}
	during := sample(t, agents, vip)
	time.Sleep(3 * time.Second) // more than a save
	peaks := peak()
	after := sample(t, agents, vip)
	arpAfter := arpRequests(t, agents)

	t.Logf("flood: %d forged requests (%d random, %d claiming real addresses from random MACs, %d from one MAC claiming them) in %s: %.0f requests/s; seed %d",
		len(packets), randomForged, claimsForged, repeatForged, took.Round(time.Microsecond), float64(len(packets))/took.Seconds(), seed)
	for i, a := range agents {
		t.Logf("%s: ARP requests received during the flood %d; clients known %d / %d / %d, answered %d (before / just after / 3 s after); "+
			"resident memory %s / peak %s / %s (peak over the agent's life %s); clients.json %s / peak %s / %s",
			a.host.Name, arpAfter[i]-arpBefore[i], before[i].known, during[i].known, after[i].known, after[i].answered,
			mib(before[i].rss), mib(peaks[i].rss), mib(after[i].rss), mib(after[i].hwm),
			kib(before[i].file), kib(peaks[i].file), kib(after[i].file))
	}
	for _, a := range agents {
		if m := missing(a); len(m) > 0 {
			t.Errorf("%s lost %d real clients to the flood (or keeps them at a forged MAC): %v", a.host.Name, len(m), m)
		}
	}

	// A node dies: its clients' new owners tell each of them, at its own MAC.
	forged, err := l.Control.DialARP()
	if err != nil {
		t.Fatal(err)
	}
	defer forged.Close()
	misdirected := countRepliesTo(forged, vip, clients)
	victim, survivors := agents[0], agents[1:]
	targetedBefore := targeted(t, survivors)
	killed := time.Now()
	victim.proc.Kill()
	<-victim.proc.Done()
	for _, a := range survivors {
		a.apply(state(2, l.Nodes[1], l.Nodes[2]))
	}
	left := []string{"node2", "node3"}
	var moved []netip.Addr
	for _, c := range clients {
		if owner[c.Addr] == victim.host.Name {
			moved = append(moved, c.Addr)
		}
	}
	untold := func() []netip.Addr {
		var out []netip.Addr
		for _, a := range moved {
			if got := heard.nodesSince(a, killed); !slices.Contains(got, rendezvous.Owner(a, left)) {
				out = append(out, a)
			}
		}
		return out
	}
	deadline := time.Now().Add(5 * time.Second)
	for len(untold()) > 0 && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	var last time.Duration
	for _, a := range moved {
		if at, ok := heard.firstSince(a, killed); ok {
			last = max(last, at.Sub(killed))
		}
	}
	t.Logf("%s died: %d of its %d real clients told by their new owners within %s of the kill (last at %s); targeted replies sent %v",
		victim.host.Name, len(moved)-len(untold()), len(moved), time.Since(killed).Round(time.Millisecond), last.Round(time.Millisecond),
		diff(targeted(t, survivors), targetedBefore))
	if u := untold(); len(u) > 0 || len(moved) == 0 {
		t.Errorf("%d of %s's %d real clients not told by their new owner: %v", len(u), victim.host.Name, len(moved), u)
	}
	for _, c := range clients {
		if owner[c.Addr] != victim.host.Name {
			if got := heard.nodesSince(c.Addr, killed); len(got) > 0 {
				t.Errorf("client %s of the living %s told by %v though it did not move", c.Addr, owner[c.Addr], got)
			}
		}
	}
	if n := misdirected(); n > 0 {
		t.Errorf("%d replies for real clients' addresses went to forged MACs", n)
	}
}

// replyLog records the ARP replies for a VIP that each real client receives at its own MAC.
type replyLog struct {
	mu      sync.Mutex
	replies map[netip.Addr][]nodeReply
}

type nodeReply struct {
	at   time.Time
	node string
}

func listenAll(clients []*lab.LinkClient, vip netip.Addr, names map[string]string) *replyLog {
	r := &replyLog{replies: map[netip.Addr][]nodeReply{}}
	for _, c := range clients {
		go func() {
			for {
				p, _, err := c.ARP.Read()
				if err != nil {
					if isClosed(err) {
						return
					}
					continue
				}
				if p.Operation != arp.OperationReply || p.SenderIP != vip || p.TargetIP != c.Addr {
					continue
				}
				r.mu.Lock()
				r.replies[c.Addr] = append(r.replies[c.Addr], nodeReply{at: time.Now(), node: names[p.SenderHardwareAddr.String()]})
				r.mu.Unlock()
			}
		}()
	}
	return r
}

// isClosed reports whether a socket's read failed because it was closed (the test ended).
func isClosed(err error) bool {
	return errors.Is(err, net.ErrClosed) || strings.Contains(err.Error(), "use of closed")
}

// nodesSince returns the nodes that replied to client since t, each once.
func (r *replyLog) nodesSince(client netip.Addr, t time.Time) []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []string
	for _, x := range r.replies[client] {
		if !x.at.Before(t) && !slices.Contains(out, x.node) {
			out = append(out, x.node)
		}
	}
	return out
}

func (r *replyLog) firstSince(client netip.Addr, t time.Time) (time.Time, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, x := range r.replies[client] {
		if !x.at.Before(t) {
			return x.at, true
		}
	}
	return time.Time{}, false
}

// talk makes every client ask for vip once per interval until the returned func is called
// (or the test ends), at most 600 rounds.
func talk(t *testing.T, clients []*lab.LinkClient, vip netip.Addr, interval time.Duration) func() {
	stop, done := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(done)
		for range harness.Every(stop, interval, 600) {
			for _, c := range clients {
				_ = c.Ask(vip)
			}
		}
	}()
	var once sync.Once
	end := func() { once.Do(func() { close(stop); <-done }) }
	t.Cleanup(end)
	return end
}

// forgeries returns the flood, shuffled: random senders from 198.18.0.0/15 (the benchmarking
// range) at random MACs; random MACs claiming the real clients' addresses; and one MAC claiming
// each real client's address again and again.
func forgeries(t *testing.T, rng *rand.Rand, vip netip.Addr, clients []*lab.LinkClient, random, claims, repeats int) []*arp.Packet {
	t.Helper()
	randomMAC := func() net.HardwareAddr {
		m := make(net.HardwareAddr, 6)
		for i := range m {
			m[i] = byte(rng.UintN(256))
		}
		m[0] = m[0]&^1 | 2 // unicast, locally administered
		return m
	}
	var out []*arp.Packet
	add := func(mac net.HardwareAddr, ip netip.Addr) {
		p, err := arp.NewPacket(arp.OperationRequest, mac, ip, ethernet.Broadcast, vip)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, p)
	}
	used := map[netip.Addr]bool{}
	for len(used) < random {
		n := rng.UintN(1 << 17)
		ip := netip.AddrFrom4([4]byte{198, 18 + byte(n>>16), byte(n >> 8), byte(n)})
		if !used[ip] {
			used[ip] = true
			add(randomMAC(), ip)
		}
	}
	for range claims {
		add(randomMAC(), clients[rng.IntN(len(clients))].Addr)
	}
	repeater := randomMAC()
	for i := range repeats {
		add(repeater, clients[i%len(clients)].Addr)
	}
	rng.Shuffle(len(out), func(i, j int) { out[i], out[j] = out[j], out[i] })
	return out
}

// countRepliesTo counts, from now on, the replies for vip to the real clients' addresses that
// reach c (the forger's host, where the bridge sends frames for forged MACs).
func countRepliesTo(c *arp.Client, vip netip.Addr, clients []*lab.LinkClient) func() int {
	real := map[netip.Addr]string{}
	for _, cl := range clients {
		real[cl.Addr] = cl.MAC.String()
	}
	var mu sync.Mutex
	n := 0
	go func() {
		for {
			p, _, err := c.Read()
			if err != nil {
				if isClosed(err) {
					return
				}
				continue
			}
			if mac, ok := real[p.TargetIP]; ok && p.Operation == arp.OperationReply && p.SenderIP == vip && p.TargetHardwareAddr.String() != mac {
				mu.Lock()
				n++
				mu.Unlock()
			}
		}
	}()
	return func() int { mu.Lock(); defer mu.Unlock(); return n }
}

// savedClients reads an agent's clients file: the real clients' MACs by address.
func savedClients(t *testing.T, a *agent) map[netip.Addr]string {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(a.state, "clients.json"))
	if os.IsNotExist(err) {
		return nil
	}
	if err != nil {
		t.Fatal(err)
	}
	var saved []struct {
		IP  netip.Addr `json:"ip"`
		MAC string     `json:"mac"`
	}
	if err := json.Unmarshal(data, &saved); err != nil {
		t.Fatalf("%s's clients.json: %v", a.host.Name, err)
	}
	out := map[netip.Addr]string{}
	for _, c := range saved {
		out[c.IP] = c.MAC
	}
	return out
}

type figures struct {
	known, answered uint32
	rss, hwm, file  int64
}

func sample(t *testing.T, agents []*agent, vip netip.Addr) []figures {
	t.Helper()
	out := make([]figures, len(agents))
	for i, a := range agents {
		out[i].rss, out[i].hwm = memory(a)
		out[i].file = fileSize(a)
		st := a.getState(t)
		for _, v := range st.GetAnnounced() {
			if v.GetVip() == vip.String() {
				out[i].known, out[i].answered = v.GetClientsKnown(), v.GetClientsAnswered()
			}
		}
	}
	return out
}

// watchPeaks samples the agents' memory and files every 20 ms until the returned func is
// called, which returns the peaks.
func watchPeaks(agents []*agent) func() []figures {
	peaks := make([]figures, len(agents))
	stop, done := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(done)
		for range harness.Every(stop, 20*time.Millisecond, 3000) {
			for i, a := range agents {
				rss, _ := memory(a)
				peaks[i].rss, peaks[i].file = max(peaks[i].rss, rss), max(peaks[i].file, fileSize(a))
			}
		}
	}()
	return func() []figures { close(stop); <-done; return peaks }
}

// memory returns the agent's resident memory and its peak, in bytes.
func memory(a *agent) (rss, hwm int64) {
	m, _ := proc.MemoryOf(a.proc.Cmd.Process.Pid)
	return m.RSS, m.HWM
}

func fileSize(a *agent) int64 {
	fi, err := os.Stat(filepath.Join(a.state, "clients.json"))
	if err != nil {
		return 0
	}
	return fi.Size()
}

func arpRequests(t *testing.T, agents []*agent) []uint64 {
	t.Helper()
	out := make([]uint64, len(agents))
	for i, a := range agents {
		st := a.getState(t)
		out[i] = st.GetL2().GetArpRequests()
	}
	return out
}

func targeted(t *testing.T, agents []*agent) map[string]uint64 {
	t.Helper()
	out := map[string]uint64{}
	for _, a := range agents {
		st := a.getState(t)
		out[a.host.Name] = st.GetL2().GetTargetedReplies()
	}
	return out
}

func diff(after, before map[string]uint64) map[string]uint64 {
	out := map[string]uint64{}
	for k, v := range after {
		out[k] = v - before[k]
	}
	return out
}

func mib(b int64) string { return fmt.Sprintf("%.1f MiB", float64(b)/(1<<20)) }
func kib(b int64) string { return fmt.Sprintf("%.1f KiB", float64(b)/(1<<10)) }

// TestPerClientFloodOfManyVIPsStaysBounded floods one agent's 50 per-client VIPs with 2,000
// forged requests each, from random addresses and MACs, and checks the agent's memory and
// clients file stay bounded (the first table wrote 17 MiB every 2 s and peaked near 120 MiB
// in this case). Figures are reported; the bounds checked are the DaemonSet's memory limit
// and the file's cap.
func TestPerClientFloodOfManyVIPsStaysBounded(t *testing.T) {
	const vips, perVIP = 50, 2000
	l := lab.New(t, lab.Options{Nodes: 3})
	tlsDir := pki.AgentsDir(t, lab.Names(l.Nodes[:1])...)
	a := startAgent(t, l.Nodes[0], tlsDir, filepath.Join(t.TempDir(), "state"))
	st := &agentv1.DesiredState{Term: 1, Generation: 1}
	var addrs []netip.Addr
	for i := range vips {
		vip := netip.AddrFrom4([4]byte{203, 0, 113, byte(100 + i)})
		an := l2Ann(vip.String(), l.Nodes...) // no heartbeats: every candidate counts as live
		an.L2.PerClient = true
		st.Announcements = append(st.Announcements, an)
		addrs = append(addrs, vip)
	}
	a.apply(st)

	seed := uint64(time.Now().UnixNano())
	rng := rand.New(rand.NewPCG(seed, 2))
	var packets []*arp.Packet
	for _, vip := range addrs {
		packets = append(packets, forgeries(t, rng, vip, nil, perVIP, 0, 0)...)
	}
	rng.Shuffle(len(packets), func(i, j int) { packets[i], packets[j] = packets[j], packets[i] })
	before := sample(t, []*agent{a}, addrs[0])[0]
	arpBefore := arpRequests(t, []*agent{a})[0]
	peak := watchPeaks([]*agent{a})
	took, err := l.Control.ForgeARP(packets)
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(3 * time.Second) // more than a save
	peaks := peak()[0]
	after := sample(t, []*agent{a}, addrs[0])[0]
	known := 0
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	resp, err := a.client.GetState(ctx, &agentv1.GetStateRequest{})
	if err != nil {
		t.Fatal(err)
	}
	for _, v := range resp.GetAnnounced() {
		known += int(v.GetClientsKnown())
	}
	t.Logf("flood: %d forged requests over %d per-client VIPs in %s (%.0f/s; seed %d); the agent received %d; clients known over all VIPs %d; "+
		"resident memory %s / peak %s / %s (peak over its life %s); clients.json %s / peak %s / %s",
		len(packets), vips, took.Round(time.Millisecond), float64(len(packets))/took.Seconds(), seed,
		resp.GetL2().GetArpRequests()-arpBefore, known,
		mib(before.rss), mib(peaks.rss), mib(after.rss), mib(after.hwm), kib(before.file), kib(peaks.file), kib(after.file))
	if after.hwm > 128<<20 {
		t.Errorf("the agent's memory peaked at %s, over the DaemonSet's 128 MiB", mib(after.hwm))
	}
	if peaks.file > 4<<20 {
		t.Errorf("clients.json reached %s, over its 4 MiB cap", kib(peaks.file))
	}
}
