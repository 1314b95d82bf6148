package agentclient

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	grpcstatus "google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"k8s.io/klog/v2"

	"github.com/metalvip/metalvip/internal/agentapi"
	agentv1 "github.com/metalvip/metalvip/proto/metalvip/agent/v1"
)

// run asks the agent what it holds, then pushes the desired state until the agent holds it,
// and probes reachability when idle.
func (a *Agents) run(ctx context.Context, c *agentConn) {
	backoff := 200 * time.Millisecond
	const maxBackoff = 10 * time.Second
	probe := time.NewTicker(10 * time.Second)
	defer probe.Stop()
	wait := time.Duration(0)
	var paced time.Time // no Apply before then (pushPace)
	// recheck: the agent could not be reached within its restart grace; ask it again after
	// the wait (by the grace's end at the latest) rather than at the next idle probe.
	recheck := false
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
		case !known || !reachable || recheck:
			recheck = false
			// First ask what the agent holds: the generation resumes from it (and its keys
			// come from it). An agent that did not answer is asked again after the backoff;
			// one that holds no certificate of the CA yet is enrolled first.
			err = a.probe(ctx, c)
			if err != nil && a.cfg.Enroll != nil {
				if eerr := a.enrollNew(ctx, c); eerr == nil {
					err = a.probe(ctx, c)
				} else {
					// Say why it stays unreachable: a handshake failure alone hides an
					// enrollment that fails the same way every time.
					err = fmt.Errorf("%w; enrolling it failed: %v", err, eerr)
				}
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
			wait = backoff
			switch until := c.restartGrace(); {
			case errors.As(err, &refused):
				// The agent answers; the state (or the term) is at fault, not the node.
				a.setReachable(c, true, nil)
			case time.Now().Before(until):
				// It said it is restarting: counting it unreachable would move its VIPs away
				// and back (the planned restart of a rolling update). Asked again when its
				// grace ends at the latest; a new Watch ends the grace sooner.
				klog.V(2).InfoS("Agent restarting: not reachable yet", "node", c.node, "err", err)
				wait = min(wait, time.Until(until)+time.Millisecond)
				recheck = true
			default:
				if !a.setReachable(c, false, err) {
					// A restart grace began meanwhile (its peers said so): as above.
					wait, recheck = min(wait, time.Until(c.restartGrace())+time.Millisecond), true
				}
			}
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
	resp, err := c.client.Apply(cctx, &agentv1.ApplyRequest{State: st, Sender: agentapi.ThisBuild()})
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
	c.held = st
	c.mu.Unlock()
	if a.hooks.Refused != nil {
		a.hooks.Refused(c.node, resp.GetRefused(), "")
	}
	if a.hooks.Applied != nil {
		a.hooks.Applied(c.node)
	}
	if len(resp.GetProblems()) > 0 {
		klog.InfoS("Agent applied the state with problems", "node", c.node, "generation", gen, "problems", resp.GetProblems())
	}
	if u := resp.GetUnknownFields(); len(u) > 0 && resp.GetChanged() {
		// An older agent (a rolling update): it applies the rest as if these were unset. Nothing
		// here relies on an agent knowing a field; said once per change of state.
		klog.InfoS("Agent does not know some fields of the state (an older build): applied as if unset", "node", c.node, "generation", gen, "fields", u)
	}
	klog.V(2).InfoS("Agent applied state", "node", c.node, "term", term, "generation", gen, "changed", resp.GetChanged(), "refused", len(resp.GetRefused()), "rtt", rtt.Round(100*time.Microsecond))
	return nil
}

func (a *Agents) probe(ctx context.Context, c *agentConn) error {
	cctx, cancel := context.WithTimeout(ctx, a.cfg.Timeout)
	defer cancel()
	asked := time.Now()
	resp, err := c.client.GetState(cctx, &agentv1.GetStateRequest{})
	if err != nil {
		return err
	}
	term := a.Term()
	now := time.Now()
	var restarting map[string]time.Time
	self := false
	for _, n := range resp.GetRestarting() {
		left := min(time.Duration(n.GetGraceLeftMillis())*time.Millisecond, MaxRestartGrace)
		if left <= 0 {
			continue
		}
		if n.GetNode() == c.node {
			// Between its restart notice and its exit: as if its Event had come.
			c.restartingUntil(now.Add(left), c.node)
			self = true
			continue
		}
		if restarting == nil {
			restarting = map[string]time.Time{}
		}
		restarting[n.GetNode()] = now.Add(left)
	}
	if !self {
		c.back(asked)
	}
	c.mu.Lock()
	c.peersRestarting = restarting
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
	cpVIP, _ := netip.ParseAddr(resp.GetControlPlane().GetVip().GetVip())
	cpChanged := cpVIP.Unmap() != c.cpVIP
	c.cpVIP = cpVIP.Unmap()
	buildChanged := resp.GetBuild() != nil && !proto.Equal(c.build, resp.GetBuild())
	if buildChanged {
		c.build = resp.GetBuild()
	}
	dataPlaneChanged := !c.known || !proto.Equal(c.dataPlane, resp.GetDataPlane())
	c.dataPlane = resp.GetDataPlane()
	c.mu.Unlock()
	if dataPlaneChanged && a.hooks.DataPlane != nil {
		a.hooks.DataPlane(c.node, resp.GetDataPlane())
	}
	if buildChanged && a.hooks.Build != nil {
		a.hooks.Build(c.node, resp.GetBuild())
	}
	if cpChanged && a.hooks.ControlPlane != nil {
		a.hooks.ControlPlane(c.node, cpVIP.Unmap())
	}
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

// watch relays the agent's events, reconnecting with backoff. Each Watch waits for the
// connection, which gRPC redials with its own backoff (at most 5 s): an agent back from a
// restart is asked what it holds as soon as it answers (it may have resumed a saved state
// older than the one it held), not after this loop's backoff, which grew while it was away.
func (a *Agents) watch(ctx context.Context, c *agentConn) {
	backoff := 500 * time.Millisecond
	for ctx.Err() == nil {
		stream, err := c.client.Watch(ctx, &agentv1.WatchRequest{}, grpc.WaitForReady(true))
		if err == nil {
			if _, herr := stream.Header(); herr == nil {
				backoff = 500 * time.Millisecond
				// The agent answers, perhaps after a restart: ask what it holds now (the
				// state is sent again if it lost it, its restart grace ends if it no longer
				// says it restarts) and check reachability.
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
				if resp.GetEvent().GetKind() == agentv1.Event_KIND_RESTARTING {
					c.restarting(resp.GetEvent())
				}
				if k := resp.GetEvent().GetKind(); k == agentv1.Event_KIND_SESSION_UP || k == agentv1.Event_KIND_SESSION_DOWN || k == agentv1.Event_KIND_DATA_PLANE {
					// A session changed: ask for the sessions now (for the BGPPeer's status);
					// or the data plane: ask what kube-proxy serves now (who may announce).
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
