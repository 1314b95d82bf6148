// Package agentlab runs the real metalvip-agent binary in the lab's node namespaces, drives it
// over its gRPC contract with mutual TLS as the CCM would, and checks the wire: ARP answers
// at the client, BGP routes in the router's kernel.
package agentlab

import (
	"context"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"

	"github.com/metalvip/metalvip/internal/agentapi"
	"github.com/metalvip/metalvip/internal/certs"
	agentv1 "github.com/metalvip/metalvip/proto/metalvip/agent/v1"
	"github.com/metalvip/metalvip/test/harness"
	"github.com/metalvip/metalvip/test/harness/pki"
	"github.com/metalvip/metalvip/test/lab"
	"github.com/metalvip/metalvip/test/testenv"
)

var agentBinary string

func TestMain(m *testing.M) {
	bins, cleanup := testenv.BuildMain("metalvip-agentlab", "./cmd/metalvip-agent")
	agentBinary = bins[0]
	testenv.LabLock("test/agentlab") // after the build: only the tests run one package at a time
	code := m.Run()
	cleanup()
	os.Exit(code)
}

// agent is one running metalvip-agent and a client for it.
type agent struct {
	t      *testing.T
	host   *lab.Host
	proc   *testenv.Proc
	client agentv1.AgentServiceClient
	state  string
	tls    string
	pub    [][]byte // heartbeat public keys, as last reported
	wrap   []string // a command the agent runs under (setpriv ...), if any
}

func startAgent(t *testing.T, h *lab.Host, tlsDir, stateDir string, wrap ...string) *agent {
	t.Helper()
	a := &agent{t: t, host: h, state: stateDir, tls: tlsDir, wrap: wrap}
	a.start()
	a.client = ccmClient(t, h, tlsDir, netip.AddrPortFrom(h.IPv4, 7472))
	a.waitServing()
	return a
}

// startAgents starts an agent (under wrap, if given) on each of hosts, with certificates
// for them all and a state directory of its own.
func startAgents(t *testing.T, hosts []*lab.Host, wrap ...string) []*agent {
	t.Helper()
	tlsDir := pki.AgentsDir(t, lab.Names(hosts)...)
	var agents []*agent
	for _, h := range hosts {
		agents = append(agents, startAgent(t, h, tlsDir, filepath.Join(t.TempDir(), "state"), wrap...))
	}
	return agents
}

// ccmClient dials the agent at addr inside h's namespace with the CCM's certificate.
func ccmClient(t *testing.T, h *lab.Host, tlsDir string, addr netip.AddrPort) agentv1.AgentServiceClient {
	t.Helper()
	cfg, err := certs.ClientConfig(pki.Files(tlsDir, "ccm"), h.Name)
	if err != nil {
		t.Fatal(err)
	}
	// The agent listens inside the node's namespace: dial from there.
	conn, err := grpc.NewClient("passthrough:///"+addr.String(), append(agentapi.ClientOptions(), grpc.WithTransportCredentials(credentials.NewTLS(cfg)), grpc.WithContextDialer(h.DialTCP))...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return agentv1.NewAgentServiceClient(conn)
}

func (a *agent) start() {
	bin, args := agentBinary, []string{}
	if len(a.wrap) > 0 {
		bin, args = a.wrap[0], append(slices.Clone(a.wrap[1:]), agentBinary)
	}
	a.proc = a.host.Start(a.t, "agent", bin, append(args,
		"--node-name", a.host.Name, "--listen-address", netip.AddrPortFrom(a.host.IPv4, 7472).String(),
		"--state-dir", a.state, "--interfaces", "eth0",
		"--tls-ca", filepath.Join(a.tls, "ca.crt"), "--tls-cert", filepath.Join(a.tls, a.host.Name+".crt"), "--tls-key", filepath.Join(a.tls, a.host.Name+".key"),
		"--v", "2")...)
}

func (a *agent) waitServing() {
	a.t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		_, err := a.client.GetState(ctx, &agentv1.GetStateRequest{})
		cancel()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			a.t.Fatalf("agent on %s not serving after 15s: %v\n%s", a.host.Name, err, a.proc.Tail(20))
		}
		select {
		case <-a.proc.Done():
			a.t.Fatalf("agent on %s exited: %v\n%s", a.host.Name, a.proc.Err(), a.proc.Tail(20))
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// apply applies st on a's node, which must report no problem.
func (a *agent) apply(st *agentv1.DesiredState) {
	a.t.Helper()
	if problems := a.applyProblems(st); len(problems) > 0 {
		a.t.Fatalf("Apply to %s: problems %v", a.host.Name, problems)
	}
}

// applyProblems applies st on a's node and returns the problems the agent reports.
func (a *agent) applyProblems(st *agentv1.DesiredState) []string {
	a.t.Helper()
	st.Node = a.host.Name
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	resp, err := a.client.Apply(ctx, &agentv1.ApplyRequest{State: st})
	if err != nil {
		a.t.Fatalf("Apply to %s: %v", a.host.Name, err)
	}
	return resp.GetProblems()
}

func desired(gen uint64, l *lab.Lab, anns ...*agentv1.Announcement) *agentv1.DesiredState {
	return &agentv1.DesiredState{
		Term: 1, Generation: gen, Announcements: anns,
		Bgp: &agentv1.BGPOptions{Asn: 64497},
		BgpPeers: []*agentv1.BGPPeer{{Address: l.Router.IPv4.String(), PeerAsn: 64496,
			Bfd: &agentv1.BFD{Enabled: true, MinRxMs: 100, MinTxMs: 100, Multiplier: 3}}},
	}
}

func l2Ann(vip string, candidates ...*lab.Host) *agentv1.Announcement {
	an := &agentv1.Announcement{Vip: vip, Mode: agentv1.Mode_MODE_L2, L2: &agentv1.L2Announcement{}}
	for _, c := range candidates {
		an.L2.Candidates = append(an.L2.Candidates, &agentv1.Candidate{Node: c.Name, Address: c.IPv4.String()})
	}
	return an
}

func bgpAnn(vip string) *agentv1.Announcement {
	return &agentv1.Announcement{Vip: vip, Mode: agentv1.Mode_MODE_BGP}
}

// whoAnswers asks for vip by ARP from the client and returns the MAC that answered, or "".
func whoAnswers(t *testing.T, client *lab.Host, vip netip.Addr) string {
	t.Helper()
	macs, err := client.AskNeighbor(vip, time.Second, true)
	if err != nil {
		t.Fatal(err)
	}
	if len(macs) == 0 {
		return ""
	}
	return macs[0]
}

// answerers asks for vip once and returns every MAC that answered within 100 ms.
func answerers(t *testing.T, client *lab.Host, vip netip.Addr) []string {
	t.Helper()
	macs, err := client.AskNeighbor(vip, 100*time.Millisecond, false)
	if err != nil {
		t.Fatal(err)
	}
	return macs
}

func TestAgentsAnnounceOnTheWireAndResumeWithoutTheCCM(t *testing.T) {
	l := lab.New(t, lab.Options{Nodes: 3})
	agents := startAgents(t, l.Nodes)
	const l2VIP, bgpVIP = "203.0.113.10", "203.0.113.20"
	for i, a := range agents {
		a.apply(desired(1, l, l2Ann(l2VIP, l.Nodes[0], l.Nodes[1]), bgpAnn(bgpVIP)))
		_ = i
	}

	// L2: only the first candidate answers.
	node1MAC := l.Nodes[0].MAC(t)
	if got := whoAnswers(t, l.Client, netip.MustParseAddr(l2VIP)); got != node1MAC {
		t.Errorf("ARP for %s answered by %q, want node1's %s", l2VIP, got, node1MAC)
	}
	if got := whoAnswers(t, l.Client, netip.MustParseAddr("203.0.113.99")); got != "" {
		t.Errorf("ARP for an unannounced VIP answered by %s", got)
	}
	// BGP: one route, three next hops.
	all := []string{"198.51.100.11", "198.51.100.12", "198.51.100.13"}
	harness.Eventually(t, 30*time.Second, "three next hops for the BGP VIP", func() bool {
		return slices.Equal(l.NextHops(t, bgpVIP), all)
	})
	// The client reaches the BGP VIP through the router... and the remote client too.
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := l.Remote.Ping(ctx, netip.MustParseAddr(bgpVIP), 2); err != nil {
		t.Errorf("remote client cannot reach the BGP VIP: %v", err)
	}
	// GetState reports it.
	st, err := agents[0].client.GetState(ctx, &agentv1.GetStateRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if len(st.GetPeers()) != 1 || st.GetPeers()[0].GetState() != "Established" || st.GetL2().GetArpReplies() == 0 {
		t.Errorf("node1 GetState: peers %v, L2 %v", st.GetPeers(), st.GetL2())
	}

	// Kill node1's agent outright (no goodbye), with no CCM anywhere, and start it again on
	// the same state: it resumes answering and advertising on its own.
	agents[0].proc.Kill()
	harness.Eventually(t, 30*time.Second, "the router drops the dead agent's next hop (BFD)", func() bool {
		return !slices.Contains(l.NextHops(t, bgpVIP), "198.51.100.11")
	})
	if got := whoAnswers(t, l.Client, netip.MustParseAddr(l2VIP)); got != "" {
		t.Errorf("ARP for %s answered by %s while its only answering agent is dead", l2VIP, got)
	}
	restart := time.Now()
	agents[0].start()
	took := harness.Eventually(t, 30*time.Second, "the restarted agent answers ARP again", func() bool {
		return whoAnswers(t, l.Client, netip.MustParseAddr(l2VIP)) == node1MAC
	})
	harness.Eventually(t, 30*time.Second, "the restarted agent advertises again", func() bool {
		return slices.Equal(l.NextHops(t, bgpVIP), all)
	})
	t.Logf("restarted agent answered ARP %s after start (%s total)", took.Round(time.Millisecond), time.Since(restart).Round(time.Millisecond))
	agents[0].waitServing()
	st, err = agents[0].client.GetState(ctx, &agentv1.GetStateRequest{})
	if err != nil || !st.GetRestored() || st.GetGeneration() != 1 {
		t.Errorf("restarted agent state: %v, %v; want restored generation 1", st, err)
	}

	// Withdraw: the BGP VIP removed from node2 leaves two next hops.
	agents[1].apply(desired(2, l, l2Ann(l2VIP, l.Nodes[0], l.Nodes[1])))
	harness.Eventually(t, 10*time.Second, "node2's next hop withdrawn", func() bool {
		return slices.Equal(l.NextHops(t, bgpVIP), []string{"198.51.100.11", "198.51.100.13"})
	})
	if !strings.Contains(agents[1].proc.Output(), "serving") {
		t.Error("agent log does not say it serves")
	}

	// SIGTERM: node3's agent withdraws before it exits.
	if err := agents[2].proc.Cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	took = harness.Eventually(t, 5*time.Second, "node3's next hop withdrawn on SIGTERM", func() bool {
		return slices.Equal(l.NextHops(t, bgpVIP), []string{"198.51.100.11"})
	})
	t.Logf("SIGTERM to next hop gone at the router: %s", took.Round(time.Millisecond))
	select {
	case <-agents[2].proc.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("agent did not exit within 10s of SIGTERM")
	}
	if err := agents[2].proc.Err(); err != nil {
		t.Errorf("agent exit after SIGTERM: %v", err)
	}
	if !strings.Contains(agents[2].proc.Output(), "withdrawing routes") {
		t.Error("agent did not log its graceful shutdown")
	}
}
