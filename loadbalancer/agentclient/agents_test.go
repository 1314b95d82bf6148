package agentclient

import (
	"context"
	"net"
	"net/netip"
	"slices"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	grpcstatus "google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/metalvip/metalvip/internal/agentapi"
	agentv1 "github.com/metalvip/metalvip/proto/metalvip/agent/v1"
)

// flakyAgent answers GetState with an error the first failures times, then with its keys.
type flakyAgent struct {
	agentv1.UnimplementedAgentServiceServer
	mu       sync.Mutex
	failures int
	calls    int
	keys     [][]byte
	build    *agentv1.Build
}

// StateOf wraps a complete state.
type StateOf struct{ State *agentv1.DesiredState }

// Build returns the state.
func (s StateOf) Build() *agentv1.DesiredState { return s.State }

func (f *flakyAgent) GetState(context.Context, *agentv1.GetStateRequest) (*agentv1.GetStateResponse, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls++
	if f.calls <= f.failures {
		return nil, grpcstatus.Error(codes.Unavailable, "the key file cannot be read yet")
	}
	return &agentv1.GetStateResponse{Node: "n1", HeartbeatPublicKeys: f.keys, Build: f.build}, nil
}

func (f *flakyAgent) Watch(_ *agentv1.WatchRequest, s agentv1.AgentService_WatchServer) error {
	_ = s.SendHeader(metadata.MD{})
	<-s.Context().Done()
	return nil
}

// TestAFailedKeyReadIsRetriedAndPeersKeepTheKeys: while a node's agent cannot say its
// heartbeat keys, its peers get them as the other agents held them (so it does not count as
// dead to them: failover stays on); the CCM asks again with backoff until the agent answers.
func TestAFailedKeyReadIsRetriedAndPeersKeepTheKeys(t *testing.T) {
	lis, err := net.Listen("tcp", "127.0.0.41:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer(agentapi.ServerOptions()...)
	fake := &flakyAgent{failures: 3, keys: [][]byte{[]byte("new key, 32 bytes long ........")}}
	agentv1.RegisterAgentServiceServer(srv, fake)
	go func() { _ = srv.Serve(lis) }()
	defer srv.Stop()

	learnt := make(chan [][]byte, 4)
	a := New(Config{Port: lis.Addr().(*net.TCPAddr).Port, Insecure: true, Timeout: time.Second}, 1,
		Hooks{Keys: func(_ string, k [][]byte) { learnt <- k }})
	defer a.Close()
	// What another agent holds (Discover at start): n1's keys as they were handed out before.
	a.SeeKeys(map[string]*agentv1.DesiredState{"n2": {HeartbeatPeers: []*agentv1.HeartbeatPeer{{Node: "n1", PublicKeys: [][]byte{[]byte("old key")}}}}})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	a.SetNodes(ctx, map[string]netip.Addr{"n1": netip.MustParseAddr("127.0.0.41")})
	if got := a.Keys("n1"); len(got) != 1 || string(got[0]) != "old key" {
		t.Fatalf("before n1 answers its peers get %q, want the key other agents hold", got)
	}
	select {
	case k := <-learnt:
		if string(k[0]) != string(fake.keys[0]) {
			t.Errorf("learnt %q", k)
		}
	case <-time.After(30 * time.Second):
		t.Fatalf("the keys were not read again after %d failed reads", fake.failures)
	}
	if got := a.Keys("n1"); string(got[0]) != string(fake.keys[0]) {
		t.Errorf("after n1 answered its peers get %q", got)
	}
	fake.mu.Lock()
	defer fake.mu.Unlock()
	if fake.calls <= fake.failures {
		t.Errorf("%d calls", fake.calls)
	}
}

// TestTheAgentsBuildIsRelayed: what build an agent says it is reaches the Build hook (the
// announcer warns of a skew from it).
func TestTheAgentsBuildIsRelayed(t *testing.T) {
	lis, err := net.Listen("tcp", "127.0.0.42:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer(agentapi.ServerOptions()...)
	fake := &flakyAgent{build: &agentv1.Build{Version: "v0.1.0", Commit: "0123abc"}}
	agentv1.RegisterAgentServiceServer(srv, fake)
	go func() { _ = srv.Serve(lis) }()
	defer srv.Stop()
	said := make(chan *agentv1.Build, 4)
	a := New(Config{Port: lis.Addr().(*net.TCPAddr).Port, Insecure: true, Timeout: time.Second}, 1,
		Hooks{Build: func(node string, b *agentv1.Build) {
			if node == "n1" {
				said <- b
			}
		}})
	defer a.Close()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	a.SetNodes(ctx, map[string]netip.Addr{"n1": netip.MustParseAddr("127.0.0.42")})
	select {
	case b := <-said:
		if !proto.Equal(b, fake.build) {
			t.Errorf("relayed %v, want %v", b, fake.build)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the agent's build was not relayed")
	}
}

// slowAgent answers GetState at once and its first slow Applies only after the CCM gave up.
type slowAgent struct {
	agentv1.UnimplementedAgentServiceServer
	mu      sync.Mutex
	slow    int // Applies still to answer late
	applied uint64
	delay   time.Duration
}

func (f *slowAgent) GetState(context.Context, *agentv1.GetStateRequest) (*agentv1.GetStateResponse, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return &agentv1.GetStateResponse{Node: "n1", Term: 1, Generation: f.applied}, nil
}

func (f *slowAgent) Apply(ctx context.Context, req *agentv1.ApplyRequest) (*agentv1.ApplyResponse, error) {
	f.mu.Lock()
	slow := f.slow > 0
	if slow {
		f.slow--
	}
	f.mu.Unlock()
	if slow {
		select {
		case <-time.After(f.delay):
		case <-ctx.Done():
		}
		return nil, grpcstatus.Error(codes.DeadlineExceeded, "too late")
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.applied = req.GetState().GetGeneration()
	return &agentv1.ApplyResponse{Term: req.GetState().GetTerm(), Generation: f.applied}, nil
}

func (f *slowAgent) Watch(_ *agentv1.WatchRequest, s agentv1.AgentService_WatchServer) error {
	_ = s.SendHeader(metadata.MD{})
	<-s.Context().Done()
	return nil
}

// An agent that answers an Apply too late but answers GetState stays reachable (its VIPs do not
// move) and gets the state once it answers in time.
func TestASlowApplyOfAnAnsweringAgentIsNoUnreachableNode(t *testing.T) {
	lis, err := net.Listen("tcp", "127.0.0.42:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer(agentapi.ServerOptions()...)
	fake := &slowAgent{slow: 2, delay: 3 * time.Second}
	agentv1.RegisterAgentServiceServer(srv, fake)
	go func() { _ = srv.Serve(lis) }()
	defer srv.Stop()

	var mu sync.Mutex
	var lost int
	a := New(Config{Port: lis.Addr().(*net.TCPAddr).Port, Insecure: true, Timeout: time.Second}, 1,
		Hooks{Reachability: func(_ string, ok bool) {
			if !ok {
				mu.Lock()
				lost++
				mu.Unlock()
			}
		}})
	defer a.Close()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	a.SetNodes(ctx, map[string]netip.Addr{"n1": netip.MustParseAddr("127.0.0.42")})
	a.Push("n1", StateOf{&agentv1.DesiredState{}})
	deadline := time.Now().Add(20 * time.Second)
	for {
		if _, ok := a.Applied("n1"); ok {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the state never applied after the slow answers")
		}
		time.Sleep(20 * time.Millisecond)
	}
	mu.Lock()
	defer mu.Unlock()
	if lost > 0 {
		t.Errorf("n1 counted unreachable %d times while it answered GetState", lost)
	}
	if !a.Reachable("n1") {
		t.Error("n1 not reachable after its state applied")
	}
}

// costlyAgent takes cost for every Apply, as an agent does for a large state.
type costlyAgent struct {
	agentv1.UnimplementedAgentServiceServer
	cost time.Duration

	mu      sync.Mutex
	applies int
	held    *agentv1.DesiredState
}

func (f *costlyAgent) GetState(context.Context, *agentv1.GetStateRequest) (*agentv1.GetStateResponse, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return &agentv1.GetStateResponse{Node: "n1", Term: f.held.GetTerm(), Generation: f.held.GetGeneration()}, nil
}

func (f *costlyAgent) Apply(_ context.Context, req *agentv1.ApplyRequest) (*agentv1.ApplyResponse, error) {
	time.Sleep(f.cost)
	f.mu.Lock()
	defer f.mu.Unlock()
	f.applies++
	f.held = req.GetState()
	return &agentv1.ApplyResponse{Term: f.held.GetTerm(), Generation: f.held.GetGeneration(), Changed: true}, nil
}

func (f *costlyAgent) Watch(_ *agentv1.WatchRequest, s agentv1.AgentService_WatchServer) error {
	_ = s.SendHeader(metadata.MD{})
	<-s.Context().Done()
	return nil
}

// A burst of changes to one node is sent in as few Applies as their cost allows: the push loop
// waits pushPace times an Apply's cost before the next, and the last state always arrives.
func TestABurstOfStatesIsPacedByTheCostOfAnApply(t *testing.T) {
	lis, err := net.Listen("tcp", "127.0.0.43:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer(agentapi.ServerOptions()...)
	const cost = 20 * time.Millisecond
	fake := &costlyAgent{cost: cost}
	agentv1.RegisterAgentServiceServer(srv, fake)
	go func() { _ = srv.Serve(lis) }()
	defer srv.Stop()

	a := New(Config{Port: lis.Addr().(*net.TCPAddr).Port, Insecure: true, Timeout: 5 * time.Second}, 1, Hooks{})
	defer a.Close()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	a.SetNodes(ctx, map[string]netip.Addr{"n1": netip.MustParseAddr("127.0.0.43")})

	// 300 states, one more VIP each, every 5 ms: back to back, an Apply of 20 ms would follow
	// another for the whole burst.
	const n = 300
	var anns []*agentv1.Announcement
	start := time.Now()
	for i := range n {
		anns = append(anns, &agentv1.Announcement{Vip: netip.AddrFrom4([4]byte{203, 0, 113, byte(i)}).String(), Mode: agentv1.Mode_MODE_BGP})
		a.Push("n1", StateOf{&agentv1.DesiredState{Node: "n1", Announcements: slices.Clone(anns)}})
		time.Sleep(5 * time.Millisecond)
	}
	burst := time.Since(start)
	deadline := time.Now().Add(20 * time.Second)
	for {
		fake.mu.Lock()
		got := len(fake.held.GetAnnouncements())
		fake.mu.Unlock()
		if got == n {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the agent holds %d VIPs 20 s after the burst, want the last state's %d", got, n)
		}
		time.Sleep(20 * time.Millisecond)
	}
	fake.mu.Lock()
	applies := fake.applies
	fake.mu.Unlock()
	// Each Apply costs at least cost and is followed by a pause of 3 times that (pushPace): at
	// most one per 4*cost of the burst, and the last one after it.
	most := int(burst/(4*cost)) + 2
	t.Logf("%d states over %s in %d Applies (at most %d paced; %d back to back)", n, burst.Round(time.Millisecond), applies, most, int(burst/cost))
	if applies > most {
		t.Errorf("%d Applies for a burst of %s at %s each: not paced (want at most %d)", applies, burst.Round(time.Millisecond), cost, most)
	}
}
