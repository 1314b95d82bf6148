package agentclient

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	grpcbackoff "google.golang.org/grpc/backoff"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	grpcstatus "google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
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
	agentApplies = metrics.NewCounterVec(&metrics.CounterOpts{
		Namespace: "metalvip", Name: "agent_applies_total",
		Help:           "Desired states pushed to agents, by result: ok, refused (items or the whole state), fenced (the agent holds a newer term), error.",
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
}

type agentConn struct {
	node   string
	addr   netip.Addr
	conn   *grpc.ClientConn
	client agentv1.AgentServiceClient
	cancel context.CancelFunc
	kick   chan struct{}
	probe  chan struct{} // a broken Watch asks for a reachability check now

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
	held      *agentv1.DesiredState // what the agent held when last asked
	keys      [][]byte
	sessions  []*agentv1.PeerStatus // the BGP sessions the agent last reported

	renewAt atomic.Int64 // enrolled agents: when its certificate is due for renewal (Unix ns)
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

// run asks the agent what it holds, then pushes the desired state until the agent holds it,
// and probes reachability when idle.
func (a *Agents) run(ctx context.Context, c *agentConn) {
	backoff := 200 * time.Millisecond
	const maxBackoff = 10 * time.Second
	probe := time.NewTicker(10 * time.Second)
	defer probe.Stop()
	wait := time.Duration(0)
	var paced time.Time // no Apply before then (pushPace)
	for {
		if wait > 0 {
			// A new state or a sign of life from the agent (its Watch stream reconnected)
			// cuts the backoff short.
			select {
			case <-ctx.Done():
				return
			case <-time.After(wait):
			case <-c.kick:
			case <-c.probe:
			}
		}
		c.mu.Lock()
		pending := c.desired != nil && (c.applied != c.version || c.appliedAt != a.Term())
		known, reachable := c.known, c.reachable
		c.mu.Unlock()
		var err error
		switch {
		case !known || !reachable:
			// First ask what the agent holds: the generation resumes from it (and its keys
			// come from it). An agent that did not answer is asked again after the backoff;
			// one that holds no certificate of the CA yet is enrolled first.
			err = a.probe(ctx, c)
			if err != nil && a.enrollNew(ctx, c) == nil {
				err = a.probe(ctx, c)
			}
		case pending:
			if d := time.Until(paced); d > 0 {
				// Changes meanwhile join this push: see pushPace.
				select {
				case <-ctx.Done():
					return
				case <-time.After(d):
				}
			}
			start := time.Now()
			err = a.apply(ctx, c)
			paced = time.Now().Add(min(pushPace*time.Since(start), maxPushPause))
			if grpcstatus.Code(err) == codes.DeadlineExceeded && ctx.Err() == nil {
				// A slow answer is not a dead node: an agent that answers GetState is
				// reachable, and is sent the state again after the backoff. Counting it
				// unreachable would move its VIPs and replan every node, which loads the
				// agents further (1,000 simulated agents under load flipped 17,000 times in
				// seven minutes, make bench-scale).
				if a.probe(ctx, c) == nil {
					err = &refusedError{err}
				}
			}
		default:
			// In step: wait for a change, probing now and then.
			select {
			case <-ctx.Done():
				return
			case <-c.kick:
			case <-c.probe:
				err = a.probe(ctx, c)
			case <-probe.C:
				err = a.probe(ctx, c)
			}
		}
		if ctx.Err() != nil {
			return
		}
		if err != nil {
			var refused *refusedError
			if errors.As(err, &refused) {
				// The agent answers; the state (or the term) is at fault, not the node.
				a.setReachable(c, true, nil)
			} else {
				a.setReachable(c, false, err)
			}
			wait = backoff
			backoff = min(2*backoff, maxBackoff)
			continue
		}
		a.setReachable(c, true, nil)
		a.renewDue(ctx, c)
		backoff, wait = 200*time.Millisecond, 0
	}
}

// A node's state is sent whole, so an Apply costs the CCM and the agent in proportion to the
// node's VIPs. During a burst of changes (thousands of Services created at once, each node's
// state holding them all) back-to-back Applies would cost the square of the burst, on the
// CCM, on the agents, and where they share cores, on the API server serving the burst: 541
// Applies for 1,000 Services in make bench, most of a core. After an Apply that took d, the
// next to that node waits until pushPace*d (at most maxPushPause) has passed, and carries
// every change made meanwhile: the push loop works at most 1/(1+pushPace) of the time, and a
// change after a quiet spell (a node's death, one new Service) is sent at once.
const (
	pushPace     = 3
	maxPushPause = time.Second
)

// refusedError is an answer of the agent that refuses a state: the agent is reachable.
type refusedError struct{ err error }

func (e *refusedError) Error() string { return e.err.Error() }
func (e *refusedError) Unwrap() error { return e.err }

func (a *Agents) apply(ctx context.Context, c *agentConn) error {
	term := a.Term()
	c.mu.Lock()
	if c.builtFor != c.version || c.built == nil {
		c.built, c.builtFor = c.desired.Build(), c.version
	}
	desired, version := c.built, c.version
	// A new content (or a new term) gets a new generation; a retry of the same reuses it.
	if c.genFor != version || c.genTerm != term {
		c.gen++
		c.genFor, c.genTerm = version, term
	}
	gen := c.gen
	c.mu.Unlock()
	// A shallow copy: the desired state is never changed once pushed, and sending only reads.
	st := agentapi.Restamped(desired, term, gen)
	st.Node = c.node
	cctx, cancel := context.WithTimeout(ctx, a.cfg.Timeout)
	defer cancel()
	sent := time.Now()
	resp, err := c.client.Apply(cctx, &agentv1.ApplyRequest{State: st})
	rtt := time.Since(sent)
	switch grpcstatus.Code(err) {
	case codes.OK:
	case codes.FailedPrecondition:
		agentApplies.WithLabelValues("fenced").Inc()
		// The agent holds a newer term: learn it from its state, not from the message.
		if perr := a.probe(ctx, c); perr != nil {
			return perr
		}
		return &refusedError{fmt.Errorf("apply generation %d under term %d: %w", gen, term, err)}
	case codes.InvalidArgument:
		agentApplies.WithLabelValues("refused").Inc()
		if a.hooks.Refused != nil {
			a.hooks.Refused(c.node, nil, grpcstatus.Convert(err).Message())
		}
		return &refusedError{fmt.Errorf("apply generation %d: %w", gen, err)}
	default:
		agentApplies.WithLabelValues("error").Inc()
		return fmt.Errorf("apply generation %d: %w", gen, err)
	}
	if resp.GetTerm() != term || resp.GetGeneration() != gen {
		// The agent holds something else than what was sent: a generation it has seen
		// already under this term (a Node re-created, a CCM restarted without asking). Go on
		// from the agent's generation and send again.
		klog.InfoS("Agent acknowledged another generation; sending again", "node", c.node, "sent", gen, "term", term, "heldTerm", resp.GetTerm(), "held", resp.GetGeneration())
		c.mu.Lock()
		if resp.GetTerm() == term && resp.GetGeneration() >= c.gen {
			c.gen = resp.GetGeneration()
		}
		c.genFor = 0
		c.mu.Unlock()
		agentApplies.WithLabelValues("error").Inc()
		return &refusedError{fmt.Errorf("agent holds generation %d of term %d, not %d of %d", resp.GetGeneration(), resp.GetTerm(), gen, term)}
	}
	agentApplies.WithLabelValues("ok").Inc()
	c.mu.Lock()
	c.applied, c.appliedAt = version, term
	c.mu.Unlock()
	if a.hooks.Refused != nil {
		a.hooks.Refused(c.node, resp.GetRefused(), "")
	}
	if len(resp.GetProblems()) > 0 {
		klog.InfoS("Agent applied the state with problems", "node", c.node, "generation", gen, "problems", resp.GetProblems())
	}
	klog.V(2).InfoS("Agent applied state", "node", c.node, "term", term, "generation", gen, "changed", resp.GetChanged(), "refused", len(resp.GetRefused()), "rtt", rtt.Round(100*time.Microsecond))
	return nil
}

func (a *Agents) probe(ctx context.Context, c *agentConn) error {
	cctx, cancel := context.WithTimeout(ctx, a.cfg.Timeout)
	defer cancel()
	resp, err := c.client.GetState(cctx, &agentv1.GetStateRequest{})
	if err != nil {
		return err
	}
	term := a.Term()
	c.mu.Lock()
	c.held = resp.GetState()
	if !c.known || resp.GetTerm() == term && resp.GetGeneration() > c.gen {
		// Resume the generation from the agent: after a CCM restart, a leader change or a
		// Node re-created, the agent holds generations this connection never gave.
		if resp.GetTerm() == term {
			c.gen = resp.GetGeneration()
			c.genFor = 0
		}
	}
	if resp.GetTerm() != term || resp.GetGeneration() != c.gen || resp.GetRestored() {
		// The agent does not hold what this leader last gave it, or holds it only from its
		// disk (it restarted): send it again, so that it knows the leader is in touch.
		c.applied = 0
	}
	keysChanged := !sameKeys(c.keys, resp.GetHeartbeatPublicKeys())
	c.keys = resp.GetHeartbeatPublicKeys()
	sessionsChanged := !slices.EqualFunc(c.sessions, resp.GetPeers(), func(x, y *agentv1.PeerStatus) bool { return proto.Equal(x, y) })
	c.sessions = resp.GetPeers()
	c.mu.Unlock()
	if sessionsChanged && a.hooks.Sessions != nil {
		a.hooks.Sessions(c.node, resp.GetPeers())
	}
	if keysChanged && a.hooks.Keys != nil {
		a.hooks.Keys(c.node, resp.GetHeartbeatPublicKeys())
	}
	if resp.GetTerm() > term && a.hooks.NewerTerm != nil {
		a.hooks.NewerTerm(c.node, resp.GetTerm())
	}
	if a.hooks.Refused != nil && resp.GetTerm() == term {
		a.hooks.Refused(c.node, resp.GetRefused(), "")
	}
	return nil
}

func sameKeys(a, b [][]byte) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if string(a[i]) != string(b[i]) {
			return false
		}
	}
	return true
}

// Discover waits until every agent's reachability is decided (each is asked for its state
// before anything is pushed to it), or timeout passes, and returns the states the reachable
// agents hold, by node.
func (a *Agents) Discover(ctx context.Context, timeout time.Duration) map[string]*agentv1.DesiredState {
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
			return held
		}
		select {
		case <-ctx.Done():
			return held
		case <-tick.C:
		}
	}
}

func (a *Agents) setReachable(c *agentConn, ok bool, err error) {
	c.mu.Lock()
	changed := !c.known || c.reachable != ok
	c.reachable, c.known = ok, true
	c.mu.Unlock()
	v := 0.0
	if ok {
		v = 1
	}
	agentReachable.WithLabelValues(c.node).Set(v)
	if changed {
		if ok {
			klog.InfoS("Agent reachable", "node", c.node)
		} else {
			klog.ErrorS(err, "Agent unreachable", "node", c.node)
		}
		if a.hooks.Reachability != nil {
			a.hooks.Reachability(c.node, ok)
		}
	}
}

// watch relays the agent's events, reconnecting with backoff.
func (a *Agents) watch(ctx context.Context, c *agentConn) {
	backoff := 500 * time.Millisecond
	for ctx.Err() == nil {
		stream, err := c.client.Watch(ctx, &agentv1.WatchRequest{})
		if err == nil {
			if _, herr := stream.Header(); herr == nil {
				// The agent answers, perhaps after a restart: ask what it holds now (the
				// state is sent again if it lost it) and check reachability.
				select {
				case c.probe <- struct{}{}:
				default:
				}
			}
			for {
				resp, rerr := stream.Recv()
				if rerr != nil {
					// The agent may be gone: check now rather than at the next probe.
					select {
					case c.probe <- struct{}{}:
					default:
					}
					break
				}
				backoff = 500 * time.Millisecond
				if k := resp.GetEvent().GetKind(); k == agentv1.Event_KIND_SESSION_UP || k == agentv1.Event_KIND_SESSION_DOWN {
					// A session changed: ask for the sessions now (for the BGPPeer's status).
					select {
					case c.probe <- struct{}{}:
					default:
					}
				}
				if a.hooks.Event != nil {
					a.hooks.Event(c.node, resp.GetEvent())
				}
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, 30*time.Second)
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
