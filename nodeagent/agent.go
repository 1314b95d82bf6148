// Package nodeagent is metalvip-agent: it takes the desired state of its node from the CCM
// (the gRPC contract in proto/metalvip/agent/v1), keeps it on disk, and drives the speakers
// that put it on the wire (l2 for ARP/NDP, bgp for BGP). It decides which of the L2 VIPs it
// answers for from the ranked candidates it is given; it holds no Kubernetes credentials and
// decides nothing about which VIPs exist.
package nodeagent

import (
	"context"
	"errors"
	"fmt"
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
	// StateDir holds the last applied state, so that a restart resumes announcing.
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
}

// Liveness is the seam to the heartbeat exchange.
type Liveness interface {
	SetKeys([][]byte)
	SetPeers([]failover.Peer)
	Alive(node string) bool
	Sees(node string) bool
	Close() error
}

// Agent applies desired states. It implements agentv1.AgentServiceServer.
type Agent struct {
	agentv1.UnimplementedAgentServiceServer
	opts Options

	mu       sync.Mutex
	state    *agentv1.DesiredState // the last accepted state; nil before the first
	restored bool
	problems []string
	views    map[netip.Addr]*agentv1.AnnouncedVIP // what each VIP is to this node now
	bgp      BGP
	bgpCfg   bgp.Config
	live     Liveness
	liveCfg  failover.Config

	watchMu  sync.Mutex
	watchers map[chan *agentv1.Event]struct{}

	stop chan struct{}
	done chan struct{}
}

var _ agentv1.AgentServiceServer = (*Agent)(nil)

// New returns an agent, resuming the state in StateDir if there is one.
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
	a := &Agent{
		opts:     opts,
		views:    map[netip.Addr]*agentv1.AnnouncedVIP{},
		watchers: map[chan *agentv1.Event]struct{}{},
		stop:     make(chan struct{}),
		done:     make(chan struct{}),
	}
	st, err := loadState(opts.StateDir)
	if err != nil {
		return nil, err
	}
	a.rememberClients() // before the restored state's first Set
	if st != nil {
		if err := validate(st, opts.Node); err != nil {
			klog.ErrorS(err, "Ignoring the saved state: it does not validate", "dir", opts.StateDir)
		} else {
			a.mu.Lock()
			a.state, a.restored = st, true
			a.applyLocked(ctx)
			a.mu.Unlock()
			klog.InfoS("Resumed the saved state", "term", st.GetTerm(), "generation", st.GetGeneration(), "announcements", len(st.GetAnnouncements()))
			a.emit(&agentv1.Event{Kind: agentv1.Event_KIND_APPLIED, Generation: st.GetGeneration(), Detail: "restored from disk"})
		}
	}
	go a.retryLoop()
	return a, nil
}

// Apply accepts a desired state; see the contract in agent.proto.
func (a *Agent) Apply(ctx context.Context, req *agentv1.ApplyRequest) (*agentv1.ApplyResponse, error) {
	st := req.GetState()
	if st == nil {
		return nil, status.Error(codes.InvalidArgument, "state: missing")
	}
	if err := validate(st, a.opts.Node); err != nil {
		return nil, status.Error(codes.InvalidArgument, err.Error())
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	cur := a.state
	if cur != nil {
		if st.GetTerm() < cur.GetTerm() {
			return nil, status.Errorf(codes.FailedPrecondition,
				"term %d is older than the accepted term %d: another leader is in charge", st.GetTerm(), cur.GetTerm())
		}
		if st.GetTerm() == cur.GetTerm() && st.GetGeneration() <= cur.GetGeneration() {
			// Idempotent: the generation (or a newer one) is applied already. The leader is
			// in touch, so the state is no longer only the one restored from disk.
			a.restored = false
			return &agentv1.ApplyResponse{Term: cur.GetTerm(), Generation: cur.GetGeneration(), Problems: slices.Clone(a.problems)}, nil
		}
	}
	if err := saveState(a.opts.StateDir, st); err != nil {
		return nil, status.Errorf(codes.Internal, "persist the state: %v", err)
	}
	changed := cur == nil || !sameContent(cur, st)
	a.state, a.restored = proto.Clone(st).(*agentv1.DesiredState), false
	if changed {
		a.applyLocked(ctx)
	}
	klog.V(2).InfoS("Applied state", "term", st.GetTerm(), "generation", st.GetGeneration(), "changed", changed, "problems", len(a.problems))
	a.emit(&agentv1.Event{Kind: agentv1.Event_KIND_APPLIED, Generation: st.GetGeneration()})
	return &agentv1.ApplyResponse{Term: st.GetTerm(), Generation: st.GetGeneration(), Changed: changed, Problems: slices.Clone(a.problems)}, nil
}

// sameContent compares two states without their term and generation.
func sameContent(x, y *agentv1.DesiredState) bool {
	x, y = proto.Clone(x).(*agentv1.DesiredState), proto.Clone(y).(*agentv1.DesiredState)
	x.Term, x.Generation, y.Term, y.Generation = 0, 0, 0, 0
	return proto.Equal(x, y)
}

// applyLocked drives the speakers to a.state. The caller holds mu.
func (a *Agent) applyLocked(ctx context.Context) {
	st := a.state
	var problems []string
	views := map[netip.Addr]*agentv1.AnnouncedVIP{}
	if err := a.applyLivenessLocked(st); err != nil {
		problems = append(problems, "failover: "+err.Error())
	}

	var vips []l2.VIP
	var routes []bgp.Route
	for _, an := range st.GetAnnouncements() {
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
			routes = append(routes, bgp.Route{
				Prefix:      netip.PrefixFrom(vip, vip.BitLen()),
				Communities: an.GetBgp().GetCommunities(),
				LocalPref:   an.GetBgp().GetLocalPref(),
			})
		}
	}
	if a.opts.L2 != nil {
		a.opts.L2.SetRefresh(time.Duration(st.GetL2().GetGratuitousRefreshSeconds()) * time.Second)
		if err := a.opts.L2.Set(vips); err != nil {
			problems = append(problems, "L2: "+err.Error())
		}
	}
	if err := a.applyBGPLocked(ctx, st, routes); err != nil {
		problems = append(problems, "BGP: "+err.Error())
	}

	a.emitChanges(views)
	a.views, a.problems = views, problems
	for _, p := range problems {
		klog.ErrorS(nil, "Could not apply all of the state; retrying", "problem", p)
	}
}

// emitChanges emits events for what changed hands on this node. The caller holds mu.
func (a *Agent) emitChanges(views map[netip.Addr]*agentv1.AnnouncedVIP) {
	for vip, v := range views {
		old := a.views[vip]
		if v.Active && (old == nil || !old.Active) {
			a.emit(&agentv1.Event{Kind: agentv1.Event_KIND_TOOK_OVER, Vip: vip.String(), Detail: v.Reason})
		}
		if !v.Active && old != nil && old.Active {
			a.emit(&agentv1.Event{Kind: agentv1.Event_KIND_RELEASED, Vip: vip.String(), Detail: v.Reason})
		}
	}
	for vip, old := range a.views {
		if _, still := views[vip]; !still && old.Active {
			a.emit(&agentv1.Event{Kind: agentv1.Event_KIND_RELEASED, Vip: vip.String(), Detail: "no longer announced"})
		}
	}
}

// decideL2 decides this node's part in an L2 VIP, writes it into view, and returns what the
// speaker should answer for, if anything. The caller holds mu.
func (a *Agent) decideL2(vip netip.Addr, an *agentv1.L2Announcement, view *agentv1.AnnouncedVIP) (l2.VIP, bool) {
	view.Sharing = nil
	if !an.GetPerClient() {
		view.Active, view.Reason = a.owns(an.GetCandidates())
		return l2.VIP{Addr: vip, Interfaces: view.Interfaces}, view.Active
	}
	var members, others []string
	for _, c := range an.GetCandidates() {
		switch {
		case c.GetNode() == a.opts.Node:
			members = append(members, c.GetNode())
		case a.live == nil || a.live.Alive(c.GetNode()):
			members = append(members, c.GetNode())
			others = append(others, c.GetNode())
		}
	}
	if !slices.Contains(members, a.opts.Node) {
		view.Active, view.Reason = false, "not a candidate"
		return l2.VIP{}, false
	}
	slices.Sort(members)
	view.Active, view.Sharing = true, members
	if len(others) == 0 {
		view.Reason = "answers every client: no other candidate is alive"
	} else {
		view.Reason = "answers its share of clients with " + strings.Join(others, ", ")
	}
	return l2.VIP{Addr: vip, Interfaces: view.Interfaces, Share: &l2.Share{Self: a.opts.Node, Members: members}}, true
}

// owns decides whether this node answers for an L2 VIP with the given ranked candidates:
//   - a live candidate ranked higher than this node answers, not this one;
//   - otherwise this node answers, once every live lower-ranked candidate shows (in its
//     heartbeats) that it sees this node: such a candidate stops answering as soon as it sees
//     a higher one, before its heartbeats show it, so two nodes never answer at once beyond
//     the time a heartbeat takes;
//   - without heartbeats (no keys), the first candidate answers.
//
// The caller holds mu.
func (a *Agent) owns(cands []*agentv1.Candidate) (bool, string) {
	me := slices.IndexFunc(cands, func(c *agentv1.Candidate) bool { return c.GetNode() == a.opts.Node })
	if a.live == nil {
		if me == 0 {
			return true, "first candidate"
		}
		return false, "standby for " + cands[0].GetNode()
	}
	for _, c := range cands[:max(me, 0)] {
		if a.live.Alive(c.GetNode()) {
			return false, "standby: " + c.GetNode() + " is alive and ranks higher"
		}
	}
	if me < 0 {
		return false, "not a candidate"
	}
	for _, c := range cands[me+1:] {
		if a.live.Alive(c.GetNode()) && !a.live.Sees(c.GetNode()) {
			return false, "taking over: waiting for " + c.GetNode() + " to release"
		}
	}
	if me == 0 {
		return true, "first candidate"
	}
	return true, "first live candidate: higher-ranked candidates are down"
}

// livenessChanged re-decides every L2 VIP when the set of live candidates changes. It runs
// before this node's heartbeats show the change (see failover.Config.OnChange).
func (a *Agent) livenessChanged() {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.state == nil {
		return
	}
	views := map[netip.Addr]*agentv1.AnnouncedVIP{}
	var vips []l2.VIP
	for vip, v := range a.views {
		views[vip] = proto.Clone(v).(*agentv1.AnnouncedVIP)
	}
	for _, an := range a.state.GetAnnouncements() {
		if an.GetMode() != agentv1.Mode_MODE_L2 {
			continue
		}
		vip, _ := netip.ParseAddr(an.GetVip())
		v := views[vip]
		if v == nil {
			continue
		}
		if l, ok := a.decideL2(vip, an.GetL2(), v); ok {
			vips = append(vips, l)
		}
	}
	if a.opts.L2 != nil {
		if err := a.opts.L2.Set(vips); err != nil {
			klog.ErrorS(err, "L2 after a liveness change")
		}
	}
	a.emitChanges(views)
	a.views = views
}

// applyLivenessLocked configures the heartbeat exchange for the state: the peers are every
// other candidate of this node's L2 VIPs, at the addresses the state gives. The caller holds
// mu.
func (a *Agent) applyLivenessLocked(st *agentv1.DesiredState) error {
	opts := st.GetL2()
	keys := opts.GetHeartbeatKeys()
	var self netip.Addr
	peers := map[string]netip.Addr{}
	for _, an := range st.GetAnnouncements() {
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
				self = addr
			} else if addr.IsValid() {
				peers[c.GetNode()] = addr
			}
		}
	}
	if len(keys) == 0 || len(peers) == 0 {
		if a.live != nil {
			_ = a.live.Close() // no one to watch: the first candidate rule applies
			a.live = nil
		}
		return nil
	}
	if !self.IsValid() {
		return errors.New("no data-plane address for this node among the candidates")
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
		OnChange: a.livenessChanged,
	}
	if a.live != nil && (a.liveCfg.Listen != cfg.Listen || a.liveCfg.Interval != cfg.Interval || a.liveCfg.Misses != cfg.Misses) {
		_ = a.live.Close()
		a.live = nil
	}
	if a.live == nil {
		l, err := a.opts.NewLiveness(cfg)
		if err != nil {
			return err
		}
		a.live, a.liveCfg = l, cfg
	}
	a.live.SetKeys(keys)
	list := make([]failover.Peer, 0, len(peers))
	for n, addr := range peers {
		list = append(list, failover.Peer{Node: n, Addr: addr})
	}
	a.live.SetPeers(list)
	return nil
}

func (a *Agent) applyBGPLocked(ctx context.Context, st *agentv1.DesiredState, routes []bgp.Route) error {
	peers, err := bgpPeers(st)
	if err != nil {
		return err
	}
	if len(peers) == 0 && len(routes) == 0 && a.bgp == nil {
		return nil
	}
	cfg := bgp.Config{ASN: st.GetBgp().GetAsn(), RouterID: a.opts.RouterID, ListenPort: -1}
	if id := st.GetBgp().GetRouterId(); id != "" {
		cfg.RouterID, _ = netip.ParseAddr(id)
	}
	if a.bgp != nil && (a.bgpCfg.ASN != cfg.ASN || a.bgpCfg.RouterID != cfg.RouterID) {
		// Global settings cannot change under a running server: restart it.
		_ = a.bgp.Shutdown(ctx)
		a.bgp = nil
	}
	if a.bgp == nil {
		if a.opts.NewBGP == nil {
			return errors.New("this agent has no BGP speaker")
		}
		if cfg.ASN == 0 {
			return errors.New("bgp.asn is not set")
		}
		s, err := a.opts.NewBGP(ctx, cfg)
		if err != nil {
			return fmt.Errorf("start the BGP speaker: %w", err)
		}
		s.OnSessionChange(a.sessionChanged)
		a.bgp, a.bgpCfg = s, cfg
	}
	if err := a.bgp.SetPeers(ctx, peers); err != nil {
		return err
	}
	return a.bgp.SetRoutes(ctx, routes)
}

func bgpPeers(st *agentv1.DesiredState) ([]bgp.Peer, error) {
	var out []bgp.Peer
	for _, p := range st.GetBgpPeers() {
		addr, err := netip.ParseAddr(p.GetAddress())
		if err != nil {
			return nil, fmt.Errorf("peer %q: not an IP address", p.GetAddress())
		}
		out = append(out, bgp.Peer{
			Address:         addr,
			Port:            uint16(p.GetPort()),
			PeerASN:         p.GetPeerAsn(),
			LocalASN:        p.GetLocalAsn(),
			HoldTime:        time.Duration(p.GetHoldTimeSeconds()) * time.Second,
			Keepalive:       time.Duration(p.GetKeepaliveSeconds()) * time.Second,
			Password:        p.GetPassword(),
			MultihopTTL:     uint8(p.GetEbgpMultihopTtl()),
			GracefulRestart: p.GetGracefulRestart(),
			BFD: bgp.BFD{
				Enabled:    p.GetBfd().GetEnabled(),
				MinRx:      time.Duration(p.GetBfd().GetMinRxMs()) * time.Millisecond,
				MinTx:      time.Duration(p.GetBfd().GetMinTxMs()) * time.Millisecond,
				Multiplier: p.GetBfd().GetMultiplier(),
			},
		})
	}
	return out, nil
}

func (a *Agent) sessionChanged(s bgp.SessionState) {
	kind := agentv1.Event_KIND_SESSION_DOWN
	if s.Established() {
		kind = agentv1.Event_KIND_SESSION_UP
	}
	a.emit(&agentv1.Event{Kind: kind, Peer: s.Peer.String(), Detail: strings.TrimSpace(s.State + " " + s.LastError)})
}

// GetState reports what the agent applied and does now.
func (a *Agent) GetState(context.Context, *agentv1.GetStateRequest) (*agentv1.GetStateResponse, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	resp := &agentv1.GetStateResponse{
		Node:       a.opts.Node,
		Term:       a.state.GetTerm(),
		Generation: a.state.GetGeneration(),
		Restored:   a.restored,
		Problems:   slices.Clone(a.problems),
	}
	if a.state != nil {
		resp.State = proto.Clone(a.state).(*agentv1.DesiredState)
		if resp.State.L2 != nil {
			resp.State.L2.HeartbeatKeys = nil // secrets stay in the agent
		}
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
			})
		}
	}
	if a.opts.L2 != nil {
		c := a.opts.L2.Counters()
		resp.L2 = &agentv1.L2Counters{
			ArpRequests: c.ARPRequests, ArpReplies: c.ARPReplies, GratuitousArps: c.GratuitousARPs,
			NeighborSolicitations: c.NeighborSolicitations, NeighborAdvertisements: c.NeighborAdvertisements,
			UnsolicitedAdvertisements: c.UnsolicitedAdvertisements, TargetedReplies: c.TargetedReplies,
		}
	}
	return resp, nil
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

func (a *Agent) retryLoop() {
	defer close(a.done)
	t := time.NewTicker(a.opts.RetryInterval)
	defer t.Stop()
	saveClients := time.NewTicker(clientsSaveInterval)
	defer saveClients.Stop()
	var savedClients uint64
	for {
		select {
		case <-a.stop:
			return
		case <-saveClients.C:
			savedClients = a.saveClientsIfChanged(savedClients)
		case <-t.C:
			a.mu.Lock()
			if a.state != nil && len(a.problems) > 0 {
				ctx, cancel := context.WithTimeout(context.Background(), a.opts.RetryInterval)
				a.applyLocked(ctx)
				cancel()
			}
			a.mu.Unlock()
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
	return errors.Join(errs...)
}
