package lab

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/metalvip/metalvip/test/testenv"
)

func TestLabConnectsNodesClientsAndRouter(t *testing.T) {
	l := New(t, Options{})
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()

	// FRR runs and has the lab's configuration.
	out, err := l.Vtysh("show bgp summary json")
	if err != nil {
		t.Fatal(err)
	}
	var summary struct {
		IPv4Unicast struct {
			RouterID string `json:"routerId"`
			AS       int    `json:"as"`
		} `json:"ipv4Unicast"`
	}
	if err := json.Unmarshal([]byte(out), &summary); err != nil {
		t.Fatalf("show bgp summary json: %v\n%s", err, out)
	}
	// With no session yet FRR may print {} for the address family: check the config too.
	cfg, err := l.Vtysh("show running-config")
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"router bgp 64496", "bgp listen range 198.51.100.0/25 peer-group NODES", "maximum-paths 8", "profile lab"} {
		if !strings.Contains(cfg, want) {
			t.Errorf("router config lacks %q:\n%s", want, cfg)
		}
	}
	for _, d := range []string{"zebra", "bgpd", "bfdd"} {
		pid, err := os.ReadFile(filepath.Join(l.Dir, d+".pid"))
		if err != nil {
			t.Errorf("%s has no pid file: %v", d, err)
			continue
		}
		if n, _ := strconv.Atoi(strings.TrimSpace(string(pid))); n <= 0 || syscall.Kill(n, 0) != nil {
			t.Errorf("%s (pid %q) is not running", d, pid)
		}
	}
	if fwd, err := l.Router.Run(ctx, "sysctl", "-n", "net.ipv4.ip_forward"); err != nil || strings.TrimSpace(string(fwd)) != "1" {
		t.Errorf("router does not forward: %q %v", fwd, err)
	}

	// A node reaches the router and the client on the segment, over IPv4 and IPv6, and the
	// remote client through the router.
	n := l.Nodes[0]
	for _, dst := range []*Host{l.Router, l.Client, l.Nodes[2], l.Remote} {
		for _, addr := range []netip.Addr{dst.IPv4, dst.IPv6} {
			if err := n.Ping(ctx, addr, 2); err != nil {
				t.Errorf("%s cannot reach %s at %s: %v", n.Name, dst.Name, addr, err)
			}
		}
	}
	// The remote client reaches the segment only through the router.
	route, err := l.Remote.Run(ctx, "ip", "route", "get", l.Client.IPv4.String())
	if err != nil || !strings.Contains(string(route), "via 198.51.100.129") {
		t.Errorf("remote's route to the client = %q, %v; want via the router", route, err)
	}
	// Nodes must not answer ARP for what they hold on lo.
	if v, err := n.Run(ctx, "sysctl", "-n", "net.ipv4.conf.all.arp_ignore"); err != nil || strings.TrimSpace(string(v)) != "1" {
		t.Errorf("node arp_ignore = %q, %v; want 1", v, err)
	}
}

func TestLabExtraClientAddresses(t *testing.T) {
	l := New(t, Options{Nodes: 1, ClientAddrs: 5})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	out, err := l.Client.Run(ctx, "ip", "-4", "-o", "addr", "show", "dev", "eth0")
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.Count(string(out), "inet "); got != 6 {
		t.Errorf("client has %d IPv4 addresses, want 6:\n%s", got, out)
	}
	// The last extra address answers from the node's side.
	if err := l.Nodes[0].Ping(ctx, ClientAddr(4), 2); err != nil {
		t.Errorf("extra client address unreachable: %v", err)
	}
}

func TestLabLeavesNothingBehind(t *testing.T) {
	var (
		namespaces []string
		inodes     map[uint64]string
		dir        string
	)
	t.Run("build a lab and start a process in it", func(t *testing.T) {
		l := New(t, Options{Nodes: 2})
		l.Nodes[1].Start(t, "sleeper", "sleep", "600")
		namespaces, inodes, dir = l.Namespaces(), namespaceInodes(t, l), l.Dir
		deadline := time.Now().Add(10 * time.Second)
		for got := processesIn(inodes); len(got) < 4; got = processesIn(inodes) { // zebra, bfdd, bgpd, sleep
			if time.Now().After(deadline) {
				t.Fatalf("expected FRR and the sleeper in the lab, found %v", got)
			}
			time.Sleep(50 * time.Millisecond)
		}
	})
	assertGone(t, namespaces, inodes, dir, 0)
}

// TestLabIsReapedWhenTheTestBinaryDies kills a test binary that holds a lab, with no chance to
// clean up, and checks that nothing is left.
func TestLabIsReapedWhenTheTestBinaryDies(t *testing.T) {
	if os.Getenv("METALVIP_LAB_CRASH_HELPER") == "1" {
		l := New(t, Options{Nodes: 1})
		l.Nodes[0].Start(t, "sleeper", "sleep", "600")
		fmt.Printf("LAB %s %s\n", l.Dir, strings.Join(l.Namespaces(), ","))
		for ino, ns := range namespaceInodes(t, l) {
			fmt.Printf("INODE %d %s\n", ino, ns)
		}
		fmt.Println("READY")
		_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
		select {}
	}
	testenv.RequireRoot(t)

	cmd := exec.Command(os.Args[0], "-test.run", "^TestLabIsReapedWhenTheTestBinaryDies$", "-test.v")
	cmd.Env = append(os.Environ(), "METALVIP_LAB_CRASH_HELPER=1")
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	var (
		namespaces []string
		dir        string
		inodes     = map[uint64]string{}
		ready      bool
	)
	sc := bufio.NewScanner(stdout)
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		switch {
		case len(f) == 3 && f[0] == "LAB":
			dir, namespaces = f[1], strings.Split(f[2], ",")
		case len(f) == 3 && f[0] == "INODE":
			ino, _ := strconv.ParseUint(f[1], 10, 64)
			inodes[ino] = f[2]
		case len(f) == 1 && f[0] == "READY":
			ready = true
		}
	}
	err = cmd.Wait()
	if !ready {
		t.Fatalf("helper did not build its lab: %v", err)
	}
	if ws, ok := cmd.ProcessState.Sys().(syscall.WaitStatus); !ok || ws.Signal() != syscall.SIGKILL {
		t.Fatalf("helper was not killed as planned: %v", err)
	}
	assertGone(t, namespaces, inodes, dir, 20*time.Second)
}

// assertGone checks, for up to wait, that the namespaces, their processes and the folder
// are gone.
func assertGone(t *testing.T, namespaces []string, inodes map[uint64]string, dir string, wait time.Duration) {
	t.Helper()
	if len(namespaces) == 0 {
		t.Fatal("no lab was built")
	}
	deadline := time.Now().Add(wait)
	for {
		var left []string
		for _, ns := range namespaces {
			if _, err := os.Stat(filepath.Join("/run/netns", ns)); err == nil {
				left = append(left, "namespace "+ns)
			}
		}
		for _, p := range processesIn(inodes) {
			left = append(left, "process "+p)
		}
		if _, err := os.Stat(dir); err == nil {
			left = append(left, "folder "+dir)
		}
		if len(left) == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("left behind: %s", strings.Join(left, "; "))
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func namespaceInodes(t *testing.T, l *Lab) map[uint64]string {
	t.Helper()
	m := map[uint64]string{}
	for _, ns := range l.Namespaces() {
		var st syscall.Stat_t
		if err := syscall.Stat(filepath.Join("/run/netns", ns), &st); err != nil {
			t.Fatalf("stat namespace %s: %v", ns, err)
		}
		m[st.Ino] = ns
	}
	return m
}

// processesIn lists processes whose network namespace is one of inodes.
func processesIn(inodes map[uint64]string) []string {
	entries, _ := os.ReadDir("/proc")
	var out []string
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		var st syscall.Stat_t
		if syscall.Stat(fmt.Sprintf("/proc/%d/ns/net", pid), &st) != nil {
			continue
		}
		if ns, ok := inodes[st.Ino]; ok {
			cmdline, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
			out = append(out, fmt.Sprintf("%d (%s in %s)", pid, strings.ReplaceAll(strings.TrimSpace(string(cmdline)), "\x00", " "), ns))
		}
	}
	return out
}

// The wire's record asks by ARP for IPv4 and by NDP for IPv6, and names who answered: here the
// nodes' kernels, for their own addresses; no one for an address no host holds.
func TestNeighborWatchRecordsWhoAnswersByARPAndNDP(t *testing.T) {
	l := New(t, Options{Nodes: 2})
	n := l.Nodes[1]
	unheld := []netip.Addr{netip.MustParseAddr("198.51.100.99"), netip.MustParseAddr("2001:db8:1::99")}
	asked := append([]netip.Addr{n.IPv4, n.IPv6}, unheld...)
	w, err := l.Client.WatchNeighbors(asked, 50*time.Millisecond, 20)
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(1500 * time.Millisecond) // 20 rounds of 50 ms, and room
	w.Stop()
	mac := n.MAC(t)
	answered := map[netip.Addr]int{}
	for _, r := range w.Rounds() {
		if len(r.MACs) > 1 || (len(r.MACs) == 1 && r.MACs[0] != mac) {
			t.Errorf("%s answered by %v; want %s only", r.VIP, r.MACs, mac)
		}
		if len(r.MACs) > 0 {
			answered[r.VIP]++
		}
	}
	for _, a := range []netip.Addr{n.IPv4, n.IPv6} {
		if answered[a] < 15 {
			t.Errorf("%s answered in %d of 20 rounds; want nearly all", a, answered[a])
		}
	}
	for _, u := range unheld {
		if answered[u] > 0 {
			t.Errorf("%s, held by no host, answered in %d rounds", u, answered[u])
		}
	}
	for _, a := range []netip.Addr{n.IPv4, n.IPv6} {
		if macs, err := l.Client.AskNeighbor(a, time.Second, true); err != nil || len(macs) != 1 || macs[0] != mac {
			t.Errorf("AskNeighbor(%s) = %v, %v; want [%s]", a, macs, err, mac)
		}
	}

	// Two hosts answering with one MAC (as two nodes answering one virtual MAC would) are two
	// answers: NeighborReplies and the watch count them, AskNeighbor names the MAC once.
	both := netip.MustParseAddr("198.51.100.98")
	other := l.Nodes[0]
	for _, step := range []struct {
		h    *Host
		args []string
	}{
		{other, []string{"link", "set", "eth0", "address", mac}},
		{other, []string{"addr", "add", both.String() + "/32", "dev", "eth0"}},
		{n, []string{"addr", "add", both.String() + "/32", "dev", "eth0"}},
	} {
		if out, err := step.h.Run(t.Context(), "ip", step.args...); err != nil {
			t.Fatalf("ip %s on %s: %v: %s", strings.Join(step.args, " "), step.h.Name, err, out)
		}
	}
	if replies, err := l.Client.NeighborReplies(both, time.Second, false); err != nil || len(replies) != 2 || replies[0] != mac || replies[1] != mac {
		t.Errorf("NeighborReplies(%s) = %v, %v; want [%s %s]", both, replies, err, mac, mac)
	}
	if macs, err := l.Client.AskNeighbor(both, time.Second, false); err != nil || len(macs) != 1 || macs[0] != mac {
		t.Errorf("AskNeighbor(%s) = %v, %v; want [%s]", both, macs, err, mac)
	}
	w, err = l.Client.WatchNeighbors([]netip.Addr{both}, 50*time.Millisecond, 10)
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(time.Second)
	w.Stop()
	twice := 0
	for _, r := range w.Rounds() {
		if r.Replies == 2 && slices.Equal(r.MACs, []string{mac}) {
			twice++
		}
	}
	if twice < 7 {
		t.Errorf("%s answered twice with %s in %d of 10 rounds; want nearly all: %v", both, mac, twice, w.Rounds())
	}
}
