package bgp

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"

	"github.com/metalvip/metalvip/test/lab"
	"github.com/metalvip/metalvip/test/testenv"
)

// The lab tests run one speaker per node namespace, each in a process of its own (this
// test binary again, running TestHelperSpeakerProcess), because a gobgp server dials from
// whatever namespace its threads happen to be in. The router runs FRR with ECMP; the tests
// read its kernel's routing table.

var (
	labVIP4 = netip.MustParsePrefix("203.0.113.10/32")
	labVIP6 = netip.MustParsePrefix("2001:db8:100::10/128")
)

// speakerSpec is what a helper process runs: written as JSON to a file, re-read on SIGHUP.
type speakerSpec struct {
	Generation int
	RouterID   netip.Addr
	ASN        uint32
	ListenPort int32 // 0: does not listen
	Restarting bool  // Config.Restarting: resumed after a restart
	// Linger keeps the process alive this long after its shutdown, as an agent's other
	// shutdown steps do.
	Linger time.Duration
	Peers  []Peer
	Routes []Route
}

const speakerSpecEnv = "METALVIP_BGP_SPEAKER_SPEC"

// TestHelperSpeakerProcess is not a test: the lab tests start it in a node namespace. It runs
// a Speaker as its spec says, applies the spec again on SIGHUP, shuts the speaker down
// gracefully on SIGTERM and for a planned restart (routes kept) on SIGUSR1.
func TestHelperSpeakerProcess(t *testing.T) {
	path := os.Getenv(speakerSpecEnv)
	if path == "" {
		return
	}
	// First, so that a signal never finds the default action (exit) in place.
	sigs := make(chan os.Signal, 4)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGHUP, syscall.SIGUSR1)
	defer signal.Stop(sigs)

	ctx := context.Background()
	spec := readSpec(t, path)
	s, err := New(ctx, Config{RouterID: spec.RouterID, ASN: spec.ASN, ListenPort: spec.ListenPort, Restarting: spec.Restarting})
	if err != nil {
		t.Fatal(err)
	}
	s.OnSessionChange(func(st SessionState) {
		fmt.Printf("SESSION %s %s bfd=%q since=%s err=%q\n", st.Peer, st.State, st.BFDState, st.Since.Format(time.RFC3339Nano), st.LastError)
	})
	apply := func(spec speakerSpec) {
		if err := s.SetPeers(ctx, spec.Peers); err != nil {
			t.Fatal(err)
		}
		if err := s.SetRoutes(ctx, spec.Routes); err != nil {
			t.Fatal(err)
		}
		fmt.Printf("APPLIED generation=%d routes=%d\n", spec.Generation, len(spec.Routes))
	}
	apply(spec)
	fmt.Println("READY")
	for sig := range sigs {
		if sig == syscall.SIGHUP {
			apply(readSpec(t, path))
			continue
		}
		start := time.Now()
		sctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		shutdown := s.Shutdown
		if sig == syscall.SIGUSR1 {
			shutdown = s.ShutdownForRestart
		}
		err := shutdown(sctx)
		cancel()
		if err != nil {
			t.Fatalf("Shutdown: %v", err)
		}
		fmt.Printf("SHUTDOWN took=%s\n", time.Since(start))
		time.Sleep(spec.Linger)
		return
	}
}

func readSpec(t *testing.T, path string) speakerSpec {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var spec speakerSpec
	if err := json.Unmarshal(b, &spec); err != nil {
		t.Fatalf("spec %s: %v", path, err)
	}
	return spec
}

// labSpeaker is a speaker process in a node namespace.
type labSpeaker struct {
	node *lab.Host
	spec speakerSpec
	path string
	proc *testenv.Proc
}

// routerPeers are the router's IPv4 and IPv6 addresses as seen from a node.
func routerPeers(l *lab.Lab, bfd bool) []Peer {
	var out []Peer
	for _, a := range []netip.Addr{l.Router.IPv4, l.Router.IPv6} {
		p := Peer{Address: a, PeerASN: 64496}
		if bfd {
			p.BFD = BFD{Enabled: true, MinRx: 100 * time.Millisecond, MinTx: 100 * time.Millisecond, Multiplier: 3}
		}
		out = append(out, p)
	}
	return out
}

func startSpeaker(t *testing.T, node *lab.Host, peers []Peer, routes []Route) *labSpeaker {
	t.Helper()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	sp := &labSpeaker{
		node: node,
		spec: speakerSpec{RouterID: node.IPv4, ASN: 64497, Peers: peers, Routes: routes},
		path: filepath.Join(t.TempDir(), node.Name+"-speaker.json"),
	}
	sp.write(t)
	sp.proc = node.Start(t, "speaker", "/usr/bin/env", speakerSpecEnv+"="+sp.path,
		exe, "-test.run=^TestHelperSpeakerProcess$", "-test.v", "-test.timeout=30m")
	sp.waitLog(t, "READY", 30*time.Second)
	return sp
}

func (sp *labSpeaker) write(t *testing.T) {
	t.Helper()
	b, err := json.MarshalIndent(sp.spec, "", "  ")
	if err != nil {
		t.Fatal(err)
	}
	tmp := sp.path + ".tmp"
	if err := os.WriteFile(tmp, b, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, sp.path); err != nil {
		t.Fatal(err)
	}
}

// setRoutes makes the speaker announce routes (SIGHUP) and waits until it has applied them.
func (sp *labSpeaker) setRoutes(t *testing.T, routes []Route) {
	t.Helper()
	sp.spec.Generation++
	sp.spec.Routes = routes
	sp.write(t)
	if err := sp.proc.Cmd.Process.Signal(syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	sp.waitLog(t, fmt.Sprintf("APPLIED generation=%d ", sp.spec.Generation), 10*time.Second)
}

// setPeers makes the speaker's sessions peers (SIGHUP) and waits until it has applied them.
func (sp *labSpeaker) setPeers(t *testing.T, peers []Peer) {
	t.Helper()
	sp.spec.Generation++
	sp.spec.Peers = peers
	sp.write(t)
	if err := sp.proc.Cmd.Process.Signal(syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	sp.waitLog(t, fmt.Sprintf("APPLIED generation=%d ", sp.spec.Generation), 10*time.Second)
}

func (sp *labSpeaker) waitLog(t *testing.T, line string, timeout time.Duration) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !strings.Contains(sp.proc.Output(), line) {
		select {
		case <-sp.proc.Done():
			t.Fatalf("%s's speaker exited (%v) before logging %q:\n%s", sp.node.Name, sp.proc.Err(), line, sp.proc.Tail(30))
		case <-time.After(20 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s's speaker did not log %q within %s:\n%s", sp.node.Name, line, timeout, sp.proc.Tail(30))
		}
	}
}

// routerFIB reads the router namespace's kernel routing table.
type routerFIB struct {
	h *netlink.Handle
}

func openRouterFIB(t *testing.T, l *lab.Lab) *routerFIB {
	t.Helper()
	ns, err := netns.GetFromName(l.Router.NS)
	if err != nil {
		t.Fatal(err)
	}
	defer ns.Close()
	h, err := netlink.NewHandleAt(ns)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(h.Close)
	return &routerFIB{h: h}
}

// nextHops returns the sorted gateways of the router's route for exactly p (none if there
// is no such route).
func (f *routerFIB) nextHops(p netip.Prefix) ([]netip.Addr, error) {
	var out []netip.Addr
	err := f.eachHop(p, func(gw net.IP, _ int) {
		if a, ok := netip.AddrFromSlice(gw); ok {
			out = append(out, a.Unmap())
		}
	})
	slices.SortFunc(out, netip.Addr.Compare)
	return slices.Compact(out), err
}

// devices returns the sorted interfaces of the router's route for exactly p.
func (f *routerFIB) devices(p netip.Prefix) ([]string, error) {
	var out []string
	err := f.eachHop(p, func(_ net.IP, index int) {
		if link, err := f.h.LinkByIndex(index); err == nil {
			out = append(out, link.Attrs().Name)
		}
	})
	slices.Sort(out)
	return slices.Compact(out), err
}

// eachHop calls hop with the gateway and the interface index of each next hop of the
// router's route for exactly p.
func (f *routerFIB) eachHop(p netip.Prefix, hop func(gw net.IP, linkIndex int)) error {
	family := netlink.FAMILY_V4
	if p.Addr().Is6() {
		family = netlink.FAMILY_V6
	}
	dst := &net.IPNet{IP: p.Addr().AsSlice(), Mask: net.CIDRMask(p.Bits(), p.Addr().BitLen())}
	routes, err := f.h.RouteListFiltered(family, &netlink.Route{Dst: dst}, netlink.RT_FILTER_DST)
	if err != nil {
		return fmt.Errorf("list routes for %s: %w", p, err)
	}
	for _, r := range routes {
		if len(r.MultiPath) == 0 {
			hop(r.Gw, r.LinkIndex)
		}
		for _, nh := range r.MultiPath {
			hop(nh.Gw, nh.LinkIndex)
		}
	}
	return nil
}

// waitNextHops waits until the router's route for p goes exactly through want (no route if
// want is empty), polling every 10 ms, and returns how long that took.
func (f *routerFIB) waitNextHops(t *testing.T, p netip.Prefix, want []netip.Addr, timeout time.Duration) time.Duration {
	t.Helper()
	start := time.Now()
	slices.SortFunc(want, netip.Addr.Compare)
	var got []netip.Addr
	var err error
	for {
		got, err = f.nextHops(p)
		if err == nil && slices.Equal(got, want) {
			return time.Since(start)
		}
		if time.Since(start) > timeout {
			t.Fatalf("router's route for %s after %s: next hops %v (%v), want %v", p, timeout, got, err, want)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func nodeAddrs(nodes []*lab.Host, v6 bool) []netip.Addr {
	var out []netip.Addr
	for _, n := range nodes {
		if v6 {
			out = append(out, n.IPv6)
		} else {
			out = append(out, n.IPv4)
		}
	}
	return out
}

func TestLabThreeSpeakersGiveTheRouterThreeNextHopsAndWithdrawIndividually(t *testing.T) {
	l := lab.New(t, lab.Options{Nodes: 3})
	fib := openRouterFIB(t, l)
	routes := []Route{{Prefix: labVIP4}, {Prefix: labVIP6}}
	var speakers []*labSpeaker
	for _, n := range l.Nodes {
		speakers = append(speakers, startSpeaker(t, n, routerPeers(l, false), routes))
	}

	t.Log("every node announces the VIPs: one route each, through all three nodes")
	fib.waitNextHops(t, labVIP4, nodeAddrs(l.Nodes, false), 30*time.Second)
	fib.waitNextHops(t, labVIP6, nodeAddrs(l.Nodes, true), 30*time.Second)
	if out, err := l.Router.Run(context.Background(), "ip", "route", "show", labVIP4.String()); err == nil {
		t.Logf("router: ip route show %s\n%s", labVIP4, out)
	}
	if out, err := l.Router.Run(context.Background(), "ip", "-6", "route", "show", labVIP6.String()); err == nil {
		t.Logf("router: ip -6 route show %s\n%s", labVIP6, out)
	}

	t.Log("node1 stops announcing: two next hops remain")
	speakers[0].setRoutes(t, nil)
	fib.waitNextHops(t, labVIP4, nodeAddrs(l.Nodes[1:], false), 10*time.Second)
	fib.waitNextHops(t, labVIP6, nodeAddrs(l.Nodes[1:], true), 10*time.Second)

	t.Log("node1 announces the IPv4 VIP again, the others stop: only node1 is left for IPv4, nobody for IPv6")
	speakers[0].setRoutes(t, []Route{{Prefix: labVIP4}})
	for _, sp := range speakers[1:] {
		sp.setRoutes(t, nil)
	}
	fib.waitNextHops(t, labVIP4, nodeAddrs(l.Nodes[:1], false), 10*time.Second)
	fib.waitNextHops(t, labVIP6, nil, 10*time.Second)

	t.Log("removed everywhere: no route")
	speakers[0].setRoutes(t, nil)
	fib.waitNextHops(t, labVIP4, nil, 10*time.Second)
	// The sessions stay up throughout: the routes left by UPDATE, not by a session reset.
	out, err := l.Vtysh("show bgp summary json")
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range l.Nodes {
		for _, a := range []netip.Addr{n.IPv4, n.IPv6} {
			if !established(out, a) {
				t.Errorf("router's session with %s is not established:\n%s", a, out)
			}
		}
	}
}

func TestLabSIGTERMWithdrawsTheNodesNextHop(t *testing.T) {
	l := lab.New(t, lab.Options{Nodes: 3})
	fib := openRouterFIB(t, l)
	routes := []Route{{Prefix: labVIP4}, {Prefix: labVIP6}}
	for _, n := range l.Nodes[1:] {
		startSpeaker(t, n, routerPeers(l, true), routes)
	}
	const rounds = 3
	var v4, v6 []time.Duration
	for round := 1; round <= rounds; round++ {
		sp := startSpeaker(t, l.Nodes[0], routerPeers(l, true), routes)
		fib.waitNextHops(t, labVIP4, nodeAddrs(l.Nodes, false), 30*time.Second)
		fib.waitNextHops(t, labVIP6, nodeAddrs(l.Nodes, true), 30*time.Second)

		start := time.Now()
		if err := sp.proc.Cmd.Process.Signal(syscall.SIGTERM); err != nil {
			t.Fatal(err)
		}
		d4, d6 := waitBoth(t, fib, nodeAddrs(l.Nodes[1:], false), nodeAddrs(l.Nodes[1:], true), start, 10*time.Second)
		v4, v6 = append(v4, d4), append(v6, d6)
		select {
		case <-sp.proc.Done():
		case <-time.After(15 * time.Second):
			t.Fatalf("node1's speaker did not exit after SIGTERM:\n%s", sp.proc.Tail(30))
		}
		if err := sp.proc.Err(); err != nil || !strings.Contains(sp.proc.Output(), "SHUTDOWN took=") {
			t.Fatalf("node1's speaker did not shut down cleanly (%v):\n%s", err, sp.proc.Tail(30))
		}
		t.Logf("round %d: SIGTERM to node1's next hop gone: IPv4 %s, IPv6 %s (%s)", round, d4, d6, lastLine(sp.proc.Output(), "SHUTDOWN"))
	}
	t.Logf("SIGTERM withdraw, median of %d: IPv4 %s, IPv6 %s", rounds, median(v4), median(v6))
	// Generous for a loaded 2-core machine; the figures above are what matters.
	for _, d := range append(v4, v6...) {
		if d > 5*time.Second {
			t.Errorf("a withdrawal on SIGTERM took %s", d)
		}
	}
}

func TestLabBFDRemovesANodeWhoseLinkFails(t *testing.T) {
	l := lab.New(t, lab.Options{Nodes: 3})
	fib := openRouterFIB(t, l)
	routes := []Route{{Prefix: labVIP4}, {Prefix: labVIP6}}
	for _, n := range l.Nodes {
		startSpeaker(t, n, routerPeers(l, true), routes)
	}
	fib.waitNextHops(t, labVIP4, nodeAddrs(l.Nodes, false), 30*time.Second)
	fib.waitNextHops(t, labVIP6, nodeAddrs(l.Nodes, true), 30*time.Second)
	// BFD must be up on the router's side for every session, or the link test below would
	// only measure the hold timer.
	var peers []netip.Addr
	for _, n := range l.Nodes {
		peers = append(peers, n.IPv4, n.IPv6)
	}
	waitBFDUp(t, l, peers, 30*time.Second)

	// Each round cuts one more node's switch port, so no round waits for a session to come
	// back. With FRR's hold time of 9 s only BFD (3 x 100 ms) can remove a next hop in
	// under 6 s.
	var v4, v6 []time.Duration
	for i, n := range l.Nodes {
		left := l.Nodes[i+1:]
		start := time.Now()
		if _, err := l.Switch.Run(context.Background(), "ip", "link", "set", "p-"+n.Name, "down"); err != nil {
			t.Fatal(err)
		}
		d4, d6 := waitBoth(t, fib, nodeAddrs(left, false), nodeAddrs(left, true), start, 15*time.Second)
		v4, v6 = append(v4, d4), append(v6, d6)
		t.Logf("%s's link down to its next hop gone: IPv4 %s, IPv6 %s", n.Name, d4, d6)
	}
	t.Logf("BFD link-down removal, median of %d: IPv4 %s, IPv6 %s", len(l.Nodes), median(v4), median(v6))
	for _, d := range append(v4, v6...) {
		if d > 5*time.Second {
			t.Errorf("removing a node whose link failed took %s: BFD did not act", d)
		}
	}
}

// waitBoth polls the router's routes for the IPv4 and the IPv6 VIP every 10 ms until each
// goes exactly through its wanted next hops, and returns how long each took from start.
func waitBoth(t *testing.T, fib *routerFIB, want4, want6 []netip.Addr, start time.Time, timeout time.Duration) (d4, d6 time.Duration) {
	t.Helper()
	for d4 == 0 || d6 == 0 {
		if d4 == 0 {
			if got, err := fib.nextHops(labVIP4); err == nil && slices.Equal(got, want4) {
				d4 = time.Since(start)
			}
		}
		if d6 == 0 {
			if got, err := fib.nextHops(labVIP6); err == nil && slices.Equal(got, want6) {
				d6 = time.Since(start)
			}
		}
		if time.Since(start) > timeout {
			got4, _ := fib.nextHops(labVIP4)
			got6, _ := fib.nextHops(labVIP6)
			t.Fatalf("after %s the router's next hops are %v and %v, want %v and %v", timeout, got4, got6, want4, want6)
		}
		time.Sleep(10 * time.Millisecond)
	}
	return d4, d6
}

// waitBFDUp waits until FRR reports an up BFD session with each peer.
func waitBFDUp(t *testing.T, l *lab.Lab, peers []netip.Addr, timeout time.Duration) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		up, err := l.RouterBFDUp()
		missing := slices.DeleteFunc(slices.Clone(peers), func(a netip.Addr) bool { return up[a] })
		if err == nil && len(missing) == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the router's BFD sessions with %v are not up after %s (%v):\n%s", missing, timeout, err, l.RouterLog(time.Time{}, 40))
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// established reports whether FRR's "show bgp summary json" has an established session
// with peer.
func established(summaryJSON string, peer netip.Addr) bool {
	var summary map[string]struct {
		Peers map[string]struct {
			State string `json:"state"`
		} `json:"peers"`
	}
	if err := json.Unmarshal([]byte(summaryJSON), &summary); err != nil {
		return false
	}
	for _, af := range summary {
		if p, ok := af.Peers[peer.String()]; ok && p.State == "Established" {
			return true
		}
	}
	return false
}

func median(ds []time.Duration) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Clone(ds)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	return s[len(s)/2]
}

func lastLine(out, prefix string) string {
	lines := strings.Split(out, "\n")
	for i := len(lines) - 1; i >= 0; i-- {
		if strings.HasPrefix(lines[i], prefix) {
			return lines[i]
		}
	}
	return ""
}

// TestLabTTLSecurityKeepsFartherPacketsOut runs GTSM (RFC 5082). Against FRR's `neighbor X
// ttl-security hops 1`: a speaker with TTLSecurity peers, one without (eBGP sends TTL 1) is
// refused. Against a speaker two hops away (in the remote namespace, behind the router), whose
// packets arrive with TTL 254: refused while the speaker expects a direct peer, taken once it
// allows two hops.
func TestLabTTLSecurityKeepsFartherPacketsOut(t *testing.T) {
	l := lab.New(t, lab.Options{Nodes: 2})
	// GTSM on FRR's side, for neighbors it knows by address (it leaves the sessions it
	// accepts from a listen range alone).
	vty := []string{"--vty_socket", l.Dir, "-c", "configure terminal", "-c", "router bgp 64496"}
	for _, n := range l.Nodes {
		for _, a := range []netip.Addr{n.IPv4, n.IPv6} {
			vty = append(vty, "-c", fmt.Sprintf("neighbor %s remote-as 64497", a), "-c", fmt.Sprintf("neighbor %s ttl-security hops 1", a),
				"-c", fmt.Sprintf("neighbor %s timers connect 1", a))
			af := "ipv4"
			if a.Is6() {
				af = "ipv6"
			}
			vty = append(vty, "-c", "address-family "+af+" unicast", "-c", fmt.Sprintf("neighbor %s activate", a), "-c", "exit-address-family")
		}
	}
	if out, err := exec.Command("vtysh", vty...).CombinedOutput(); err != nil || len(bytes.TrimSpace(out)) > 0 {
		t.Fatalf("configure FRR's GTSM: %v: %s", err, out)
	}
	gtsm := func(on bool) []Peer {
		peers := routerPeers(l, false)
		for i := range peers {
			peers[i].TTLSecurity = on
		}
		return peers
	}
	node1, node2 := l.Nodes[0], l.Nodes[1]
	const remoteASN = 64499
	remote := Peer{Address: l.Remote.IPv4, PeerASN: remoteASN, TTLSecurity: true}
	sp1 := startSpeaker(t, node1, append(gtsm(true), remote), []Route{{Prefix: labVIP4}})
	startSpeaker(t, node2, gtsm(false), []Route{{Prefix: labVIP4}})
	// The remote speaker listens, two hops from node1, and runs GTSM for two hops.
	far := startSpeakerSpec(t, l.Remote, speakerSpec{RouterID: l.Remote.IPv4, ASN: remoteASN, ListenPort: 179,
		Peers: []Peer{{Address: node1.IPv4, PeerASN: 64497, TTLSecurity: true, MultihopTTL: 2, Passive: true}}})

	// Long enough for several connect attempts on each side (FRR 1 s, the speakers 5 s).
	const refusedFor = 12 * time.Second
	start := time.Now()
	deadline := start.Add(30 * time.Second)
	for {
		out, err := l.Vtysh("show bgp summary json")
		if err != nil {
			t.Fatal(err)
		}
		if established(out, node1.IPv4) && established(out, node1.IPv6) && time.Since(start) >= refusedFor {
			for _, a := range []netip.Addr{node2.IPv4, node2.IPv6} {
				if established(out, a) {
					t.Fatalf("FRR runs GTSM, yet its session with %s (TTL 1) is established:\n%s", a, out)
				}
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("FRR's GTSM sessions with node1 are not up within 30s:\n%s", out)
		}
		time.Sleep(200 * time.Millisecond)
	}
	t.Logf("FRR with GTSM: node1 (TTL security) peers, node2 (TTL 1) still refused after %s", time.Since(start).Round(time.Millisecond))
	openRouterFIB(t, l).waitNextHops(t, labVIP4, []netip.Addr{node1.IPv4}, 10*time.Second)
	farUp := "SESSION " + l.Remote.IPv4.String() + " Established"
	if strings.Contains(sp1.proc.Output(), farUp) || strings.Contains(far.proc.Output(), "SESSION "+node1.IPv4.String()+" Established") {
		t.Fatalf("node1 took a session from two hops away while expecting a direct peer:\n%s", sp1.proc.Tail(20))
	}
	t.Logf("node1 refused the speaker two hops away for %s", time.Since(start).Round(time.Millisecond))

	t.Log("node1 allows two hops for the remote peer: the session comes up")
	remote.MultihopTTL = 2
	sp1.setPeers(t, append(gtsm(true), remote))
	sp1.waitLog(t, farUp, 30*time.Second)
}

func startSpeakerSpec(t *testing.T, h *lab.Host, spec speakerSpec) *labSpeaker {
	t.Helper()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	sp := &labSpeaker{node: h, spec: spec, path: filepath.Join(t.TempDir(), h.Name+"-speaker.json")}
	sp.write(t)
	sp.proc = h.Start(t, "speaker", "/usr/bin/env", speakerSpecEnv+"="+sp.path,
		exe, "-test.run=^TestHelperSpeakerProcess$", "-test.v", "-test.timeout=30m")
	sp.waitLog(t, "READY", 30*time.Second)
	return sp
}

// TestLabAPlannedRestartKeepsTheNextHopAtAGracefulRestartRouter (issue 32): a speaker whose
// sessions negotiated graceful restart with FRR, stopped for a restart (ShutdownForRestart)
// and started again 2 s later, as a DaemonSet's rolling update restarts an agent: the
// router's route to the VIP goes through the node at every moment (FRR keeps it stale while
// the node is away, the restarted speaker's End-of-RIB refreshes it), with BFD up on the
// sessions before (the TCP close ends the session before BFD's detection time does). The
// same with a plain Shutdown removes the next hop, which shows the sampling sees a gap when
// there is one. (A node whose link fails is still removed by BFD in about 300 ms with
// graceful restart on: measured by TestLabBFDRemovesANodeWhoseLinkFails's setup with it.)
func TestLabAPlannedRestartKeepsTheNextHopAtAGracefulRestartRouter(t *testing.T) {
	l := lab.New(t, lab.Options{Nodes: 2})
	fib := openRouterFIB(t, l)
	routes := []Route{{Prefix: labVIP4}, {Prefix: labVIP6}}
	peers := routerPeers(l, true)
	for i := range peers {
		peers[i].GracefulRestart = true
	}
	// node2 announces too, so that the route exists throughout and only node1's next hop is
	// in question.
	startSpeaker(t, l.Nodes[1], peers, routes)
	for _, tc := range []struct {
		name string
		sig  syscall.Signal
		keep bool
	}{
		{"a planned restart (SIGUSR1: ShutdownForRestart)", syscall.SIGUSR1, true},
		{"a goodbye (SIGTERM: Shutdown)", syscall.SIGTERM, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			sp := startSpeaker(t, l.Nodes[0], peers, routes)
			every4, every6 := nodeAddrs(l.Nodes, false), nodeAddrs(l.Nodes, true)
			fib.waitNextHops(t, labVIP4, every4, 30*time.Second)
			fib.waitNextHops(t, labVIP6, every6, 30*time.Second)
			waitBFDUp(t, l, []netip.Addr{l.Nodes[0].IPv4, l.Nodes[0].IPv6}, 30*time.Second)
			start := time.Now()
			if err := sp.proc.Cmd.Process.Signal(tc.sig); err != nil {
				t.Fatal(err)
			}
			select {
			case <-sp.proc.Done():
			case <-time.After(15 * time.Second):
				t.Fatalf("node1's speaker did not exit:\n%s", sp.proc.Tail(30))
			}
			// Sample the router's routes every 10 ms: 2 s away, then the speaker started
			// again, until its sessions are back and 3 s have passed.
			var missing []string
			samples := 0
			sample := func() {
				samples++
				got4, err4 := fib.nextHops(labVIP4)
				got6, err6 := fib.nextHops(labVIP6)
				if err4 != nil || err6 != nil || !slices.Equal(got4, every4) || !slices.Equal(got6, every6) {
					missing = append(missing, fmt.Sprintf("+%s: %v %v (%v %v)", time.Since(start).Round(time.Millisecond), got4, got6, err4, err6))
				}
			}
			for time.Since(start) < 2*time.Second {
				sample()
				time.Sleep(10 * time.Millisecond)
			}
			// Started again as the agent starts from its saved state: it says it restarts.
			sp = startSpeakerSpec(t, l.Nodes[0], speakerSpec{RouterID: l.Nodes[0].IPv4, ASN: 64497, Peers: peers, Routes: routes, Restarting: true})
			back := time.Now()
			for time.Since(back) < 5*time.Second {
				sample()
				time.Sleep(10 * time.Millisecond)
			}
			fib.waitNextHops(t, labVIP4, every4, 30*time.Second)
			fib.waitNextHops(t, labVIP6, every6, 30*time.Second)
			t.Logf("%s: %d samples of the router's routes over %s, %d without node1's next hop (the first: %v)", tc.name, samples, time.Since(start).Round(time.Millisecond), len(missing), missing[:min(len(missing), 3)])
			if tc.keep && len(missing) > 0 {
				t.Errorf("the router lost node1's next hop during a planned restart with graceful restart: %s", strings.Join(missing[:min(len(missing), 10)], "; "))
			}
			if !tc.keep && len(missing) == 0 {
				t.Errorf("the router kept node1's next hop throughout a goodbye: the sampling cannot see a gap")
			}
			if out, err := l.Vtysh("show bgp ipv4 unicast " + labVIP4.String()); err == nil {
				t.Logf("router after the restart:\n%s", out)
			}
			// The restarted speaker said it kept forwarding (RFC 4724 F bit): without it the
			// router drops node1's routes when the new session comes up and adds them back on
			// the UPDATE, a gap the kernel's route may hide from the sampling but an ECMP set
			// does not (connections rehashed and reset; e2ecluster's upgrade saw it).
			out, err := l.Vtysh("show bgp neighbors " + l.Nodes[0].IPv4.String())
			if err != nil {
				t.Fatal(err)
			}
			if tc.keep && !strings.Contains(out, "F bit: True") {
				t.Errorf("node1's restarted speaker did not say it kept forwarding (F bit); the router's view:\n%s", out)
			}
			sp.proc.Cmd.Process.Signal(syscall.SIGTERM)
			<-sp.proc.Done()
		})
	}
}

// TestLabARestartQuickerThanTheRoutersBFDDetectionKeepsTheNextHop (issue 32): the router still
// runs the BFD session of the stopped speaker until its detection time ends (3 x 1 s here,
// as with a BGPPeer's tolerant BFD); a restarted speaker whose session came up before that
// had it ended by the router at the expiry (FRR: Cease/BFD Down 25 ms after the session came
// up, the node's route gone until the session returned 5 s later; e2ecluster's rolling
// update saw it). The restarted speaker holds its first session back until then; the router
// keeps the route stale meanwhile.
func TestLabARestartQuickerThanTheRoutersBFDDetectionKeepsTheNextHop(t *testing.T) {
	l := lab.New(t, lab.Options{Nodes: 2})
	fib := openRouterFIB(t, l)
	routes := []Route{{Prefix: labVIP4}}
	peers := []Peer{{Address: l.Router.IPv4, PeerASN: 64496, GracefulRestart: true,
		BFD: BFD{Enabled: true, MinRx: time.Second, MinTx: time.Second, Multiplier: 3}}}
	startSpeaker(t, l.Nodes[1], peers, routes)
	spec := speakerSpec{RouterID: l.Nodes[0].IPv4, ASN: 64497, Peers: peers, Routes: routes}
	sp := startSpeakerSpec(t, l.Nodes[0], spec)
	every := nodeAddrs(l.Nodes, false)
	fib.waitNextHops(t, labVIP4, every, 30*time.Second)
	waitBFDUp(t, l, []netip.Addr{l.Nodes[0].IPv4}, 30*time.Second)

	start := time.Now()
	if err := sp.proc.Cmd.Process.Signal(syscall.SIGUSR1); err != nil {
		t.Fatal(err)
	}
	<-sp.proc.Done()
	spec.Restarting = true
	sp = startSpeakerSpec(t, l.Nodes[0], spec)
	t.Logf("restarted %s after the stop", time.Since(start).Round(time.Millisecond))
	var missing []string
	samples := 0
	up := ""
	for time.Since(start) < 9*time.Second {
		samples++
		if got, err := fib.nextHops(labVIP4); err != nil || !slices.Equal(got, every) {
			missing = append(missing, fmt.Sprintf("+%s: %v (%v)", time.Since(start).Round(time.Millisecond), got, err))
		}
		if up == "" && strings.Contains(sp.proc.Output(), " Established ") {
			up = time.Since(start).Round(time.Millisecond).String()
		}
		time.Sleep(10 * time.Millisecond)
	}
	events := l.RouterLog(start, 1<<20)
	t.Logf("%d samples over %s, the new session up at +%s, %d without node1's next hop %v", samples, time.Since(start).Round(time.Millisecond), up, len(missing), missing[:min(len(missing), 3)])
	if up == "" {
		t.Errorf("the restarted speaker's session did not come up within 9 s:\n%s", sp.proc.Tail(20))
	}
	if len(missing) > 0 {
		t.Errorf("the router lost node1's next hop: %s", strings.Join(missing[:min(len(missing), 10)], "; "))
	}
	for _, bad := range []string{"BFD Down", "Cease"} {
		if strings.Contains(events, bad) || strings.Contains(sp.proc.Output(), "cease") {
			t.Errorf("the router ended the restarted session (%q); its log:\n%s\nthe speaker's:\n%s", bad, events, sp.proc.Tail(20))
			break
		}
	}
}

// TestLabRouterShapes (issue 31): the speakers with a second router implementation (GoBGP)
// and in iBGP, as with FRR in eBGP above: three nodes give the router three next hops for an
// IPv4 VIP over IPv4 sessions and for an IPv6 VIP over IPv6 sessions (ECMP); a node whose link
// fails leaves both within BFD's time (the hold time is 9 s); a node that says goodbye
// (SIGTERM) leaves both at once.
func TestLabRouterShapes(t *testing.T) {
	for _, tc := range []struct {
		name string
		opts lab.Options
	}{
		{"GoBGP router, eBGP", lab.Options{Nodes: 3, Router: lab.RouterGoBGP}},
		{"GoBGP router, iBGP", lab.Options{Nodes: 3, Router: lab.RouterGoBGP, IBGP: true}},
		{"FRR router, iBGP", lab.Options{Nodes: 3, IBGP: true}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			l := lab.New(t, tc.opts)
			fib := openRouterFIB(t, l)
			asn := uint32(64497)
			if tc.opts.IBGP {
				asn = 64496
			}
			routes := []Route{{Prefix: labVIP4}, {Prefix: labVIP6}}
			var sps []*labSpeaker
			for _, n := range l.Nodes {
				sps = append(sps, startSpeakerSpec(t, n, speakerSpec{RouterID: n.IPv4, ASN: asn, Peers: routerPeers(l, true), Routes: routes}))
			}
			start := time.Now()
			fib.waitNextHops(t, labVIP4, nodeAddrs(l.Nodes, false), 30*time.Second)
			fib.waitNextHops(t, labVIP6, nodeAddrs(l.Nodes, true), 30*time.Second)
			t.Logf("ECMP over the three nodes for both VIPs after %s", time.Since(start).Round(time.Millisecond))
			var peers []netip.Addr
			for _, n := range l.Nodes {
				peers = append(peers, n.IPv4, n.IPv6)
			}
			waitBFDUp(t, l, peers, 30*time.Second)

			start = time.Now()
			if _, err := l.Switch.Run(context.Background(), "ip", "link", "set", "p-"+l.Nodes[0].Name, "down"); err != nil {
				t.Fatal(err)
			}
			d4, d6 := waitBoth(t, fib, nodeAddrs(l.Nodes[1:], false), nodeAddrs(l.Nodes[1:], true), start, 15*time.Second)
			t.Logf("node1's link down to its next hops gone: IPv4 %s, IPv6 %s", d4, d6)
			if max(d4, d6) > 5*time.Second {
				t.Errorf("removing a node whose link failed took %s: BFD did not act", max(d4, d6))
			}

			start = time.Now()
			if err := sps[1].proc.Cmd.Process.Signal(syscall.SIGTERM); err != nil {
				t.Fatal(err)
			}
			d4, d6 = waitBoth(t, fib, nodeAddrs(l.Nodes[2:], false), nodeAddrs(l.Nodes[2:], true), start, 15*time.Second)
			t.Logf("node2's goodbye to its next hops gone: IPv4 %s, IPv6 %s", d4, d6)
			if max(d4, d6) > 5*time.Second {
				t.Errorf("a goodbye took %s to reach the router", max(d4, d6))
			}
		})
	}
}

// TestLabMultihopEBGPToARouterBeyondTheSegment (issue 31): the nodes peer with a router two
// hops away (on the remote host, behind the lab's router: GoBGP, then FRR) over multi-hop eBGP:
// with a TTL of 2 the sessions come up and the router learns the VIP from every node; a goodbye
// withdraws it from that node's next hops. A TTL of 1 (the default) does not reach it.
func TestLabMultihopEBGPToARouterBeyondTheSegment(t *testing.T) {
	for _, router := range []string{lab.RouterGoBGP, lab.RouterFRR} {
		t.Run(router, func(t *testing.T) {
			l := lab.New(t, lab.Options{Nodes: 3})
			// hopsOf is the remote router's next hops for the VIP, sorted, as "[a b c]".
			var hopsOf func() string
			switch router {
			case lab.RouterGoBGP:
				rr, err := l.StartRemoteRouter(64499)
				if err != nil {
					t.Fatal(err)
				}
				hopsOf = func() string {
					var hops string
					for _, line := range strings.Split(rr.Output(), "\n") {
						if rest, ok := strings.CutPrefix(line, "ROUTE "+labVIP4.String()+" "); ok {
							hops = rest
						}
					}
					return hops
				}
			default:
				if err := l.StartRemoteFRR(64499); err != nil {
					t.Fatal(err)
				}
				hopsOf = func() string {
					out, err := l.RemoteVtysh("show bgp ipv4 unicast " + labVIP4.String() + " json")
					if err != nil {
						return ""
					}
					var got struct {
						Paths []struct {
							Nexthops []struct {
								IP string `json:"ip"`
							} `json:"nexthops"`
						} `json:"paths"`
					}
					if json.Unmarshal([]byte(out), &got) != nil {
						return ""
					}
					var hops []string
					for _, p := range got.Paths {
						for _, n := range p.Nexthops {
							hops = append(hops, n.IP)
						}
					}
					if len(hops) == 0 {
						return ""
					}
					slices.Sort(hops)
					return "[" + strings.Join(slices.Compact(hops), " ") + "]"
				}
			}
			far := func(ttl uint8) []Peer { return []Peer{{Address: l.Remote.IPv4, PeerASN: 64499, MultihopTTL: ttl}} }
			routes := []Route{{Prefix: labVIP4}}
			wait := func(want string) {
				t.Helper()
				deadline := time.Now().Add(30 * time.Second)
				for hopsOf() != want {
					if time.Now().After(deadline) {
						t.Fatalf("the remote router's paths to %s go via %q, want %q", labVIP4, hopsOf(), want)
					}
					time.Sleep(20 * time.Millisecond)
				}
			}

			one := startSpeakerSpec(t, l.Nodes[0], speakerSpec{RouterID: l.Nodes[0].IPv4, ASN: 64497, Peers: far(0), Routes: routes})
			time.Sleep(3 * time.Second) // gobgp dials at once and again after its connect retry
			if got := hopsOf(); got != "" {
				t.Fatalf("a session with TTL 1 reached a router two hops away: it routes %s via %s", labVIP4, got)
			}
			one.setPeers(t, far(2))
			var sps []*labSpeaker
			for _, n := range l.Nodes[1:] {
				sps = append(sps, startSpeakerSpec(t, n, speakerSpec{RouterID: n.IPv4, ASN: 64497, Peers: far(2), Routes: routes}))
			}
			start := time.Now()
			wait("[198.51.100.11 198.51.100.12 198.51.100.13]")
			t.Logf("multi-hop sessions of three nodes: the remote %s router has %s from all three after %s", router, labVIP4, time.Since(start).Round(time.Millisecond))
			if err := sps[0].proc.Cmd.Process.Signal(syscall.SIGTERM); err != nil {
				t.Fatal(err)
			}
			wait("[198.51.100.11 198.51.100.13]")
		})
	}
}

// TestLabASourceAddressOpensTheSessionFromIt (issue 31): a peer with a source address (a
// second address of the node's) has its session opened from it: the router sees the session
// from that address and routes the VIP to it.
func TestLabASourceAddressOpensTheSessionFromIt(t *testing.T) {
	l := lab.New(t, lab.Options{Nodes: 1})
	fib := openRouterFIB(t, l)
	src := netip.MustParseAddr("198.51.100.49") // a node address no node of this lab has
	if out, err := l.Nodes[0].Run(context.Background(), "ip", "addr", "add", src.String()+"/25", "dev", "eth0"); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	peer := Peer{Address: l.Router.IPv4, PeerASN: 64496, SourceAddress: src, ConnectRetry: 2 * time.Second}
	startSpeakerSpec(t, l.Nodes[0], speakerSpec{RouterID: l.Nodes[0].IPv4, ASN: 64497, Peers: []Peer{peer}, Routes: []Route{{Prefix: labVIP4}}})
	fib.waitNextHops(t, labVIP4, []netip.Addr{src}, 30*time.Second)
	out, err := l.Vtysh("show bgp ipv4 unicast summary")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out, src.String()) || strings.Contains(out, l.Nodes[0].IPv4.String()) {
		t.Errorf("the router's sessions do not come from %s alone:\n%s", src, out)
	}
}

// TestLabUnnumberedSessionsCarryRoutes (issue 31): two nodes peer with FRR over point-to-point
// links that have only link-local addresses (BGP unnumbered: Peer.Interface on the node,
// "neighbor IF interface" on the router): the sessions come up, the router installs the IPv4
// and the IPv6 VIP through both links (ECMP over link-local next hops), and a link that goes
// silent leaves the set within BFD's time.
func TestLabUnnumberedSessionsCarryRoutes(t *testing.T) {
	l := lab.New(t, lab.Options{Nodes: 2, Unnumbered: true})
	fib := openRouterFIB(t, l)
	peer := Peer{Interface: lab.UnnumberedLink, PeerASN: 64496, ConnectRetry: time.Second,
		BFD: BFD{Enabled: true, MinRx: 100 * time.Millisecond, MinTx: 100 * time.Millisecond, Multiplier: 3}}
	routes := []Route{{Prefix: labVIP4}, {Prefix: labVIP6}}
	var sps []*labSpeaker
	start := time.Now()
	for _, n := range l.Nodes {
		sps = append(sps, startSpeakerSpec(t, n, speakerSpec{RouterID: n.IPv4, ASN: 64497, Peers: []Peer{peer}, Routes: routes}))
	}
	links := func(nodes []*lab.Host) []string {
		var out []string
		for _, n := range nodes {
			out = append(out, lab.UnnumberedRouterLink(n))
		}
		return out
	}
	waitDevs := func(want []string, timeout time.Duration) {
		t.Helper()
		deadline := time.Now().Add(timeout)
		for {
			d4, err4 := fib.devices(labVIP4)
			d6, err6 := fib.devices(labVIP6)
			if err4 == nil && err6 == nil && slices.Equal(d4, want) && slices.Equal(d6, want) {
				return
			}
			if time.Now().After(deadline) {
				sum, _ := l.Vtysh("show bgp summary")
				t.Fatalf("after %s the router routes %s via %v (%v) and %s via %v (%v), want %v; FRR:\n%s\n%s\nnode1's speaker:\n%s",
					timeout, labVIP4, d4, err4, labVIP6, d6, err6, want, sum, l.RouterLog(start, 40), sps[0].proc.Tail(20))
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	waitDevs(links(l.Nodes), 30*time.Second)
	t.Logf("unnumbered sessions of two nodes: the router routes both VIPs over both links after %s", time.Since(start).Round(time.Millisecond))
	for _, sp := range sps {
		sp.waitLog(t, "Established", 10*time.Second)
	}

	// BFD up at the router, then node1's link fails.
	deadline := time.Now().Add(30 * time.Second)
	for {
		out, err := l.Vtysh("show bfd peers brief json")
		if err == nil && strings.Count(out, `"status":"up"`) >= 2 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the router's BFD sessions over the unnumbered links are not up: %s (%v)", out, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	// The link stays up (the router's side keeps its carrier): only BFD can tell.
	cut := time.Now()
	drop := fmt.Sprintf("add table inet cut; add chain inet cut in { type filter hook input priority 0; }; add rule inet cut in iifname %[1]s drop; "+
		"add chain inet cut out { type filter hook output priority 0; }; add rule inet cut out oifname %[1]s drop", lab.UnnumberedLink)
	if out, err := l.Nodes[0].Run(context.Background(), "nft", drop); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	waitDevs(links(l.Nodes[1:]), 15*time.Second)
	took := time.Since(cut)
	t.Logf("node1's unnumbered link silent to its next hops gone: %s", took.Round(time.Millisecond))
	if took > 5*time.Second {
		t.Errorf("removing a node whose unnumbered link went silent took %s: BFD did not act", took)
	}
}
