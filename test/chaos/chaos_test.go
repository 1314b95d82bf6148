// Package chaos runs a seeded schedule of faults on the bare-process lab (real agents, CCM,
// API server, FRR) and checks invariants on the wire and in the API only, trusting nothing
// metalvip says of itself (issue 30):
//
//	I1  a live Service's address never changes;
//	I2  no ARP or NDP request is answered by two MACs for longer than MaxDouble in a row;
//	I3  every L2 VIP is answered again within a second of each fault's end, by one node, and
//	    the BGP VIP has next hops at the router once the faults have settled;
//	I4  no address that no Service holds is answered, nor one of a BGP pool; no L2 VIP is
//	    routed;
//	I5  no component exits on its own (the CCM may when it loses its Lease, but never twice
//	    within a minute) or passes its chart's memory limit.
//
// The same seed replays the same schedule. `make test` runs the short form (seed 1: every kind
// of fault once); `make chaos DURATION=60m SEED=...` a long one (METALVIP_CHAOS_DURATION,
// METALVIP_CHAOS_SEEDS; METALVIP_CHAOS_KINDS draws from the listed kinds only, to replay a
// failure on the faults it suspects).
package chaos

import (
	"fmt"
	"math/rand/v2"
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

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/metalvip/metalvip/api/v1alpha1"
	"github.com/metalvip/metalvip/internal/annotation"

	"github.com/metalvip/metalvip/test/cluster"
	"github.com/metalvip/metalvip/test/harness"
	"github.com/metalvip/metalvip/test/harness/proc"
	"github.com/metalvip/metalvip/test/kubeapi"
	"github.com/metalvip/metalvip/test/lab"
	"github.com/metalvip/metalvip/test/testenv"
)

var ccmBinary, agentBinary string

func TestMain(m *testing.M) {
	bins, cleanup := testenv.BuildMain("metalvip-chaos", "./cmd/metalvip-cloud-controller-manager", "./cmd/metalvip-agent")
	ccmBinary, agentBinary = bins[0], bins[1]
	testenv.LabLock("test/chaos") // after the build: only the tests run one package at a time
	kubeapi.Main(m, cleanup)
}

const (
	// askEvery is how often the client asks for every VIP.
	askEvery = 50 * time.Millisecond
	// MaxDouble bounds a run of requests answered by two MACs: the default profile's detection
	// (3 x 50 ms) and room for a loaded 2-core machine; the worst is reported.
	MaxDouble = 500 * time.Millisecond
	// reanswer bounds I3: a VIP answered again this soon after a fault ends.
	reanswer = time.Second
	// LongOutage: an outage during a fault longer than this is logged with its context (every
	// single fault leaves live candidates: a failover takes 150 ms by default).
	LongOutage = time.Second
)

// fault is one entry of the schedule.
type fault struct {
	Kind string
	Node string
	Hold time.Duration
	// Filled in as it runs.
	Began, Healed time.Duration // since the start of the schedule
}

func (f fault) String() string {
	return fmt.Sprintf("%-11s %-6s held %-6s at +%s, healed +%s", f.Kind, f.Node, f.Hold, f.Began.Round(time.Millisecond), f.Healed.Round(time.Millisecond))
}

// kinds of fault. Most apply to one node; those in nodeless to none. (endpoints-move draws a node
// to move the endpoints to.)
var kinds = []string{
	"agent-kill", "agent-pause", "agent-restart", "restart-then-die", "node-death", "link-flap", "grpc-drop", "heartbeat-loss", "heartbeat-oneway", "disk-readonly", "disk-full", // a node
	"ccm-restart", "ccm-race", "api-down", "router-restart", "tenant-edit", "tenant-move", "service-churn", "pool-delete", "endpoints-move", // the cluster
}

// restartGrace is the agents' --restart-grace: agent-restart comes back within it (1 to 3 s),
// restart-then-die after it.
const restartGrace = 3500 * time.Millisecond

// nodeless are the kinds that apply to no node.
var nodeless = map[string]bool{"ccm-restart": true, "ccm-race": true, "api-down": true, "router-restart": true, "tenant-edit": true, "tenant-move": true, "service-churn": true, "pool-delete": true}

// schedule draws n faults from seed. With n 0 it is the short form: every kind once, in an
// order drawn from seed.
func schedule(seed uint64, n int, nodes, from []string) []fault {
	rng := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	var order []string
	if n == 0 {
		order = slices.Clone(from)
		rng.Shuffle(len(order), func(i, j int) { order[i], order[j] = order[j], order[i] })
	} else {
		for range n {
			order = append(order, from[rng.IntN(len(from))])
		}
	}
	out := make([]fault, 0, len(order))
	for _, k := range order {
		f := fault{Kind: k, Node: nodes[rng.IntN(len(nodes))]}
		f.Hold = time.Duration(1+rng.IntN(3)) * time.Second
		switch f.Kind {
		case "grpc-drop":
			f.Hold = 12 * time.Second // the CCM probes an idle agent every 10 s
		case "heartbeat-loss", "heartbeat-oneway":
			f.Hold = 5 * time.Second
		case "api-down":
			f.Hold = time.Minute
		case "restart-then-die":
			f.Hold = restartGrace + 2*time.Second // back after the grace ran out: its peers took over
		}
		if nodeless[f.Kind] {
			f.Node = ""
		}
		out = append(out, f)
	}
	return out
}

func seeds(t *testing.T) []uint64 {
	v := os.Getenv("METALVIP_CHAOS_SEEDS")
	if v == "" {
		return []uint64{1} // every kind of fault once, in about three minutes
	}
	var out []uint64
	for _, s := range strings.Split(v, ",") {
		n, err := strconv.ParseUint(strings.TrimSpace(s), 10, 64)
		if err != nil {
			t.Fatalf("METALVIP_CHAOS_SEEDS=%q: %v", v, err)
		}
		out = append(out, n)
	}
	return out
}

// drawn are the kinds of fault the schedule draws from: METALVIP_CHAOS_KINDS (a list, to replay
// a failure on the faults it suspects), or every kind.
func drawn(t *testing.T) []string {
	v := os.Getenv("METALVIP_CHAOS_KINDS")
	if v == "" {
		return kinds
	}
	var out []string
	for _, k := range strings.Split(v, ",") {
		k = strings.TrimSpace(k)
		if !slices.Contains(kinds, k) {
			t.Fatalf("METALVIP_CHAOS_KINDS=%q: no fault %q; the kinds are %s", v, k, strings.Join(kinds, ", "))
		}
		out = append(out, k)
	}
	return out
}

func duration(t *testing.T) time.Duration {
	v := os.Getenv("METALVIP_CHAOS_DURATION")
	if v == "" {
		return 0
	}
	d, err := time.ParseDuration(v)
	if err != nil {
		t.Fatalf("METALVIP_CHAOS_DURATION=%q: %v", v, err)
	}
	return d
}

func TestChaos(t *testing.T) {
	for _, seed := range seeds(t) {
		t.Run(fmt.Sprintf("seed-%d", seed), func(t *testing.T) { soak(t, seed, duration(t)) })
	}
}

// soak runs seed's schedule for d (0: the short form, every kind of fault once).
func soak(t *testing.T, seed uint64, d time.Duration) {
	c := cluster.New(t, kubeapi.Get(t), cluster.Options{CCMBinary: ccmBinary, AgentBinary: agentBinary, Nodes: 4, LeaderElect: true, ClientAddrs: 7,
		AgentArgs: []string{"--restart-grace", restartGrace.String()}})
	s := &soakRun{t: t, c: c}
	nodes := make([]string, 0, len(c.Agents))
	for n := range c.Agents {
		nodes = append(nodes, n)
	}
	slices.Sort(nodes)
	s.nodes = nodes
	// Each state folder on a small file system of its own, which disk-full fills.
	s.smallDisks()
	for i := range 4 {
		name := fmt.Sprintf("l2-%d", i)
		s.l2 = append(s.l2, name)
		s.vips = append(s.vips, c.Service(name))
	}
	// Two addresses for one Service; ETP Local with endpoints on two nodes (endpoints-move moves
	// them); a VIP answered per client (the client asks from one address: one node answers).
	s.vips = append(s.vips, c.ServiceIPs("multi-0", 2, cluster.Annotate(annotation.VIPCount, "2"))...)
	s.local = []string{"node1", "node2"}
	c.Endpoints("local-0", s.local...)
	s.vips = append(s.vips, c.Service("local-0", cluster.Local))
	s.perClient = c.Service("perclient-0", cluster.InPool(c.PerClientPool("perclient")))
	s.vips = append(s.vips, s.perClient)
	// A VIP answered with a virtual MAC: two nodes answering it give one MAC twice.
	c.Object(v1alpha1.IPPoolResource, "vmac-"+c.NS, fmt.Sprintf(`{addresses: ["203.0.113.40/29"], autoAssign: false, serviceAllocation: {namespaces: [%s]}, announce: {l2: {virtualMAC: {scheme: Local}}}}`, c.NS))
	s.vmac = c.Service("vmac-0", cluster.InPool("vmac-"+c.NS))
	s.vips = append(s.vips, s.vmac)
	// An IPv6 Service, answered by NDP.
	c.Object(v1alpha1.IPPoolResource, "v6-"+c.NS, fmt.Sprintf(`{addresses: ["2001:db8:100::1-2001:db8:100::ff"], autoAssign: false, serviceAllocation: {namespaces: [%s]}}`, c.NS))
	s.vips = append(s.vips, c.Service("v6-0", ipv6Only, cluster.InPool("v6-"+c.NS)))
	bgpPool, _ := c.BGPPool()
	s.bgpVIP = c.Service("bgp-0", cluster.InPool(bgpPool))
	// The Service whose request a tenant changes (tenant-move): its address moves by its own
	// request, so I1 leaves it out.
	s.tenant = []netip.Addr{c.Service(tenantService)}
	// An address of each L2 pool (203.0.113.0/27, 2001:db8:100::/120) that no Service holds.
	unheld := []netip.Addr{netip.MustParseAddr("203.0.113.30"), netip.MustParseAddr("2001:db8:100::fe")}
	for _, u := range unheld {
		if slices.Contains(s.vips, u) {
			t.Fatalf("%s is held; pick another unheld address", u)
		}
	}
	addresses := serviceAddresses(t, c)
	delete(addresses, tenantService)
	harness.Eventually(t, 30*time.Second, "every L2 VIP answered by one node", s.settled)
	n := 0
	if d > 0 {
		n = int(d/time.Second) + 1 // more than fit (every fault holds a second at least): the run ends when d has passed
	}
	plan := schedule(seed, n, nodes, drawn(t))
	limit := d
	if limit == 0 {
		limit = 10 * time.Minute
	}
	// Asked by ARP and NDP: the L2 VIPs, the unheld addresses and the BGP VIP (an address of a
	// BGP pool is never answered by ARP: I4).
	asked := append(slices.Concat(s.vips, unheld), s.bgpVIP)
	watch, err := c.Lab.Client.WatchNeighbors(asked, askEvery, int((limit+5*time.Minute)/askEvery))
	if err != nil {
		t.Fatal(err)
	}
	clients := s.watchClients(s.perClient, c.ClientAddrs()[1:7], int((limit+5*time.Minute)/askEvery))
	vmac := s.watchClients(s.vmac, c.ClientAddrs()[7:8], int((limit+5*time.Minute)/askEvery))
	s.start = time.Now()
	for i := range plan {
		if d > 0 && time.Since(s.start) > d {
			plan = plan[:i]
			break
		}
		f := &plan[i]
		f.Began = time.Since(s.start)
		heal := s.inject(*f)
		time.Sleep(f.Hold)
		heal()
		f.Healed = time.Since(s.start)
		t.Logf("fault %d: %s", i+1, f)
		// Settle: every L2 VIP answered by one node, the BGP VIP routed, no L2 VIP routed.
		if !waitUntil(20*time.Second, s.settled) {
			t.Errorf("after fault %d (%s) the VIPs did not settle within 20s: L2 answerers %v, BGP next hops %v", i+1, f, answerers(c, s.vips), c.NextHops(s.bgpVIP))
		}
		for _, v := range s.vips {
			if hops := c.NextHops(v); len(hops) > 0 {
				t.Errorf("I4: after fault %d (%s) the L2 VIP %s is routed at the router via %v", i+1, f, v, hops)
			}
		}
		s.components(i, *f)
	}
	watch.Stop()
	clients.Stop()
	vmac.Stop()
	rounds := watch.Rounds()
	start := s.start

	// The record: faults by kind, the worst double answer and outage.
	byKind := map[string]int{}
	for _, f := range plan {
		byKind[f.Kind]++
	}
	// Every request answered by one node: by one MAC; per client, by one node (a node taking
	// clients over may also tell them unasked, so a client's answers are counted by node);
	// the virtual MAC's VIP, asked from an address of its own, by one answer (two nodes
	// answering with one virtual MAC are one MAC twice).
	worstDouble, worstOutage := s.checkWire(rounds, s.vips, "", func(r lab.NeighborRound) bool { return len(r.MACs) >= 2 }, plan)
	clientRounds, vmacRounds := clients.Rounds(), vmac.Rounds()
	d2, o2 := s.checkWire(clientRounds, clients.cs.Addrs, fmt.Sprintf("%s asked from ", s.perClient), func(r lab.NeighborRound) bool { return len(r.MACs) >= 2 }, plan)
	d3, o3 := s.checkWire(vmacRounds, vmac.cs.Addrs, fmt.Sprintf("%s (a virtual MAC) asked from ", s.vmac), func(r lab.NeighborRound) bool { return r.Replies >= 2 }, plan)
	worstDouble, worstOutage = max(worstDouble, d2, d3), max(worstOutage, o2, o3)
	for _, never := range append(slices.Clone(unheld), s.bgpVIP) {
		for _, r := range rounds {
			if r.VIP == never && len(r.MACs) > 0 {
				t.Errorf("I4: %s answered by ARP or NDP (by %v) at +%s: no Service holds it, or its pool announces by BGP\n%s", never, r.MACs, r.At.Sub(start).Round(time.Millisecond), context(rounds, never, r.At, start, plan))
				break
			}
		}
	}
	now := serviceAddresses(t, c)
	delete(now, tenantService)
	if !equalAddresses(now, addresses) {
		t.Errorf("I1: the Services' addresses changed: %v, then %v", addresses, now)
	}
	t.Logf("seed %d: %d faults in %s (%v); %d ARP and NDP requests, %d more for %s from %d client addresses and %d for %s from one more; worst double answer %s, worst outage %s; peak memory: agent %.1f MiB, CCM %.1f MiB; CCM exits outside api-down: %d",
		seed, len(plan), time.Since(start).Round(time.Second), byKind, len(rounds), len(clientRounds), s.perClient, len(clients.cs.Addrs), len(vmacRounds), s.vmac, worstDouble, worstOutage,
		float64(s.peak["agent"])/(1<<20), float64(s.peak["ccm"])/(1<<20), s.ccmExits)
	if t.Failed() {
		var tl []string
		for i, f := range plan {
			tl = append(tl, fmt.Sprintf("  %d. %s", i+1, f))
		}
		t.Logf("seed %d, the fault timeline (replay: METALVIP_CHAOS_SEEDS=%d):\n%s", seed, seed, strings.Join(tl, "\n"))
	}
}

// The chart's memory limits (I5).
const (
	agentMemoryLimit = 128 << 20
	ccmMemoryLimit   = 512 << 20
)

// components checks I5 once fault i has settled: no agent exited on its own (each is started
// again, as its DaemonSet would, so that one exit is told once); the CCM may exit when it
// loses its Lease (it is started again, as its Deployment would, and counted) but not twice
// within a minute, a crash loop; no process is past its chart's memory limit (the peak of its
// resident memory).
func (s *soakRun) components(i int, f fault) {
	t, c := s.t, s.c
	for _, n := range s.nodes {
		a := c.Agents[n]
		select {
		case <-a.Proc.Done():
			t.Errorf("I5: after fault %d (%s) %s's agent has exited on its own (%v); its last lines:\n%s", i+1, f, n, a.Proc.Err(), a.Proc.Tail(20))
			c.StartAgent(a)
			continue
		default:
		}
		s.memory("agent", n, a.Proc, agentMemoryLimit, i, f)
	}
	select {
	case <-c.CCM.Done():
		s.ccmExits++
		t.Logf("after fault %d (%s) the CCM has exited (%v), started again; its last lines:\n%s", i+1, f, c.CCM.Err(), c.CCM.Tail(10))
		if !s.ccmStarted.IsZero() && time.Since(s.ccmStarted) < time.Minute {
			t.Errorf("I5: after fault %d (%s) the CCM exited again %s after it was started again: a crash loop", i+1, f, time.Since(s.ccmStarted).Round(time.Second))
		}
		c.StartCCM()
		s.ccmStarted = time.Now()
	default:
		s.memory("ccm", "", c.CCM, ccmMemoryLimit, i, f)
	}
}

// memory keeps the peak of p's resident memory by kind, and tells one past limit.
func (s *soakRun) memory(kind, node string, p *testenv.Proc, limit int64, i int, f fault) {
	m, err := proc.MemoryOf(p.Cmd.Process.Pid)
	if err != nil {
		return // exited meanwhile: told at the next fault
	}
	if s.peak == nil {
		s.peak = map[string]int64{}
	}
	s.peak[kind] = max(s.peak[kind], m.HWM)
	if m.HWM > limit {
		s.t.Errorf("I5: after fault %d (%s) the %s %s has used %.1f MiB, past its limit of %d MiB", i+1, f, kind, node, float64(m.HWM)/(1<<20), limit>>20)
	}
}

// ipv6Only makes a Service single-stack IPv6.
func ipv6Only(s *corev1.Service) {
	policy := corev1.IPFamilyPolicySingleStack
	s.Spec.IPFamilies, s.Spec.IPFamilyPolicy = []corev1.IPFamily{corev1.IPv6Protocol}, &policy
}

// soakRun is one seed's run: the cluster and what the faults act on.
type soakRun struct {
	t      *testing.T
	c      *cluster.Cluster
	l2     []string     // the L2 Services
	vips   []netip.Addr // their addresses
	bgpVIP netip.Addr
	// perClient is the VIP answered per client, also asked from several client addresses.
	perClient netip.Addr
	// vmac is the VIP answered with a virtual MAC, also asked from a client address of its own.
	vmac  netip.Addr
	nodes []string
	local []string // the nodes of the ETP Local Service's endpoints
	// I5
	peak       map[string]int64 // the peak resident memory by kind of process
	ccmExits   int              // the CCM's exits outside api-down
	ccmStarted time.Time        // when the soak last started it again after one
	start      time.Time
	churn      int          // Services made by service-churn so far
	tenant     []netip.Addr // tenant-move's Service's addresses
	moves      int          // tenant-move's moves so far
	oneway     int          // heartbeat-oneway faults so far
}

// settled: every L2 VIP answered by one node, the BGP VIP routed.
func (s *soakRun) settled() bool {
	for _, v := range s.vips {
		if len(s.c.Answerers(v)) != 1 {
			return false
		}
	}
	return len(s.c.NextHops(s.bgpVIP)) > 0
}

// inject applies f and returns what heals it.
func (s *soakRun) inject(f fault) (heal func()) {
	t, c := s.t, s.c
	t.Helper()
	switch f.Kind {
	case "agent-kill":
		a := c.Agents[f.Node]
		a.Proc.Kill()
		return func() { c.StartAgent(a) }
	case "agent-restart", "restart-then-die":
		// A planned restart: SIGTERM, the agent tells its peers and the CCM it is back within
		// its grace (they hold its VIPs for it); started again within the grace, or after it
		// ran out and its peers took over (restart-then-die: the notice is no lease on a VIP).
		a := c.Agents[f.Node]
		a.Proc.Stop(10 * time.Second)
		return func() { c.StartAgent(a) }
	case "agent-pause":
		p := c.Agents[f.Node].Proc.Cmd.Process
		if err := p.Signal(syscall.SIGSTOP); err != nil {
			t.Fatalf("SIGSTOP %s: %v", f.Node, err)
		}
		return func() { _ = p.Signal(syscall.SIGCONT) }
	case "node-death":
		c.Kill(f.Node)
		return func() { c.Revive(f.Node) }
	case "link-flap":
		// The link goes down and up; the agent lives on, holding its state.
		h := c.Agents[f.Node].Host
		if _, err := h.Run(t.Context(), "ip", "link", "set", "eth0", "down"); err != nil {
			t.Fatalf("link down on %s: %v", f.Node, err)
		}
		return func() {
			if _, err := h.Run(t.Context(), "ip", "link", "set", "eth0", "up"); err != nil {
				t.Fatalf("link up on %s: %v", f.Node, err)
			}
			_, _ = h.Run(t.Context(), "ip", "route", "replace", "default", "via", "198.51.100.1")
		}
	case "grpc-drop":
		return s.nft(f.Node, "tcp dport 7472 drop")
	case "heartbeat-loss":
		// A fifth of the heartbeats lost, both ways (no netem on these machines: nftables
		// drops at random).
		return s.nft(f.Node, "udp dport 7473 numgen random mod 5 0 drop", "udp sport 7473 numgen random mod 5 0 drop")
	case "heartbeat-oneway":
		// Every heartbeat lost one way: out of the node, then (its next time) into it. The node
		// hearing nothing takes over; the other must yield to it, not answer beside it.
		s.oneway++
		chain := "output"
		if s.oneway%2 == 0 {
			chain = "input"
		}
		return s.nftChains(f.Node, []string{chain}, "udp dport 7473 drop")
	case "disk-full":
		// The state folder's file system full, and the agent restarted on it.
		a := c.Agents[f.Node]
		filler := filepath.Join(a.State, ".chaos-filler")
		// dd stops at the end of the space with an error: the point.
		_ = exec.Command("dd", "if=/dev/zero", "of="+filler, "bs=64k", "count=64").Run()
		a.Proc.Kill()
		c.StartAgent(a)
		return func() {
			if err := os.Remove(filler); err != nil {
				t.Errorf("disk-full on %s: %v", f.Node, err)
			}
		}
	case "disk-readonly":
		// The state folder read-only, and the agent restarted on it: it can save neither its
		// state nor its boot counter.
		a := c.Agents[f.Node]
		if out, err := exec.Command("mount", "--bind", a.State, a.State).CombinedOutput(); err != nil {
			t.Fatalf("bind-mount %s: %v: %s", a.State, err, out)
		}
		mounted := true
		unmount := func() {
			if mounted {
				// The agent started meanwhile has a mount namespace of its own (ip netns exec
				// makes one) holding a copy of the mount: unmounted there too, or its disk
				// would stay read-only for its whole life.
				if p := a.Proc.Cmd.Process; p != nil {
					_ = exec.Command("nsenter", "-t", strconv.Itoa(p.Pid), "-m", "umount", a.State).Run()
				}
				_ = exec.Command("umount", a.State).Run()
				mounted = false
			}
		}
		t.Cleanup(unmount)
		if out, err := exec.Command("mount", "-o", "remount,bind,ro", a.State).CombinedOutput(); err != nil {
			unmount()
			t.Fatalf("remount %s read-only: %v: %s", a.State, err, out)
		}
		a.Proc.Kill()
		c.StartAgent(a)
		return unmount
	case "ccm-restart":
		c.CCM.Kill()
		return func() { c.StartCCM() }
	case "ccm-race":
		// A second CCM races for the Lease; the first is killed at the end of the hold and
		// the second leads.
		old := c.CCM
		c.CCM = c.StartCCMReplica("ccm", c.LeaderElectFlags()...)
		return func() { old.Kill() }
	case "api-down":
		if err := c.Srv.Pause(); err != nil {
			t.Fatalf("pause the API server: %v", err)
		}
		return func() {
			if err := c.Srv.Resume(); err != nil {
				t.Fatalf("resume the API server: %v", err)
			}
			// The CCM exits once it knows it lost its Lease, as a pod would (and be restarted).
			select {
			case <-c.CCM.Done():
				t.Logf("api-down: the CCM exited (%v), as it does when it lost its Lease; started again", c.CCM.Err())
				c.StartCCM()
			case <-time.After(8 * time.Second):
				t.Logf("api-down: the CCM kept running")
			}
		}
	case "router-restart":
		if err := c.Lab.RestartRouter(); err != nil {
			t.Fatalf("restart the router: %v", err)
		}
		return func() {}
	case "endpoints-move":
		// The ETP Local Service's endpoints move to the fault's node and the next, or if they
		// are there already, one node on.
		i := slices.Index(s.nodes, f.Node)
		to := []string{f.Node, s.nodes[(i+1)%len(s.nodes)]}
		if slices.Equal(to, s.local) {
			to = []string{to[1], s.nodes[(i+2)%len(s.nodes)]}
		}
		c.Endpoints("local-0", to...)
		s.local = to
		return func() {}
	case "tenant-edit":
		return s.tenantEdit()
	case "tenant-move":
		return s.tenantMove()
	case "service-churn":
		return s.serviceChurn()
	case "pool-delete":
		return s.poolDelete()
	}
	t.Fatalf("unknown fault %q", f.Kind)
	return nil
}

// nft drops, on node, what rules match (input and output) until healed.
func (s *soakRun) nft(node string, rules ...string) (heal func()) {
	return s.nftChains(node, []string{"input", "output"}, rules...)
}

// nftChains drops, on node, what rules match in the chains given (input, output) until healed.
func (s *soakRun) nftChains(node string, chains []string, rules ...string) (heal func()) {
	h := s.c.Agents[node].Host
	var b strings.Builder
	for _, chain := range chains {
		fmt.Fprintf(&b, " chain %s {\n  type filter hook %s priority 0; policy accept;\n", chain, chain)
		for _, r := range rules {
			fmt.Fprintf(&b, "  %s\n", r)
		}
		b.WriteString(" }\n")
	}
	cmd := h.Command(s.t.Context(), "nft", "-f", "-")
	cmd.Stdin = strings.NewReader("table inet metalvip-chaos {\n" + b.String() + "}\n")
	if out, err := cmd.CombinedOutput(); err != nil {
		s.t.Fatalf("nft on %s: %v: %s", node, err, out)
	}
	return func() { _, _ = h.Run(s.t.Context(), "nft", "delete", "table", "inet", "metalvip-chaos") }
}

// tenantEdit: a tenant overwrites the controller's records on an L2 Service, naming the BGP
// pool and the unheld address, and the CCM restarts meanwhile. The address must keep its pool's
// mode and not change (I1; I4: no route at the router, the unheld address never answered).
func (s *soakRun) tenantEdit() (heal func()) {
	t, c := s.t, s.c
	name := s.l2[0]
	patch := fmt.Sprintf(`{"metadata":{"annotations":{%q:%q,%q:"203.0.113.30"}}}`,
		annotation.AllocatedPool, "bgp-"+c.NS, annotation.AllocatedIPs)
	if _, err := c.Srv.Client.CoreV1().Services(c.NS).Patch(t.Context(), name, types.MergePatchType, []byte(patch), metav1.PatchOptions{}); err != nil {
		t.Fatalf("tenant edit of %s: %v", name, err)
	}
	c.CCM.Kill()
	c.StartCCM()
	return func() {}
}

// tenantService is the Service whose request tenant-move changes.
const tenantService = "tenant-0"

// tenantMove: a tenant changes its Service's request, in turn to two addresses of the BGP pool
// (metalvip.io/pool and vip-count) and to one requested address of the L2 pool with a sharing
// key (metalvip.io/ips and sharing-key). The Service moves: its new addresses announced by their
// pool's mode (routed, or answered by one node and not routed), the old ones by nothing.
func (s *soakRun) tenantMove() (heal func()) {
	t, c := s.t, s.c
	s.moves++
	bgpPool, _ := c.BGPPool()
	patch := fmt.Sprintf(`{"metadata":{"annotations":{%q:%q,%q:"2",%q:null,%q:null}}}`,
		annotation.Pool, bgpPool, annotation.VIPCount, annotation.IPs, annotation.SharingKey)
	want := func(ips []netip.Addr) bool {
		return len(ips) == 2 && ips[0] != ips[1] && netip.MustParsePrefix("203.0.113.64/27").Contains(ips[0]) && netip.MustParsePrefix("203.0.113.64/27").Contains(ips[1])
	}
	if s.moves%2 == 0 {
		patch = fmt.Sprintf(`{"metadata":{"annotations":{%q:null,%q:null,%q:"203.0.113.25",%q:"tenant"}}}`,
			annotation.Pool, annotation.VIPCount, annotation.IPs, annotation.SharingKey)
		want = func(ips []netip.Addr) bool { return len(ips) == 1 && ips[0] == netip.MustParseAddr("203.0.113.25") }
	}
	if _, err := c.Srv.Client.CoreV1().Services(c.NS).Patch(t.Context(), tenantService, types.MergePatchType, []byte(patch), metav1.PatchOptions{}); err != nil {
		t.Fatalf("tenant move of %s: %v", tenantService, err)
	}
	old := s.tenant
	return func() {
		var now []netip.Addr
		if !waitUntil(15*time.Second, func() bool {
			now = nil
			for _, ip := range serviceAddresses(t, c)[tenantService] {
				now = append(now, netip.MustParseAddr(ip))
			}
			return want(now)
		}) {
			t.Errorf("tenant-move %d: %s shows %v 15s after the tenant's request (%s)", s.moves, tenantService, now, patch)
			return
		}
		s.tenant = now
		announced := func() bool {
			for _, ip := range now {
				bgp := netip.MustParsePrefix("203.0.113.64/27").Contains(ip)
				if bgp && (len(c.NextHops(ip)) == 0 || len(c.Answerers(ip)) > 0) {
					return false
				}
				if !bgp && (len(c.Answerers(ip)) != 1 || len(c.NextHops(ip)) > 0) {
					return false
				}
			}
			for _, ip := range old {
				if !slices.Contains(now, ip) && (len(c.NextHops(ip)) > 0 || len(c.Answerers(ip)) > 0) {
					return false
				}
			}
			return true
		}
		if !waitUntil(15*time.Second, announced) {
			for _, ip := range slices.Concat(old, now) {
				t.Errorf("I4: tenant-move %d of %s from %v to %v: %s answered by %v, routed via %v 15s after", s.moves, tenantService, old, now, ip, c.Answerers(ip), c.NextHops(ip))
			}
		}
	}
}

// poolDelete: the BGP pool deleted under its Service, then created again. Its address stays the
// Service's (I1) and is announced by nothing meanwhile: not routed, never answered by ARP (I4),
// until the pool is back.
func (s *soakRun) poolDelete() (heal func()) {
	t, c := s.t, s.c
	name, spec := c.BGPPool()
	if err := c.Dyn.Resource(v1alpha1.IPPoolResource).Delete(t.Context(), name, metav1.DeleteOptions{}); err != nil {
		t.Fatalf("delete pool %s: %v", name, err)
	}
	return func() {
		if !waitUntil(10*time.Second, func() bool { return len(c.NextHops(s.bgpVIP)) == 0 }) {
			t.Errorf("I4: %s still routed via %v 10s after its pool %s was deleted", s.bgpVIP, c.NextHops(s.bgpVIP), name)
		}
		c.Object(v1alpha1.IPPoolResource, name, spec)
	}
}

// smallDisks puts each agent's state folder on a tmpfs of 1 MiB of its own (its files copied
// over, the agent started again on it), for disk-full to fill.
func (s *soakRun) smallDisks() {
	t, c := s.t, s.c
	for _, n := range s.nodes {
		a := c.Agents[n]
		a.Proc.Kill()
		keep := a.State + ".chaos"
		for _, args := range [][]string{
			{"cp", "-a", a.State, keep},
			{"mount", "-t", "tmpfs", "-o", "size=1m,mode=0700", "chaos-" + n, a.State},
			{"cp", "-a", keep + "/.", a.State},
		} {
			if out, err := exec.Command(args[0], args[1:]...).CombinedOutput(); err != nil {
				t.Fatalf("%s: %v: %s", strings.Join(args, " "), err, out)
			}
			if args[0] == "mount" {
				t.Cleanup(func() { _ = exec.Command("umount", "-l", a.State).Run() })
			}
		}
		c.StartAgent(a)
	}
}

// serviceChurn: a Service is created, answered, and deleted; its address must then no longer be
// answered (I4) soon after.
func (s *soakRun) serviceChurn() (heal func()) {
	t, c := s.t, s.c
	s.churn++
	name := fmt.Sprintf("churn-%d", s.churn)
	ip := c.Service(name)
	if !waitUntil(10*time.Second, func() bool { return len(c.Answerers(ip)) == 1 }) {
		t.Errorf("I3: %s (%s) not answered by one node within 10s of its address: %v", name, ip, c.Answerers(ip))
	}
	if err := c.Srv.Client.CoreV1().Services(c.NS).Delete(t.Context(), name, metav1.DeleteOptions{}); err != nil {
		t.Fatalf("delete %s: %v", name, err)
	}
	return func() {
		if !waitUntil(10*time.Second, func() bool { return len(c.Answerers(ip)) == 0 }) {
			t.Errorf("I4: %s, the address of the deleted Service %s, still answered by %v 10s after", ip, name, c.Answerers(ip))
		}
	}
}

// run is a stretch of consecutive rounds of one VIP.
type run struct {
	from, to time.Time
}

func (r run) length() time.Duration { return r.to.Sub(r.from) + askEvery }

// runs returns the stretches of v's rounds for which match holds. The latest round is left
// out (its answers may still be on the way).
func runs(rounds []lab.NeighborRound, v netip.Addr, match func(lab.NeighborRound) bool) []run {
	var out []run
	var cur *run
	var mine []lab.NeighborRound
	for _, r := range rounds {
		if r.VIP == v {
			mine = append(mine, r)
		}
	}
	if len(mine) > 0 {
		mine = mine[:len(mine)-1]
	}
	for _, r := range mine {
		switch {
		case match(r) && cur == nil:
			cur = &run{from: r.At, to: r.At}
		case match(r):
			cur.to = r.At
		case cur != nil:
			out = append(out, *cur)
			cur = nil
		}
	}
	if cur != nil {
		out = append(out, *cur)
	}
	return out
}

// context prints v's rounds from a second before at to a second after, and the faults then.
func context(rounds []lab.NeighborRound, v netip.Addr, at, start time.Time, plan []fault) string {
	var b strings.Builder
	for _, f := range plan {
		if began, healed := start.Add(f.Began), start.Add(f.Healed); healed.After(at.Add(-5*time.Second)) && began.Before(at.Add(5*time.Second)) {
			fmt.Fprintf(&b, "  fault: %s\n", f)
		}
	}
	for _, r := range rounds {
		if r.VIP == v && r.At.After(at.Add(-time.Second)) && r.At.Before(at.Add(time.Second)) {
			fmt.Fprintf(&b, "  +%s %s %v\n", r.At.Sub(start).Round(time.Millisecond), v, r.MACs)
		}
	}
	return b.String()
}

func answerers(c *cluster.Cluster, vips []netip.Addr) map[netip.Addr][]string {
	out := map[netip.Addr][]string{}
	for _, v := range vips {
		out[v] = c.Answerers(v)
	}
	return out
}

// waitUntil is harness.WithinEvery at 100 ms (its conditions ask the wire or the router), for
// the soak's checks that go on when cond never held.
func waitUntil(d time.Duration, cond func() bool) bool {
	_, ok := harness.WithinEvery(d, 100*time.Millisecond, cond)
	return ok
}

func equalAddresses(a, b map[string][]string) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if !slices.Equal(v, b[k]) {
			return false
		}
	}
	return true
}

// serviceAddresses returns the addresses each Service of the cluster's namespace shows.
func serviceAddresses(t *testing.T, c *cluster.Cluster) map[string][]string {
	t.Helper()
	list, err := c.Srv.Client.CoreV1().Services(c.NS).List(t.Context(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	out := map[string][]string{}
	for _, s := range list.Items {
		for _, in := range s.Status.LoadBalancer.Ingress {
			out[s.Name] = append(out[s.Name], in.IP)
		}
	}
	return out
}
