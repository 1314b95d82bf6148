package agentlab

import (
	"context"
	"net/netip"
	"path/filepath"
	"strings"
	"testing"
	"time"

	agentv1 "github.com/metalvip/metalvip/proto/metalvip/agent/v1"
	"github.com/metalvip/metalvip/test/harness"
	"github.com/metalvip/metalvip/test/harness/pki"
	"github.com/metalvip/metalvip/test/lab"
)

// TestAnIPv6OnlyNodesAgentStarts runs the agent as the DaemonSet does on a node whose only
// address is IPv6: --listen-address and --metrics-address given the bare pod IP ($(NODE_IP)),
// no IPv4 for a BGP router ID. It serves the CCM over IPv6, answers NDP for an IPv6 VIP, and
// its probes answer on the IPv6 address.
func TestAnIPv6OnlyNodesAgentStarts(t *testing.T) {
	l := lab.New(t, lab.Options{Nodes: 1})
	h := l.Nodes[0]
	if out, err := h.Run(context.Background(), "ip", "-4", "addr", "flush", "dev", "eth0"); err != nil {
		t.Fatalf("remove the node's IPv4 address: %v %s", err, out)
	}
	tlsDir := pki.AgentsDir(t, lab.Names(l.Nodes)...)
	a := &agent{t: t, host: h, state: filepath.Join(t.TempDir(), "state"), tls: tlsDir}
	a.proc = h.Start(t, "agent", agentBinary,
		"--node-name", h.Name, "--listen-address", h.IPv6.String(), "--metrics-address", h.IPv6.String(),
		"--state-dir", a.state, "--interfaces", "eth0",
		"--tls-ca", filepath.Join(tlsDir, "ca.crt"), "--tls-cert", filepath.Join(tlsDir, h.Name+".crt"), "--tls-key", filepath.Join(tlsDir, h.Name+".key"),
		"--v", "2")
	a.client = ccmClient(t, h, tlsDir, netip.AddrPortFrom(h.IPv6, 7472))
	a.waitServing()

	vip := netip.MustParseAddr("2001:db8:100::60")
	an := &agentv1.Announcement{Vip: vip.String(), Mode: agentv1.Mode_MODE_L2, L2: &agentv1.L2Announcement{
		Candidates: []*agentv1.Candidate{{Node: h.Name, Address: h.IPv6.String()}},
	}}
	a.apply(&agentv1.DesiredState{Term: 1, Generation: 1, Announcements: []*agentv1.Announcement{an}})
	mac := h.MAC(t)
	harness.Eventually(t, 10*time.Second, "the client learns the node's MAC for the IPv6 VIP by NDP", func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		_ = l.Client.Ping(ctx, vip, 1) // resolves the neighbour; the node has no such address to answer the echo
		out, _ := l.Client.Run(context.Background(), "ip", "-6", "neigh", "show", vip.String(), "dev", "eth0")
		return strings.Contains(string(out), mac)
	})
	for _, path := range []string{"/readyz", "/healthz", "/metrics"} {
		url := "http://" + netip.AddrPortFrom(h.IPv6, 7474).String() + path
		if out, err := h.Run(context.Background(), "curl", "-sf", "--max-time", "5", url); err != nil {
			t.Errorf("%s: %v %s", url, err, out)
		} else if path == "/metrics" && !strings.Contains(string(out), `metalvip_agent_vips{state="answered"} 1`) {
			t.Errorf("%s does not count the one VIP answered:\n%s", url, out)
		}
	}
	st := a.getState(t)
	if len(st.GetProblems()) > 0 {
		t.Errorf("problems on an IPv6-only node with L2 alone: %v", st.GetProblems())
	}
}
