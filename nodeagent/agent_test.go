package nodeagent

import (
	"context"
	"errors"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	"github.com/metalvip/metalvip/internal/agentapi"
	"github.com/metalvip/metalvip/internal/certs"
	"github.com/metalvip/metalvip/nodeagent/bgp"
	"github.com/metalvip/metalvip/nodeagent/l2"
	agentv1 "github.com/metalvip/metalvip/proto/metalvip/agent/v1"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, goleak.IgnoreTopFunction("github.com/metalvip/metalvip/test/testenv.spawner"))
}

// The speakers are fakes here: the contract is about what the agent accepts and reports. The
// real speakers are tested on the wire in their packages and in the agent's lab test.
type fakeL2 struct {
	mu   sync.Mutex
	sets [][]l2.VIP
	// Clients of per-client VIPs: known (as learnt), and remembered (given at start), with
	// how many Sets came before.
	known          []l2.Client
	knownVer       uint64
	remembered     []l2.Client
	setsBeforeMemo int
}

func (f *fakeL2) KnownClients() ([]l2.Client, uint64) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.known), f.knownVer
}

func (f *fakeL2) Remember(cs []l2.Client) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.remembered, f.setsBeforeMemo = slices.Clone(cs), len(f.sets)
}

func (f *fakeL2) Set(v []l2.VIP) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.sets = append(f.sets, slices.Clone(v))
	return nil
}
func (f *fakeL2) Counters() l2.Counters    { return l2.Counters{ARPReplies: 7} }
func (f *fakeL2) SetRefresh(time.Duration) {}
func (f *fakeL2) Close() error             { return nil }
func (f *fakeL2) last() []l2.VIP {
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.sets) == 0 {
		return nil
	}
	return f.sets[len(f.sets)-1]
}
func (f *fakeL2) calls() int { f.mu.Lock(); defer f.mu.Unlock(); return len(f.sets) }

type fakeBGP struct {
	mu       sync.Mutex
	refuse   error // SetPeers takes the peers but reports this, as gobgp refusing one would
	peers    []bgp.Peer
	routes   []bgp.Route
	onChange func(bgp.SessionState)
	shutdown bool
	// forRestart: the shutdown was ShutdownForRestart (routes kept at graceful-restart peers).
	forRestart bool
}

func (f *fakeBGP) SetPeers(_ context.Context, p []bgp.Peer) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.peers = p
	return f.refuse
}
func (f *fakeBGP) SetRoutes(_ context.Context, r []bgp.Route) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.routes = r
	return nil
}
func (f *fakeBGP) Sessions() []bgp.SessionState {
	return []bgp.SessionState{{Peer: netip.MustParseAddr("198.51.100.1"), State: "Established"}}
}
func (f *fakeBGP) OnSessionChange(fn func(bgp.SessionState)) { f.onChange = fn }
func (f *fakeBGP) Shutdown(context.Context) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.shutdown = true
	return nil
}
func (f *fakeBGP) ShutdownForRestart(context.Context) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.shutdown, f.forRestart = true, true
	return nil
}

// pki writes a CA, the CCM's client certificate, agent certificates for node-a and node-b,
// and a second CA with a client certificate of its own.
type pki struct {
	dir string
}

func newPKI(t *testing.T) pki {
	t.Helper()
	dir := t.TempDir()
	write := func(name string, p certs.Pair) {
		if err := os.WriteFile(filepath.Join(dir, name+".crt"), p.Cert, 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, name+".key"), p.Key, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	ca, err := certs.NewCA("metalvip-ca", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	write("ca", ca)
	for name, usage := range map[string]certs.Usage{certs.CCMName: certs.Client, certs.ViewerName: certs.Client, "node-a": certs.Server, "node-b": certs.Server} {
		p, err := certs.Issue(ca, name, usage, time.Hour)
		if err != nil {
			t.Fatal(err)
		}
		write(name, p)
	}
	// An agent certificate that may also act as a client: right CA, wrong identity.
	nb, err := certs.Issue(ca, "node-b", certs.Client, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	write("node-b-as-client", nb)
	rogue, err := certs.NewCA("rogue-ca", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	write("rogue-ca", rogue)
	rc, err := certs.Issue(rogue, certs.CCMName, certs.Client, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	write("rogue-ccm", rc)
	return pki{dir}
}

func (p pki) files(name, ca string) certs.Files {
	return certs.Files{CA: filepath.Join(p.dir, ca+".crt"), Cert: filepath.Join(p.dir, name+".crt"), Key: filepath.Join(p.dir, name+".key")}
}

type harness struct {
	agent *Agent
	l2    *fakeL2
	bgp   *fakeBGP
	addr  string
	pki   pki
	dir   string
}

// serve starts an agent for node-a behind real mutual TLS on loopback.
func serve(t *testing.T, stateDir string, with ...func(*Options)) *harness {
	t.Helper()
	h := &harness{l2: &fakeL2{}, bgp: &fakeBGP{}, pki: newPKI(t), dir: stateDir}
	opts := Options{
		Node: "node-a", StateDir: stateDir, Interfaces: []string{"eth0"},
		RouterID: netip.MustParseAddr("198.51.100.11"), L2: h.l2,
		NewBGP: func(context.Context, bgp.Config) (BGP, error) { return h.bgp, nil },
	}
	for _, f := range with {
		f(&opts)
	}
	var err error
	h.agent, err = New(context.Background(), opts)
	if err != nil {
		t.Fatal(err)
	}
	tlsCfg, err := certs.ServerConfig(h.pki.files("node-a", "ca"), certs.CCMName, certs.ViewerName)
	if err != nil {
		t.Fatal(err)
	}
	srv := NewServer(h.agent, credentials.NewTLS(tlsCfg), true)
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	h.addr = lis.Addr().String()
	go func() { _ = srv.Serve(lis) }()
	t.Cleanup(func() {
		srv.Stop()
		_ = h.agent.Close(context.Background())
	})
	return h
}

// client dials the agent as the holder of certificate name (CA ca), expecting the agent to be
// node.
func (h *harness) client(t *testing.T, name, ca, node string) agentv1.AgentServiceClient {
	t.Helper()
	cfg, err := certs.ClientConfig(h.pki.files(name, ca), node)
	if err != nil {
		t.Fatal(err)
	}
	conn, err := grpc.NewClient(h.addr, append(agentapi.ClientOptions(), grpc.WithTransportCredentials(credentials.NewTLS(cfg)))...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return agentv1.NewAgentServiceClient(conn)
}

func (h *harness) ccm(t *testing.T) agentv1.AgentServiceClient {
	return h.client(t, certs.CCMName, "ca", "node-a")
}

func (h *harness) viewer(t *testing.T) agentv1.AgentServiceClient {
	return h.client(t, certs.ViewerName, "ca", "node-a")
}

func ctx(t *testing.T) context.Context {
	c, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	t.Cleanup(cancel)
	return c
}

func state(term, gen uint64, anns ...*agentv1.Announcement) *agentv1.DesiredState {
	return &agentv1.DesiredState{
		Term: term, Generation: gen, Node: "node-a", Announcements: anns,
		Bgp: &agentv1.BGPOptions{Asn: 64497},
		BgpPeers: []*agentv1.BGPPeer{{Address: "198.51.100.1", PeerAsn: 64496,
			Bfd: &agentv1.BFD{Enabled: true, MinRxMs: 100, MinTxMs: 100, Multiplier: 3}}},
	}
}

func l2VIP(vip string, candidates ...string) *agentv1.Announcement {
	an := &agentv1.Announcement{Vip: vip, Mode: agentv1.Mode_MODE_L2, L2: &agentv1.L2Announcement{}}
	for _, c := range candidates {
		an.L2.Candidates = append(an.L2.Candidates, &agentv1.Candidate{Node: c})
	}
	return an
}

func bgpVIP(vip string) *agentv1.Announcement {
	return &agentv1.Announcement{Vip: vip, Mode: agentv1.Mode_MODE_BGP, Bgp: &agentv1.BGPAnnouncement{Communities: []string{"64496:100"}, LocalPref: 200}}
}

func TestApplyAndGetState(t *testing.T) {
	h := serve(t, t.TempDir())
	c := h.ccm(t)
	applied := state(1, 1,
		l2VIP("203.0.113.10", "node-a", "node-b"),
		l2VIP("203.0.113.11", "node-b", "node-a"),
		bgpVIP("203.0.113.20"),
	)
	//lint:ignore SA1019 an older CCM's shared key must not come back out of GetState
	applied.L2 = &agentv1.L2Options{HeartbeatKeys: [][]byte{[]byte("secret-key-0123456789abcdef0123")}, HeartbeatIntervalMs: 50}
	applied.BgpPeers[0].Password = "md5-secret"
	resp, err := c.Apply(ctx(t), &agentv1.ApplyRequest{State: applied})
	if err != nil || !resp.GetChanged() || resp.GetGeneration() != 1 || len(resp.GetProblems()) != 0 {
		t.Fatalf("Apply = %v, %v", resp, err)
	}
	if got := h.l2.last(); len(got) != 1 || got[0].Addr != netip.MustParseAddr("203.0.113.10") || !slices.Equal(got[0].Interfaces, []string{"eth0"}) {
		t.Errorf("L2 speaker told %v; want only 203.0.113.10 on eth0 (first candidate)", got)
	}
	h.bgp.mu.Lock()
	routes, peers := h.bgp.routes, h.bgp.peers
	h.bgp.mu.Unlock()
	if len(routes) != 1 || routes[0].Prefix != netip.MustParsePrefix("203.0.113.20/32") || routes[0].LocalPref != 200 {
		t.Errorf("BGP routes %v", routes)
	}
	if len(peers) != 1 || peers[0].PeerASN != 64496 || !peers[0].BFD.Enabled || peers[0].BFD.MinRx != 100*time.Millisecond {
		t.Errorf("BGP peers %+v", peers)
	}

	st, err := c.GetState(ctx(t), &agentv1.GetStateRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if st.GetNode() != "node-a" || st.GetTerm() != 1 || st.GetGeneration() != 1 || st.GetRestored() {
		t.Errorf("GetState header %v", st)
	}
	reasons := map[string]string{}
	for _, v := range st.GetAnnounced() {
		reasons[v.GetVip()] = map[bool]string{true: "active: ", false: "idle: "}[v.GetActive()] + v.GetReason()
	}
	want := map[string]string{
		"203.0.113.10": "active: first candidate",
		"203.0.113.11": "idle: standby for node-b",
		"203.0.113.20": "active: advertised to BGP peers",
	}
	for vip, w := range want {
		if reasons[vip] != w {
			t.Errorf("GetState says %s is %q, want %q", vip, reasons[vip], w)
		}
	}
	if len(st.GetPeers()) != 1 || st.GetPeers()[0].GetState() != "Established" || st.GetL2().GetArpReplies() != 7 {
		t.Errorf("GetState peers %v, L2 %v", st.GetPeers(), st.GetL2())
	}
	// The held state comes back (a new leader plans from it), without secrets.
	held := st.GetState()
	//lint:ignore SA1019 see above
	if len(held.GetL2().GetHeartbeatKeys()) != 0 || held.GetL2().GetHeartbeatIntervalMs() != 50 {
		t.Errorf("held L2 options %v; want the interval and no keys", held.GetL2())
	}
	if pw := held.GetBgpPeers()[0].GetPassword(); pw != "" {
		t.Errorf("GetState returned the BGP password %q", pw)
	}
	held.L2, applied.L2 = nil, nil
	applied.BgpPeers[0].Password = ""
	if !proto.Equal(held, applied) {
		t.Errorf("held state %v, want what was applied %v", held, applied)
	}
	if keys := st.GetHeartbeatPublicKeys(); len(keys) != 1 || len(keys[0]) != 32 {
		t.Errorf("GetState heartbeat keys %x; want one X25519 public key", keys)
	}
}

func TestApplyIsIdempotentAndFencedByTerm(t *testing.T) {
	h := serve(t, t.TempDir())
	c := h.ccm(t)
	s := state(5, 3, l2VIP("203.0.113.10", "node-a"))
	if _, err := c.Apply(ctx(t), &agentv1.ApplyRequest{State: s}); err != nil {
		t.Fatal(err)
	}
	calls := h.l2.calls()
	// The same generation again, even with other content: a no-op.
	again, err := c.Apply(ctx(t), &agentv1.ApplyRequest{State: state(5, 3, l2VIP("203.0.113.99", "node-a"))})
	if err != nil || again.GetChanged() || again.GetGeneration() != 3 || h.l2.calls() != calls {
		t.Errorf("re-Apply of generation 3 = %v, %v, speaker calls %d -> %d; want a no-op", again, err, calls, h.l2.calls())
	}
	// An older generation: a no-op too.
	if r, err := c.Apply(ctx(t), &agentv1.ApplyRequest{State: state(5, 2)}); err != nil || r.GetGeneration() != 3 {
		t.Errorf("older generation = %v, %v", r, err)
	}
	// A newer generation with the same content: accepted, nothing re-applied.
	if r, err := c.Apply(ctx(t), &agentv1.ApplyRequest{State: state(5, 4, l2VIP("203.0.113.10", "node-a"))}); err != nil || r.GetChanged() || h.l2.calls() != calls {
		t.Errorf("same content, newer generation = %v, %v", r, err)
	}
	// A deposed leader (older term) is refused and changes nothing.
	_, err = c.Apply(ctx(t), &agentv1.ApplyRequest{State: state(4, 100)})
	if status.Code(err) != codes.FailedPrecondition || !strings.Contains(err.Error(), "older than the accepted term 5") {
		t.Errorf("older term: %v; want FailedPrecondition", err)
	}
	if got := h.l2.last(); len(got) != 1 {
		t.Errorf("after the fenced Apply the speaker has %v", got)
	}
	// A new term starts its own generations.
	if r, err := c.Apply(ctx(t), &agentv1.ApplyRequest{State: state(6, 1)}); err != nil || !r.GetChanged() || len(h.l2.last()) != 0 {
		t.Errorf("new term, generation 1 = %v, %v; speaker %v", r, err, h.l2.last())
	}
}

// TestGetStateSaysItsBuildAndTheCCMsThatAppliedLast: an agent says its own build and the build
// of the CCM whose Apply arrived last (metalvipctl version reads both to flag a skew); none
// before the first Apply, and a fenced Apply of a deposed leader does not count.
func TestGetStateSaysItsBuildAndTheCCMsThatAppliedLast(t *testing.T) {
	h := serve(t, t.TempDir())
	c := h.ccm(t)
	st, err := c.GetState(ctx(t), &agentv1.GetStateRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if !proto.Equal(st.GetBuild(), agentapi.ThisBuild()) || st.GetBuild().GetVersion() == "" || st.GetAppliedBy() != nil {
		t.Errorf("before an Apply: build %v, applied by %v; want this build and none", st.GetBuild(), st.GetAppliedBy())
	}
	older := &agentv1.Build{Version: "v0.1.0", Commit: "0123abc"}
	newer := &agentv1.Build{Version: "v0.2.0", Commit: "4567def"}
	appliedBy := func() *agentv1.Build {
		st, err := c.GetState(ctx(t), &agentv1.GetStateRequest{})
		if err != nil {
			t.Fatal(err)
		}
		return st.GetAppliedBy()
	}
	if _, err := c.Apply(ctx(t), &agentv1.ApplyRequest{State: state(5, 1), Sender: older}); err != nil {
		t.Fatal(err)
	}
	if got := appliedBy(); !proto.Equal(got, older) {
		t.Errorf("applied by %v; want %v", got, older)
	}
	// The same generation from the CCM of the next version (a rolling update of the CCM).
	if _, err := c.Apply(ctx(t), &agentv1.ApplyRequest{State: state(5, 1), Sender: newer}); err != nil {
		t.Fatal(err)
	}
	if got := appliedBy(); !proto.Equal(got, newer) {
		t.Errorf("applied again by %v; want %v", got, newer)
	}
	if _, err := c.Apply(ctx(t), &agentv1.ApplyRequest{State: state(4, 9), Sender: older}); status.Code(err) != codes.FailedPrecondition {
		t.Fatalf("a deposed leader's Apply: %v; want FailedPrecondition", err)
	}
	if got := appliedBy(); !proto.Equal(got, newer) {
		t.Errorf("after a fenced Apply, applied by %v; want still %v", got, newer)
	}
}

func TestAStateWrongAsAWholeIsRefusedNamingTheField(t *testing.T) {
	h := serve(t, t.TempDir())
	c := h.ccm(t)
	if _, err := c.Apply(ctx(t), &agentv1.ApplyRequest{State: state(1, 1, l2VIP("203.0.113.10", "node-a"))}); err != nil {
		t.Fatal(err)
	}
	with := func(f func(s *agentv1.DesiredState)) *agentv1.DesiredState {
		s := state(1, 2, l2VIP("203.0.113.10", "node-a"))
		f(s)
		return s
	}
	for _, tc := range []struct {
		name string
		st   *agentv1.DesiredState
		want string
	}{
		{"a state for another node is refused", with(func(s *agentv1.DesiredState) { s.Node = "node-b" }), `node: the state is for "node-b"`},
		{"a state without a term is refused", with(func(s *agentv1.DesiredState) { s.Term = 0 }), "term: 0 is out of range"},
		{"a term from a clock is refused", with(func(s *agentv1.DesiredState) { s.Term = 1764578400000000 }), "1 to 2147483648"},
		{"a router ID that is not IPv4 is refused", with(func(s *agentv1.DesiredState) { s.Bgp.RouterId = "2001:db8::1" }), "bgp.router_id"},
		{"a heartbeat interval of 1 ms is refused", with(func(s *agentv1.DesiredState) { s.L2 = &agentv1.L2Options{HeartbeatIntervalMs: 1} }), "l2.heartbeat_interval_ms: 1 is out of range"},
		{"one heartbeat miss is refused", with(func(s *agentv1.DesiredState) { s.L2 = &agentv1.L2Options{HeartbeatMisses: 1} }), "l2.heartbeat_misses"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := c.Apply(ctx(t), &agentv1.ApplyRequest{State: tc.st})
			if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("Apply = %v; want InvalidArgument with %q", err, tc.want)
			}
			if st, _ := c.GetState(ctx(t), &agentv1.GetStateRequest{}); st.GetGeneration() != 1 {
				t.Errorf("a refused state changed the generation to %d", st.GetGeneration())
			}
		})
	}
	t.Run("the highest term a Lease can give is taken", func(t *testing.T) {
		if _, err := c.Apply(ctx(t), &agentv1.ApplyRequest{State: state(MaxTerm, 1)}); err != nil {
			t.Errorf("Apply with term %d = %v", uint64(MaxTerm), err)
		}
	})
}

func TestWatchStreamsEvents(t *testing.T) {
	h := serve(t, t.TempDir())
	c := h.ccm(t)
	wctx, cancel := context.WithCancel(ctx(t))
	defer cancel()
	w, err := c.Watch(wctx, &agentv1.WatchRequest{})
	if err != nil {
		t.Fatal(err)
	}
	events := make(chan *agentv1.Event, 100)
	go func() {
		for {
			r, err := w.Recv()
			if err != nil {
				close(events)
				return
			}
			events <- r.GetEvent()
		}
	}()
	expect := func(kind agentv1.Event_Kind, vip string) {
		t.Helper()
		deadline := time.After(5 * time.Second)
		for {
			select {
			case ev, ok := <-events:
				if !ok {
					t.Fatalf("stream ended waiting for %v %s", kind, vip)
				}
				if ev.GetKind() == kind && ev.GetVip() == vip {
					return
				}
			case <-deadline:
				t.Fatalf("no %v %s within 5s", kind, vip)
			}
		}
	}
	if _, err := w.Header(); err != nil { // the stream is registered once headers arrive
		t.Fatal(err)
	}
	if _, err := c.Apply(ctx(t), &agentv1.ApplyRequest{State: state(1, 1, l2VIP("203.0.113.10", "node-a", "node-b"))}); err != nil {
		t.Fatal(err)
	}
	expect(agentv1.Event_KIND_TOOK_OVER, "203.0.113.10")
	expect(agentv1.Event_KIND_APPLIED, "")
	if _, err := c.Apply(ctx(t), &agentv1.ApplyRequest{State: state(1, 2, l2VIP("203.0.113.10", "node-b", "node-a"))}); err != nil {
		t.Fatal(err)
	}
	expect(agentv1.Event_KIND_RELEASED, "203.0.113.10")
	h.bgp.onChange(bgp.SessionState{Peer: netip.MustParseAddr("198.51.100.1"), State: "Established"})
	expect(agentv1.Event_KIND_SESSION_UP, "")
}

func TestRestartResumesFromDisk(t *testing.T) {
	dir := t.TempDir()
	h := serve(t, dir)
	if _, err := h.ccm(t).Apply(ctx(t), &agentv1.ApplyRequest{State: state(2, 7, l2VIP("203.0.113.10", "node-a"), bgpVIP("203.0.113.20"))}); err != nil {
		t.Fatal(err)
	}
	info, err := os.Stat(filepath.Join(dir, stateFile))
	if err != nil || info.Mode().Perm() != 0o600 {
		t.Fatalf("saved state: %v, %v; want a file readable by its owner only", info, err)
	}
	// A second agent on the same folder, with no CCM around.
	h2 := serve(t, dir)
	if got := h2.l2.last(); len(got) != 1 || got[0].Addr != netip.MustParseAddr("203.0.113.10") {
		t.Errorf("restarted agent's L2 speaker got %v", got)
	}
	h2.bgp.mu.Lock()
	routes := h2.bgp.routes
	h2.bgp.mu.Unlock()
	if len(routes) != 1 {
		t.Errorf("restarted agent's BGP routes %v", routes)
	}
	st, err := h2.ccm(t).GetState(ctx(t), &agentv1.GetStateRequest{})
	if err != nil || !st.GetRestored() || st.GetTerm() != 2 || st.GetGeneration() != 7 {
		t.Errorf("restarted agent's state %v, %v", st, err)
	}
	// The old term stays fenced after the restart.
	if _, err := h2.ccm(t).Apply(ctx(t), &agentv1.ApplyRequest{State: state(1, 9)}); status.Code(err) != codes.FailedPrecondition {
		t.Errorf("an older term after a restart: %v", err)
	}
}

// The soak's seed 5: an agent whose state directory could not be written applied states in
// memory only, was restarted, resumed the older state saved before and answered VIPs that had
// moved beside their new owners, until the CCM sent the current state. An agent that starts on
// a state directory it cannot write does not resume the saved state (it may be older than the
// one last held): it answers nothing, so that its peers answer its VIPs, and keeps only the
// term, which still fences older leaders; the CCM's next state is applied.
func TestAnAgentStartingOnADiskItCannotWriteDoesNotResumeTheSavedState(t *testing.T) {
	dir := t.TempDir()
	h := serve(t, dir)
	if _, err := h.ccm(t).Apply(ctx(t), &agentv1.ApplyRequest{State: state(2, 7, l2VIP("203.0.113.10", "node-a"), bgpVIP("203.0.113.20"))}); err != nil {
		t.Fatal(err)
	}
	old := writable
	writable = func(string) error { return errors.New("read-only file system") }
	t.Cleanup(func() { writable = old })
	h2 := serve(t, dir)
	if got := h2.l2.last(); len(got) != 0 {
		t.Errorf("an agent started on a disk it cannot write answers %v; want nothing until the CCM sends a state", got)
	}
	h2.bgp.mu.Lock()
	routes := len(h2.bgp.routes)
	h2.bgp.mu.Unlock()
	if routes != 0 {
		t.Errorf("it announces %d BGP routes; want none", routes)
	}
	st, err := h2.ccm(t).GetState(ctx(t), &agentv1.GetStateRequest{})
	if err != nil || st.GetRestored() || st.GetTerm() != 2 || st.GetGeneration() != 0 ||
		!slices.ContainsFunc(st.GetProblems(), func(p string) bool { return strings.Contains(p, "is not resumed") }) {
		t.Errorf("its state %v, %v; want term 2 kept, generation 0, not restored, the problem said", st, err)
	}
	if _, err := h2.ccm(t).Apply(ctx(t), &agentv1.ApplyRequest{State: state(1, 9)}); status.Code(err) != codes.FailedPrecondition {
		t.Errorf("an older term: %v; want it fenced still", err)
	}
	if h2.agent.Gauges().StateSaved {
		t.Error("the gauge says the state is saved; want not: the term it holds is not on disk")
	}
	// The disk can be written again, no Apply yet: the term held alone replaces the older
	// state on disk, so that a restart cannot resume that either.
	writable = old
	deadline := time.Now().Add(10 * time.Second)
	for {
		saved, _, err := loadState(dir)
		if err == nil && saved.GetTerm() == 2 && saved.GetGeneration() == 0 && len(saved.GetAnnouncements()) == 0 && h2.agent.Gauges().StateSaved {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("10 s after the disk came back the saved state is %v (%v), the gauge says saved %v; want term 2 alone", saved, err, h2.agent.Gauges().StateSaved)
		}
		time.Sleep(50 * time.Millisecond)
	}
	// The leader's next state, even of a generation it sent before the restart, is applied.
	if _, err := h2.ccm(t).Apply(ctx(t), &agentv1.ApplyRequest{State: state(2, 7, l2VIP("203.0.113.10", "node-a"))}); err != nil {
		t.Fatal(err)
	}
	if got := h2.l2.last(); len(got) != 1 {
		t.Errorf("after the CCM's state it answers %v; want its VIP", got)
	}
}

// Issue 30, fault 3: a state directory that cannot be written (a full or read-only disk).
// Apply used to save first and fail INTERNAL, which the CCM counts as an unreachable node: its
// VIPs moved, and the node, alive on its old state, answered beside their new owners. Now the
// state is applied in memory, and the problem said (the Apply's problems, GetState, the
// metalvip_agent_state_saved gauge) until a save succeeds again; once the disk can be written,
// the held state is saved without waiting for the next Apply (the soak's seed 5: an agent
// restarted minutes after its disk came back resumed the state of before and answered VIPs
// that had moved).
func TestAStateThatCannotBeSavedIsAppliedSaidAndSavedOnceItCanBe(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "state")
	h := serve(t, dir)
	c := h.ccm(t)
	if _, err := c.Apply(ctx(t), &agentv1.ApplyRequest{State: state(2, 1, l2VIP("203.0.113.10", "node-a"))}); err != nil {
		t.Fatal(err)
	}
	// The disk goes bad: the state directory is away, a regular file in its place.
	away := dir + ".away"
	if err := os.Rename(dir, away); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(dir, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	resp, err := c.Apply(ctx(t), &agentv1.ApplyRequest{State: state(2, 2, l2VIP("203.0.113.10", "node-a"), l2VIP("203.0.113.11", "node-a"))})
	if err != nil {
		t.Fatalf("Apply with a state directory that cannot be written: %v; want it applied", err)
	}
	if got := h.l2.last(); len(got) != 2 {
		t.Errorf("the speaker answers %v; want both VIPs of the new state", got)
	}
	if !slices.ContainsFunc(resp.GetProblems(), func(p string) bool { return strings.Contains(p, "could not be saved") }) {
		t.Errorf("problems %v; want the state not saved said", resp.GetProblems())
	}
	if h.agent.Gauges().StateSaved {
		t.Error("the gauge says the state is saved")
	}
	// The disk is fine again; no Apply comes.
	if err := os.Remove(dir); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(away, dir); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		st, _, err := loadState(dir)
		if err == nil && st.GetGeneration() == 2 && h.agent.Gauges().StateSaved {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("10 s after the disk came back the saved state is %v (%v), saved gauge %v; want generation 2 saved",
				st.GetGeneration(), err, h.agent.Gauges().StateSaved)
		}
		time.Sleep(50 * time.Millisecond)
	}
	got, err := c.GetState(ctx(t), &agentv1.GetStateRequest{})
	if err != nil || slices.ContainsFunc(got.GetProblems(), func(p string) bool { return strings.Contains(p, "could not be saved") }) {
		t.Errorf("once the disk is fine: %v, problems %v; want no problem", err, got.GetProblems())
	}
}

// An agent upgraded over a state saved in the old format (protojson, state.json) resumes from
// it, and its first save replaces it.
func TestRestartResumesFromAStateSavedInTheOldFormat(t *testing.T) {
	dir := t.TempDir()
	old, err := protojson.Marshal(state(2, 7, l2VIP("203.0.113.10", "node-a")))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, legacyStateFile), old, 0o600); err != nil {
		t.Fatal(err)
	}
	h := serve(t, dir)
	if got := h.l2.last(); len(got) != 1 || got[0].Addr != netip.MustParseAddr("203.0.113.10") {
		t.Errorf("the agent did not resume from %s: its L2 speaker got %v", legacyStateFile, got)
	}
	if st, err := h.ccm(t).GetState(ctx(t), &agentv1.GetStateRequest{}); err != nil || !st.GetRestored() || st.GetGeneration() != 7 {
		t.Errorf("restarted agent's state %v, %v; want generation 7 restored", st, err)
	}
	if _, err := h.ccm(t).Apply(ctx(t), &agentv1.ApplyRequest{State: state(2, 8, l2VIP("203.0.113.11", "node-a"))}); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(dir, legacyStateFile)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("%s still there after a save: %v", legacyStateFile, err)
	}
	st, _, err := loadState(dir)
	if err != nil || st.GetGeneration() != 8 {
		t.Errorf("saved state %v, %v; want generation 8", st, err)
	}
}

// The clients of per-client VIPs survive a restart: saved when they change, given to the
// speaker before the restored state's first Set.
func TestRestartRemembersClients(t *testing.T) {
	dir := t.TempDir()
	h := serve(t, dir)
	if _, err := h.ccm(t).Apply(ctx(t), &agentv1.ApplyRequest{State: state(2, 7, l2VIP("203.0.113.10", "node-a"))}); err != nil {
		t.Fatal(err)
	}
	mac, _ := net.ParseMAC("02:00:00:00:00:51")
	want := []l2.Client{{VIP: netip.MustParseAddr("203.0.113.10"), IP: netip.MustParseAddr("198.51.100.51"), MAC: mac, Interface: "eth0"}}
	h.l2.mu.Lock()
	h.l2.known, h.l2.knownVer = want, 1
	h.l2.mu.Unlock()
	deadline := time.Now().Add(10 * time.Second)
	for {
		if _, err := os.Stat(filepath.Join(dir, "clients.json")); err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the clients were not saved within 10 s")
		}
		time.Sleep(50 * time.Millisecond)
	}
	h2 := serve(t, dir)
	h2.l2.mu.Lock()
	got, before := h2.l2.remembered, h2.l2.setsBeforeMemo
	h2.l2.mu.Unlock()
	if len(got) != 1 || got[0].VIP != want[0].VIP || got[0].IP != want[0].IP || got[0].MAC.String() != mac.String() || got[0].Interface != "eth0" {
		t.Errorf("restarted agent's speaker remembered %+v; want %+v", got, want)
	}
	if before != 0 {
		t.Errorf("the clients were given after %d Sets; want before the first", before)
	}
	if h2.l2.calls() == 0 {
		t.Error("the restored state was not set")
	}
}

// Close withdraws the BGP routes (Shutdown); a planned restart with a grace keeps them at
// graceful-restart peers (ShutdownForRestart), unless the node drains or no grace is given.
func TestCloseWithdrawsBGPAndAPlannedRestartKeepsTheRoutes(t *testing.T) {
	for _, tc := range []struct {
		name       string
		restart    time.Duration // < 0: Close
		draining   bool
		forRestart bool
	}{
		{"Close", -1, false, false},
		{"a planned restart", 10 * time.Second, false, true},
		{"a restart without a grace", 0, false, false},
		{"a draining node's restart", 10 * time.Second, true, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := serve(t, t.TempDir())
			st := state(1, 1, bgpVIP("203.0.113.20"))
			st.Draining = tc.draining
			if _, err := h.ccm(t).Apply(ctx(t), &agentv1.ApplyRequest{State: st}); err != nil {
				t.Fatal(err)
			}
			var err error
			if tc.restart < 0 {
				err = h.agent.Close(context.Background())
			} else {
				err = h.agent.Restart(context.Background(), tc.restart)
			}
			if err != nil {
				t.Fatal(err)
			}
			h.bgp.mu.Lock()
			defer h.bgp.mu.Unlock()
			if !h.bgp.shutdown {
				t.Error("the BGP speaker was not shut down")
			}
			if h.bgp.forRestart != tc.forRestart {
				t.Errorf("shut down for a restart (routes kept): %v; want %v", h.bgp.forRestart, tc.forRestart)
			}
		})
	}
}

func TestMutualTLSRefusesStrangers(t *testing.T) {
	h := serve(t, t.TempDir())
	call := func(c agentv1.AgentServiceClient) error {
		_, err := c.GetState(ctx(t), &agentv1.GetStateRequest{})
		return err
	}
	if err := call(h.ccm(t)); err != nil {
		t.Fatalf("the CCM is refused: %v", err)
	}
	for _, tc := range []struct {
		name   string
		client agentv1.AgentServiceClient
	}{
		{"a client certificate from another CA", h.client(t, "rogue-ccm", "ca", "node-a")},
		{"an agent's certificate used as a client", h.client(t, "node-b-as-client", "ca", "node-a")},
		{"a CCM expecting another node", h.client(t, certs.CCMName, "ca", "node-b")},
		{"a CCM trusting another CA", h.client(t, certs.CCMName, "rogue-ca", "node-a")},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if err := call(tc.client); status.Code(err) != codes.Unavailable {
				t.Errorf("GetState = %v; want the connection refused (Unavailable)", err)
			}
		})
	}
	t.Run("no client certificate", func(t *testing.T) {
		cfg, err := certs.ClientConfig(h.pki.files(certs.CCMName, "ca"), "node-a")
		if err != nil {
			t.Fatal(err)
		}
		cfg.GetClientCertificate = nil
		conn, err := grpc.NewClient(h.addr, grpc.WithTransportCredentials(credentials.NewTLS(cfg)))
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		if err := call(agentv1.NewAgentServiceClient(conn)); status.Code(err) != codes.Unavailable {
			t.Errorf("GetState without a client certificate = %v", err)
		}
	})
	t.Run("plaintext", func(t *testing.T) {
		conn, err := grpc.NewClient(h.addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		if err := call(agentv1.NewAgentServiceClient(conn)); status.Code(err) != codes.Unavailable {
			t.Errorf("plaintext GetState = %v", err)
		}
	})
}
