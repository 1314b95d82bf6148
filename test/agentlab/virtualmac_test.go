package agentlab

import (
	"context"
	"encoding/json"
	"fmt"
	"net/netip"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/metalvip/metalvip/api/v1alpha1"
	"github.com/metalvip/metalvip/loadbalancer/pools"
	agentv1 "github.com/metalvip/metalvip/proto/metalvip/agent/v1"
	"github.com/metalvip/metalvip/test/harness"
	"github.com/metalvip/metalvip/test/harness/pki"
	"github.com/metalvip/metalvip/test/lab"
)

func vmacAnn(vip netip.Addr, candidates ...*lab.Host) *agentv1.Announcement {
	an := l2Ann(vip.String(), candidates...)
	an.L2.VirtualMac = pools.VirtualMAC(v1alpha1.VirtualMACLocal, vip).String()
	return an
}

// TestAVirtualMACWithoutNetAdminIsAnsweredWithTheNodesMAC runs an agent with CAP_NET_RAW alone
// (what every other feature needs): it cannot make the node receive a virtual MAC (nftables
// and the NIC's unicast filter need NET_ADMIN), so it answers the VIP with its interface's own
// MAC and says why, rather than answering with a MAC whose frames it would drop.
func TestAVirtualMACWithoutNetAdminIsAnsweredWithTheNodesMAC(t *testing.T) {
	if _, err := exec.LookPath("setpriv"); err != nil {
		t.Skip("setpriv (util-linux) not found")
	}
	l := lab.New(t, lab.Options{Nodes: 1})
	tlsDir := pki.AgentsDir(t, lab.Names(l.Nodes)...)
	netRawOnly := []string{"/usr/bin/setpriv", "--bounding-set=-all,+net_raw", "--inh-caps=-all", "--ambient-caps=-all", "--"}
	a := startAgent(t, l.Nodes[0], tlsDir, filepath.Join(t.TempDir(), "state"), netRawOnly...)
	vip := netip.MustParseAddr("203.0.113.60")
	problems := strings.Join(a.applyProblems(desired(1, l, vmacAnn(vip, l.Nodes[0]))), "; ")
	if !strings.Contains(problems, "virtual MACs: ") || !strings.Contains(problems, "operation not permitted; answering with the interfaces' own MACs") {
		t.Errorf("problems %q; want the filter's refusal and what the agent does instead", problems)
	}
	if got, want := whoAnswers(t, l.Client, vip), l.Nodes[0].MAC(t); got != want {
		t.Errorf("ARP for %s answered by %q; want the node's own %s", vip, got, want)
	}
	t.Logf("with CAP_NET_RAW alone: %s", problems)
}

// TestTakingOverManyVirtualMACs gives two agents 50 VIPs with virtual MACs, node1 first, kills
// node1 hard, and measures how long node2 takes until it answers every one with its MAC, and
// how long its agent spends making the node receive the 50 MACs and setting the speaker (one
// nftables transaction, from its log).
func TestTakingOverManyVirtualMACs(t *testing.T) {
	l := lab.New(t, lab.Options{Nodes: 2})
	agents := startAgents(t, l.Nodes)
	const n = 50
	var vips []netip.Addr
	var anns []*agentv1.Announcement
	for i := range n {
		v := netip.AddrFrom4([4]byte{203, 0, 113, byte(100 + i)})
		vips = append(vips, v)
		anns = append(anns, vmacAnn(v, l.Nodes...))
	}
	for _, a := range agents {
		a.apply(heartbeatsOn(t, desired(1, l, anns...), a, agents))
	}
	macOfVIP := func(v netip.Addr) string { return pools.VirtualMAC(v1alpha1.VirtualMACLocal, v).String() }
	harness.Eventually(t, 10*time.Second, "node1 answers every VIP with its virtual MAC", func() bool {
		return whoAnswers(t, l.Client, vips[0]) == macOfVIP(vips[0]) && whoAnswers(t, l.Client, vips[n-1]) == macOfVIP(vips[n-1])
	})
	if st := agents[1].getState(t); slices.ContainsFunc(st.GetAnnounced(), func(v *agentv1.AnnouncedVIP) bool { return v.GetActive() }) {
		t.Fatal("node2 answers before node1 died")
	}
	before := strings.Count(agents[1].proc.Output(), "Set the speaker and the virtual MACs")
	killed := killNode(t, agents[0])
	left := slices.Clone(vips)
	var firstAt time.Duration
	took := harness.Eventually(t, 10*time.Second, "node2 answers every VIP with its virtual MAC", func() bool {
		left = slices.DeleteFunc(left, func(v netip.Addr) bool {
			ok := whoAnswers(t, l.Client, v) == macOfVIP(v)
			if ok && firstAt == 0 {
				firstAt = time.Since(killed)
			}
			return ok
		})
		return len(left) == 0
	})
	// The agent's own account of the takeover: the line with 50 MACs after none.
	var costs []string
	re := regexp.MustCompile(`"Set the speaker and the virtual MACs" vips=(\d+) macsBefore=(\d+) macs=(\d+) took="([^"]+)"`)
	lines := strings.Split(agents[1].proc.Output(), "\n")
	seen := 0
	for _, line := range lines {
		if !strings.Contains(line, "Set the speaker and the virtual MACs") {
			continue
		}
		if seen++; seen <= before {
			continue
		}
		if m := re.FindStringSubmatch(line); m != nil {
			costs = append(costs, fmt.Sprintf("%s VIPs, MACs %s to %s in %s", m[1], m[2], m[3], m[4]))
		}
	}
	t.Logf("node1 killed: node2 answered a first VIP with its virtual MAC after %s, all %d after %s (asking them one by one); its agent set the speaker and the MACs: %v",
		firstAt.Round(time.Millisecond), n, took.Round(time.Millisecond), costs)
	if !slices.ContainsFunc(costs, func(c string) bool { return strings.Contains(c, "MACs 0 to 50") }) {
		t.Errorf("no takeover of the 50 MACs in node2's log: %v", costs)
	}
	out, err := l.Nodes[1].Run(context.Background(), "bridge", "fdb", "show", "dev", "eth0", "self")
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.Count(string(out), "02:00:cb:00:71:"); got != n {
		t.Errorf("node2's unicast filter holds %d virtual MACs; want %d:\n%s", got, n, out)
	}
}

// fdbPort returns the switch port the lab's bridge has learnt mac on, or "".
func fdbPort(t *testing.T, l *lab.Lab, mac string) string {
	t.Helper()
	out, err := l.Switch.Run(context.Background(), "bridge", "-j", "fdb", "show", "br", "br0")
	if err != nil {
		t.Fatal(err)
	}
	var entries []struct {
		MAC string `json:"mac"`
		Dev string `json:"ifname"`
	}
	if err := json.Unmarshal(out, &entries); err != nil {
		t.Fatalf("bridge -j fdb: %v: %s", err, out)
	}
	for _, e := range entries {
		if e.MAC == mac {
			return e.Dev
		}
	}
	return ""
}

// TestAVirtualMACMovesInOrderAcrossQuickRestarts kills the owner of a VIP with a virtual MAC
// hard and starts it again at once (an agent that crashes and restarts: its peers still name
// it), ten times, with no CCM: a client with a permanent neighbour entry for the virtual MAC is
// answered again within the failover bound, the bridge learns the MAC on the next owner's port,
// and a capture at the switch sees the MAC from one node at a time, the returning node taking
// it back only after the other stopped.
func TestAVirtualMACMovesInOrderAcrossQuickRestarts(t *testing.T) {
	l := lab.New(t, lab.Options{Nodes: 3})
	agents := startAgents(t, l.Nodes)
	vip := netip.MustParseAddr("203.0.113.61")
	mac := pools.VirtualMAC(v1alpha1.VirtualMACLocal, vip)
	for _, a := range agents {
		a.apply(heartbeatsOn(t, desired(1, l, vmacAnn(vip, l.Nodes...)), a, agents))
	}
	harness.Eventually(t, 10*time.Second, "node1 answers with the virtual MAC", func() bool { return fdbPort(t, l, mac.String()) == "p-node1" })
	if _, err := l.Client.Run(context.Background(), "ip", "neigh", "replace", vip.String(), "lladdr", mac.String(), "dev", "eth0", "nud", "permanent"); err != nil {
		t.Fatal(err)
	}
	capture, err := l.CaptureFrom(mac, vip)
	if err != nil {
		t.Fatal(err)
	}
	stopAsking, err := l.Client.AskEvery(vip, 20*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	const trials = 10
	var outages, backs []time.Duration
	for trial := range trials {
		probe, err := l.Client.Probe(vip, 20*time.Millisecond, 3000)
		if err != nil {
			t.Fatal(err)
		}
		harness.Eventually(t, 5*time.Second, "the probe is answered", probe.Answered)
		killed := killNode(t, agents[0])
		harness.Eventually(t, 5*time.Second, "the client is answered again", func() bool {
			return probe.Answered() && time.Since(killed) > 300*time.Millisecond
		})
		probe.Stop()
		outage, lost := probe.Outage(killed.Add(-20 * time.Millisecond))
		if port := fdbPort(t, l, mac.String()); port != "p-node2" {
			t.Errorf("trial %d: the bridge has %s on %q; want node2's port", trial, mac, port)
		}
		revived := time.Now()
		reviveNode(t, agents[0])
		harness.Eventually(t, 15*time.Second, "node1 takes its VIP back", func() bool { return fdbPort(t, l, mac.String()) == "p-node1" })
		tookBack := time.Since(revived)
		t.Logf("trial %d: outage %s (%d probes lost); node1 back on the bridge %s after its restart began", trial, outage.Round(time.Millisecond), lost, tookBack.Round(time.Millisecond))
		outages, backs = append(outages, outage), append(backs, tookBack)
		if outage > 5*time.Second {
			t.Errorf("trial %d: outage %s over the 5 s bound", trial, outage)
		}
		time.Sleep(500 * time.Millisecond)
	}
	stopAsking()
	frames := capture.Stop()
	runs := frames.Runs()
	doubles, asked := frames.DoubleAnswers(l.Client.IPv4)
	interleaved := lab.Interleaved(runs, 20*time.Millisecond)
	var gaps []time.Duration
	for i := 1; i < len(runs); i++ {
		gaps = append(gaps, runs[i].First.Sub(runs[i-1].Last))
	}
	t.Logf("virtual MAC, quick restarts, %d trials: client outage %s; node1 back after %s; capture: %d frames from %s in %d runs (%s), %d requests, %d answered from two ports, %d interleaved; gaps between one node's last frame and the next's first: %s",
		trials, durations(outages), durations(backs), len(frames.FromMAC), mac, len(runs), lab.RunNames(runs), asked, doubles, interleaved, durations(gaps))
	if doubles > 0 || interleaved > 0 {
		t.Errorf("%d requests answered from two nodes, %d runs interleaved; want none", doubles, interleaved)
	}
	if len(runs) != 2*trials+1 {
		t.Errorf("%d runs; want %d: node1, then node2 and node1 again per trial", len(runs), 2*trials+1)
	}
	if asked < trials*50 {
		t.Errorf("only %d requests seen at the switch", asked)
	}
}

// durations formats durations as p50/p99/max over their count.
func durations(ds []time.Duration) string {
	if len(ds) == 0 {
		return "none"
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	pct := func(p float64) time.Duration { return s[min(len(s)-1, int(p*float64(len(s))))] }
	return fmt.Sprintf("p50 %s, p99 %s, max %s over %d", pct(0.5).Round(time.Millisecond), pct(0.99).Round(time.Millisecond), s[len(s)-1].Round(time.Millisecond), len(s))
}
