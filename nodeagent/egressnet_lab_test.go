package nodeagent

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/vishvananda/netns"

	"github.com/metalvip/metalvip/test/lab"
)

// egressNetOn returns the egress configuration of a lab host's namespace.
func egressNetOn(t *testing.T, h *lab.Host) *nlEgress {
	t.Helper()
	ns, err := netns.GetFromPath(filepath.Join("/run/netns", h.NS))
	if err != nil {
		t.Fatal(err)
	}
	defer ns.Close()
	e, err := newEgressNetIn(ns)
	if err != nil {
		t.Fatal(err)
	}
	return e
}

// TestLabEgressLeavesFromTheVIP checks the egress rules on the wire: a "pod" address on node1
// (on its loopback: this kernel has no dummy devices) reaches the server behind the router from the VIP when node1 is the
// egress node (SNAT there), and when node2 is (routed to node2 as itself, SNAT there); a
// connection from another address of node1 keeps its source; an empty configuration leaves
// nothing behind, and a new EgressNet (a restarted agent) removes what an old one left.
func TestLabEgressLeavesFromTheVIP(t *testing.T) {
	t.Run("IPv4", func(t *testing.T) {
		testEgressLeavesFromTheVIP(t, egressFamily{
			vip: "203.0.113.50", pod: "198.18.1.2", other: "198.18.1.3", podNet: "198.18.1.0/24",
			cluster: []string{"198.18.0.0/15", "198.51.100.0/25"}, forward: "net.ipv4.ip_forward=1",
			addr: func(h *lab.Host) netip.Addr { return h.IPv4 },
		})
	})
	t.Run("IPv6", func(t *testing.T) {
		testEgressLeavesFromTheVIP(t, egressFamily{
			vip: "2001:db8:100::50", pod: "2001:db8:18:1::2", other: "2001:db8:18:1::3", podNet: "2001:db8:18:1::/64",
			cluster: []string{"2001:db8:18::/48", "2001:db8:1::/64"}, forward: "net.ipv6.conf.all.forwarding=1",
			addr: func(h *lab.Host) netip.Addr { return h.IPv6 },
		})
	})
}

// egressFamily are the addresses of one family's egress lab test.
type egressFamily struct {
	vip, pod, other, podNet string
	cluster                 []string
	forward                 string // the sysctl that makes a node forward
	addr                    func(*lab.Host) netip.Addr
}

func testEgressLeavesFromTheVIP(t *testing.T, fam egressFamily) {
	l := lab.New(t, lab.Options{Nodes: 2})
	ctx := context.Background()
	n1, n2 := l.Nodes[0], l.Nodes[1]
	vip := netip.MustParseAddr(fam.vip)
	pod := netip.MustParseAddr(fam.pod)
	other := netip.MustParseAddr(fam.other)
	var cluster []netip.Prefix
	for _, c := range fam.cluster {
		cluster = append(cluster, netip.MustParsePrefix(c))
	}
	ipf := "-4"
	if vip.Is6() {
		ipf = "-6"
	}
	for _, a := range []netip.Addr{pod, other} {
		cmd := []string{"ip", ipf, "addr", "add", netip.PrefixFrom(a, a.BitLen()).String(), "dev", "lo"}
		if a.Is6() {
			cmd = append(cmd, "nodad")
		}
		if out, err := n1.Run(ctx, cmd[0], cmd[1:]...); err != nil {
			t.Fatalf("node1: %v: %v %s", cmd, err, out)
		}
	}
	// node2 forwards (as a Kubernetes node does) and routes the pods' replies back to node1
	// (a CNI's pod-CIDR route).
	for _, cmd := range [][]string{{"sysctl", "-qw", fam.forward}, {"ip", ipf, "route", "add", fam.podNet, "via", fam.addr(n1).String()}} {
		if out, err := n2.Run(ctx, cmd[0], cmd[1:]...); err != nil {
			t.Fatalf("node2: %v: %v %s", cmd, err, out)
		}
	}
	// The router reaches the "pods" as themselves (a routed pod network), so that a source
	// the rules leave alone gets its answer too.
	if out, err := l.Router.Run(ctx, "ip", ipf, "route", "add", fam.podNet, "via", fam.addr(n1).String()); err != nil {
		t.Fatalf("router: %v %s", err, out)
	}
	log := l.Remote.RecordSources(t, 9000, 10000)
	// The router sends the VIP's packets to the egress node (its L2 answer, here by hand).
	towards := func(h *lab.Host) {
		t.Helper()
		if out, err := l.Router.Run(ctx, "ip", ipf, "neigh", "replace", vip.String(), "lladdr", h.MAC(t), "dev", "eth0", "nud", "permanent"); err != nil {
			t.Fatalf("router: %v %s", err, out)
		}
	}
	server := fam.addr(l.Remote)
	source := func(src netip.Addr) (netip.Addr, error) {
		got, err := egressDial(ctx, t, log, n1, src, server, n1, n2)
		return got.From, err
	}
	expect := func(what string, src, want netip.Addr) {
		t.Helper()
		got, err := source(src)
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		if got != want {
			t.Fatalf("%s: the server saw %s, want %s", what, got, want)
		}
	}

	e1, e2 := egressNetOn(t, n1), egressNetOn(t, n2)
	t.Cleanup(func() { _ = e1.Close(); _ = e2.Close() })

	// node1 is the egress node.
	towards(n1)
	if err := e1.Set(EgressConfig{Cluster: cluster, SNAT: []EgressSNAT{{VIP: vip, Sources: []netip.Addr{pod}}}}); err != nil {
		t.Fatal(err)
	}
	expect("node1 the egress node", pod, vip)
	// The other address is no pod of the Service: it leaves as itself (nothing masquerades
	// here), not from the VIP.
	expect("another address on node1", other, other)
	if f := e1.Flows()[vip]; f < 1 {
		t.Errorf("flows counted for %s: %d, want at least 1", vip, f)
	}

	// node2 becomes the egress node: node1 routes the pod to it, node2 source-NATs it.
	towards(n2)
	if err := e2.Set(EgressConfig{Cluster: cluster, SNAT: []EgressSNAT{{VIP: vip, Sources: []netip.Addr{pod}}}}); err != nil {
		t.Fatal(err)
	}
	if err := e1.Set(EgressConfig{Cluster: cluster, Route: []EgressRoute{{VIP: vip, Via: fam.addr(n2), Sources: []netip.Addr{pod}}}}); err != nil {
		t.Fatal(err)
	}
	// The pod's connections NATed to the VIP on node1 are forgotten (in the background): one
	// under way would otherwise keep its NAT and, routed no more, leave as the pod.
	e1.forgets.Wait()
	if out, _ := n1.Run(ctx, "conntrack", "-L", "-s", pod.String()); strings.Contains(string(out), "dst="+vip.String()+" ") {
		t.Fatalf("node1 keeps the pod's connections NATed to the VIP after node2 became the egress node:\n%s", out)
	}
	expect("node2 the egress node", pod, vip)
	expect("another address on node1, node2 the egress node", other, other)
	if rules, _ := n1.Run(ctx, "ip", ipf, "rule", "show"); !strings.Contains(string(rules), "7471:") {
		t.Fatalf("node1 has no rule of priority 7471:\n%s", rules)
	}
	// A cluster destination is not routed to node2: node1 reaches node2's address as itself.
	if err := n1.Do(func() error {
		d := net.Dialer{LocalAddr: &net.TCPAddr{IP: pod.AsSlice()}, Timeout: time.Second}
		c, err := d.DialContext(ctx, "tcp", netip.AddrPortFrom(fam.addr(n2), 9).String())
		if err == nil {
			_ = c.Close()
		}
		return nil // refused or not: the rule check below is what counts
	}); err != nil {
		t.Fatal(err)
	}
	if rules, _ := n1.Run(ctx, "ip", ipf, "rule", "show"); !strings.Contains(string(rules), fmt.Sprintf("from %s to %s lookup main", pod, cluster[1])) {
		t.Fatalf("node1 has no rule sending the pod's cluster destinations to main:\n%s", rules)
	}

	// An egress node without an address of the VIP's family (known to the CCM): the pod's
	// connections out are refused, not sent from its own address.
	if err := e1.Set(EgressConfig{Cluster: cluster, Route: []EgressRoute{{VIP: vip, Sources: []netip.Addr{pod}}}}); err != nil {
		t.Fatal(err)
	}
	cannotConnect(ctx, t, n1, pod, server, "the pod reached the server with no route to the egress node")

	// A restarted agent on node1 finds the old rules and, with nothing to do, removes them.
	fresh := egressNetOn(t, n1)
	if err := fresh.Set(EgressConfig{}); err != nil {
		t.Fatal(err)
	}
	if err := e2.Set(EgressConfig{}); err != nil {
		t.Fatal(err)
	}
	for _, h := range []*lab.Host{n1, n2} {
		for _, f := range []string{"ip", "ip6"} {
			if out, err := h.Run(ctx, "nft", "list", "table", f, egressTable); err == nil {
				t.Errorf("%s keeps the table: %s", h.Name, out)
			}
		}
		rules, _ := h.Run(ctx, "ip", ipf, "rule", "show")
		routes, _ := h.Run(ctx, "ip", ipf, "route", "show", "table", "all")
		if strings.Contains(string(rules), "747") || strings.Contains(string(routes), "table 7473") {
			t.Errorf("%s keeps rules or routes:\n%s\n%s", h.Name, rules, routes)
		}
	}
	expect("egress off", pod, pod)
	_ = fresh.Close()
}

// egressDial connects from src on h to port 9000 of server, sends a line and returns the
// connection as the server's log saw it; when it fails, the hosts' conntrack, rules and routes
// go to the test's log.
func egressDial(ctx context.Context, t *testing.T, log *lab.SourceLog, h *lab.Host, src, server netip.Addr, hosts ...*lab.Host) (lab.Source, error) {
	line := fmt.Sprintf("from-%s-%d", src, time.Now().UnixNano())
	var conn net.Conn
	if err := h.Do(func() error {
		d := net.Dialer{LocalAddr: &net.TCPAddr{IP: src.AsSlice()}, Timeout: 2 * time.Second}
		var err error
		conn, err = d.DialContext(ctx, "tcp", netip.AddrPortFrom(server, 9000).String())
		return err
	}); err != nil {
		ipf := map[bool]string{true: "-4", false: "-6"}[src.Is4()]
		for _, x := range hosts {
			for _, cmd := range [][]string{{"ip", "route", "get", server.String(), "from", src.String()}, {"conntrack", "-L", "-f", map[bool]string{true: "ipv4", false: "ipv6"}[src.Is4()]}, {"nft", "list", "ruleset"}, {"ip", ipf, "rule"}, {"ip", ipf, "route", "show", "table", "all"}, {"ip", "-s", "link"}} {
				out, err := x.Run(ctx, cmd[0], cmd[1:]...)
				t.Logf("%s %v: %v\n%s", x.Name, cmd, err, out)
			}
		}
		return lab.Source{}, err
	}
	if _, err := conn.Write([]byte(line + "\n")); err != nil {
		return lab.Source{}, err
	}
	_ = conn.Close()
	for range 300 {
		if got := log.Since(time.Time{}, line); len(got) > 0 {
			return got[0], nil
		}
		time.Sleep(10 * time.Millisecond)
	}
	return lab.Source{}, fmt.Errorf("the server did not see %s (it saw %v)", line, log.Since(time.Time{}, ""))
}

// TestLabBGPEgressRepliesReachTheEgressNode checks egress through a BGP address on the wire,
// where the router may hash a reply to any announcer: here always to the one that is not the
// egress node (a static route in place of ECMP, the worst case). The egress node maps the pod's
// connections to source ports in the reply range; the other announcer sends the packets to the
// VIP with a destination port in it on to the egress node, which holds their NAT. Without that
// steering the connection fails; with it the server sees the VIP, for a pod on the egress node
// and for one routed to it from the other.
func TestLabBGPEgressRepliesReachTheEgressNode(t *testing.T) {
	l := lab.New(t, lab.Options{Nodes: 2})
	ctx := context.Background()
	n1, n2 := l.Nodes[0], l.Nodes[1]
	vip := netip.MustParseAddr("203.0.113.60")
	pod := netip.MustParseAddr("198.18.1.2")
	cluster := []netip.Prefix{netip.MustParsePrefix("198.18.0.0/15"), netip.MustParsePrefix("198.51.100.0/25")}
	ports := PortRange{First: 49152, Last: 65534}
	run := func(h *lab.Host, cmd ...string) {
		t.Helper()
		if out, err := h.Run(ctx, cmd[0], cmd[1:]...); err != nil {
			t.Fatalf("%s: %v: %v %s", h.Name, cmd, err, out)
		}
	}
	run(n1, "ip", "addr", "add", pod.String()+"/32", "dev", "lo")
	for _, h := range []*lab.Host{n1, n2} {
		// Kubernetes nodes forward; a BGP address is no local address of theirs (kube-proxy
		// answers it by DNAT): the lab's local VIP range goes.
		run(h, "sysctl", "-qw", "net.ipv4.ip_forward=1")
		run(h, "ip", "route", "del", "local", lab.VIPRangeV4.String(), "dev", "lo", "table", "local")
		// As kube-proxy's KUBE-FORWARD: forwarded packets conntrack calls invalid are dropped
		// (a reply whose SYN this node never saw is one, unless it is not tracked).
		run(h, "nft", "add table ip kubeproxy { chain forward { type filter hook forward priority 0; ct state invalid counter drop; }; }")
	}
	run(n2, "ip", "route", "add", "198.18.1.0/24", "via", n1.IPv4.String())
	run(l.Router, "ip", "route", "add", "198.18.1.0/24", "via", n1.IPv4.String())
	towards := func(h *lab.Host) {
		t.Helper()
		run(l.Router, "ip", "route", "replace", vip.String()+"/32", "via", h.IPv4.String())
	}
	log := l.Remote.RecordSources(t, 9000, 10000)
	server := l.Remote.IPv4
	e1, e2 := egressNetOn(t, n1), egressNetOn(t, n2)
	t.Cleanup(func() { _ = e1.Close(); _ = e2.Close() })
	expect := func(what string) {
		t.Helper()
		got, err := egressDial(ctx, t, log, n1, pod, server, n1, n2)
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		if got.From != vip || got.Port < ports.First {
			t.Fatalf("%s: the server saw %s port %d, want %s from a port in %d-%d", what, got.From, got.Port, vip, ports.First, ports.Last)
		}
	}

	// node1 is the egress node; the router sends the VIP's packets to node2.
	towards(n2)
	if err := e1.Set(EgressConfig{Cluster: cluster, SNAT: []EgressSNAT{{VIP: vip, Sources: []netip.Addr{pod}, Ports: ports}}}); err != nil {
		t.Fatal(err)
	}
	// node2 does not steer yet: the replies never reach node1.
	cannotConnect(ctx, t, n1, pod, server, "connected with the replies sent to node2, which does not steer")
	if err := e2.Set(EgressConfig{Cluster: cluster, Steer: []EgressSteer{{VIP: vip, Via: n1.IPv4, Ports: ports}}}); err != nil {
		t.Fatal(err)
	}
	expect("node1 the egress node, replies through node2")
	// A firewall flushes node2's ruleset and its rules go: the check writes them again.
	run(n2, "nft", "flush", "ruleset")
	run(n2, "ip", "rule", "del", "prio", "7472")
	run(n2, "ip", "rule", "del", "prio", "7472")
	if err := e2.Check(); err != nil {
		t.Fatal(err)
	}
	run(n2, "nft", "add table ip kubeproxy { chain forward { type filter hook forward priority 0; ct state invalid counter drop; }; }")
	expect("node1 the egress node, replies through node2 after its rules were flushed and checked")
	if err := e2.Check(); err != nil { // intact: nothing to do
		t.Fatal(err)
	}
	if rules, _ := n2.Run(ctx, "ip", "rule", "show"); !strings.Contains(string(rules), "to 203.0.113.60 ipproto tcp dport 49152-65534 lookup") {
		t.Fatalf("node2 has no steering rule:\n%s", rules)
	}
	if out, _ := n2.Run(ctx, "nft", "list", "chain", "ip", egressTable, "prerouting"); !regexp.MustCompile(`tcp dport 49152-65534 counter packets [1-9][0-9]* bytes [0-9]+ notrack`).Match(out) {
		t.Fatalf("node2 passed on no reply untracked:\n%s", out)
	}

	// node2 becomes the egress node; the router sends the VIP's packets to node1, which
	// routes its pod to node2 and steers the replies there.
	if err := e2.Set(EgressConfig{Cluster: cluster, SNAT: []EgressSNAT{{VIP: vip, Sources: []netip.Addr{pod}, Ports: ports}}}); err != nil {
		t.Fatal(err)
	}
	if err := e1.Set(EgressConfig{Cluster: cluster, Route: []EgressRoute{{VIP: vip, Via: n2.IPv4, Sources: []netip.Addr{pod}}},
		Steer: []EgressSteer{{VIP: vip, Via: n2.IPv4, Ports: ports}}}); err != nil {
		t.Fatal(err)
	}
	towards(n1)
	e1.forgets.Wait()
	expect("node2 the egress node, replies through node1")

	// Off: nothing left on either node.
	for _, e := range []*nlEgress{e1, e2} {
		if err := e.Set(EgressConfig{}); err != nil {
			t.Fatal(err)
		}
	}
	for _, h := range []*lab.Host{n1, n2} {
		rules, _ := h.Run(ctx, "ip", "rule", "show")
		routes, _ := h.Run(ctx, "ip", "route", "show", "table", "all")
		if strings.Contains(string(rules), "747") || strings.Contains(string(routes), "table 7473") {
			t.Errorf("%s keeps rules or routes:\n%s\n%s", h.Name, rules, routes)
		}
	}
}

// cannotConnect fails the test, saying why, when src on h connects to port 9000 of server
// within a second.
func cannotConnect(ctx context.Context, t *testing.T, h *lab.Host, src, server netip.Addr, why string) {
	t.Helper()
	if err := h.Do(func() error {
		d := net.Dialer{LocalAddr: &net.TCPAddr{IP: src.AsSlice()}, Timeout: time.Second}
		c, err := d.DialContext(ctx, "tcp", netip.AddrPortFrom(server, 9000).String())
		if err == nil {
			_ = c.Close()
			return errors.New(why)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
}
