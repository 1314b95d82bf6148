package nodeagent

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"time"

	"google.golang.org/protobuf/proto"
	"k8s.io/klog/v2"

	"github.com/metalvip/metalvip/nodeagent/failover"
	"github.com/metalvip/metalvip/nodeagent/l2"
	agentv1 "github.com/metalvip/metalvip/proto/metalvip/agent/v1"
)

// livenessChanged re-decides every L2 VIP when what the heartbeats of the monitor of
// generation gen say changed, from the view it hands over (or a later one). It runs before
// this node's heartbeats show the change (see failover.Config.OnChange). A retired monitor's
// last OnChange may run after a new one replaced it (failover.Monitor.Close does not wait for
// it): it decides nothing.
func (a *Agent) livenessChanged(gen uint64, v failover.View) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if gen != a.liveGen || a.live == nil {
		return
	}
	if v.Seq > a.facts.Seq {
		a.facts = v
	}
	a.redecideL2Locked()
}

// redecideL2 decides every L2 VIP again from the latest view: a wait a decision set is over
// (redecideLocked).
func (a *Agent) redecideL2() {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.redecideL2Locked()
}

// redecideL2Locked decides every L2 VIP again, and announces again those a candidate's change
// may have drawn clients from. The caller holds mu.
func (a *Agent) redecideL2Locked() {
	if a.state == nil || a.closing() {
		return
	}
	views := map[netip.Addr]*agentv1.AnnouncedVIP{}
	var vips []l2.VIP
	for vip, v := range a.views {
		views[vip] = proto.Clone(v).(*agentv1.AnnouncedVIP)
	}
	moved := a.heardChangedLocked()
	for _, an := range a.checked.announcements {
		if an.GetMode() != agentv1.Mode_MODE_L2 {
			continue
		}
		vip := an.vip
		v := views[vip]
		if v == nil {
			continue
		}
		// A candidate that died, came back, stopped or started seeing this node, or took it
		// for dead however briefly (a lapse no heartbeat showed, counted in the next) may have
		// answered for the VIP meanwhile and drawn clients: the VIP, if this node keeps it, is
		// announced again to draw them back.
		if v.GetActive() && slices.ContainsFunc(an.GetL2().GetCandidates(), func(c *agentv1.Candidate) bool { return moved[c.GetNode()] }) {
			a.again[vip]++
		}
		if l, ok := a.decideL2(an, v); ok {
			vips = append(vips, l)
		}
	}
	for vip := range a.again {
		if views[vip] == nil {
			delete(a.again, vip) // no longer in the state
		}
	}
	vips = append(vips, a.controlPlaneWire().l2...)
	a.setL2Locked(vips)
	a.setEgressLocked()
	for _, p := range a.l2Problems {
		klog.ErrorS(nil, "L2 after a liveness change", "problem", p)
	}
	a.emitChanges(views)
	a.views = views
}

// heard is what the heartbeats say of a peer.
type heard struct {
	alive, sees bool
	lapses      uint64
}

// heardChangedLocked returns the candidates (of this node's L2 VIPs) whose liveness, whether
// they see this node, or their lapses changed since it was last called, and remembers what the
// heartbeats say now. The caller holds mu.
func (a *Agent) heardChangedLocked() map[string]bool {
	moved := map[string]bool{}
	if a.live == nil {
		return moved
	}
	now := map[string]heard{}
	for _, an := range a.checked.announcements {
		for _, c := range an.GetL2().GetCandidates() {
			if n := c.GetNode(); n != a.opts.Node {
				now[n] = heard{alive: a.facts.Alive(n), sees: a.facts.Sees(n), lapses: a.facts.Lapses(n)}
			}
		}
	}
	for n, h := range now {
		if old, ok := a.heard[n]; ok && old != h {
			moved[n] = true
		}
	}
	a.heard = now
	return moved
}

// applyLivenessLocked configures the heartbeat exchange for the state: the peers are every
// other candidate of this node's L2 VIPs, with the keys and addresses of heartbeat_peers (a
// candidate without keys cannot be heard, so it counts as dead), and the departing peers of
// heartbeat_peers (nodes the CCM cannot reach, which yield when they hear this node). A state without any
// heartbeat peer (a CCM that hands out no keys) runs no heartbeats: then only first
// candidates answer. The caller holds mu.
func (a *Agent) applyLivenessLocked(st *agentv1.DesiredState) error {
	opts := st.GetL2()
	var self netip.Addr
	peers := map[string]failover.Peer{}
	for _, an := range a.checked.announcements {
		if an.GetMode() != agentv1.Mode_MODE_L2 {
			continue
		}
		cands := an.GetL2().GetCandidates()
		if !slices.ContainsFunc(cands, func(c *agentv1.Candidate) bool { return c.GetNode() == a.opts.Node }) {
			continue
		}
		for k, c := range cands {
			addr := an.candidates[k]
			if c.GetNode() == a.opts.Node {
				if addr.IsValid() {
					self = addr
				}
				continue
			}
			p := a.checked.hbPeers[c.GetNode()]
			// A candidate the state also says departing (the CCM reaches it again but it
			// does not hold the CCM's state yet) stays departing: never shown alive, never
			// waited for.
			p.Node = c.GetNode()
			if !p.Addr.IsValid() {
				p.Addr = addr
			}
			if p.Addr.IsValid() {
				peers[p.Node] = p
			}
		}
	}
	// Departing peers (nodes the CCM cut off from this node's candidate lists) hear this
	// node's heartbeats, which never show them alive: they yield what they shared with it.
	for n, p := range a.checked.hbPeers {
		if _, candidate := peers[n]; !candidate && p.Departing && p.Addr.IsValid() && n != a.opts.Node {
			peers[n] = p
		}
	}
	if len(st.GetHeartbeatPeers()) == 0 || len(peers) == 0 {
		a.closeLivenessLocked() // no one to watch: the first candidate rule applies
		return nil
	}
	if !self.IsValid() {
		a.closeLivenessLocked()
		return errors.New("no data-plane address for this node among the candidates: only first candidates answer")
	}
	port := uint16(opts.GetHeartbeatPort())
	if port == 0 {
		port = 7473
	}
	gen := a.liveGen + 1
	cfg := failover.Config{
		Node:     a.opts.Node,
		Listen:   netip.AddrPortFrom(self, port),
		Interval: time.Duration(opts.GetHeartbeatIntervalMs()) * time.Millisecond,
		Misses:   int(opts.GetHeartbeatMisses()),
		Identity: a.identity,
		OnChange: func(v failover.View) { a.livenessChanged(gen, v) },
		OnRTT:    a.opts.Observer.HeartbeatRTT,
	}
	if a.live != nil && (a.liveCfg.Listen != cfg.Listen || a.liveCfg.Interval != cfg.Interval || a.liveCfg.Misses != cfg.Misses) {
		a.closeLivenessLocked()
	}
	if a.live == nil {
		l, err := a.opts.NewLiveness(cfg)
		if err != nil {
			return fmt.Errorf("%w: only first candidates answer", err)
		}
		a.live, a.liveCfg, a.liveGen = l, cfg, gen
	}
	list := make([]failover.Peer, 0, len(peers))
	for _, p := range peers {
		list = append(list, p)
	}
	a.live.SetPeers(list)
	a.watched = map[string]bool{}
	for _, p := range list {
		if !p.Departing {
			a.watched[p.Node] = true
		}
	}
	a.facts = a.live.View()
	a.hbPeers = len(list)
	return nil
}

// closeLivenessLocked stops the heartbeat exchange, keeping its counters. The caller holds
// mu: Close does not wait for an OnChange under way (which waits for mu), and that one, of a
// retired generation, decides nothing (livenessChangedFor).
func (a *Agent) closeLivenessLocked() {
	if a.live == nil {
		return
	}
	live := a.live
	a.live, a.facts = nil, failover.View{}
	a.hbBase = addCounters(a.hbBase, live.Counters())
	_ = live.Close()
}

func addCounters(x, y failover.Counters) failover.Counters {
	out := failover.Counters{Sent: x.Sent + y.Sent, Accepted: x.Accepted + y.Accepted, Unproven: x.Unproven + y.Unproven, Stalls: x.Stalls + y.Stalls, Refused: map[string]uint64{}}
	for _, m := range []map[string]uint64{x.Refused, y.Refused} {
		for k, v := range m {
			out.Refused[k] += v
		}
	}
	return out
}

// RotateHeartbeatKey makes a new heartbeat key now (metalvip-agent does on SIGHUP); see
// failover.Identity.Rotate. It does nothing while an earlier rotation is under way.
func (a *Agent) RotateHeartbeatKey() {
	select {
	case a.rotate <- struct{}{}:
	default:
	}
}

// rotationCheck is how often the heartbeat key's age is looked at.
const rotationCheck = time.Minute

// stateResaveInterval is how often a held state that could not be saved is tried again. Until
// it is saved, a restart would resume an older state, answering VIPs that moved meanwhile
// beside their new owners until the CCM replaces it (the soak's seed 5 saw it for 4 s, the
// agent restarted minutes after its disk was writable again, on the state of before).
const stateResaveInterval = time.Second

// resaveState saves the held state if the last save of it failed, once the state directory
// passes the write probe.
func (a *Agent) resaveState() {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.unsaved == "" || a.state == nil {
		return
	}
	err := writable(a.opts.StateDir)
	if err == nil {
		err = saveState(a.opts.StateDir, a.state)
	}
	a.noteSaved(err, a.state)
}

func (a *Agent) retryLoop() {
	defer close(a.done)
	t := time.NewTicker(a.opts.RetryInterval)
	defer t.Stop()
	saveClients := time.NewTicker(clientsSaveInterval)
	defer saveClients.Stop()
	age := time.NewTicker(rotationCheck)
	defer age.Stop()
	resave := time.NewTicker(stateResaveInterval)
	defer resave.Stop()
	var savedClients uint64
	for {
		select {
		case <-a.stop:
			return
		case <-resave.C:
			a.resaveState()
		case <-saveClients.C:
			savedClients = a.saveClientsIfChanged(savedClients)
		case <-age.C:
			if a.identity.RotationDue(time.Now(), a.opts.HeartbeatKeyLifetime) {
				a.rotateKey("age")
			}
			a.settleRotation()
		case <-a.rotate:
			a.rotateKey("asked")
			a.settleRotation()
		case <-t.C:
			a.applyMu.Lock()
			a.mu.Lock()
			if len(a.macs) > 0 {
				if err := a.opts.MACFilter.Check(); err != nil {
					klog.ErrorS(err, "Virtual MACs: cannot check what the node receives")
				}
			}
			if a.opts.Egress != nil {
				if err := a.opts.Egress.Check(); err != nil {
					klog.ErrorS(err, "Egress rules")
					a.egressProblem = "egress: " + err.Error()
				} else if a.egressProblem != "" {
					a.setEgressLocked() // says again what it does, the problem gone
				}
			}
			if (a.state != nil || a.opts.ControlPlane != nil) && len(a.problems)+len(a.l2Problems) > 0 {
				ctx, cancel := context.WithTimeout(context.Background(), a.opts.RetryInterval)
				a.applyLocked(ctx)
				cancel()
			}
			a.mu.Unlock()
			a.applyMu.Unlock()
		}
	}
}

func (a *Agent) rotateKey(why string) {
	ok, err := a.identity.Rotate(time.Now())
	switch {
	case err != nil:
		klog.ErrorS(err, "Heartbeat key rotation: the new key is not saved; it is used for this run")
	case ok:
		klog.InfoS("Heartbeat key rotation started: a new key is published; the old one is kept until every peer uses the new one", "why", why)
	default:
		klog.InfoS("Heartbeat key rotation not started: the previous one is still under way", "why", why)
	}
}

// settleRotation ends a rotation when no heartbeats run: no peer can still need the old key.
func (a *Agent) settleRotation() {
	a.mu.Lock()
	idle := a.live == nil
	a.mu.Unlock()
	if idle && len(a.identity.PublicKeys()) > 1 {
		if err := a.identity.Settle(); err != nil {
			klog.ErrorS(err, "Cannot save the heartbeat keys")
		}
	}
}
