package agentclient

import (
	"context"
	"net"
	"net/netip"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	grpcbackoff "google.golang.org/grpc/backoff"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"k8s.io/component-base/metrics"
	"k8s.io/component-base/metrics/legacyregistry"
	"k8s.io/klog/v2"

	"github.com/metalvip/metalvip/internal/agentapi"
	"github.com/metalvip/metalvip/internal/certs"
	agentv1 "github.com/metalvip/metalvip/proto/metalvip/agent/v1"
)

var (
	agentReachable = metrics.NewGaugeVec(&metrics.GaugeOpts{
		Namespace: "metalvip", Name: "agent_reachable",
		Help:           "1 when the CCM reaches the node's agent, 0 when it does not.",
		StabilityLevel: metrics.ALPHA,
	}, []string{"node"})
	// Not metalvip_agent_applies_total: that is the agent's own, with other results.
	agentApplies = metrics.NewCounterVec(&metrics.CounterOpts{
		Namespace: "metalvip", Subsystem: "ccm", Name: "pushes_total",
		Help:           "Desired states the CCM pushed to agents, by result: ok, refused (the whole state refused), fenced (the agent holds a newer term), error (unreachable, or it holds another generation).",
		StabilityLevel: metrics.ALPHA,
	}, []string{"result"})
	registerMetrics sync.Once
)

// Config says how the CCM reaches agents.
type Config struct {
	Port     int
	TLS      certs.Files // empty with Insecure or Enroll
	Insecure bool
	// Enroll issues the agents' certificates (enroll.go); nil: they come from files.
	Enroll  Enroller
	Timeout time.Duration
	// Dial overrides how connections are made (tests in network namespaces); nil dials TCP.
	Dial func(ctx context.Context, addr string) (net.Conn, error)
}

// Hooks are told what the agents say. Each may be nil; none may block.
type Hooks struct {
	// Reachability: the CCM reaches (or no longer reaches) the node's agent.
	Reachability func(node string, reachable bool)
	// Event: something happened on the node (took over, released, session up/down).
	Event func(node string, ev *agentv1.Event)
	// Refused: the items of the node's last state the agent refused (empty: none); whole,
	// when not empty, says the agent refused the state as a whole, and why.
	Refused func(node string, items []*agentv1.Refusal, whole string)
	// Keys: the node's heartbeat public keys, as its agent reported them, changed.
	Keys func(node string, keys [][]byte)
	// NewerTerm: the agent holds a term above this leader's (a claim from elsewhere); the
	// announcer raises its term from the Lease, never from what the agent says alone.
	NewerTerm func(node string, held uint64)
	// Sessions: the node's BGP sessions, as its agent reported them, changed.
	Sessions func(node string, sessions []*agentv1.PeerStatus)
	// Applied: the node's agent acknowledged a state of this leader: it holds what the plan
	// gave it, no longer what it held before.
	Applied func(node string)
	// ControlPlane: the control-plane VIP the node's agent serves from its local file
	// (GetState control_plane) changed; invalid when it serves none.
	ControlPlane func(node string, vip netip.Addr)
	// Build: the build the node's agent says it is (GetState build) changed, or was first
	// said.
	Build func(node string, build *agentv1.Build)
	// DataPlane: what the node's agent says of its kube-proxy (GetState data_plane) changed;
	// nil from an agent that does not check it.
	DataPlane func(node string, dp *agentv1.DataPlane)
}

// Agents keeps one connection per node's agent, pushes each node's desired state to it (only
// when it changed; bursts coalesce; failures retry with backoff), knows which agents are
// reachable, and relays what the agents say. A refusal is the object's fault, never the node's:
// an agent that refuses items is reachable.
type Agents struct {
	cfg   Config
	hooks Hooks
	term  atomic.Uint64

	mu    sync.Mutex
	conns map[string]*agentConn
	// seen are nodes' heartbeat keys as other agents hold them (learnt at start), for nodes
	// whose own agent has not answered yet: a CCM that cannot read one node's keys must not
	// make its peers count it dead.
	seen map[string][][]byte
	// discovering: Discover is under way; an agent not reached meanwhile is counted
	// unreachable only when it ends, once every agent that answered said whether it is
	// restarting (resolveDiscovery).
	discovering atomic.Bool
}

type agentConn struct {
	node   string
	addr   netip.Addr
	conn   *grpc.ClientConn
	client agentv1.AgentServiceClient
	cancel context.CancelFunc
	kick   chan struct{}
	probe  chan struct{} // a broken Watch asks for a reachability check now

	reachMu   sync.Mutex // serialises setReachable
	mu        sync.Mutex
	desired   NodeState             // without term and generation; never changed once given
	built     *agentv1.DesiredState // desired, materialised for the version built
	builtFor  uint64
	version   uint64 // grows with every Push
	applied   uint64 // the version the agent holds; 0: none
	appliedAt uint64 // the term it was applied under
	gen       uint64 // the generation last given (resumed from the agent)
	genFor    uint64 // the version gen was given to
	genTerm   uint64 // and the term
	reachable bool
	known     bool                  // reachability decided at least once
	unreached error                 // not reached during Discover: not told yet, why
	held      *agentv1.DesiredState // what the agent held when last asked, or acknowledged since
	keys      [][]byte
	sessions  []*agentv1.PeerStatus // the BGP sessions the agent last reported
	cpVIP     netip.Addr            // the control-plane VIP the agent last reported serving
	build     *agentv1.Build        // the build the agent last said it is (nil: none said)
	dataPlane *agentv1.DataPlane    // what the agent last said of its kube-proxy
	// restartUntil: the agent said it is restarting (Event KIND_RESTARTING, its GetState, or
	// its peers did); until then, or until a GetState asked after restartSaid answers without
	// the agent listing itself (a new process), failing to reach it does not count it
	// unreachable.
	restartUntil time.Time
	restartSaid  time.Time
	// peersRestarting: the nodes this agent's last GetState said are restarting (its heartbeat
	// peers' notices), with the end of their grace; Discover reads them for agents it could
	// not reach.
	peersRestarting map[string]time.Time

	renewAt atomic.Int64 // enrolled agents: when its certificate is due for renewal (Unix ns)
}

// MaxRestartGrace bounds how long an agent that said it is restarting is not counted
// unreachable (the agent's heartbeat peers bound it the same way: failover.MaxRestartGrace).
const MaxRestartGrace = 30 * time.Second

// restarting records an agent's restart notice; an agent whose GetState, asked after it, no
// longer lists itself as restarting is back (probe).
func (c *agentConn) restarting(ev *agentv1.Event) {
	grace := min(time.Duration(ev.GetRestartGraceMillis())*time.Millisecond, MaxRestartGrace)
	c.restartingUntil(time.Now().Add(grace), c.node)
}

// restartingUntil records that the agent is restarting until then, as its Event, its own
// GetState or its heartbeat peers (by) said (a leader that started while it was away never
// got its Event).
func (c *agentConn) restartingUntil(until time.Time, by string) {
	c.mu.Lock()
	was := c.restartUntil
	if until.After(was) {
		c.restartUntil = until
	}
	c.restartSaid = time.Now()
	c.mu.Unlock()
	if was.IsZero() {
		klog.InfoS("Agent restarting: not counted unreachable while it may be away, its VIPs wait for it", "node", c.node, "grace", time.Until(until).Round(time.Millisecond), "from", by)
	}
}

// restartGrace returns until when the agent may be away restarting (zero: it is not).
func (c *agentConn) restartGrace() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.restartUntil
}

// back ends a restart grace: a GetState asked at asked answered without the agent listing
// itself as restarting. The old process answers listing itself until it exits (and a Watch it
// answers says nothing: a stream broken and opened again may reach the old process); an
// answer to a call made before the notice says nothing either.
func (c *agentConn) back(asked time.Time) {
	c.mu.Lock()
	was := !c.restartUntil.IsZero() && c.restartSaid.Before(asked)
	if was {
		c.restartUntil, c.restartSaid = time.Time{}, time.Time{}
	}
	c.mu.Unlock()
	if was {
		klog.InfoS("Agent back from its restart", "node", c.node)
	}
}

// New returns the connection manager; term is this leader's term.
func New(cfg Config, term uint64, hooks Hooks) *Agents {
	registerMetrics.Do(func() {
		legacyregistry.MustRegister(agentReachable, agentApplies, agentEnrollments)
	})
	if cfg.Timeout <= 0 {
		cfg.Timeout = 5 * time.Second
	}
	a := &Agents{cfg: cfg, hooks: hooks, conns: map[string]*agentConn{}, seen: map[string][][]byte{}}
	a.term.Store(term)
	return a
}

// Term is the term states are sent with.
func (a *Agents) Term() uint64 { return a.term.Load() }

// SetTerm changes the term (raised from the Lease) and sends every state again under it.
func (a *Agents) SetTerm(t uint64) {
	a.term.Store(t)
	a.mu.Lock()
	defer a.mu.Unlock()
	for _, c := range a.conns {
		c.mu.Lock()
		c.applied = 0
		c.mu.Unlock()
		c.poke()
	}
}

// SetNodes sets the nodes and their agents' addresses; connections to nodes gone, or whose
// address changed, are closed (a new connection resumes from what the agent reports). The
// connections live until ctx ends or Close.
func (a *Agents) SetNodes(ctx context.Context, addrs map[string]netip.Addr) {
	a.mu.Lock()
	defer a.mu.Unlock()
	for name, c := range a.conns {
		if addr, ok := addrs[name]; !ok || addr != c.addr {
			c.cancel()
			c.conn.Close()
			delete(a.conns, name)
			agentReachable.DeleteLabelValues(name)
		}
	}
	for name, addr := range addrs {
		if _, ok := a.conns[name]; ok || !addr.IsValid() {
			continue
		}
		c, err := a.dial(ctx, name, addr)
		if err != nil {
			klog.ErrorS(err, "Cannot set up the connection to an agent", "node", name)
			continue
		}
		a.conns[name] = c
	}
}

func (a *Agents) dial(ctx context.Context, node string, addr netip.Addr) (*agentConn, error) {
	c := &agentConn{node: node, addr: addr, kick: make(chan struct{}, 1), probe: make(chan struct{}, 1)}
	var creds credentials.TransportCredentials
	switch {
	case a.cfg.Insecure:
		creds = insecure.NewCredentials()
	case a.cfg.Enroll != nil:
		creds = credentials.NewTLS(a.enrolledTLS(c))
	default:
		cfg, err := certs.ClientConfig(a.cfg.TLS, node)
		if err != nil {
			return nil, err
		}
		creds = credentials.NewTLS(cfg)
	}
	opts := append(agentapi.ClientOptions(),
		grpc.WithTransportCredentials(creds),
		// gRPC's default reconnect backoff grows to 120 s: an agent back after a reboot of a
		// few seconds stayed unreachable (and on its stale saved state) for minutes. Keep
		// the redial within run's own backoff.
		grpc.WithConnectParams(grpc.ConnectParams{Backoff: grpcbackoff.Config{BaseDelay: 200 * time.Millisecond,
			Multiplier: 1.6, Jitter: 0.2, MaxDelay: 5 * time.Second}, MinConnectTimeout: 5 * time.Second}),
	)
	if a.cfg.Dial != nil {
		opts = append(opts, grpc.WithContextDialer(a.cfg.Dial))
	}
	target := "passthrough:///" + netip.AddrPortFrom(addr, uint16(a.cfg.Port)).String()
	conn, err := grpc.NewClient(target, opts...)
	if err != nil {
		return nil, err
	}
	cctx, cancel := context.WithCancel(ctx)
	c.conn, c.client, c.cancel = conn, agentv1.NewAgentServiceClient(conn), cancel
	go a.run(cctx, c)
	go a.watch(cctx, c)
	return c, nil
}

func (c *agentConn) poke() {
	select {
	case c.kick <- struct{}{}:
	default:
	}
}

// NodeState is a node's desired state as the announcer hands it over: built into the message
// only when it is sent, so a burst of changes costs one build, on the connection's goroutine.
type NodeState interface {
	Build() *agentv1.DesiredState
}

// Push sets a node's desired state; it is sent unless the agent holds it already. st must not
// be changed afterwards.
func (a *Agents) Push(node string, st NodeState) {
	a.mu.Lock()
	c := a.conns[node]
	a.mu.Unlock()
	if c == nil {
		return
	}
	c.mu.Lock()
	c.desired = st
	c.version++
	c.mu.Unlock()
	c.poke()
}

// Reachable reports whether the node's agent answered the last call.
func (a *Agents) Reachable(node string) bool {
	a.mu.Lock()
	c := a.conns[node]
	a.mu.Unlock()
	if c == nil {
		return false
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.reachable
}

// HeldPeers returns the heartbeat peers of the state the node's agent was last known to hold
// (its answer to the last GetState, or the last state it acknowledged since), sorted: the
// nodes whose heartbeats it takes.
func (a *Agents) HeldPeers(node string) []string {
	a.mu.Lock()
	c := a.conns[node]
	a.mu.Unlock()
	if c == nil {
		return nil
	}
	c.mu.Lock()
	held := c.held
	c.mu.Unlock()
	var out []string
	for _, p := range held.GetHeartbeatPeers() {
		if p.GetNode() != node {
			out = append(out, p.GetNode())
		}
	}
	slices.Sort(out)
	return slices.Compact(out)
}

// Applied returns the generation the node's agent last acknowledged, and whether it holds the
// latest state pushed.
func (a *Agents) Applied(node string) (uint64, bool) {
	a.mu.Lock()
	c := a.conns[node]
	a.mu.Unlock()
	if c == nil {
		return 0, false
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.gen, c.applied != 0 && c.applied == c.version
}

// Keys returns the node's heartbeat public keys as its agent last reported them, else as
// its peers' agents hold them.
func (a *Agents) Keys(node string) [][]byte {
	a.mu.Lock()
	c, seen := a.conns[node], a.seen[node]
	a.mu.Unlock()
	if c == nil {
		return seen
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.keys) == 0 {
		return seen
	}
	return c.keys
}

// SeeKeys records nodes' keys as the agents' held states give them (Discover's answers).
func (a *Agents) SeeKeys(held map[string]*agentv1.DesiredState) {
	a.mu.Lock()
	defer a.mu.Unlock()
	for _, st := range held {
		for _, p := range st.GetHeartbeatPeers() {
			if len(p.GetPublicKeys()) > 0 {
				a.seen[p.GetNode()] = p.GetPublicKeys()
			}
		}
	}
}

// Discover sets the nodes (SetNodes) and waits until every agent's reachability is decided
// (each is asked for its state before anything is pushed to it), or timeout passes, and
// returns the states the reachable agents hold, by node. An agent not reached is counted
// unreachable when it returns, unless the agents that answered say it is restarting
// (resolveDiscovery).
func (a *Agents) Discover(ctx context.Context, addrs map[string]netip.Addr, timeout time.Duration) map[string]*agentv1.DesiredState {
	a.discovering.Store(true) // until resolveDiscovery, on every way out
	a.SetNodes(ctx, addrs)
	deadline := time.Now().Add(timeout)
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for {
		a.mu.Lock()
		conns := make([]*agentConn, 0, len(a.conns))
		for _, c := range a.conns {
			conns = append(conns, c)
		}
		a.mu.Unlock()
		held := map[string]*agentv1.DesiredState{}
		decided := true
		for _, c := range conns {
			c.mu.Lock()
			decided = decided && c.known
			if c.reachable && c.held != nil {
				held[c.node] = c.held
			}
			c.mu.Unlock()
		}
		if decided || time.Now().After(deadline) {
			a.resolveDiscovery(conns)
			return held
		}
		select {
		case <-ctx.Done():
			a.resolveDiscovery(conns)
			return held
		case <-tick.C:
		}
	}
}

// resolveDiscovery tells the reachability of the agents Discover could not reach. One whose
// heartbeat peers say it is restarting (a rolling update that restarts this CCM and the
// agents at once: this leader never got its Event) stays counted reachable for the rest of its
// grace, as with a leader that got the Event: its VIPs wait for it instead of moving away and
// back; not back by then, it is counted unreachable (run). The others are unreachable now.
func (a *Agents) resolveDiscovery(conns []*agentConn) {
	// From now on a failed call is told at once (setReachable); one told before this agent's
	// turn below is taken back by it, in order (reachMu), if its peers say it is restarting.
	a.discovering.Store(false)
	type notice struct {
		until time.Time
		by    string
	}
	said := map[string]notice{}
	for _, c := range conns {
		c.mu.Lock()
		if c.reachable {
			for n, until := range c.peersRestarting {
				if until.After(said[n].until) {
					said[n] = notice{until, c.node}
				}
			}
		}
		c.mu.Unlock()
	}
	now := time.Now()
	for _, c := range conns {
		c.reachMu.Lock()
		c.mu.Lock()
		err := c.unreached
		c.unreached = nil
		n, restarting := said[c.node]
		// Not reached (told yet or not), or not answered yet (a call under way at the deadline).
		restarting = restarting && (!c.reachable || !c.known) && n.until.After(now)
		if restarting {
			c.reachable, c.known = true, true
		}
		c.mu.Unlock()
		switch {
		case restarting:
			c.restartingUntil(n.until, n.by)
			a.tellReachable(c, true, nil)
		case err != nil:
			a.tellReachable(c, false, err)
		}
		c.reachMu.Unlock()
	}
}

// setReachable records whether the agent answered, and tells the Reachability hook of a
// change. An agent that is not reached within a restart grace is not counted unreachable:
// then it returns false and changes nothing (the grace may begin while the call that failed
// was under way: resolveDiscovery).
func (a *Agents) setReachable(c *agentConn, ok bool, err error) bool {
	// One change told at a time, in the order made: the hook's last word is the state.
	c.reachMu.Lock()
	defer c.reachMu.Unlock()
	c.mu.Lock()
	if !ok && time.Now().Before(c.restartUntil) {
		c.mu.Unlock()
		return false
	}
	if !ok && a.discovering.Load() && (!c.known || c.unreached != nil) {
		// Decided, told when Discover ends (resolveDiscovery).
		c.known, c.reachable, c.unreached = true, false, err
		c.mu.Unlock()
		return true
	}
	changed := !c.known || c.reachable != ok || c.unreached != nil
	c.reachable, c.known, c.unreached = ok, true, nil
	c.mu.Unlock()
	if changed {
		a.tellReachable(c, ok, err)
	}
	return true
}

// tellReachable tells the log, the metric and the hook that the agent is reachable or not.
// The caller holds c.reachMu.
func (a *Agents) tellReachable(c *agentConn, ok bool, err error) {
	v := 0.0
	if ok {
		v = 1
	}
	agentReachable.WithLabelValues(c.node).Set(v)
	if ok {
		klog.InfoS("Agent reachable", "node", c.node)
	} else {
		klog.ErrorS(err, "Agent unreachable", "node", c.node)
	}
	if a.hooks.Reachability != nil {
		a.hooks.Reachability(c.node, ok)
	}
}

// Close closes every connection.
func (a *Agents) Close() {
	a.mu.Lock()
	defer a.mu.Unlock()
	for name, c := range a.conns {
		c.cancel()
		c.conn.Close()
		delete(a.conns, name)
	}
}
