package loadbalancer

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
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
		Help:           "Desired states pushed to agents, by result.",
		StabilityLevel: metrics.ALPHA,
	}, []string{"result"})
	registerMetrics sync.Once
)

// AgentConfig says how the CCM reaches agents.
type AgentConfig struct {
	Port     int
	TLS      certs.Files // empty with Insecure
	Insecure bool
	Timeout  time.Duration
	// Dial overrides how connections are made (tests in network namespaces); nil dials TCP.
	Dial func(ctx context.Context, addr string) (netConn, error)
}

// Agents keeps one connection per node's agent, pushes each node's desired state to it
// (only when it changed; bursts coalesce; failures retry with backoff), knows which agents are
// reachable, and relays the agents' events.
type Agents struct {
	cfg     AgentConfig
	term    uint64
	onReach func(node string, reachable bool)
	onEvent func(node string, ev *agentv1.Event)
	onKeys  func(node string) // the node's heartbeat keys changed

	mu    sync.Mutex
	conns map[string]*agentConn
	ctx   context.Context
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
	desired   *agentv1.DesiredState // without term and generation
	applied   *agentv1.DesiredState
	pending   *agentv1.DesiredState // the content generation gen was given to
	gen       uint64
	reachable bool
	known     bool                  // reachability decided at least once
	held      *agentv1.DesiredState // what the agent held when last asked
	keys      [][]byte              // the agent's heartbeat public keys, newest first
}

// OnKeysChanged registers f, called when a node's agent reports other heartbeat keys than
// before; call it before SetNodes.
func (a *Agents) OnKeysChanged(f func(node string)) { a.onKeys = f }

// Keys returns the heartbeat public keys the node's agent last reported.
func (a *Agents) Keys(node string) [][]byte {
	if a == nil {
		return nil
	}
	a.mu.Lock()
	c := a.conns[node]
	a.mu.Unlock()
	if c == nil {
		return nil
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.keys
}

// NewAgents returns the connections manager; term is this leader's term.
func NewAgents(ctx context.Context, cfg AgentConfig, term uint64, onReach func(string, bool), onEvent func(string, *agentv1.Event)) *Agents {
	registerMetrics.Do(func() {
		legacyregistry.MustRegister(agentReachable, agentApplies)
	})
	if cfg.Timeout <= 0 {
		cfg.Timeout = 5 * time.Second
	}
	return &Agents{cfg: cfg, term: term, onReach: onReach, onEvent: onEvent, conns: map[string]*agentConn{}, ctx: ctx}
}

// SetNodes sets the nodes and their agents' addresses; connections to nodes gone are closed.
func (a *Agents) SetNodes(addrs map[string]netip.Addr) {
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
		c, err := a.dial(name, addr)
		if err != nil {
			klog.ErrorS(err, "Cannot set up the connection to an agent", "node", name)
			continue
		}
		a.conns[name] = c
	}
}

func (a *Agents) dial(node string, addr netip.Addr) (*agentConn, error) {
	var creds credentials.TransportCredentials
	if a.cfg.Insecure {
		creds = insecure.NewCredentials()
	} else {
		cfg, err := certs.ClientConfig(a.cfg.TLS, node)
		if err != nil {
			return nil, err
		}
		creds = credentials.NewTLS(cfg)
	}
	opts := append(agentapi.ClientOptions(), grpc.WithTransportCredentials(creds))
	if a.cfg.Dial != nil {
		opts = append(opts, grpc.WithContextDialer(func(ctx context.Context, s string) (netConn, error) { return a.cfg.Dial(ctx, s) }))
	}
	target := "passthrough:///" + netip.AddrPortFrom(addr, uint16(a.cfg.Port)).String()
	conn, err := grpc.NewClient(target, opts...)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(a.ctx)
	c := &agentConn{node: node, addr: addr, conn: conn, client: agentv1.NewAgentServiceClient(conn), cancel: cancel,
		kick: make(chan struct{}, 1), probe: make(chan struct{}, 1)}
	go a.run(ctx, c)
	go a.watch(ctx, c)
	return c, nil
}

// Push sets a node's desired state; it is sent when it differs from what the agent applied.
func (a *Agents) Push(node string, st *agentv1.DesiredState) {
	a.mu.Lock()
	c := a.conns[node]
	a.mu.Unlock()
	if c == nil {
		return
	}
	c.mu.Lock()
	c.desired = st
	c.mu.Unlock()
	select {
	case c.kick <- struct{}{}:
	default:
	}
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

// Applied returns the generation the node's agent last accepted.
func (a *Agents) Applied(node string) (uint64, bool) {
	a.mu.Lock()
	c := a.conns[node]
	a.mu.Unlock()
	if c == nil {
		return 0, false
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.gen, c.applied != nil
}

// run pushes the desired state until it is applied, and probes reachability when idle.
func (a *Agents) run(ctx context.Context, c *agentConn) {
	backoff := 200 * time.Millisecond
	const maxBackoff = 10 * time.Second
	probe := time.NewTicker(10 * time.Second)
	defer probe.Stop()
	wait := time.Duration(0)
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
		desired, applied := c.desired, c.applied
		c.mu.Unlock()
		var err error
		switch {
		case desired != nil && (applied == nil || !proto.Equal(desired, applied)):
			err = a.apply(ctx, c, desired)
			if errors.Is(err, errResend) {
				continue // the agent holds a newer generation of this term: send above it
			}
		case !c.isKnown():
			err = a.probe(ctx, c)
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
			a.setReachable(c, false, err)
			wait = backoff
			backoff = min(2*backoff, maxBackoff)
			continue
		}
		a.setReachable(c, true, nil)
		backoff, wait = 200*time.Millisecond, 0
	}
}

func (c *agentConn) isKnown() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.known
}

func (a *Agents) apply(ctx context.Context, c *agentConn, desired *agentv1.DesiredState) error {
	c.mu.Lock()
	// A new content gets a new generation; a retry of the same content reuses it.
	if c.pending == nil || !proto.Equal(c.pending, desired) {
		c.gen++
		c.pending = desired
	}
	gen := c.gen
	c.mu.Unlock()
	st := proto.Clone(desired).(*agentv1.DesiredState)
	st.Term, st.Generation, st.Node = a.term, gen, c.node
	cctx, cancel := context.WithTimeout(ctx, a.cfg.Timeout)
	defer cancel()
	resp, err := c.client.Apply(cctx, &agentv1.ApplyRequest{State: st})
	if err != nil {
		agentApplies.WithLabelValues("error").Inc()
		return fmt.Errorf("apply generation %d: %w", gen, err)
	}
	agentApplies.WithLabelValues("ok").Inc()
	if resp.GetTerm() == a.term && resp.GetGeneration() != gen {
		// A no-op: the agent holds another generation of this term (this CCM restarted, or
		// lost count). Resume from it.
		c.mu.Lock()
		c.gen, c.pending = max(c.gen, resp.GetGeneration()), nil
		c.mu.Unlock()
		klog.V(2).InfoS("Agent holds another generation; sending above it", "node", c.node, "sent", gen, "held", resp.GetGeneration())
		return errResend
	}
	c.mu.Lock()
	c.applied = desired
	c.mu.Unlock()
	if len(resp.GetProblems()) > 0 {
		klog.InfoS("Agent applied the state with problems", "node", c.node, "generation", gen, "problems", resp.GetProblems())
	}
	klog.V(2).InfoS("Agent applied state", "node", c.node, "term", a.term, "generation", gen, "changed", resp.GetChanged())
	return nil
}

func (a *Agents) probe(ctx context.Context, c *agentConn) error {
	cctx, cancel := context.WithTimeout(ctx, a.cfg.Timeout)
	defer cancel()
	resp, err := c.client.GetState(cctx, &agentv1.GetStateRequest{})
	if err != nil {
		return err
	}
	c.mu.Lock()
	c.held = resp.GetState()
	if resp.GetTerm() == a.term && resp.GetGeneration() > c.gen {
		// A restarted CCM resumes the agent's count; the next content gets a generation above.
		c.gen, c.pending = resp.GetGeneration(), nil
	}
	keys := resp.GetHeartbeatPublicKeys()
	changed := !slices.EqualFunc(c.keys, keys, func(x, y []byte) bool { return string(x) == string(y) })
	c.keys = keys
	c.mu.Unlock()
	if changed && a.onKeys != nil {
		a.onKeys(c.node)
	}
	return nil
}

// errResend says an Apply was a no-op because the agent holds another generation.
var errResend = errors.New("the agent holds another generation")

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
		if a.onReach != nil {
			a.onReach(c.node, ok)
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
				// The agent answers, perhaps after a restart: push the state again (the same
				// generation, a no-op if it has it) and check reachability now.
				c.mu.Lock()
				c.applied = nil
				c.mu.Unlock()
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
				if a.onEvent != nil {
					a.onEvent(c.node, resp.GetEvent())
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

// netConn is what a dialer returns.
type netConn = net.Conn
