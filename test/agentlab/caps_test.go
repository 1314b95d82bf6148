package agentlab

import (
	"fmt"
	"net/netip"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	agentv1 "github.com/metalvip/metalvip/proto/metalvip/agent/v1"
	"github.com/metalvip/metalvip/test/harness"
	"github.com/metalvip/metalvip/test/harness/proc"
	"github.com/metalvip/metalvip/test/lab"
)

const capNetRaw = 1 << 13

// capEff reads an agent's effective capabilities.
func capEff(t *testing.T, a *agent) uint64 {
	t.Helper()
	v, err := proc.CapEff(a.proc.Cmd.Process.Pid)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// TestTheAgentNeedsOnlyNetRaw runs two agents as root with no capability but CAP_NET_RAW (no
// NET_ADMIN, no NET_BIND_SERVICE) and checks that everything they do works: gRPC with mutual
// TLS, ARP and NDP answers, heartbeats (TTL 255 and IP_RECVTTL), a BGP session with a TCP MD5
// password and BFD, routes at the router. An agent with no capability at all cannot answer
// ARP: NET_RAW is the one it needs.
func TestTheAgentNeedsOnlyNetRaw(t *testing.T) {
	if _, err := exec.LookPath("setpriv"); err != nil {
		t.Skip("setpriv (util-linux) not found")
	}
	l := lab.New(t, lab.Options{Nodes: 2})
	// FRR peers with node1 by address, with an MD5 password.
	const password = "lab-md5-secret"
	n1 := l.Nodes[0].IPv4
	if out, err := exec.Command("vtysh", "--vty_socket", l.Dir, "-c", "configure terminal", "-c", "router bgp 64496",
		"-c", fmt.Sprintf("neighbor %s remote-as 64497", n1), "-c", fmt.Sprintf("neighbor %s password %s", n1, password),
		"-c", fmt.Sprintf("neighbor %s bfd profile lab", n1), "-c", fmt.Sprintf("neighbor %s timers connect 1", n1),
		"-c", "address-family ipv4 unicast", "-c", fmt.Sprintf("neighbor %s activate", n1)).CombinedOutput(); err != nil {
		t.Fatalf("configure FRR: %v: %s", err, out)
	}
	netRawOnly := []string{"/usr/bin/setpriv", "--bounding-set=-all,+net_raw", "--inh-caps=-all", "--ambient-caps=-all", "--"}
	agents := startAgents(t, l.Nodes, netRawOnly...)
	for _, a := range agents {
		if got := capEff(t, a); got != capNetRaw {
			t.Fatalf("%s's agent runs with capabilities %#x; want CAP_NET_RAW (%#x) alone", a.host.Name, got, capNetRaw)
		}
	}
	vip4, vip6, bgpVIP := netip.MustParseAddr("203.0.113.50"), "2001:db8:100::50", "203.0.113.51"
	for _, a := range agents {
		st := desired(1, l, l2Ann(vip4.String(), l.Nodes...), l2Ann(vip6, l.Nodes...), bgpAnn(bgpVIP))
		st.BgpPeers[0].Password = password
		a.apply(heartbeatsOn(t, st, a, agents))
	}
	mac1 := l.Nodes[0].MAC(t)
	harness.Eventually(t, 10*time.Second, "node1 answers ARP", func() bool { return whoAnswers(t, l.Client, vip4) == mac1 })
	harness.Eventually(t, 30*time.Second, "the router has node1's BGP route, over MD5", func() bool {
		hops := l.NextHops(t, bgpVIP)
		return len(hops) >= 1 && hops[0] == n1.String()
	})
	var st1, st2 *agentv1.GetStateResponse
	harness.Eventually(t, 30*time.Second, "node1's session with BFD up, node2 standing by for node1 by heartbeats", func() bool {
		st1, st2 = agents[0].getState(t), agents[1].getState(t)
		up := len(st1.GetPeers()) == 1 && st1.GetPeers()[0].GetState() == "Established" && st1.GetPeers()[0].GetBfdState() == "Up"
		return up && st2.GetHeartbeats().GetAccepted() > 0 && st1.GetHeartbeats().GetAccepted() > 0
	})
	for _, st := range []*agentv1.GetStateResponse{st1, st2} {
		if len(st.GetProblems()) > 0 {
			t.Errorf("%s with NET_RAW alone has problems: %v", st.GetNode(), st.GetProblems())
		}
	}
	for _, v := range st2.GetAnnounced() {
		if v.GetMode() == agentv1.Mode_MODE_L2 && !strings.Contains(v.GetReason(), "node1 is alive") {
			t.Errorf("node2's view of %s: %q; want it standing by for node1, which it hears", v.GetVip(), v.GetReason())
		}
	}
	t.Logf("with CAP_NET_RAW alone: ARP answered, NDP socket open, heartbeats %d accepted, BGP %s (BFD %s) with MD5",
		st2.GetHeartbeats().GetAccepted(), st1.GetPeers()[0].GetState(), st1.GetPeers()[0].GetBfdState())

	t.Run("without NET_RAW the agent cannot answer ARP, and says so", func(t *testing.T) {
		for _, a := range agents {
			a.proc.Kill()
		}
		none := []string{"/usr/bin/setpriv", "--bounding-set=-all", "--inh-caps=-all", "--ambient-caps=-all", "--"}
		a := startAgent(t, l.Nodes[0], agents[0].tls, filepath.Join(t.TempDir(), "state"), none...)
		if got := capEff(t, a); got != 0 {
			t.Fatalf("the agent runs with capabilities %#x; want none", got)
		}
		if problems := a.applyProblems(desired(1, l, l2Ann(vip4.String(), l.Nodes[0]))); !strings.Contains(strings.Join(problems, "; "), "operation not permitted") {
			t.Errorf("problems %v; want the ARP socket refused", problems)
		}
		if got := whoAnswers(t, l.Client, vip4); got != "" {
			t.Errorf("ARP answered by %s without NET_RAW", got)
		}
	})
}
