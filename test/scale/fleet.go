package main

import (
	"context"
	"fmt"
	"maps"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/protobuf/proto"

	"github.com/metalvip/metalvip/internal/agentapi"
	"github.com/metalvip/metalvip/internal/certs"
	"github.com/metalvip/metalvip/internal/connlimit"
	"github.com/metalvip/metalvip/nodeagent"
	"github.com/metalvip/metalvip/nodeagent/failover"
	agentv1 "github.com/metalvip/metalvip/proto/metalvip/agent/v1"
	"github.com/metalvip/metalvip/test/harness/pki"
)

// fleet is the simulated agents: each the real agent logic (nodeagent.New with no speakers)
// behind metalvip-agent's own gRPC server (nodeagent.NewServer on a connlimit listener), with
// mutual TLS, on a loopback address of its own. What the wire would carry is left out: no
// ARP, no BGP, and heartbeats by a shared table of who is dead (liveTable) instead of UDP,
// which 1,000 agents on 2 cores could not carry (measured on its own: the fast-failover
// section of docs/benchmarks.md). Every state that lands is given to the tracker; bytes are
// counted on the wire (TLS included) and as messages.
type fleet struct {
	dir    string
	port   int
	ca     certs.Pair
	tr     *tracker
	live   *liveTable
	agents []*simAgent
	byName map[string]*simAgent

	wireIn, wireOut         atomic.Int64 // bytes the agents read and wrote, TLS records included
	applyBytes, stateBytes  atomic.Int64 // Apply requests and GetState answers, as messages
	applies, gets, watches  atomic.Int64
	appliesFailed, accepted atomic.Int64
}

type simAgent struct {
	name  string
	addr  netip.Addr
	dir   string
	files certs.Files

	mu    sync.Mutex
	agent *nodeagent.Agent
	srv   *grpc.Server
}

// simAddr is the loopback address of the i-th simulated node: 127.77.0.1 up, 250 a /24.
func simAddr(i int) netip.Addr {
	return netip.AddrFrom4([4]byte{127, 77, byte(i / 250), byte(i%250 + 1)})
}

func simName(i int) string { return fmt.Sprintf("sim-%04d", i) }

// newFleet issues a certificate for each of n nodes (the CCM's too) under dir.
func newFleet(dir string, n, port int, tr *tracker) (*fleet, error) {
	names := make([]string, n)
	for i := range n {
		names[i] = simName(i)
	}
	ca, err := pki.Agents(dir, "", 24*time.Hour, names...)
	if err != nil {
		return nil, err
	}
	f := &fleet{dir: dir, port: port, ca: ca, tr: tr, live: newLiveTable(), byName: map[string]*simAgent{}}
	for i := range n {
		a := &simAgent{name: simName(i), addr: simAddr(i), dir: filepath.Join(dir, simName(i)), files: pki.Files(dir, simName(i))}
		if err := os.MkdirAll(a.dir, 0o700); err != nil {
			return nil, err
		}
		f.agents = append(f.agents, a)
		f.byName[a.name] = a
		tr.addAgent(a.name)
	}
	return f, nil
}

// start starts an agent on its saved state, as a restarted metalvip-agent does.
func (f *fleet) start(a *simAgent) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	agent, err := nodeagent.New(context.Background(), nodeagent.Options{
		Node: a.name, StateDir: filepath.Join(a.dir, "state"),
		NewLiveness: func(c failover.Config) (nodeagent.Liveness, error) { return f.live.join(c.Node, c.OnChange), nil },
	})
	if err != nil {
		return fmt.Errorf("agent %s: %w", a.name, err)
	}
	tlsCfg, err := certs.ServerConfig(a.files, certs.CCMName)
	if err != nil {
		_ = agent.Close(context.Background())
		return fmt.Errorf("agent %s TLS: %w", a.name, err)
	}
	tcp, err := net.Listen("tcp", netip.AddrPortFrom(a.addr, uint16(f.port)).String())
	if err != nil {
		_ = agent.Close(context.Background())
		return fmt.Errorf("agent %s: %w", a.name, err)
	}
	lis := connlimit.New(countingListener{tcp, f}, agentapi.MaxConnsPerAddr, agentapi.MaxPendingHandshakes)
	// The agent's own server (the CCM's role checked as metalvip-agent checks it), and
	// interceptors inside it that record what lands.
	srv := nodeagent.NewServer(agent, credentials.NewTLS(tlsCfg), true, nodeagent.WithInterceptors(f.record(a.name),
		func(srv any, ss grpc.ServerStream, _ *grpc.StreamServerInfo, next grpc.StreamHandler) error {
			f.watches.Add(1)
			return next(srv, ss)
		}))
	go func() { _ = srv.Serve(lis) }()
	a.agent, a.srv = agent, srv
	return nil
}

// stop stops an agent as a node dying does for the CCM: its connections close.
func (f *fleet) stop(a *simAgent) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.srv == nil {
		return
	}
	a.srv.Stop()
	_ = a.agent.Close(context.Background())
	a.srv, a.agent = nil, nil
}

func (f *fleet) stopAll() {
	var wg sync.WaitGroup
	for _, a := range f.agents {
		wg.Add(1)
		go func() { defer wg.Done(); f.stop(a) }()
	}
	wg.Wait()
}

// record gives every state an agent takes to the tracker, and counts the calls.
func (f *fleet) record(node string) grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, next grpc.UnaryHandler) (any, error) {
		resp, err := next(ctx, req)
		switch info.FullMethod {
		case agentv1.AgentService_Apply_FullMethodName:
			f.applies.Add(1)
			q := req.(*agentv1.ApplyRequest)
			f.applyBytes.Add(int64(proto.Size(q)))
			r, ok := resp.(*agentv1.ApplyResponse)
			if err != nil || !ok {
				f.appliesFailed.Add(1)
				break
			}
			if r.GetTerm() == q.GetState().GetTerm() && r.GetGeneration() == q.GetState().GetGeneration() {
				f.accepted.Add(1)
				f.tr.landed(node, q.GetState(), time.Now())
			}
		case agentv1.AgentService_GetState_FullMethodName:
			f.gets.Add(1)
			if m, ok := resp.(proto.Message); ok && err == nil {
				f.stateBytes.Add(int64(proto.Size(m)))
			}
		}
		return resp, err
	}
}

// counts is a snapshot of the fleet's counters.
type counts struct {
	wireIn, wireOut, applyBytes, stateBytes, applies, accepted, failed, gets, watches int64
}

func (f *fleet) counts() counts {
	return counts{f.wireIn.Load(), f.wireOut.Load(), f.applyBytes.Load(), f.stateBytes.Load(), f.applies.Load(), f.accepted.Load(), f.appliesFailed.Load(), f.gets.Load(), f.watches.Load()}
}

func (c counts) minus(o counts) counts {
	return counts{c.wireIn - o.wireIn, c.wireOut - o.wireOut, c.applyBytes - o.applyBytes, c.stateBytes - o.stateBytes, c.applies - o.applies, c.accepted - o.accepted, c.failed - o.failed, c.gets - o.gets, c.watches - o.watches}
}

// countingListener counts the bytes of the connections it accepts.
type countingListener struct {
	net.Listener
	f *fleet
}

func (l countingListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return &countingConn{Conn: c, f: l.f}, nil
}

type countingConn struct {
	net.Conn
	f *fleet
}

func (c *countingConn) Read(b []byte) (int, error) {
	n, err := c.Conn.Read(b)
	c.f.wireIn.Add(int64(n))
	return n, err
}

func (c *countingConn) Write(b []byte) (int, error) {
	n, err := c.Conn.Write(b)
	c.f.wireOut.Add(int64(n))
	return n, err
}

// liveTable stands for the heartbeats among the simulated agents: a node is alive until it is
// killed, and every live node sees every other. A kill tells the agents watching the node at
// once, as their monitors would after the misses (the data plane's own failover, measured in
// the lab), so the agents take over and say so to the CCM as real ones do.
type liveTable struct {
	mu      sync.Mutex
	dead    map[string]bool
	members map[*simLive]struct{}
}

func newLiveTable() *liveTable {
	return &liveTable{dead: map[string]bool{}, members: map[*simLive]struct{}{}}
}

func (t *liveTable) join(node string, onChange func(failover.View)) *simLive {
	l := &simLive{t: t, node: node, onChange: onChange}
	t.mu.Lock()
	t.members[l] = struct{}{}
	t.mu.Unlock()
	return l
}

// set marks a node dead or alive and tells the agents watching it.
func (t *liveTable) set(node string, dead bool) {
	t.mu.Lock()
	if dead {
		t.dead[node] = true
	} else {
		delete(t.dead, node)
	}
	var tell []*simLive
	for l := range t.members {
		l.mu.Lock()
		if l.peers[node] && l.onChange != nil {
			tell = append(tell, l)
		}
		l.mu.Unlock()
	}
	t.mu.Unlock()
	// Outside the locks: OnChange takes the agent's lock, which SetPeers is called under.
	for _, l := range tell {
		l.onChange(l.View())
	}
}

func (t *liveTable) isDead(node string) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.dead[node]
}

// simLive is one agent's view of the table (nodeagent.Liveness).
type simLive struct {
	t        *liveTable
	node     string
	onChange func(failover.View)
	mu       sync.Mutex
	peers    map[string]bool
	seq      uint64
}

var _ nodeagent.Liveness = (*simLive)(nil)

// View says every live peer is alive and sees this node; no peer lapses (a simulated node's
// liveness changes only when the fleet kills or revives one).
func (l *simLive) View() failover.View {
	l.mu.Lock()
	l.seq++
	v := failover.View{Node: l.node, Seq: l.seq, Peers: make(map[string]failover.PeerView, len(l.peers))}
	peers := slices.Collect(maps.Keys(l.peers))
	l.mu.Unlock()
	for _, n := range peers {
		if !l.t.isDead(n) {
			v.Peers[n] = failover.PeerView{Alive: true, Sees: true}
		}
	}
	return v
}

func (l *simLive) SetPeers(ps []failover.Peer) {
	m := make(map[string]bool, len(ps))
	for _, p := range ps {
		m[p.Node] = true
	}
	l.mu.Lock()
	l.peers = m
	l.mu.Unlock()
}

func (l *simLive) Restarting(time.Duration) {}

func (l *simLive) Counters() failover.Counters {
	return failover.Counters{Refused: map[string]uint64{}}
}

func (l *simLive) Close() error {
	l.t.mu.Lock()
	delete(l.t.members, l)
	l.t.mu.Unlock()
	return nil
}
