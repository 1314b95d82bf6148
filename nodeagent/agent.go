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
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"sync"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"k8s.io/klog/v2"

	"github.com/metalvip/metalvip/internal/agentapi"
	"github.com/metalvip/metalvip/nodeagent/bgp"
	"github.com/metalvip/metalvip/nodeagent/dataplane"
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
	// ShutdownForRestart stops for a planned restart: peers with graceful restart keep the
	// routes.
	ShutdownForRestart(context.Context) error
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
	// Egress writes the node's egress rules (docs/egress.md); nil means NewEgressNet
	// (nftables and policy routing, which need NET_ADMIN once a Service asks for egress).
	Egress EgressNet
	// HearPeerTimeout is how long after the agent starts a peer not heard since counts as
	// alive and not seeing this node (see heardFacts); 0 means 10 s.
	HearPeerTimeout time.Duration
	// Observer is told what the agent does, for metrics; nil for none.
	Observer Observer
	// DataPlane says how to check the node's kube-proxy (its Healthz empty: not checked);
	// its OnChange is the agent's.
	DataPlane dataplane.Config
	// HoldsAddress says whether the node holds an address (a BGP peer's source address);
	// nil means the addresses of the host's interfaces.
	HoldsAddress func(netip.Addr) bool
}

// Liveness is the seam to the heartbeat exchange. It tells its changes through
// failover.Config.OnChange, with the view they are about.
type Liveness interface {
	// View is what the heartbeats say now (after SetPeers: the monitor does not tell it).
	View() failover.View
	SetPeers([]failover.Peer)
	Counters() failover.Counters
	// Restarting tells the peers this node restarts and is back within grace
	// (failover.Monitor.Restarting).
	Restarting(grace time.Duration)
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
	// appliedBy is the build of the CCM whose Apply of the current term arrived last (nil:
	// none since the start), for GetState.
	appliedBy *agentv1.Build
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
	// unsaved says why the held state is not on disk (the last Apply could not save it); ""
	// when it is.
	unsaved string
	views   map[netip.Addr]*agentv1.AnnouncedVIP // what each VIP is to this node now
	bgp     BGP
	bgpCfg  bgp.Config
	live    Liveness
	liveGen uint64 // the generation of live: each new monitor, one more
	// facts is the latest view of live, the one every decision reads: handed over by its
	// OnChange, or taken after SetPeers, whichever is later (failover.View.Seq).
	facts   failover.View
	liveCfg failover.Config
	hbBase  failover.Counters // of the heartbeat monitors closed so far
	// macs are the virtual MACs the MAC filter takes, by interface; l2Problems what went
	// wrong the last time the speaker and the filter were set.
	macs       map[string][]net.HardwareAddr
	l2Problems []string
	// hbPeers counts the heartbeat peers; deadAhead, for each L2 VIP this node answers after
	// a better candidate died, when that candidate was last proven alive (observe.go).
	hbPeers   int
	deadAhead map[netip.Addr]time.Time
	// heard is what the heartbeats said of each candidate at the last liveness change (alive,
	// sees this node, lapses); again counts, per L2 VIP, the changes that made this node announce a
	// VIP it kept answering (l2.VIP.Again).
	heard map[string]heard
	again map[netip.Addr]uint64
	healthState
	// restartingUntil: this agent gave its restart notice (Restart) and is back by then at
	// the latest; GetState says so to a CCM that did not get the Event.
	restartingUntil time.Time
	// dataPlane asks the node's kube-proxy whether it serves (GetState's data_plane).
	dataPlane *dataplane.Checker
	// egress is what this node does for each egress VIP (setEgressLocked); egressProblem what
	// went wrong writing the rules last; watched the heartbeat peers (egressNodeLocked).
	egress        []*agentv1.EgressStatus
	egressProblem string
	watched       map[string]bool

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
	if opts.Egress == nil {
		e, err := NewEgressNet()
		if err != nil {
			return nil, fmt.Errorf("egress: %w", err)
		}
		opts.Egress = e
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
		heard:      map[string]heard{},
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

	dp := opts.DataPlane
	dp.OnChange = func() { a.emit(&agentv1.Event{Kind: agentv1.Event_KIND_DATA_PLANE}) }
	a.dataPlane = dataplane.New(dp)

	a.rememberClients() // before the restored state's first Set
	st, problem := a.restore()
	if problem != "" {
		klog.ErrorS(nil, "Starting without the saved state", "problem", problem)
		a.startProblems = append(a.startProblems, problem)
	}
	if st != nil && problem != "" {
		// Only the saved term, to fence older leaders: nothing to answer.
		a.mu.Lock()
		a.state, a.checked = st, a.checkState(st)
		// Held, and not on disk: saved (replacing the older state there) once the directory
		// can be written, so that a restart then cannot resume the older state either.
		a.unsaved = fmt.Sprintf("state directory: the term %d, held alone, is not saved yet; the older state on disk is replaced once the directory can be written", st.GetTerm())
		a.mu.Unlock()
		klog.InfoS("Kept only the saved term", "term", st.GetTerm())
	} else if st != nil {
		a.applyMu.Lock()
		a.mu.Lock()
		a.state, a.checked, a.restored = st, a.checkState(st), true
		a.applyLocked(ctx)
		a.mu.Unlock()
		a.applyMu.Unlock()
		klog.InfoS("Resumed the saved state", "term", st.GetTerm(), "generation", st.GetGeneration(),
			"announcements", len(st.GetAnnouncements()), "refused", len(a.checked.refused))
		a.emit(&agentv1.Event{Kind: agentv1.Event_KIND_APPLIED, Generation: st.GetGeneration(), Detail: "restored from disk"})
	}
	if !a.restored {
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
// returned. A state directory that cannot be written keeps only the saved term (see below).
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
	if err == nil && st != nil {
		if werr := writable(a.opts.StateDir); werr != nil {
			// The saved state may be older than the one this node held last: states applied
			// while the disk could not be written are held in memory only. Answering from it
			// would answer VIPs that moved meanwhile beside their new owners (the soak's seed
			// 5: 3 s, until the CCM sent the current state). Without it, this node answers
			// nothing and sends no heartbeats: its peers count it dead and answer its VIPs
			// until the CCM sends a state. Only the term is kept, to fence older leaders.
			return &agentv1.DesiredState{Node: st.GetNode(), Term: max(st.GetTerm(), 1)}, fmt.Sprintf(
				"state directory: %v; the saved state (term %d, generation %d) may be older than the one last held and is not resumed: no announcements until the next Apply",
				werr, st.GetTerm(), st.GetGeneration())
		}
		return st, ""
	}
	if err == nil {
		return nil, ""
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
			a.restored, a.appliedBy = false, req.GetSender()
			return a.answerLocked(false), nil
		}
	}
	// A state that cannot be saved (a full or read-only disk) is applied all the same, and
	// said: failing the Apply would make the CCM count this node unreachable and move its
	// VIPs, for a fault that keeps none of them from being answered. A restart then resumes
	// the older state saved before, which the CCM replaces as after any absence.
	a.noteSaved(saveState(a.opts.StateDir, st), st)
	changed := cur == nil || !agentapi.SameContent(cur, st)
	// Kept, not copied (a copy was a tenth of an Apply of 5,000 VIPs): gRPC decodes each request
	// anew for the call, and nothing in the agent changes a state it holds.
	a.state, a.restored, a.startProblems, a.appliedBy = st, false, nil, req.GetSender()
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
		UnknownFields: slices.Clone(a.checked.unknown),
	}
}

func (a *Agent) problemsLocked() []string {
	out := slices.Concat(a.startProblems, a.problems, a.l2Problems)
	if a.egressProblem != "" {
		out = append(out, a.egressProblem)
	}
	if a.unsaved != "" {
		out = append(out, a.unsaved)
	}
	return out
}

// noteSaved records whether the state st, being applied, was saved (err nil) or not, and
// logs the change. The caller holds mu.
func (a *Agent) noteSaved(err error, st *agentv1.DesiredState) {
	if err == nil {
		if a.unsaved != "" {
			klog.InfoS("The state is saved again", "term", st.GetTerm(), "generation", st.GetGeneration())
		}
		a.unsaved = ""
		return
	}
	was := a.unsaved
	a.unsaved = fmt.Sprintf("state directory: the state (term %d, generation %d) is applied but could not be saved: %v; a restart would resume an older one", st.GetTerm(), st.GetGeneration(), err)
	if was == "" {
		klog.ErrorS(err, "Cannot save the state: applying it in memory only", "dir", a.opts.StateDir, "term", st.GetTerm(), "generation", st.GetGeneration())
	} else {
		klog.V(2).InfoS("Still cannot save the state", "err", err, "generation", st.GetGeneration())
	}
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
	routeAt := map[netip.Prefix]int{} // an aggregate's index in routes: its VIPs make one route
	for _, an := range a.checked.announcements {
		vip := an.vip
		view := &agentv1.AnnouncedVIP{Vip: vip.String(), Mode: an.GetMode()}
		views[vip] = view
		switch an.GetMode() {
		case agentv1.Mode_MODE_L2:
			ifaces := an.GetL2().GetInterfaces()
			if len(ifaces) == 0 {
				ifaces = a.opts.Interfaces
			}
			view.Interfaces = ifaces
			if v, ok := a.decideL2(an, view); ok {
				vips = append(vips, v)
			}
		case agentv1.Mode_MODE_BGP:
			view.Active, view.Reason = true, "advertised to BGP peers"
			r := bgp.Route{
				Prefix:           netip.PrefixFrom(vip, vip.BitLen()),
				Communities:      an.GetBgp().GetCommunities(),
				LargeCommunities: an.GetBgp().GetLargeCommunities(),
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
			if l := an.GetBgp().GetAggregateLength(); l != 0 {
				r.Prefix = netip.PrefixFrom(vip, int(l)).Masked()
				view.Reason += ", in the aggregate " + r.Prefix.String()
			}
			if i, ok := routeAt[r.Prefix]; ok {
				routes[i] = mergeRoutes(routes[i], r)
				continue
			}
			routeAt[r.Prefix] = len(routes)
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
	a.setEgressLocked()
	problems = append(problems, a.applyBGPLocked(ctx, st, routes, cp)...)
	a.dataPlane.SetPorts(a.checked.hcPorts)

	a.emitChanges(views)
	a.views, a.problems = views, problems
	for _, p := range slices.Concat(problems, a.l2Problems) {
		klog.ErrorS(nil, "Could not apply all of the state; retrying", "problem", p)
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

// Close withdraws every BGP route and closes the sessions (peers see the withdraws before the
// sessions end), then stops answering ARP and NDP. The saved state stays, so a restarted
// agent resumes.
// Restart stops the agent for a planned restart (a rolling update) that will be back within
// grace: its heartbeats and the CCM (an Event on its Watch streams) are told first, so that
// its peers keep counting it alive and the CCM does not count it unreachable for that long;
// the VIPs it answers wait for it instead of moving away and back. It then stops as Close
// does. A node that is draining hands over instead (its VIPs are leaving it: holding them
// for its return would delay that), as does an agent without grace or state.
func (a *Agent) Restart(ctx context.Context, grace time.Duration) error {
	a.mu.Lock()
	st, live := a.state, a.live
	a.mu.Unlock()
	if grace <= 0 || st == nil || st.GetDraining() {
		if st.GetDraining() {
			klog.InfoS("Draining: the VIPs move now, not held for the restart")
		}
		return a.Close(ctx)
	}
	grace = min(grace, failover.MaxRestartGrace)
	klog.InfoS("Planned restart: the peers and the CCM hold this node's VIPs for it", "grace", grace)
	a.mu.Lock()
	a.restartingUntil = time.Now().Add(grace)
	a.mu.Unlock()
	a.emit(&agentv1.Event{Kind: agentv1.Event_KIND_RESTARTING, RestartGraceMillis: uint32(grace.Milliseconds())})
	a.flushWatchers(ctx, restartFlush)
	if live != nil {
		live.Restarting(grace)
	}
	return a.close(ctx, true)
}

// restartFlush bounds how long Restart waits for its Event to leave for the watchers.
const restartFlush = 500 * time.Millisecond

// flushWatchers waits until every watcher has taken the events emitted so far, at most d.
func (a *Agent) flushWatchers(ctx context.Context, d time.Duration) {
	end := time.Now().Add(d)
	for time.Now().Before(end) && ctx.Err() == nil {
		a.watchMu.Lock()
		pending := 0
		for ch := range a.watchers {
			pending += len(ch)
		}
		a.watchMu.Unlock()
		if pending == 0 {
			return
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func (a *Agent) Close(ctx context.Context) error { return a.close(ctx, false) }

// close stops the agent; restart keeps its BGP routes at the peers that negotiated graceful
// restart (see bgp.Speaker.ShutdownForRestart) instead of withdrawing them.
func (a *Agent) close(ctx context.Context, restart bool) error {
	select {
	case <-a.stop:
		return nil
	default:
	}
	close(a.stop)
	<-a.done
	a.dataPlane.Close()
	if a.opts.ControlPlane != nil {
		a.opts.ControlPlane.close() // its heartbeats' callbacks take applyMu and mu
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.redecide != nil {
		a.redecide.Stop()
	}
	// A monitor's Close does not wait for a callback under way (which takes mu): closed
	// under mu, as every retired monitor is.
	var errs []error
	if a.live != nil {
		errs = append(errs, a.live.Close())
		a.live = nil
	}
	if a.bgp != nil {
		if restart {
			errs = append(errs, a.bgp.ShutdownForRestart(ctx))
		} else {
			errs = append(errs, a.bgp.Shutdown(ctx))
		}
		a.bgp = nil
	}
	if a.opts.L2 != nil {
		errs = append(errs, a.opts.L2.Close())
	}
	// The speaker has stopped: nothing answers with a virtual MAC any more.
	errs = append(errs, a.opts.MACFilter.Close())
	// Egress rules stay over a planned restart (the next run finds and replaces them): the
	// pods' connections keep their source meanwhile. Otherwise they go.
	if !restart {
		errs = append(errs, a.opts.Egress.Close())
	}
	return errors.Join(errs...)
}

// mergeRoutes is the one route of an aggregate that carries the VIPs of x and y: the
// communities of both, the higher LOCAL_PREF, the weights added, GRACEFUL_SHUTDOWN only
// while both have it (a node drains as a whole, so they do).
func mergeRoutes(x, y bgp.Route) bgp.Route {
	x.Communities = slices.Compact(slices.Sorted(slices.Values(append(slices.Clone(x.Communities), y.Communities...))))
	x.LargeCommunities = slices.Compact(slices.Sorted(slices.Values(append(slices.Clone(x.LargeCommunities), y.LargeCommunities...))))
	x.LocalPref = max(x.LocalPref, y.LocalPref)
	x.Weight = min(x.Weight+y.Weight, bgp.MaxWeight)
	x.GracefulShutdown = x.GracefulShutdown && y.GracefulShutdown
	return x
}
