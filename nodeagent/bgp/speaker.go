// Package bgp announces VIPs to BGP peers with an embedded gobgp v4 server: one server per
// agent process, dialing its peers (routers, top-of-rack switches), announcing each VIP as a
// /32 or /128 with this node as the next hop, and withdrawing it when asked or on Shutdown.
//
// It decides how the node speaks BGP: which sessions exist (SetPeers), which VIPs are
// announced on them (SetRoutes), with BFD for sub-second failure detection and a goodbye
// that withdraws before it closes. It does not decide which node announces which VIP (the
// planner does), and it must not touch the node's interfaces, addresses or kernel routes:
// the server never installs what it learns (no zebra), so a speaker only ever changes what
// its peers see.
package bgp

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"slices"
	"sync"
	"time"

	"github.com/go-logr/logr"
	api "github.com/osrg/gobgp/v4/api"
	"github.com/osrg/gobgp/v4/pkg/apiutil"
	"github.com/osrg/gobgp/v4/pkg/config/oc"
	"github.com/osrg/gobgp/v4/pkg/packet/bgp"
	"github.com/osrg/gobgp/v4/pkg/server"
	"k8s.io/klog/v2"
)

// SessionState is the state of one peer's session.
type SessionState struct {
	// Peer is the peer's address; for an unnumbered peer fe80:: zoned with Interface.
	Peer netip.Addr
	// Interface is an unnumbered peer's interface (Peer.Interface), "" for the others.
	Interface string
	// State is the BGP FSM state: Idle, Connect, Active, OpenSent, OpenConfirm or Established.
	State string
	// BFDState is Up, Down, Init or AdminDown; empty when BFD is off for the peer.
	BFDState string
	// Since is when State last changed.
	Since time.Time
	// LastError says why the session last went down or failed to come up (a notification,
	// a hold timer, BFD); empty if it never did.
	LastError string
	// RoutesAdvertised is how many routes the session sends the peer now (0 unless
	// Established).
	RoutesAdvertised uint64
}

// Established reports whether the session is up.
func (s SessionState) Established() bool { return s.State == stateEstablished }

const stateEstablished = "Established"

// Speaker is one embedded BGP speaker. Its methods may be called from any goroutine.
type Speaker struct {
	cfg       Config
	server    *server.BgpServer
	serveDone chan struct{}
	stopWatch context.CancelFunc

	mu       sync.Mutex // serializes SetPeers, SetRoutes, Shutdown and BFD arming; guards the fields below
	peers    map[netip.Addr]Peer
	routes   map[netip.Prefix]route
	bfdArmed map[netip.Addr]bool // peers whose BFD runs in gobgp now (see bfdLoop)
	closed   bool
	// restarting: the peers SetPeers adds first are told this speaker restarts
	// (Config.Restarting); peers added after are new.
	restarting bool
	// started is when New ran; deferred holds the peers whose first session waits for the
	// router's BFD session of the previous process to end (see deferFirstSession).
	started  time.Time
	deferred map[netip.Addr]deferredPeer
	// solicited is when the neighbours of each unnumbered peer's link whose session is down
	// were last solicited (see solicitNeighbours).
	solicited map[netip.Addr]time.Time

	bfdKick chan struct{}
	stopBFD context.CancelFunc
	bfdDone chan struct{}

	stateMu  sync.Mutex // guards sessions and handlers
	sessions map[netip.Addr]*session
	handlers []func(SessionState)
}

// session is what the speaker knows of one configured peer's session.
type session struct {
	SessionState
	bfd bool // BFD configured
}

// New starts a speaker with no peers and no routes. Shutdown stops it.
func New(ctx context.Context, cfg Config) (*Speaker, error) {
	if err := cfg.validate(); err != nil {
		return nil, fmt.Errorf("bgp config: %w", err)
	}
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("start bgp speaker: %w", err)
	}
	if cfg.ListenPort == 0 {
		cfg.ListenPort = -1
	}
	logger := cfg.Logger
	if logger == nil {
		// gobgp's Info (every FSM step) at V(2); its warnings stay visible.
		logger = slog.New(logr.ToSlogHandler(klog.Background().WithName("gobgp").V(2)))
	}
	s := &Speaker{
		cfg:        cfg,
		restarting: cfg.Restarting,
		started:    time.Now(),
		deferred:   map[netip.Addr]deferredPeer{},
		solicited:  map[netip.Addr]time.Time{},
		server:     server.NewBgpServer(server.LoggerOption(logger, nil)),
		serveDone:  make(chan struct{}),
		peers:      map[netip.Addr]Peer{},
		routes:     map[netip.Prefix]route{},
		bfdArmed:   map[netip.Addr]bool{},
		bfdKick:    make(chan struct{}, 1),
		bfdDone:    make(chan struct{}),
		sessions:   map[netip.Addr]*session{},
	}
	go func() {
		defer close(s.serveDone)
		s.server.Serve()
	}()

	global := &api.Global{
		Asn:        cfg.ASN,
		RouterId:   cfg.RouterID.String(),
		ListenPort: cfg.ListenPort,
		Families: []uint32{
			uint32(oc.AfiSafiTypeToIntMap[oc.AFI_SAFI_TYPE_IPV4_UNICAST]),
			uint32(oc.AfiSafiTypeToIntMap[oc.AFI_SAFI_TYPE_IPV6_UNICAST]),
		},
	}
	for _, a := range cfg.ListenAddresses {
		global.ListenAddresses = append(global.ListenAddresses, a.String())
	}
	if err := s.server.StartBgp(ctx, &api.StartBgpRequest{Global: global}); err != nil {
		s.server.Stop()
		<-s.serveDone
		return nil, fmt.Errorf("start bgp speaker (AS %d, router ID %s, port %d): %w", cfg.ASN, cfg.RouterID, cfg.ListenPort, err)
	}
	watchCtx, cancel := context.WithCancel(context.Background())
	s.stopWatch = cancel
	if err := s.server.WatchEvent(watchCtx, server.WatchEventMessageCallbacks{OnPeerUpdate: s.onPeerEvent}, server.WatchPeer()); err != nil {
		cancel()
		s.server.Stop()
		<-s.serveDone
		return nil, fmt.Errorf("watch bgp sessions: %w", err)
	}
	bfdCtx, stopBFD := context.WithCancel(context.Background())
	s.stopBFD = stopBFD
	go s.bfdLoop(bfdCtx)
	return s, nil
}

// OnSessionChange registers f to be called on every state change of every session (for
// example Active, OpenSent, Established, then Idle when it drops). Calls come from one
// goroutine, in order; f must not block.
func (s *Speaker) OnSessionChange(f func(SessionState)) {
	s.stateMu.Lock()
	defer s.stateMu.Unlock()
	s.handlers = append(s.handlers, f)
}

// Sessions returns the state of every configured peer's session, by address.
func (s *Speaker) Sessions() []SessionState {
	running := s.bfdStates()
	advertised := s.advertised()
	s.stateMu.Lock()
	out := make([]SessionState, 0, len(s.sessions))
	for addr, st := range s.sessions {
		ss := st.SessionState
		ss.BFDState = bfdStateOf(st.bfd, running, addr)
		if ss.Established() {
			ss.RoutesAdvertised = advertised[addr]
		}
		out = append(out, ss)
	}
	s.stateMu.Unlock()
	slices.SortFunc(out, func(a, b SessionState) int { return a.Peer.Compare(b.Peer) })
	return out
}

// Shutdown says goodbye: it withdraws every route and waits (briefly) until the withdrawals
// are on the wire, then closes every session with a Cease notification and stops the
// server. It returns early with ctx's error if ctx ends first; the server then finishes
// stopping in the background. Later calls return nil.
func (s *Speaker) Shutdown(ctx context.Context) error { return s.shutdown(ctx, false) }

// ShutdownForRestart stops the speaker for a planned restart of the agent (RFC 4724): it
// withdraws nothing, and closes the session of every peer that negotiated graceful restart
// without a notification, so that the peer keeps this node's routes (stale) for the restart
// time we advertised and keeps forwarding; the restarted agent announces them again and
// its End-of-RIB clears what it no longer announces. Peers without graceful restart get the
// Cease notification and drop the routes at once, as with Shutdown. A crash (no call at all)
// is left to the peers' BFD and hold timers.
//
// The BFD sessions stop with the BGP ones. The router's BFD session expires one detection
// time later, while the BGP session is down already (graceful restart keeps the routes); the
// restarted speaker holds its first session back until then (see deferFirstSession).
func (s *Speaker) ShutdownForRestart(ctx context.Context) error { return s.shutdown(ctx, true) }

func (s *Speaker) shutdown(ctx context.Context, restart bool) error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	s.closed = true
	var errs []error
	if len(s.routes) > 0 && !restart {
		if err := s.withdrawAll(ctx); err != nil {
			errs = append(errs, err)
		}
	}
	s.mu.Unlock()

	s.stopBFD()
	<-s.bfdDone // it only waits for s.mu or a gobgp call
	s.stopWatch()
	stopped := make(chan struct{})
	go func() {
		defer close(stopped)
		if restart {
			// No notification to a peer that negotiated graceful restart: it keeps the
			// routes. Stop below then finds the BGP side stopped (and says so in its log at
			// error level, which is why it is skipped: the BFD server's goroutine and socket
			// go with the process, which a planned restart ends next).
			if err := s.server.StopBgp(context.Background(), &api.StopBgpRequest{AllowGracefulRestart: true}); err != nil {
				klog.ErrorS(err, "Stopping the BGP speaker for a restart")
			}
		} else {
			s.server.Stop() // Cease (peer de-configured) to every peer, then stop
		}
		<-s.serveDone
	}()
	select {
	case <-stopped:
	case <-ctx.Done():
		errs = append(errs, fmt.Errorf("stop bgp server: %w", ctx.Err()))
	}
	return errors.Join(errs...)
}

// withdrawWait bounds how long Shutdown waits for withdrawals to be sent before closing
// the sessions (which makes peers drop the routes anyway).
const withdrawWait = 2 * time.Second

// withdrawAll withdraws every route and waits until each established session that carried
// some has sent an UPDATE since. Only the wait heeds ctx: the withdrawal itself is quick
// and worth making even when the caller is out of time.
func (s *Speaker) withdrawAll(ctx context.Context) error {
	var v4, v6 bool
	for p := range s.routes {
		v4 = v4 || p.Addr().Is4()
		v6 = v6 || p.Addr().Is6()
	}
	carries := func(a peerKey) bool { return interfaceOf(a) != "" || a.Is4() && v4 || a.Is6() && v6 }
	before, err := s.sentUpdates(context.WithoutCancel(ctx))
	if err != nil {
		return err
	}
	if err := s.server.DeletePath(apiutil.DeletePathRequest{DeleteAll: true}); err != nil {
		return fmt.Errorf("withdraw all routes: %w", err)
	}
	s.routes = map[netip.Prefix]route{}

	ctx, cancel := context.WithTimeout(ctx, withdrawWait)
	defer cancel()
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	for {
		now, err := s.sentUpdates(context.WithoutCancel(ctx))
		if err != nil {
			return err
		}
		pending := 0
		for a, n := range before {
			if m, up := now[a]; up && m <= n && carries(a) {
				pending++
			}
		}
		if pending == 0 {
			return nil
		}
		select {
		case <-ctx.Done():
			if errors.Is(ctx.Err(), context.DeadlineExceeded) {
				klog.InfoS("BGP withdrawals not confirmed sent before closing the sessions", "pending", pending)
				return nil
			}
			return fmt.Errorf("wait for withdrawals: %w", ctx.Err())
		case <-tick.C:
		}
	}
}

// sentUpdates returns, for each established session, how many UPDATEs it has sent.
func (s *Speaker) sentUpdates(ctx context.Context) (map[netip.Addr]uint64, error) {
	out := map[netip.Addr]uint64{}
	err := s.server.ListPeer(ctx, &api.ListPeerRequest{}, func(p *api.Peer) {
		st := p.GetState()
		if st.GetSessionState() != api.PeerState_SESSION_STATE_ESTABLISHED {
			return
		}
		if a, err := netip.ParseAddr(st.GetNeighborAddress()); err == nil {
			out[keyOfNeighbor(a)] = st.GetMessages().GetSent().GetUpdate()
		}
	})
	if err != nil {
		return nil, fmt.Errorf("list bgp peers: %w", err)
	}
	return out, nil
}

// advertised returns, by peer, how many routes gobgp sends it now (its Adj-RIB-Out).
func (s *Speaker) advertised() map[netip.Addr]uint64 {
	out := map[netip.Addr]uint64{}
	_ = s.server.ListPeer(context.Background(), &api.ListPeerRequest{EnableAdvertised: true}, func(p *api.Peer) {
		a, err := netip.ParseAddr(p.GetState().GetNeighborAddress())
		if err != nil {
			return
		}
		for _, af := range p.GetAfiSafis() {
			out[keyOfNeighbor(a)] += af.GetState().GetAdvertised()
		}
	})
	return out
}

// onPeerEvent runs on gobgp's watcher goroutine.
func (s *Speaker) onPeerEvent(ev *apiutil.WatchEventMessage_PeerEvent, at time.Time) {
	if ev.Type != apiutil.PEER_EVENT_STATE {
		return
	}
	ps := ev.Peer.State
	key := keyOfNeighbor(ps.NeighborAddress)
	st := SessionState{Peer: key, Interface: interfaceOf(key), State: fsmStateName(ps.SessionState), Since: at}
	running := s.bfdStates()
	if failure(ps.DisconnectReason) {
		st.LastError = ps.DisconnectMessage
		if st.LastError == "" {
			st.LastError = ps.DisconnectReason.String()
		}
	}
	s.stateMu.Lock()
	if cur, ok := s.sessions[st.Peer]; ok {
		st.BFDState = bfdStateOf(cur.bfd, running, st.Peer)
		switch {
		case st.LastError == "":
			st.LastError = cur.LastError
		case cur.Established() && running[st.Peer] == "Down":
			// gobgp resets the session itself when BFD fails; say so.
			st.LastError = "BFD down: " + st.LastError
		}
		cur.SessionState = st
	} else {
		st.BFDState = running[st.Peer]
	}
	handlers := slices.Clone(s.handlers)
	s.stateMu.Unlock()
	s.kickBFD()
	if st.Established() || failure(ps.DisconnectReason) {
		klog.InfoS("BGP session", "peer", ps.NeighborAddress, "state", st.State, "bfd", st.BFDState, "lastError", st.LastError)
	} else {
		klog.V(2).InfoS("BGP session", "peer", ps.NeighborAddress, "state", st.State)
	}
	for _, h := range handlers {
		h(st)
	}
}

// failure reports whether a session left a state because something went wrong (rather
// than because a timer moved it on or we removed the peer).
func failure(r api.PeerState_DisconnectReason) bool {
	switch r {
	case api.PeerState_DISCONNECT_REASON_UNSPECIFIED,
		api.PeerState_DISCONNECT_REASON_IDLE_TIMER_EXPIRED,
		api.PeerState_DISCONNECT_REASON_DECONFIGURED,
		api.PeerState_DISCONNECT_REASON_GRACEFUL_RESTART:
		return false
	}
	return true
}

func (s *Speaker) bfdStates() map[netip.Addr]string {
	out := map[netip.Addr]string{}
	s.server.ListBfdPeer(context.Background(), func(addr string, st *api.BfdPeerState) {
		if a, err := netip.ParseAddr(addr); err == nil {
			out[keyOfNeighbor(a)] = bfdStateName(st.GetSessionState())
		}
	})
	return out
}

func fsmStateName(s bgp.FSMState) string {
	switch s {
	case bgp.BGP_FSM_IDLE:
		return "Idle"
	case bgp.BGP_FSM_CONNECT:
		return "Connect"
	case bgp.BGP_FSM_ACTIVE:
		return "Active"
	case bgp.BGP_FSM_OPENSENT:
		return "OpenSent"
	case bgp.BGP_FSM_OPENCONFIRM:
		return "OpenConfirm"
	case bgp.BGP_FSM_ESTABLISHED:
		return stateEstablished
	}
	return fmt.Sprintf("Unknown(%d)", int(s))
}

func bfdStateName(s api.BfdSessionState) string {
	switch s {
	case api.BfdSessionState_BFD_SESSION_STATE_UP:
		return "Up"
	case api.BfdSessionState_BFD_SESSION_STATE_DOWN:
		return "Down"
	case api.BfdSessionState_BFD_SESSION_STATE_INIT:
		return "Init"
	case api.BfdSessionState_BFD_SESSION_STATE_ADMIN_DOWN:
		return "AdminDown"
	}
	return ""
}
