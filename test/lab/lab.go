// Package lab builds a network lab in Linux network namespaces for tests: N nodes, an on-link
// client and a router on one L2 segment (a bridge in a switch namespace of its own), and a
// remote client behind the router. The router runs FRR (zebra, bgpd, bfdd) and accepts BGP
// sessions from the nodes with ECMP on. Nothing touches the host's own namespace.
//
//	segment 198.51.100.0/25, 2001:db8:1::/64
//	  router   .1    ::1       node i   .(10+i)  ::(10+i)      client .100 ::100
//	remote link 198.51.100.128/25, 2001:db8:2::/64
//	  router   .129  ::1       remote   .130     ::2
//	VIPs 203.0.113.0/24 and 2001:db8:100::/64 (on-link for the client, routed for the remote)
//
// Everything is removed when the test ends, and also when the test binary dies without
// cleaning up (a panic, a timeout, SIGKILL): a reaper process holds the lab's inventory and
// deletes it when its pipe from the test binary closes.
package lab

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/metalvip/metalvip/test/testenv"
)

// Addresses of the lab.
var (
	SegmentV4  = netip.MustParsePrefix("198.51.100.0/25")
	SegmentV6  = netip.MustParsePrefix("2001:db8:1::/64")
	RemoteV4   = netip.MustParsePrefix("198.51.100.128/25")
	RemoteV6   = netip.MustParsePrefix("2001:db8:2::/64")
	VIPRangeV4 = netip.MustParsePrefix("203.0.113.0/24")
	VIPRangeV6 = netip.MustParsePrefix("2001:db8:100::/64")
)

// ClientAddr is the i-th extra client address (Options.ClientAddrs): 198.51.100.51 up, between
// the nodes (.11 to .50) and the client's own .100.
func ClientAddr(i int) netip.Addr { return netip.AddrFrom4([4]byte{198, 51, 100, byte(51 + i)}) }

// Options shape a lab. The zero value gives 3 nodes with the documentation ASNs.
type Options struct {
	Nodes     int    // default 3, at most 40
	RouterASN uint32 // default 64496
	NodeASN   uint32 // default 64497: the nodes' side of the eBGP sessions
	// ClientAddrs adds this many extra IPv4 addresses to the on-link client (from
	// ClientAddr(0) up), for tests that need many clients on the segment. At most 49.
	ClientAddrs int
	// BFDIntervalMS is the router's BFD transmit and receive interval (default 100 ms,
	// detect multiplier 3).
	BFDIntervalMS int
	// Router is the router's BGP implementation: RouterFRR (the default) or RouterGoBGP.
	Router string
	// IBGP makes the nodes' sessions iBGP: the nodes' ASN is the router's (NodeASN is
	// ignored).
	IBGP bool
	// Unnumbered adds a point-to-point link between each node and the router, with
	// link-local IPv6 addresses only (UnnumberedLink on the node, UnnumberedRouterLink on the
	// router), and FRR peers with the nodes over them as BGP unnumbered ("neighbor IF
	// interface", eBGP, BFD, IPv4 and IPv6 unicast). FRR only.
	Unnumbered bool
}

// UnnumberedLink is the node's side of its point-to-point link to the router
// (Options.Unnumbered).
const UnnumberedLink = "un0"

// UnnumberedRouterLink is the router's side of node's point-to-point link.
func UnnumberedRouterLink(node *Host) string { return "un-" + node.Name }

// The router's BGP implementations (Options.Router).
const (
	// RouterFRR is FRR 8 (zebra, bgpd, bfdd): the default, with Vtysh, RouterLog and
	// RestartRouter.
	RouterFRR = "frr"
	// RouterGoBGP is gobgp v4 (test/lab/gobgprouter): sessions from the same ranges, BFD,
	// graceful restart (helper) and ECMP routes in the kernel as FRR's, without weights from
	// the link-bandwidth community. Its log is the "router-gobgp" process's output.
	RouterGoBGP = "gobgp"
)

// Lab is a running lab.
type Lab struct {
	ID      string // short random id that prefixes every namespace
	Dir     string // configuration, sockets and logs
	Nodes   []*Host
	Router  *Host
	Client  *Host // on the segment
	Remote  *Host // behind the router
	Control *Host // on the segment, for a control plane (the CCM) that must reach the agents
	Switch  *Host // holds the bridge; no addresses

	opts       Options
	t          testenv.TB
	reaper     *testenv.Reaper
	procs      []*testenv.Proc
	mu         sync.Mutex
	nexthopIDs uint32        // the last nexthop object id made (resilient.go); 0: none yet
	gobgp      *testenv.Proc // the router with RouterGoBGP
}

// Host is one network namespace.
type Host struct {
	Name string // role: node1, router, client, remote, switch
	NS   string // namespace name
	IPv4 netip.Addr
	IPv6 netip.Addr
	lab  *Lab
}

// NamespacePrefix starts the name of every namespace a lab creates.
const NamespacePrefix = "mvlab-"

// New builds a lab; it is removed when the test ends. It skips the test when not root (fails
// it under METALVIP_REQUIRE_LAB=1) and fails it when FRR or iproute2 are missing.
func New(t testenv.TB, opts Options) *Lab {
	t.Helper()
	testenv.RequireRoot(t)
	for _, bin := range []string{"ip", "/usr/lib/frr/zebra", "/usr/lib/frr/bgpd", "/usr/lib/frr/bfdd", "vtysh"} {
		if _, err := exec.LookPath(bin); err != nil {
			testenv.Skip(t, "%s not found; run hack/install-deps.sh (make test does)", bin)
		}
	}
	if opts.Nodes == 0 {
		opts.Nodes = 3
	}
	if opts.Nodes < 1 || opts.Nodes > 40 {
		t.Fatalf("lab: %d nodes; give 1 to 40", opts.Nodes)
	}
	if opts.ClientAddrs < 0 || opts.ClientAddrs > 49 {
		t.Fatalf("lab: %d extra client addresses; give 0 to 49", opts.ClientAddrs)
	}
	if opts.RouterASN == 0 {
		opts.RouterASN = 64496
	}
	if opts.NodeASN == 0 {
		opts.NodeASN = 64497
	}
	if opts.BFDIntervalMS == 0 {
		opts.BFDIntervalMS = 100
	}
	switch opts.Router {
	case "":
		opts.Router = RouterFRR
	case RouterFRR, RouterGoBGP:
	default:
		t.Fatalf("lab: router %q; give %q or %q", opts.Router, RouterFRR, RouterGoBGP)
	}
	if opts.IBGP {
		opts.NodeASN = opts.RouterASN
	}
	if opts.Unnumbered && opts.Router != RouterFRR {
		t.Fatalf("lab: unnumbered links need the FRR router, not %q", opts.Router)
	}

	b := make([]byte, 3)
	_, _ = rand.Read(b)
	l := &Lab{ID: hex.EncodeToString(b), opts: opts, t: t}
	var err error
	if l.Dir, err = os.MkdirTemp("", "metalvip-lab-"+l.ID+"-"); err != nil {
		t.Fatalf("lab: %v", err)
	}
	l.Switch = l.host("switch", netip.Addr{}, netip.Addr{})
	l.Router = l.host("router", netip.MustParseAddr("198.51.100.1"), netip.MustParseAddr("2001:db8:1::1"))
	for i := 1; i <= opts.Nodes; i++ {
		l.Nodes = append(l.Nodes, l.host(fmt.Sprintf("node%d", i),
			netip.AddrFrom4([4]byte{198, 51, 100, byte(10 + i)}),
			netip.MustParseAddr(fmt.Sprintf("2001:db8:1::%d", 10+i))))
	}
	l.Client = l.host("client", netip.MustParseAddr("198.51.100.100"), netip.MustParseAddr("2001:db8:1::100"))
	l.Control = l.host("control", netip.MustParseAddr("198.51.100.2"), netip.MustParseAddr("2001:db8:1::2"))
	l.Remote = l.host("remote", netip.MustParseAddr("198.51.100.130"), netip.MustParseAddr("2001:db8:2::2"))

	// The reaper comes first, so that whatever happens next is undone.
	if err := l.startReaper(); err != nil {
		os.RemoveAll(l.Dir)
		t.Fatalf("lab: %v", err)
	}
	t.Cleanup(l.close)
	if err := l.build(); err != nil {
		t.Fatalf("lab %s: %v", l.ID, err)
	}
	return l
}

func (l *Lab) host(name string, v4, v6 netip.Addr) *Host {
	return &Host{Name: name, NS: NamespacePrefix + l.ID + "-" + name, IPv4: v4, IPv6: v6, lab: l}
}

// Hosts returns every namespace of the lab.
func (l *Lab) Hosts() []*Host {
	hs := []*Host{l.Switch, l.Router, l.Client, l.Remote, l.Control}
	return append(hs, l.Nodes...)
}

// NextHops returns the next hops of the router's kernel route to vip, sorted.
func (l *Lab) NextHops(t testenv.TB, vip string) []string {
	t.Helper()
	hops, err := l.RouteNextHops(vip)
	if err != nil {
		t.Fatalf("%v", err)
	}
	return hops
}

// RouteNextHops is NextHops for any goroutine: it returns the error instead of failing.
func (l *Lab) RouteNextHops(vip string) ([]string, error) {
	return l.routeHops(vip, func(h routeHop) string { return h.Gateway })
}

// RouteDevices returns the interfaces of the router's kernel route to vip (of each next hop),
// sorted: with Options.Unnumbered, UnnumberedRouterLink of the nodes it goes through.
func (l *Lab) RouteDevices(vip string) ([]string, error) {
	return l.routeHops(vip, func(h routeHop) string { return h.Dev })
}

// routeHop is one next hop of "ip -j route": a single-path route's own fields, or one of a
// multipath route's nexthops.
type routeHop struct {
	Gateway string `json:"gateway"`
	Dev     string `json:"dev"`
}

// routeHops returns field of each next hop of the router's kernel route to vip, sorted and
// without duplicates or empty values.
func (l *Lab) routeHops(vip string, field func(routeHop) string) ([]string, error) {
	out, err := l.Router.Run(context.Background(), "ip", "-j", "route", "show", vip)
	if err != nil {
		return nil, err
	}
	var routes []struct {
		routeHop
		Nexthops []routeHop `json:"nexthops"`
	}
	if err := json.Unmarshal(out, &routes); err != nil {
		return nil, fmt.Errorf("ip -j route: %w: %s", err, out)
	}
	var vals []string
	for _, r := range routes {
		for _, h := range append([]routeHop{r.routeHop}, r.Nexthops...) {
			if v := field(h); v != "" {
				vals = append(vals, v)
			}
		}
	}
	slices.Sort(vals)
	return slices.Compact(vals), nil
}

// Names returns the hosts' names, in order.
func Names(hosts []*Host) []string {
	out := make([]string, 0, len(hosts))
	for _, h := range hosts {
		out = append(out, h.Name)
	}
	return out
}

// Namespaces returns the names of every namespace of the lab.
func (l *Lab) Namespaces() []string {
	var out []string
	for _, h := range l.Hosts() {
		out = append(out, h.NS)
	}
	return out
}

// startReaper starts a process, in a session of its own so that a terminal's Ctrl-C does not
// reach it, that waits for its stdin to close and then kills every process left in the lab's
// namespaces and deletes them and the lab's folder. The test binary holds the other end of
// stdin: when it exits, however it exits, the kernel closes it.
func (l *Lab) startReaper() error {
	script := `for ns in "$@"; do
  for pid in $(ip netns pids "$ns" 2>/dev/null); do kill -9 "$pid" 2>/dev/null; done
done
for ns in "$@"; do ip netns delete "$ns" 2>/dev/null; done
rm -rf "$LAB_DIR" "/var/run/frr/$LAB_FRR" "/var/run/frr/$LAB_FRR-remote"
echo reaped`
	var err error
	l.reaper, err = testenv.StartReaper("reaper", script, []string{"LAB_DIR=" + l.Dir, "LAB_FRR=" + l.frrName()}, l.Namespaces()...)
	return err
}

// close stops the lab's processes gracefully, then lets the reaper remove the rest.
func (l *Lab) close() {
	for i := len(l.procs) - 1; i >= 0; i-- {
		l.procs[i].Stop(3 * time.Second)
	}
	if l.t.Failed() {
		for _, c := range []string{"show bgp summary", "show bfd peers brief"} {
			if out, err := l.Vtysh(c); err == nil {
				l.t.Logf("lab %s router at teardown, %s:\n%s", l.ID, c, out)
			}
		}
	}
	if !l.reaper.Reap(30 * time.Second) {
		l.t.Errorf("lab %s: reaper did not finish within 30s", l.ID)
	}
}

func (l *Lab) build() error {
	for _, h := range l.Hosts() {
		if err := ip("netns", "add", h.NS); err != nil {
			return err
		}
		// No duplicate address detection on lab links: it delays IPv6 by seconds.
		if err := h.sysctls(map[string]string{
			"net.ipv6.conf.all.accept_dad":     "0",
			"net.ipv6.conf.default.accept_dad": "0",
		}); err != nil {
			return err
		}
		if err := ip("-n", h.NS, "link", "set", "lo", "up"); err != nil {
			return err
		}
	}
	if err := ip("-n", l.Switch.NS, "link", "add", "br0", "type", "bridge", "stp_state", "0", "forward_delay", "0"); err != nil {
		return err
	}
	if err := ip("-n", l.Switch.NS, "link", "set", "br0", "up"); err != nil {
		return err
	}
	segment := append([]*Host{l.Router, l.Client, l.Control}, l.Nodes...)
	for _, h := range segment {
		port := "p-" + h.Name
		if err := ip("-n", l.Switch.NS, "link", "add", port, "type", "veth", "peer", "name", "eth0", "netns", h.NS); err != nil {
			return err
		}
		if err := ip("-n", l.Switch.NS, "link", "set", port, "master", "br0", "up"); err != nil {
			return err
		}
		if err := h.addrs("eth0", netip.PrefixFrom(h.IPv4, SegmentV4.Bits()), netip.PrefixFrom(h.IPv6, SegmentV6.Bits())); err != nil {
			return err
		}
	}
	// Nodes accept traffic for every VIP (as kube-proxy makes a real node do), but their
	// kernels must not answer ARP for VIPs: only the agent decides who answers for a VIP.
	// (Linux answers NDP only for addresses on the receiving interface, so the local routes
	// give no NDP answers; they do let a node receive unicast Neighbor Solicitations.)
	for _, h := range l.Nodes {
		if err := h.sysctls(map[string]string{
			"net.ipv4.conf.all.arp_ignore":   "1",
			"net.ipv4.conf.all.arp_announce": "2",
		}); err != nil {
			return err
		}
		if err := ip("-n", h.NS, "route", "add", "local", VIPRangeV4.String(), "dev", "lo"); err != nil {
			return err
		}
		if err := ip("-n", h.NS, "-6", "route", "add", "local", VIPRangeV6.String(), "dev", "lo"); err != nil {
			return err
		}
	}
	if l.opts.Unnumbered {
		for _, h := range l.Nodes {
			if err := ip("-n", l.Router.NS, "link", "add", UnnumberedRouterLink(h), "type", "veth", "peer", "name", UnnumberedLink, "netns", h.NS); err != nil {
				return err
			}
			if err := ip("-n", l.Router.NS, "link", "set", UnnumberedRouterLink(h), "up"); err != nil {
				return err
			}
			if err := ip("-n", h.NS, "link", "set", UnnumberedLink, "up"); err != nil {
				return err
			}
		}
	}
	// Router to remote: a direct link.
	if err := ip("-n", l.Router.NS, "link", "add", "eth1", "type", "veth", "peer", "name", "eth0", "netns", l.Remote.NS); err != nil {
		return err
	}
	if err := l.Router.addrs("eth1", netip.MustParsePrefix("198.51.100.129/25"), netip.MustParsePrefix("2001:db8:2::1/64")); err != nil {
		return err
	}
	if err := l.Remote.addrs("eth0", netip.PrefixFrom(l.Remote.IPv4, RemoteV4.Bits()), netip.PrefixFrom(l.Remote.IPv6, RemoteV6.Bits())); err != nil {
		return err
	}
	for i := range l.opts.ClientAddrs {
		a := ClientAddr(i)
		if err := ip("-n", l.Client.NS, "addr", "add", netip.PrefixFrom(a, SegmentV4.Bits()).String(), "dev", "eth0"); err != nil {
			return err
		}
	}

	// Routes. Nodes and the client reach the rest through the router; the client reaches VIPs
	// on-link (it ARPs for them), the remote client only through the router.
	for _, h := range append([]*Host{l.Client, l.Control}, l.Nodes...) {
		if err := h.defaultRoutes("198.51.100.1", "2001:db8:1::1"); err != nil {
			return err
		}
	}
	if err := l.Remote.defaultRoutes("198.51.100.129", "2001:db8:2::1"); err != nil {
		return err
	}
	for _, h := range []*Host{l.Client, l.Router} {
		// The router keeps this on-link route for L2 VIPs; BGP's /32s and /128s are more
		// specific and win for BGP VIPs.
		if err := ip("-n", h.NS, "route", "add", VIPRangeV4.String(), "dev", "eth0"); err != nil {
			return err
		}
		if err := ip("-n", h.NS, "-6", "route", "add", VIPRangeV6.String(), "dev", "eth0"); err != nil {
			return err
		}
	}
	if err := l.Router.sysctls(map[string]string{
		"net.ipv4.ip_forward":                  "1",
		"net.ipv6.conf.all.forwarding":         "1",
		"net.ipv4.fib_multipath_hash_policy":   "1", // ECMP by L4 flow, so flows spread
		"net.ipv6.fib_multipath_hash_policy":   "1",
		"net.ipv4.conf.all.rp_filter":          "0",
		"net.ipv4.conf.default.rp_filter":      "0",
		"net.ipv4.conf.all.accept_redirects":   "0",
		"net.ipv4.conf.all.send_redirects":     "0",
		"net.ipv4.conf.default.send_redirects": "0",
	}); err != nil {
		return err
	}
	if l.opts.Router == RouterGoBGP {
		return l.startGoBGP()
	}
	return l.startFRR()
}

func ip(args ...string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, "ip", args...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("ip %s: %v: %s", strings.Join(args, " "), err, bytes.TrimSpace(out))
	}
	return nil
}

// waitFor polls cond every 50 ms until it holds, the timeout passes, or p exits.
func waitFor(timeout time.Duration, cond func() bool, p *testenv.Proc) error {
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			return fmt.Errorf("timed out after %s", timeout)
		}
		select {
		case <-p.Done():
			return fmt.Errorf("exited: %v", p.Err())
		case <-time.After(50 * time.Millisecond):
		}
	}
	return nil
}
