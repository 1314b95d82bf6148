// Package nodeagent is metalvip-agent: it takes the desired state of its node from the CCM
// (the gRPC contract in proto/metalvip/agent/v1), keeps it on disk, and drives the speakers
// that put it on the wire (l2 for ARP/NDP, bgp for BGP) and the heartbeat exchange (failover).
// It decides which of the L2 VIPs it answers for from the ranked candidates it is given
// (ownership.go), and which items of a state it takes: an invalid announcement or BGP peer is
// refused alone, with the reason, and the rest applied (validate.go). For a VIP with a virtual
// MAC it makes the node receive frames sent to that MAC while it answers (macfilter.go). With a
// local file it also serves the control-plane VIP in front of the kube-apiservers
// (standalone.go), a second source kept apart from the CCM's state. It holds no Kubernetes
// credentials, decides nothing about which Service VIPs exist, and never returns a secret.
package nodeagent

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"k8s.io/klog/v2"

	"github.com/metalvip/metalvip/internal/agentapi"
	"github.com/metalvip/metalvip/nodeagent/bgp"
	"github.com/metalvip/metalvip/nodeagent/failover"
	"github.com/metalvip/metalvip/nodeagent/l2"
	agentv1 "github.com/metalvip/metalvip/proto/metalvip/agent/v1"
)

// L2 is the seam to the ARP/NDP speaker.
type L2 interface {
	Set([]l2.VIP) error
	SetRefresh(time.Duration)
	Counters() l2.Counters
	Close() error
}

// BGP is the seam to the BGP speaker.
type BGP interface {
	SetPeers(context.Context, []bgp.Peer) error
	SetRoutes(context.Context, []bgp.Route) error
	Sessions() []bgp.SessionState
	OnSessionChange(func(bgp.SessionState))
	Shutdown(context.Context) error
}

// Options configure an Agent.
type Options struct {
	// Node is this node's name; states for other nodes are refused.
	Node string
	// StateDir holds the last applied state, so that a restart resumes announcing, and the
	// node's heartbeat identity (keys and boot counter).
	StateDir string
	// Interfaces are where L2 VIPs are answered when an announcement names none.
	Interfaces []string
	// RouterID is the BGP router ID when the state gives none (the node's IPv4 address).
	RouterID netip.Addr
	// L2 is the ARP/NDP speaker.
	L2 L2
	// NewBGP starts a BGP speaker; called when BGP is first needed or its global settings
	// change.
	NewBGP func(context.Context, bgp.Config) (BGP, error)
	// RetryInterval is how often a state that could not be fully applied is tried again.
	RetryInterval time.Duration
	// NewLiveness starts the heartbeat exchange among L2 candidates; nil means failover.New.
	NewLiveness func(failover.Config) (Liveness, error)
	// HeartbeatKeyLifetime is how old the heartbeat key may grow before a new one is made
	// (see failover.Identity.Rotate); 0 means never by age.
	HeartbeatKeyLifetime time.Duration
	// ControlPlane is the second source of desired state, the control-plane VIP from a local
	// file (standalone.go); nil for none. The agent starts it and closes it.
	ControlPlane *ControlPlane
	// MACFilter makes the node receive frames sent to the virtual MACs it answers with; nil
	// means NewMACFilter (nftables and the NICs' unicast filters, which need NET_ADMIN).
	MACFilter MACFilter
	// HearPeerTimeout is how long after the agent starts a peer not heard since counts as
	// alive and not seeing this node (see heardFacts); 0 means 10 s.
	HearPeerTimeout time.Duration
	// Observer is told what the agent does, for metrics; nil for none.
	Observer Observer
}

// Liveness is the seam to the heartbeat exchange.
type Liveness interface {
	LivenessFacts
	SetPeers([]failover.Peer)
	Counters() failover.Counters
	Close() error
}

// Agent applies desired states. It implements agentv1.AgentServiceServer.
type Agent struct {
	agentv1.UnimplementedAgentServiceServer
	opts     Options
	identity *failover.Identity

	// applyMu serializes whoever drives the speakers (Apply, the retries, the start), so that
	// applyLocked may let go of mu while it waits for a heartbeat monitor to close.
	applyMu  sync.Mutex
	mu       sync.Mutex
	state    *agentv1.DesiredState // the last accepted state, as given; nil before the first
	checked  checkedState          // state's items, checked
	restored bool
	// started is when the agent started; heardAny says a peer's heartbeats have shown since
	// that it sees this node (heardFacts). standbyFor is, for each L2 VIP this node stands
	// by for, the live candidate it stands by for; handover holds a VIP with a virtual MAC
	// that a new plan gave this node while that candidate lives (cautiousLocked). redecide
	// decides L2 again when the first of those waits ends.
	started    time.Time
	heardAny   bool
	standbyFor map[netip.Addr]string
	handover   map[netip.Addr]time.Time
	redecide   *time.Timer
	redecideAt time.Time
	problems   []string
	// startProblems are what went wrong reading the state directory at start; they are
	// reported until the next accepted Apply.
	startProblems []string
	views         map[netip.Addr]*agentv1.AnnouncedVIP // what each VIP is to this node now
	bgp           BGP
	bgpCfg        bgp.Config
	live          Liveness
	liveCfg       failover.Config
	hbBase        failover.Counters // of the heartbeat monitors closed so far
	// macs are the virtual MACs the MAC filter takes, by interface; l2Problems what went
	// wrong the last time the speaker and the filter were set.
	macs       map[string][]net.HardwareAddr
	l2Problems []string
	// hbPeers counts the heartbeat peers; deadAhead, for each L2 VIP this node answers after
	// a better candidate died, when that candidate was last proven alive (observe.go).
	hbPeers   int
	deadAhead map[netip.Addr]time.Time
	// heard is what the heartbeats said of each candidate at the last liveness change (alive,
	// sees this node); again counts, per L2 VIP, the changes that made this node announce a
	// VIP it kept answering (l2.VIP.Again).
	heard map[string][2]bool
	again map[netip.Addr]uint64
	healthState

	watchMu  sync.Mutex
	watchers map[chan *agentv1.Event]struct{}

	rotate chan struct{}
	stop   chan struct{}
	done   chan struct{}
}

var _ agentv1.AgentServiceServer = (*Agent)(nil)

// New returns an agent, resuming the state in StateDir if there is one. A state directory it
// cannot read costs the state it held, never the agent: it starts with no announcements from
// it, says why in its log and in GetState, and takes the next Apply.
func New(ctx context.Context, opts Options) (*Agent, error) {
	if opts.Node == "" {
		return nil, errors.New("a node name is required")
	}
	if opts.RetryInterval <= 0 {
		opts.RetryInterval = 10 * time.Second
	}
	if opts.NewLiveness == nil {
		opts.NewLiveness = func(c failover.Config) (Liveness, error) { return failover.New(c) }
	}
	if cp := opts.ControlPlane; cp != nil && cp.Node() != opts.Node {
		return nil, fmt.Errorf("the control-plane file is for node %q; this agent is %q", cp.Node(), opts.Node)
	}
	if opts.HearPeerTimeout <= 0 {
		opts.HearPeerTimeout = 10 * time.Second
	}
	if opts.MACFilter == nil {
		f, err := NewMACFilter()
		if err != nil {
			return nil, fmt.Errorf("MAC filter: %w", err)
		}
		opts.MACFilter = f
	}
	if opts.Observer == nil {
		opts.Observer = noObserver{}
	}
	a := &Agent{
		opts:       opts,
		views:      map[netip.Addr]*agentv1.AnnouncedVIP{},
		started:    time.Now(),
		standbyFor: map[netip.Addr]string{},
		handover:   map[netip.Addr]time.Time{},
		deadAhead:  map[netip.Addr]time.Time{},
		heard:      map[string][2]bool{},
		again:      map[netip.Addr]uint64{},
		watchers:   map[chan *agentv1.Event]struct{}{},
		rotate:     make(chan struct{}, 1),
		stop:       make(chan struct{}),
		done:       make(chan struct{}),
	}
	id, err := failover.LoadIdentity(opts.StateDir, time.Now())
	if id == nil {
		return nil, fmt.Errorf("heartbeat identity: %w", err)
	}
	if err != nil {
		klog.ErrorS(err, "Heartbeat identity")
		a.startProblems = append(a.startProblems, "heartbeat identity: "+err.Error())
	}
	a.identity = id
	klog.InfoS("Heartbeat identity", "boot", id.Boot(), "keys", len(id.PublicKeys()))

	a.rememberClients() // before the restored state's first Set
	if st, problem := a.restore(); st != nil {
		a.applyMu.Lock()
		a.mu.Lock()
		a.state, a.checked, a.restored = st, a.checkState(st), true
		a.applyLocked(ctx)
		a.mu.Unlock()
		a.applyMu.Unlock()
		klog.InfoS("Resumed the saved state", "term", st.GetTerm(), "generation", st.GetGeneration(),
			"announcements", len(st.GetAnnouncements()), "refused", len(a.checked.refused))
		a.emit(&agentv1.Event{Kind: agentv1.Event_KIND_APPLIED, Generation: st.GetGeneration(), Detail: "restored from disk"})
	} else if problem != "" {
		klog.ErrorS(nil, "Starting without the saved state", "problem", problem)
		a.startProblems = append(a.startProblems, problem)
	}
	if a.state == nil {
		// Nothing to answer for: stop receiving any virtual MAC a crashed run left received.
		if err := opts.MACFilter.Set(nil); err != nil {
			klog.ErrorS(err, "Virtual MACs left by an earlier run")
		}
	}
	go a.retryLoop()
	if cp := opts.ControlPlane; cp != nil {
		if err := cp.start(a.controlPlaneChanged, a.emit); err != nil {
			_ = a.Close(ctx)
			return nil, err
		}
	}
	return a, nil
}

// restore reads the saved state. A file that cannot be used is moved aside, and the problem
// returned.
func (a *Agent) restore() (*agentv1.DesiredState, string) {
	st, file, err := loadState(a.opts.StateDir)
	if err == nil && st != nil {
		if st.GetTerm() > MaxTerm {
			// Saved by an agent of the clock-term era: keep announcing what it held, and let
			// the first leader's term (from the Lease) replace it.
			klog.InfoS("The saved state has a clock-based term; any leader's term will replace it", "term", st.GetTerm())
			st.Term = 0
			err = checkWhole(withTerm(st, 1), a.opts.Node)
		} else {
			err = checkWhole(st, a.opts.Node)
		}
		if err != nil {
			err = fmt.Errorf("%w: it does not validate: %v", errUnusable, err)
		}
	}
	if err == nil {
		return st, ""
	}
	problem := fmt.Sprintf("%s: %v; no announcements from it until the next Apply", file, err)
	if errors.Is(err, errUnusable) {
		if moved, merr := moveStateAside(a.opts.StateDir, file); merr == nil {
			problem += "; moved to " + moved
		}
	}
	return nil, problem
}

func withTerm(st *agentv1.DesiredState, term uint64) *agentv1.DesiredState {
	c := proto.Clone(st).(*agentv1.DesiredState)
	c.Term = term
	return c
}

// Apply accepts a desired state; see the contract in agent.proto. It keeps req's state: a caller
// in the same process must not change it afterwards.
func (a *Agent) Apply(ctx context.Context, req *agentv1.ApplyRequest) (*agentv1.ApplyResponse, error) {
	st := req.GetState()
	if st == nil {
		return nil, status.Error(codes.InvalidArgument, "state: missing")
	}
	if err := checkWhole(st, a.opts.Node); err != nil {
		return nil, status.Error(codes.InvalidArgument, err.Error())
	}
	a.applyMu.Lock()
	defer a.applyMu.Unlock()
	a.mu.Lock()
	defer a.mu.Unlock()
	cur := a.state
	if cur != nil {
		if st.GetTerm() < cur.GetTerm() {
			return nil, status.Errorf(codes.FailedPrecondition,
				"term %d is older than the accepted term %d: another leader is in charge", st.GetTerm(), cur.GetTerm())
		}
		if st.GetTerm() == cur.GetTerm() && st.GetGeneration() <= cur.GetGeneration() {
			// Idempotent: the generation (or a newer one) is applied already; the answer says
			// which, so that a CCM that lost count resumes from it. The leader is in touch, so
			// the state is no longer only the one restored from disk.
			a.restored = false
			return a.answerLocked(false), nil
		}
	}
	if err := saveState(a.opts.StateDir, st); err != nil {
		return nil, status.Errorf(codes.Internal, "persist the state: %v", err)
	}
	changed := cur == nil || !agentapi.SameContent(cur, st)
	// Kept, not copied (a copy was a tenth of an Apply of 5,000 VIPs): gRPC decodes each request
	// anew for the call, and nothing in the agent changes a state it holds.
	a.state, a.restored, a.startProblems = st, false, nil
	if changed {
		a.checked = a.checkState(a.state)
		a.applyLocked(ctx)
		a.opts.Observer.Applied(len(a.checked.refused))
	}
	klog.V(2).InfoS("Applied state", "term", st.GetTerm(), "generation", st.GetGeneration(), "changed", changed,
		"problems", len(a.problems), "refused", len(a.checked.refused))
	for _, r := range a.checked.refused {
		if changed {
			klog.InfoS("Refused an item of the state", "kind", r.GetKind(), "key", r.GetKey(), "field", r.GetField(), "reason", r.GetReason())
		}
	}
	a.emit(&agentv1.Event{Kind: agentv1.Event_KIND_APPLIED, Generation: st.GetGeneration()})
	return a.answerLocked(changed), nil
}

// answerLocked says what the agent holds. The caller holds mu.
func (a *Agent) answerLocked(changed bool) *agentv1.ApplyResponse {
	return &agentv1.ApplyResponse{
		Term: a.state.GetTerm(), Generation: a.state.GetGeneration(), Changed: changed,
		Problems: a.problemsLocked(), Refused: cloneRefusals(a.checked.refused),
	}
}

func (a *Agent) problemsLocked() []string {
	return slices.Concat(a.startProblems, a.problems, a.l2Problems)
}

func cloneRefusals(rs []*agentv1.Refusal) []*agentv1.Refusal {
	out := make([]*agentv1.Refusal, len(rs))
	for i, r := range rs {
		out[i] = proto.Clone(r).(*agentv1.Refusal)
	}
	return out
}

// applyLocked drives the speakers to the checked items of a.state. The caller holds applyMu
// and mu.
func (a *Agent) applyLocked(ctx context.Context) {
	st := a.state
	problems := slices.Clone(a.checked.problems)
	views := map[netip.Addr]*agentv1.AnnouncedVIP{}
	if err := a.applyLivenessLocked(st); err != nil {
		problems = append(problems, "failover: "+err.Error())
	}

	var vips []l2.VIP
	var routes []bgp.Route
	for _, an := range a.checked.announcements {
		vip, _ := netip.ParseAddr(an.GetVip())
		view := &agentv1.AnnouncedVIP{Vip: vip.String(), Mode: an.GetMode()}
		views[vip] = view
		switch an.GetMode() {
		case agentv1.Mode_MODE_L2:
			ifaces := an.GetL2().GetInterfaces()
			if len(ifaces) == 0 {
				ifaces = a.opts.Interfaces
			}
			view.Interfaces = ifaces
			if v, ok := a.decideL2(vip, an.GetL2(), view); ok {
				vips = append(vips, v)
			}
		case agentv1.Mode_MODE_BGP:
			view.Active, view.Reason = true, "advertised to BGP peers"
			r := bgp.Route{
				Prefix:           netip.PrefixFrom(vip, vip.BitLen()),
				Communities:      an.GetBgp().GetCommunities(),
				LocalPref:        an.GetBgp().GetLocalPref(),
				GracefulShutdown: st.GetDraining(),
			}
			for _, w := range an.GetBgp().GetWeights() {
				if w.GetNode() == a.opts.Node {
					r.Weight = w.GetEndpoints()
				}
			}
			if an.GetBgp().GetDrainByWeight() {
				drainByWeight(&r)
			}
			if r.Weight > 0 {
				view.Reason = fmt.Sprintf("advertised to BGP peers, weight %d", r.Weight)
			}
			switch {
			case r.GracefulShutdown:
				view.Reason += ", graceful shutdown (draining)"
			case st.GetDraining():
				view.Reason += ", the least (draining by weight)"
			}
			routes = append(routes, r)
		}
	}
	for i, s := range st.GetBgp().GetPrefixes() {
		p, err := netip.ParsePrefix(s)
		switch {
		case err != nil || p.Masked() != p || p.Addr().Is4In6():
			problems = append(problems, fmt.Sprintf("bgp.prefixes[%d]: %q is not a CIDR such as 10.96.0.0/16; not advertised", i, s))
		case slices.ContainsFunc(routes, func(r bgp.Route) bool { return r.Prefix == p }):
		default:
			routes = append(routes, bgp.Route{Prefix: p, GracefulShutdown: st.GetDraining()})
		}
	}
	cp := a.controlPlaneWire()
	vips, routes = append(vips, cp.l2...), append(routes, cp.routes...)
	if a.opts.L2 != nil {
		a.opts.L2.SetRefresh(time.Duration(st.GetL2().GetGratuitousRefreshSeconds()) * time.Second)
	}
	a.setL2Locked(vips)
	problems = append(problems, a.applyBGPLocked(ctx, st, routes, cp)...)

	a.emitChanges(views)
	a.views, a.problems = views, problems
	for _, p := range slices.Concat(problems, a.l2Problems) {
		klog.ErrorS(nil, "Could not apply all of the state; retrying", "problem", p)
	}
}

// setL2Locked gives the speaker vips, with the node receiving every virtual MAC it answers
// with from before the speaker first sends from it until after it last has: a takeover's
// first frame from the MAC finds the node receiving, and a release has stopped answering (the
// heartbeats' ordered hand-over then lets the next owner start) before frames stop arriving.
// A virtual MAC the node cannot receive is answered with the interface's own MAC meanwhile:
// clients that heed gratuitous ARP still reach the VIP, and l2Problems says why. The caller
// holds mu.
func (a *Agent) setL2Locked(vips []l2.VIP) {
	var problems []string
	want := macsOf(vips)
	if len(want)+len(a.macs) > 0 {
		defer func(start time.Time, before int) {
			klog.V(2).InfoS("Set the speaker and the virtual MACs", "vips", len(vips), "macsBefore", before, "macs", countMACs(a.macs), "took", time.Since(start))
		}(time.Now(), countMACs(a.macs))
	}
	if err := a.opts.MACFilter.Set(unionMACs(a.macs, want)); err != nil {
		problems = append(problems, fmt.Sprintf("virtual MACs: %v; answering with the interfaces' own MACs until the node can receive them", err))
		vips, want = withoutMACs(vips), nil
	}
	if a.opts.L2 != nil {
		if err := a.opts.L2.Set(vips); err != nil {
			problems = append(problems, "L2: "+err.Error())
		}
	}
	if err := a.opts.MACFilter.Set(want); err != nil && len(problems) == 0 {
		problems = append(problems, fmt.Sprintf("virtual MACs: %v", err))
	}
	a.macs, a.l2Problems = want, problems
}

// macsOf returns the virtual MACs of vips by interface.
func macsOf(vips []l2.VIP) map[string][]net.HardwareAddr {
	out := map[string][]net.HardwareAddr{}
	for _, v := range vips {
		if v.MAC == nil {
			continue
		}
		for _, ifname := range v.Interfaces {
			out[ifname] = append(out[ifname], v.MAC)
		}
	}
	return out
}

func countMACs(m map[string][]net.HardwareAddr) int {
	n := 0
	for _, macs := range m {
		n += len(macs)
	}
	return n
}

func unionMACs(x, y map[string][]net.HardwareAddr) map[string][]net.HardwareAddr {
	out := map[string][]net.HardwareAddr{}
	for _, m := range []map[string][]net.HardwareAddr{x, y} {
		for ifname, macs := range m {
			out[ifname] = append(out[ifname], macs...)
		}
	}
	return out
}

func withoutMACs(vips []l2.VIP) []l2.VIP {
	out := slices.Clone(vips)
	for i := range out {
		out[i].MAC = nil
	}
	return out
}

// emitChanges emits events for what changed hands on this node. The caller holds mu.
func (a *Agent) emitChanges(views map[netip.Addr]*agentv1.AnnouncedVIP) {
	// Takeovers after a death are logged at Info in one line, whatever their number: a node
	// that stood by for a thousand VIPs of a dead one would otherwise write a thousand lines
	// at once, the work of a flap (the agent's own heartbeats wait meanwhile).
	var failedOver []netip.Addr
	var reason string
	var soonest, latest time.Duration
	for vip, v := range views {
		old := a.views[vip]
		l2 := v.GetMode() != agentv1.Mode_MODE_BGP
		if v.Active && (old == nil || !old.Active) {
			a.emit(&agentv1.Event{Kind: agentv1.Event_KIND_TOOK_OVER, Vip: vip.String(), Detail: v.Reason})
			if l2 {
				var after time.Duration
				if t, ok := a.deadAhead[vip]; ok {
					after = time.Since(t)
				}
				a.opts.Observer.TookOver(vip, after)
				if after > 0 {
					failedOver, reason = append(failedOver, vip), v.Reason
					if soonest == 0 || after < soonest {
						soonest = after
					}
					latest = max(latest, after)
				}
				klog.V(2).InfoS("Answering for an L2 VIP", "vip", vip, "reason", v.Reason, "sinceOwnerLastHeard", after.Round(time.Millisecond))
			}
		}
		if !v.Active && old != nil && old.Active {
			a.emit(&agentv1.Event{Kind: agentv1.Event_KIND_RELEASED, Vip: vip.String(), Detail: v.Reason})
			if l2 {
				a.opts.Observer.Released(vip)
				klog.V(2).InfoS("No longer answering for an L2 VIP", "vip", vip, "reason", v.Reason)
			}
		}
	}
	switch n := len(failedOver); {
	case n == 1:
		klog.InfoS("Answering for an L2 VIP", "vip", failedOver[0], "reason", reason, "sinceOwnerLastHeard", soonest.Round(time.Millisecond))
	case n > 1:
		slices.SortFunc(failedOver, netip.Addr.Compare)
		klog.InfoS("Answering for L2 VIPs whose higher-ranked candidates are down", "count", n, "vips", failedOver[:min(n, 10)],
			"sinceOwnerLastHeard", soonest.Round(time.Millisecond), "upTo", latest.Round(time.Millisecond))
	}
	for vip, old := range a.views {
		if _, still := views[vip]; !still {
			delete(a.deadAhead, vip)
		}
		if _, still := views[vip]; !still && old.Active {
			a.emit(&agentv1.Event{Kind: agentv1.Event_KIND_RELEASED, Vip: vip.String(), Detail: "no longer announced"})
			if old.GetMode() != agentv1.Mode_MODE_BGP {
				a.opts.Observer.Released(vip)
			}
		}
	}
}

// decideL2 decides this node's part in an L2 VIP (ownership.go), writes it into view, and
// returns what the speaker should answer for, if anything. The caller holds mu.
func (a *Agent) decideL2(vip netip.Addr, an *agentv1.L2Announcement, view *agentv1.AnnouncedVIP) (l2.VIP, bool) {
	cands := make([]string, 0, len(an.GetCandidates()))
	for _, c := range an.GetCandidates() {
		cands = append(cands, c.GetNode())
	}
	var live LivenessFacts
	if a.live != nil {
		live = a.live
	}
	d := decideL2(a.opts.Node, cands, an.GetPerClient(), live)
	if live != nil {
		a.noteHeardLocked(live)
		d = a.cautiousLocked(vip, cands, an, live, d)
	}
	// Make-before-break: a node being drained that answered the VIP keeps answering while it
	// stays a candidate (the CCM takes it off after the drain's delay), behind the new owner,
	// which answers and announces at once. It sends no gratuitous ARP meanwhile, which would
	// draw the clients back (a share of one member answers every client and announces none).
	lingers := !d.Active && a.state.GetDraining() && !an.GetPerClient() && an.GetVirtualMac() == "" &&
		slices.Contains(cands, a.opts.Node) && a.views[vip].GetActive()
	if lingers {
		d = l2Decision{Active: true, Reason: "draining: answers while " + cands[0] + " takes over (make-before-break), without gratuitous ARP"}
	}
	view.Active, view.Reason, view.Sharing = d.Active, d.Reason, d.Sharing
	delete(a.deadAhead, vip)
	if !d.Active {
		return l2.VIP{}, false
	}
	if live != nil {
		if t, ok := a.deadAheadLocked(cands, live); ok {
			a.deadAhead[vip] = t
		}
	}
	v := l2.VIP{Addr: vip, Interfaces: view.Interfaces, Again: a.again[vip]}
	if an.GetPerClient() {
		v.Share = &l2.Share{Self: a.opts.Node, Members: d.Sharing}
	}
	if lingers {
		v.Share = &l2.Share{Self: a.opts.Node, Members: []string{a.opts.Node}}
	}
	if m := an.GetVirtualMac(); m != "" {
		v.MAC, _ = net.ParseMAC(m) // checked by checkItems
		view.Reason += "; virtual MAC " + v.MAC.String()
	}
	return v, true
}

// cautiousLocked makes two corrections to a decision d for vip, both against two nodes
// answering at once while nodes hold states that do not agree (a node restarted from a saved
// state that its peers no longer share, a new plan reaching the nodes one after the other):
//   - for HearPeerTimeout after the start, while this node has heard none of its peers, a
//     peer counts as alive and not seeing this node (heardFacts);
//   - a VIP with a virtual MAC that this node stood by for, and that a new plan makes it
//     answer while the node it stood by for is alive, is answered after one detection time:
//     that node, told at about the same time, stops first. A takeover because that node died
//     is not held.
//
// The caller holds mu.
func (a *Agent) cautiousLocked(vip netip.Addr, cands []string, an *agentv1.L2Announcement, live LivenessFacts, d l2Decision) l2Decision {
	now := time.Now()
	until := a.started.Add(a.opts.HearPeerTimeout)
	if !a.heardAny && now.Before(until) {
		a.redecideLocked(until)
		isUnheard := func(n string) bool { return n != a.opts.Node }
		c := decideL2(a.opts.Node, cands, an.GetPerClient(), heardFacts{live, isUnheard})
		if d.Active && !c.Active {
			c.Reason = fmt.Sprintf("just started and hears none of its peers: waiting up to %s for them or the CCM, as their states may no longer name this node (%s)",
				until.Sub(now).Round(time.Second), c.Reason)
		}
		d = c
	}

	if !d.Active {
		delete(a.handover, vip)
		delete(a.standbyFor, vip)
		me := max(slices.Index(cands, a.opts.Node), 0)
		for _, c := range cands[:me] {
			if live.Alive(c) {
				a.standbyFor[vip] = c
				break
			}
		}
		return d
	}
	prev := a.standbyFor[vip]
	if an.GetVirtualMac() != "" && prev != "" && live.Alive(prev) {
		until, held := a.handover[vip]
		if !held {
			until = now.Add(a.detectionTime())
			a.handover[vip] = until
		}
		if now.Before(until) {
			a.redecideLocked(until)
			return l2Decision{Reason: fmt.Sprintf("the plan moved it here from %s, which is alive: answering in %s, once %s has stopped", prev, until.Sub(now).Round(time.Millisecond), prev)}
		}
	}
	delete(a.handover, vip)
	delete(a.standbyFor, vip)
	return d
}

// noteHeardLocked notes whether any candidate of this node's L2 VIPs has shown that it sees
// this node. The caller holds mu.
func (a *Agent) noteHeardLocked(live LivenessFacts) {
	if a.heardAny {
		return
	}
	for _, an := range a.checked.announcements {
		for _, c := range an.GetL2().GetCandidates() {
			if c.GetNode() != a.opts.Node && live.Sees(c.GetNode()) {
				a.heardAny = true
				return
			}
		}
	}
}

// detectionTime is how long the heartbeats take to find a node dead.
func (a *Agent) detectionTime() time.Duration {
	iv, misses := a.liveCfg.Interval, a.liveCfg.Misses
	if iv <= 0 {
		iv = 50 * time.Millisecond // failover.Config's defaults
	}
	if misses <= 0 {
		misses = 3
	}
	return time.Duration(misses) * iv
}

// redecideLocked makes L2 be decided again at the latest at at. The caller holds mu.
func (a *Agent) redecideLocked(at time.Time) {
	if a.redecide != nil && !a.redecideAt.IsZero() && !at.Before(a.redecideAt) && a.redecideAt.After(time.Now()) {
		return // an earlier one is due
	}
	a.redecideAt = at
	d := max(time.Until(at), time.Millisecond)
	if a.redecide == nil {
		a.redecide = time.AfterFunc(d, a.livenessChanged)
		return
	}
	a.redecide.Reset(d)
}

// livenessChanged re-decides every L2 VIP when the set of live candidates changes. It runs
// before this node's heartbeats show the change (see failover.Config.OnChange).
func (a *Agent) livenessChanged() {
	a.mu.Lock()
	defer a.mu.Unlock()
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
		vip, _ := netip.ParseAddr(an.GetVip())
		v := views[vip]
		if v == nil {
			continue
		}
		// A candidate that died, came back or stopped or started seeing this node may have
		// answered for the VIP meanwhile (it took this node for dead) and drawn clients: the
		// VIP, if this node keeps it, is announced again to draw them back.
		if v.GetActive() && slices.ContainsFunc(an.GetL2().GetCandidates(), func(c *agentv1.Candidate) bool { return moved[c.GetNode()] }) {
			a.again[vip]++
		}
		if l, ok := a.decideL2(vip, an.GetL2(), v); ok {
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
	for _, p := range a.l2Problems {
		klog.ErrorS(nil, "L2 after a liveness change", "problem", p)
	}
	a.emitChanges(views)
	a.views = views
}

// heardChangedLocked returns the candidates (of this node's L2 VIPs) whose liveness, or
// whether they see this node, changed since it was last called, and remembers what the
// heartbeats say now. The caller holds mu.
func (a *Agent) heardChangedLocked() map[string]bool {
	moved := map[string]bool{}
	if a.live == nil {
		return moved
	}
	now := map[string][2]bool{}
	for _, an := range a.checked.announcements {
		for _, c := range an.GetL2().GetCandidates() {
			if n := c.GetNode(); n != a.opts.Node {
				now[n] = [2]bool{a.live.Alive(n), a.live.Sees(n)}
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
// candidate without keys cannot be heard, so it counts as dead). A state without any
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
		for _, c := range cands {
			addr, _ := netip.ParseAddr(c.GetAddress())
			if c.GetNode() == a.opts.Node {
				if addr.IsValid() {
					self = addr
				}
				continue
			}
			p := a.checked.hbPeers[c.GetNode()]
			p.Node = c.GetNode()
			if !p.Addr.IsValid() {
				p.Addr = addr
			}
			if p.Addr.IsValid() {
				peers[p.Node] = p
			}
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
	cfg := failover.Config{
		Node:     a.opts.Node,
		Listen:   netip.AddrPortFrom(self, port),
		Interval: time.Duration(opts.GetHeartbeatIntervalMs()) * time.Millisecond,
		Misses:   int(opts.GetHeartbeatMisses()),
		Identity: a.identity,
		OnChange: a.livenessChanged,
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
		a.live, a.liveCfg = l, cfg
	}
	list := make([]failover.Peer, 0, len(peers))
	for _, p := range peers {
		list = append(list, p)
	}
	a.live.SetPeers(list)
	a.hbPeers = len(list)
	return nil
}

// closeLivenessLocked stops the heartbeat exchange, keeping its counters. The caller holds
// applyMu and mu. The monitor's OnChange takes mu and Close waits for it, so mu is let go
// meanwhile; applyMu keeps every other applier out.
func (a *Agent) closeLivenessLocked() {
	if a.live == nil {
		return
	}
	live := a.live
	a.live = nil
	a.hbBase = addCounters(a.hbBase, live.Counters())
	a.mu.Unlock()
	_ = live.Close()
	a.mu.Lock()
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

// applyBGPLocked gives the speaker the valid peers and the routes, and returns what it could
// not do. A peer gobgp refuses costs only that peer's session: the routes are set all the
// same. The control-plane file's peers join the CCM's (cp). The caller holds mu.
func (a *Agent) applyBGPLocked(ctx context.Context, st *agentv1.DesiredState, routes []bgp.Route, cp cpWire) []string {
	peers, problems := mergePeers(a.checked.peers, cp.peers)
	if len(peers) == 0 && len(routes) == 0 && a.bgp == nil {
		return nil
	}
	cfg := bgp.Config{ASN: cmp.Or(st.GetBgp().GetAsn(), cp.asn), RouterID: a.opts.RouterID, ListenPort: -1}
	if cfg.ASN == 0 && len(peers) > 0 {
		cfg.ASN = peers[0].LocalASN // every valid peer has one when the state gives no default
	}
	if id := st.GetBgp().GetRouterId(); id != "" {
		cfg.RouterID, _ = netip.ParseAddr(id)
	} else if cp.routerID.IsValid() {
		cfg.RouterID = cp.routerID
	}
	if a.bgp != nil && (a.bgpCfg.ASN != cfg.ASN || a.bgpCfg.RouterID != cfg.RouterID) && cfg.ASN != 0 {
		// Global settings cannot change under a running server: restart it.
		_ = a.bgp.Shutdown(ctx)
		a.bgp = nil
	}
	if a.bgp == nil {
		if a.opts.NewBGP == nil {
			return append(problems, "BGP: this agent has no BGP speaker")
		}
		if cfg.ASN == 0 {
			return append(problems, "BGP: bgp.asn is not set and no peer gives a local ASN: nothing to speak BGP as")
		}
		if !cfg.RouterID.IsValid() {
			return append(problems, "BGP: no router ID: the node has no IPv4 address to use; give the agent --router-id (a 32-bit ID unique among the peers, written as an IPv4 address)")
		}
		s, err := a.opts.NewBGP(ctx, cfg)
		if err != nil {
			return append(problems, fmt.Sprintf("BGP: start the speaker: %v", err))
		}
		s.OnSessionChange(a.sessionChanged)
		a.bgp, a.bgpCfg = s, cfg
	}
	if err := a.bgp.SetPeers(ctx, peers); err != nil {
		problems = append(problems, "BGP peers: "+err.Error())
	}
	if err := a.bgp.SetRoutes(ctx, routes); err != nil {
		problems = append(problems, "BGP routes: "+err.Error())
	}
	return problems
}

func (a *Agent) sessionChanged(s bgp.SessionState) {
	kind := agentv1.Event_KIND_SESSION_DOWN
	if s.Established() {
		kind = agentv1.Event_KIND_SESSION_UP
	}
	a.emit(&agentv1.Event{Kind: kind, Peer: s.Peer.String(), Detail: strings.TrimSpace(s.State + " " + s.LastError)})
}

// GetState reports what the agent applied and does now. It never returns a secret: BGP
// passwords are blanked, the heartbeat keys are public halves.
func (a *Agent) GetState(context.Context, *agentv1.GetStateRequest) (*agentv1.GetStateResponse, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	resp := &agentv1.GetStateResponse{
		Node:                a.opts.Node,
		Term:                a.state.GetTerm(),
		Generation:          a.state.GetGeneration(),
		Restored:            a.restored,
		Problems:            a.problemsLocked(),
		Refused:             cloneRefusals(a.checked.refused),
		HeartbeatPublicKeys: a.identity.PublicKeys(),
	}
	if a.opts.ControlPlane != nil {
		resp.ControlPlane = a.opts.ControlPlane.status()
	}
	if a.state != nil {
		resp.State = withoutSecrets(a.state)
	}
	for vip, v := range a.views {
		c := proto.Clone(v).(*agentv1.AnnouncedVIP)
		if cl, ok := a.opts.L2.(interface {
			Clients(netip.Addr) (int, int)
		}); ok && len(c.Sharing) > 0 {
			known, answered := cl.Clients(vip)
			c.ClientsKnown, c.ClientsAnswered = uint32(known), uint32(answered)
		}
		resp.Announced = append(resp.Announced, c)
	}
	slices.SortFunc(resp.Announced, func(x, y *agentv1.AnnouncedVIP) int { return strings.Compare(x.GetVip(), y.GetVip()) })
	if a.bgp != nil {
		for _, s := range a.bgp.Sessions() {
			resp.Peers = append(resp.Peers, &agentv1.PeerStatus{
				Address: s.Peer.String(), State: s.State, BfdState: s.BFDState, LastError: s.LastError, SinceUnix: s.Since.Unix(),
				RoutesAdvertised: uint32(min(s.RoutesAdvertised, 1<<32-1)),
			})
		}
	}
	resp.L2, resp.Heartbeats = a.countersLocked()
	return resp, nil
}

// countersLocked returns the speaker's and the heartbeat monitors' counters so far. The
// caller holds mu.
func (a *Agent) countersLocked() (*agentv1.L2Counters, *agentv1.HeartbeatCounters) {
	var l2c *agentv1.L2Counters
	if a.opts.L2 != nil {
		c := a.opts.L2.Counters()
		l2c = &agentv1.L2Counters{
			ArpRequests: c.ARPRequests, ArpReplies: c.ARPReplies, GratuitousArps: c.GratuitousARPs,
			NeighborSolicitations: c.NeighborSolicitations, NeighborAdvertisements: c.NeighborAdvertisements,
			UnsolicitedAdvertisements: c.UnsolicitedAdvertisements, TargetedReplies: c.TargetedReplies,
		}
	}
	hb := a.hbBase
	if a.live != nil {
		hb = addCounters(hb, a.live.Counters())
	}
	return l2c, &agentv1.HeartbeatCounters{Sent: hb.Sent, Accepted: hb.Accepted, Unproven: hb.Unproven, Refused: hb.Refused, Stalls: hb.Stalls}
}

// withoutSecrets returns a copy of st without BGP passwords or the deprecated shared keys.
func withoutSecrets(st *agentv1.DesiredState) *agentv1.DesiredState {
	out := proto.Clone(st).(*agentv1.DesiredState)
	if out.L2 != nil {
		//lint:ignore SA1019 an older CCM may still send the shared key: it must not come back out
		out.L2.HeartbeatKeys = nil
	}
	for _, p := range out.BgpPeers {
		p.Password = ""
	}
	return out
}

// Watch streams events until the client goes away or the agent closes.
func (a *Agent) Watch(_ *agentv1.WatchRequest, stream agentv1.AgentService_WatchServer) error {
	ch := make(chan *agentv1.Event, 256)
	a.watchMu.Lock()
	a.watchers[ch] = struct{}{}
	a.watchMu.Unlock()
	defer func() {
		a.watchMu.Lock()
		delete(a.watchers, ch)
		a.watchMu.Unlock()
	}()
	// Headers tell the client the stream is registered: events from now on reach it.
	if err := stream.SendHeader(metadata.MD{}); err != nil {
		return err
	}
	for {
		select {
		case <-stream.Context().Done():
			return nil
		case <-a.stop:
			return status.Error(codes.Unavailable, "agent shutting down")
		case ev := <-ch:
			if err := stream.Send(&agentv1.WatchResponse{Event: ev}); err != nil {
				return err
			}
		}
	}
}

// emit sends an event to every watcher; a watcher too slow to keep up loses it.
func (a *Agent) emit(ev *agentv1.Event) {
	ev.UnixNano = time.Now().UnixNano()
	a.watchMu.Lock()
	defer a.watchMu.Unlock()
	for ch := range a.watchers {
		select {
		case ch <- ev:
		default:
			klog.V(2).InfoS("Watcher too slow: event dropped", "kind", ev.GetKind())
		}
	}
}

// closing reports whether Close has begun.
func (a *Agent) closing() bool {
	select {
	case <-a.stop:
		return true
	default:
		return false
	}
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

func (a *Agent) retryLoop() {
	defer close(a.done)
	t := time.NewTicker(a.opts.RetryInterval)
	defer t.Stop()
	saveClients := time.NewTicker(clientsSaveInterval)
	defer saveClients.Stop()
	age := time.NewTicker(rotationCheck)
	defer age.Stop()
	var savedClients uint64
	for {
		select {
		case <-a.stop:
			return
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

// Close withdraws every BGP route and closes the sessions (peers see the withdraws before the
// sessions end), then stops answering ARP and NDP. The saved state stays, so a restarted
// agent resumes.
func (a *Agent) Close(ctx context.Context) error {
	select {
	case <-a.stop:
		return nil
	default:
	}
	close(a.stop)
	<-a.done
	if a.opts.ControlPlane != nil {
		a.opts.ControlPlane.close() // its heartbeats' callbacks take applyMu and mu
	}
	a.mu.Lock()
	if a.redecide != nil {
		a.redecide.Stop()
	}
	a.mu.Unlock()
	// The monitor's callback takes mu: stop it before taking mu.
	a.mu.Lock()
	live := a.live
	a.live = nil
	a.mu.Unlock()
	var errs []error
	if live != nil {
		errs = append(errs, live.Close())
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.bgp != nil {
		errs = append(errs, a.bgp.Shutdown(ctx))
		a.bgp = nil
	}
	if a.opts.L2 != nil {
		errs = append(errs, a.opts.L2.Close())
	}
	// The speaker has stopped: nothing answers with a virtual MAC any more.
	errs = append(errs, a.opts.MACFilter.Close())
	return errors.Join(errs...)
}
