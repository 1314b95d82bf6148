package agentclient

import (
	"context"
	"net"
	"net/netip"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"

	"github.com/metalvip/metalvip/internal/agentapi"
	agentv1 "github.com/metalvip/metalvip/proto/metalvip/agent/v1"
)

// restartingAgent answers GetState, and on its Watch stream says it restarts with grace once
// restart is closed; from then on its GetState lists itself as restarting, as the agent's does
// until it exits.
type restartingAgent struct {
	agentv1.UnimplementedAgentServiceServer
	restart chan struct{}
	grace   time.Duration
}

func (f *restartingAgent) GetState(context.Context, *agentv1.GetStateRequest) (*agentv1.GetStateResponse, error) {
	resp := &agentv1.GetStateResponse{Node: "n1"}
	select {
	case <-f.restart:
		resp.Restarting = []*agentv1.RestartNotice{{Node: "n1", GraceLeftMillis: uint32(f.grace.Milliseconds())}}
	default:
	}
	return resp, nil
}

func (f *restartingAgent) Watch(_ *agentv1.WatchRequest, s agentv1.AgentService_WatchServer) error {
	_ = s.SendHeader(metadata.MD{})
	select {
	case <-s.Context().Done():
		return nil
	case <-f.restart:
	}
	_ = s.Send(&agentv1.WatchResponse{Event: &agentv1.Event{Kind: agentv1.Event_KIND_RESTARTING, RestartGraceMillis: uint32(f.grace.Milliseconds())}})
	// As the agent's: the stream lasts until the server stops.
	<-s.Context().Done()
	return nil
}

// serveAgent serves fake on addr until the test ends or the returned stop is called.
func serveAgent(t *testing.T, addr string, fake agentv1.AgentServiceServer) (stop func()) {
	t.Helper()
	lis, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer(agentapi.ServerOptions()...)
	agentv1.RegisterAgentServiceServer(srv, fake)
	go func() { _ = srv.Serve(lis) }()
	t.Cleanup(srv.Stop)
	return srv.Stop
}

// watchReach starts Agents on the agent at 127.0.0.44:port and returns its reachability as
// the hook says it, with when.
func watchReach(t *testing.T, port int) (*Agents, <-chan bool, func()) {
	t.Helper()
	reach := make(chan bool, 16)
	a := New(Config{Port: port, Insecure: true, Timeout: time.Second}, 1, Hooks{Reachability: func(node string, ok bool) {
		if node == "n1" {
			reach <- ok
		}
	}})
	ctx, cancel := context.WithCancel(context.Background())
	a.SetNodes(ctx, map[string]netip.Addr{"n1": netip.MustParseAddr("127.0.0.44")})
	return a, reach, func() { cancel(); a.Close() }
}

func freeTCPPort(t *testing.T, host string) int {
	t.Helper()
	l, err := net.Listen("tcp", host+":0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

func expectReach(t *testing.T, reach <-chan bool, want bool, within time.Duration) {
	t.Helper()
	select {
	case ok := <-reach:
		if ok != want {
			t.Fatalf("reachability %v, want %v", ok, want)
		}
	case <-time.After(within):
		t.Fatalf("no reachability %v within %s", want, within)
	}
}

// Issue 32: an agent that said it restarts (a rolling update) is not counted unreachable, which
// would move its VIPs away and back, until its grace runs out; then it is.
func TestARestartingAgentIsNotUnreachableUntilItsGraceEnds(t *testing.T) {
	port := freeTCPPort(t, "127.0.0.44")
	const grace = 3 * time.Second
	fake := &restartingAgent{restart: make(chan struct{}), grace: grace}
	stop := serveAgent(t, "127.0.0.44:"+strconv.Itoa(port), fake)
	_, reach, done := watchReach(t, port)
	defer done()
	expectReach(t, reach, true, 30*time.Second)
	close(fake.restart)
	said := time.Now()
	time.Sleep(100 * time.Millisecond) // the Event is on its way before the server goes
	stop()
	expectReach(t, reach, false, grace+30*time.Second)
	if took := time.Since(said); took < grace-500*time.Millisecond {
		t.Errorf("counted unreachable %s after it said it restarts with a grace of %s", took.Round(time.Millisecond), grace)
	}
}

func TestARestartingAgentBackWithinItsGraceIsNeverUnreachable(t *testing.T) {
	port := freeTCPPort(t, "127.0.0.44")
	addr := "127.0.0.44:" + strconv.Itoa(port)
	fake := &restartingAgent{restart: make(chan struct{}), grace: 20 * time.Second}
	stop := serveAgent(t, addr, fake)
	_, reach, done := watchReach(t, port)
	defer done()
	expectReach(t, reach, true, 30*time.Second)
	close(fake.restart)
	time.Sleep(100 * time.Millisecond)
	stop()
	time.Sleep(2 * time.Second) // away, as a restart is: the CCM's probes fail meanwhile
	serveAgent(t, addr, &restartingAgent{restart: make(chan struct{})})
	select {
	case ok := <-reach:
		t.Fatalf("reachability changed to %v during a restart within its grace", ok)
	case <-time.After(5 * time.Second):
	}
}

// Without a notice, an agent that goes away is unreachable at once (what the grace changes).
func TestAnAgentGoneWithoutANoticeIsUnreachable(t *testing.T) {
	port := freeTCPPort(t, "127.0.0.44")
	stop := serveAgent(t, "127.0.0.44:"+strconv.Itoa(port), &restartingAgent{restart: make(chan struct{})})
	_, reach, done := watchReach(t, port)
	defer done()
	expectReach(t, reach, true, 30*time.Second)
	stop()
	expectReach(t, reach, false, 5*time.Second)
}

// peerAgent answers GetState as node, saying that the nodes in restarting are restarting
// (the notices its heartbeat peers gave) for grace from now.
type peerAgent struct {
	agentv1.UnimplementedAgentServiceServer
	node       string
	restarting []string
	grace      time.Duration
}

func (f *peerAgent) GetState(context.Context, *agentv1.GetStateRequest) (*agentv1.GetStateResponse, error) {
	resp := &agentv1.GetStateResponse{Node: f.node, State: &agentv1.DesiredState{}}
	for _, n := range f.restarting {
		resp.Restarting = append(resp.Restarting, &agentv1.RestartNotice{Node: n, GraceLeftMillis: uint32(f.grace.Milliseconds())})
	}
	return resp, nil
}

// discoverWithN1Away starts a new leader's Agents on n1 (127.0.0.44, nothing listening: its
// agent is away) and n2 (127.0.0.45, answering as peer says), and returns whether Discover
// counted n1 reachable and the hook's later word on n1.
func discoverWithN1Away(t *testing.T, peer *peerAgent) (bool, <-chan bool) {
	t.Helper()
	port := freeTCPPort(t, "127.0.0.44")
	serveAgent(t, "127.0.0.45:"+strconv.Itoa(port), peer)
	reach := make(chan bool, 16)
	a := New(Config{Port: port, Insecure: true, Timeout: time.Second}, 1, Hooks{Reachability: func(node string, ok bool) {
		if node == "n1" {
			reach <- ok
		}
	}})
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(func() { cancel(); a.Close() })
	held := a.Discover(ctx, map[string]netip.Addr{"n1": netip.MustParseAddr("127.0.0.44"), "n2": netip.MustParseAddr("127.0.0.45")}, 10*time.Second)
	if _, ok := held["n2"]; !ok || !a.Reachable("n2") {
		t.Fatalf("Discover did not reach n2 (held %v)", held)
	}
	return a.Reachable("n1"), reach
}

// Issue 32: a rolling update restarts the CCM and the agents at once. A new leader never got
// the Event of an agent that was already away restarting; its heartbeat peers say so in their
// GetState, and the leader does not count it unreachable (which moves its VIPs away and back)
// until the grace they gave ends.
func TestANewLeaderKeepsAnAgentItsPeersSayIsRestarting(t *testing.T) {
	const grace = 3 * time.Second
	start := time.Now()
	reachable, reach := discoverWithN1Away(t, &peerAgent{node: "n2", restarting: []string{"n1"}, grace: grace})
	if !reachable {
		t.Fatal("n1, restarting as its peer n2 says, counted unreachable by the new leader")
	}
	// n1 was never told unreachable, and stays reachable until the grace runs out with n1
	// still away: unreachable then, not before.
	for len(reach) > 0 {
		if !<-reach {
			t.Fatal("n1 was told unreachable during Discover")
		}
	}
	for {
		select {
		case ok := <-reach:
			if ok {
				t.Fatal("n1 counted reachable again after Discover: a change the first plan would take for a node returning")
			}
			if took := time.Since(start); took < grace-500*time.Millisecond {
				t.Fatalf("n1 counted unreachable %s after the leader started, within the grace of %s its peer gave", took.Round(time.Millisecond), grace)
			}
			return
		case <-time.After(grace + 30*time.Second):
			t.Fatal("n1, away past its grace, never counted unreachable")
		}
	}
}

// The same leader without the peers' word: an agent away is unreachable (what the notice
// changes).
func TestANewLeaderCountsAnAgentAwayWithoutANoticeUnreachable(t *testing.T) {
	if reachable, _ := discoverWithN1Away(t, &peerAgent{node: "n2"}); reachable {
		t.Fatal("n1, away and said by no peer to be restarting, counted reachable")
	}
}

// An agent whose GetState says it is restarting itself (between its notice and its exit) is
// held as if its Event had come.
func TestAnAgentThatSaysItIsRestartingIsNotUnreachableUntilItsGraceEnds(t *testing.T) {
	port := freeTCPPort(t, "127.0.0.44")
	const grace = 3 * time.Second
	stop := serveAgent(t, "127.0.0.44:"+strconv.Itoa(port), &peerAgent{node: "n1", restarting: []string{"n1"}, grace: grace})
	_, reach, done := watchReach(t, port)
	defer done()
	expectReach(t, reach, true, 30*time.Second)
	said := time.Now()
	stop()
	expectReach(t, reach, false, grace+30*time.Second)
	if took := time.Since(said); took < grace-500*time.Millisecond {
		t.Errorf("counted unreachable %s after its GetState said it restarts with a grace of %s", took.Round(time.Millisecond), grace)
	}
}

// reWatchedAgent is a peerAgent whose Watch streams end soon after they open, so that the
// client opens them again and again, and says on opened when one opens again; its GetState
// answers slowly. A new Watch answered by the old process (between its notice and its exit)
// does not mean it is back.
type reWatchedAgent struct {
	peerAgent
	watches atomic.Int32
	opened  chan struct{}
}

func (f *reWatchedAgent) GetState(ctx context.Context, req *agentv1.GetStateRequest) (*agentv1.GetStateResponse, error) {
	time.Sleep(300 * time.Millisecond)
	return f.peerAgent.GetState(ctx, req)
}

func (f *reWatchedAgent) Watch(_ *agentv1.WatchRequest, s agentv1.AgentService_WatchServer) error {
	_ = s.SendHeader(metadata.MD{})
	if f.watches.Add(1) > 2 {
		select {
		case f.opened <- struct{}{}:
		default:
		}
	}
	time.Sleep(20 * time.Millisecond)
	return nil
}

func TestAnAgentStillSayingItRestartsIsNotBackBecauseItAnswersAWatch(t *testing.T) {
	port := freeTCPPort(t, "127.0.0.44")
	const grace = 4 * time.Second
	fake := &reWatchedAgent{peerAgent: peerAgent{node: "n1", restarting: []string{"n1"}, grace: grace}, opened: make(chan struct{})}
	stop := serveAgent(t, "127.0.0.44:"+strconv.Itoa(port), fake)
	_, reach, done := watchReach(t, port)
	defer done()
	expectReach(t, reach, true, 30*time.Second)
	select {
	case <-fake.opened:
	case <-time.After(30 * time.Second):
		t.Fatal("no Watch opened again within 30s")
	}
	// The GetState that the new Watch asks for is under way: the old process exits meanwhile.
	said := time.Now()
	stop()
	expectReach(t, reach, false, grace+30*time.Second)
	if took := time.Since(said); took < grace/3 {
		t.Errorf("counted unreachable %s after its GetState said it restarts with a grace of %s (a Watch it answered ended the grace)", took.Round(time.Millisecond), grace)
	}
}
