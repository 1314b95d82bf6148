package bgp

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"time"

	api "github.com/osrg/gobgp/v4/api"
	"github.com/osrg/gobgp/v4/pkg/packet/bgp"
	"k8s.io/klog/v2"
)

// SetPeers makes the speaker's sessions exactly peers: it adds new peers, restarts the
// session of a peer whose configuration changed, and closes (Cease) the sessions of peers
// no longer listed. Invalid input changes nothing. If gobgp refuses some changes the others
// still apply, the error lists the refused ones and the next call retries them.
func (s *Speaker) SetPeers(ctx context.Context, peers []Peer) error {
	want, err := normalizePeers(s.cfg, peers)
	if err != nil {
		return fmt.Errorf("set bgp peers: %w", err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return ErrShutdown
	}
	var errs []error
	for _, addr := range sortedKeys(s.peers) {
		if w, keep := want[addr]; keep && w == s.peers[addr] {
			continue
		}
		if err := ctx.Err(); err != nil {
			return errors.Join(append(errs, fmt.Errorf("set bgp peers: %w", err))...)
		}
		if _, waiting := s.deferred[addr]; waiting {
			delete(s.deferred, addr) // gobgp never had it
		} else if err := s.deletePeer(ctx, addr); err != nil {
			errs = append(errs, fmt.Errorf("delete bgp peer %s: %w", s.peers[addr].Name(), err))
			continue
		}
		delete(s.peers, addr)
		delete(s.bfdArmed, addr)
		delete(s.solicited, addr)
		s.stateMu.Lock()
		delete(s.sessions, addr)
		s.stateMu.Unlock()
	}
	for _, addr := range sortedKeys(want) {
		if _, ok := s.peers[addr]; ok {
			continue
		}
		if err := ctx.Err(); err != nil {
			return errors.Join(append(errs, fmt.Errorf("set bgp peers: %w", err))...)
		}
		p := want[addr]
		// Track the session before gobgp can report on it.
		s.stateMu.Lock()
		s.sessions[addr] = &session{SessionState: SessionState{Peer: addr, Interface: p.Interface, State: "Idle", Since: time.Now()}, bfd: p.BFD.Enabled}
		s.stateMu.Unlock()
		if until, ok := s.deferFirstSession(p); ok {
			s.deferred[addr] = deferredPeer{until: until, restarting: s.restarting}
			s.peers[addr] = p
			klog.V(2).InfoS("BGP session deferred until the router's BFD session of the previous process has ended", "peer", p.Name(), "until", until)
			s.kickBFD()
			continue
		}
		if p.Interface != "" {
			// Unnumbered: gobgp takes the peer only once the link's neighbour is in the
			// kernel's table. Solicit it and let bfdLoop add the peer when it is.
			solicitNeighbours(p.Interface)
			s.deferred[addr] = deferredPeer{until: time.Now().Add(unnumberedResolve), restarting: s.restarting}
			s.peers[addr] = p
			s.kickBFD()
			continue
		}
		if err := s.addPeer(ctx, p, s.restarting); err != nil {
			s.stateMu.Lock()
			delete(s.sessions, addr)
			s.stateMu.Unlock()
			errs = append(errs, err)
			continue
		}
		s.peers[addr] = p
	}
	s.restarting = false
	return errors.Join(errs...)
}

// deferredPeer is a peer whose first session waits (Speaker.deferred).
type deferredPeer struct {
	until      time.Time
	restarting bool // it is told this speaker restarts when it is added
}

// deferFirstSession says whether p's first session must wait, and until when: a speaker
// started from a saved state (an agent's restart) with graceful restart and BFD towards p.
// The router still runs the BFD session of the previous process until its detection time
// ends (our multiplier times the slower of our intervals, when the router's receive
// interval is not slower), counted from when that process stopped, which was before this
// one started. A BGP session that comes up before then is ended by the router when that BFD
// session expires (FRR sends Cease/BFD Down, RFC 9384, and drops the routes graceful restart
// kept), so it waits; the router keeps the node's routes stale meanwhile.
func (s *Speaker) deferFirstSession(p Peer) (time.Time, bool) {
	if !s.cfg.Restarting || !p.GracefulRestart || !p.BFD.Enabled {
		return time.Time{}, false
	}
	until := s.started.Add(time.Duration(p.BFD.Multiplier)*max(p.BFD.MinTx, p.BFD.MinRx) + bfdHoldMargin)
	return until, time.Now().Before(until)
}

// addPeer adds p's session to gobgp, BFD off (bfdLoop arms it once the session is up).
// restarting tells the peer that this speaker restarts with its forwarding state kept
// (RFC 4724's restart and forwarding bits: gobgp's LocalRestarting, its state, not its
// configuration, so that arming BFD later leaves the session be). Called with s.mu held.
func (s *Speaker) addPeer(ctx context.Context, p Peer, restarting bool) error {
	ap := apiPeer(p, false)
	if restarting && ap.GracefulRestart != nil {
		ap.GracefulRestart.LocalRestarting = true
	}
	if err := s.server.AddPeer(ctx, &api.AddPeerRequest{Peer: ap}); err != nil {
		return fmt.Errorf("add bgp peer %s (AS %d): %w", p.Name(), p.PeerASN, err)
	}
	return nil
}

// apiPeer translates a normalized Peer into gobgp's configuration, with BFD running if
// p asks for it and bfd is true.
func apiPeer(p Peer, bfd bool) *api.Peer {
	var afis []api.Family_Afi
	switch {
	case p.Interface != "":
		// IPv4 routes go with the link-local IPv6 next hop (gobgp always offers the extended
		// next hop capability, RFC 8950, for families other than IPv6).
		afis = []api.Family_Afi{api.Family_AFI_IP, api.Family_AFI_IP6}
	case p.Address.Is6():
		afis = []api.Family_Afi{api.Family_AFI_IP6}
	default:
		afis = []api.Family_Afi{api.Family_AFI_IP}
	}
	var afiSafis []*api.AfiSafi
	for _, afi := range afis {
		family := &api.Family{Afi: afi, Safi: api.Family_SAFI_UNICAST}
		afiSafis = append(afiSafis, &api.AfiSafi{Config: &api.AfiSafiConfig{Family: family, Enabled: true}})
	}
	out := &api.Peer{
		Conf: &api.PeerConf{
			PeerAsn:      p.PeerASN,
			LocalAsn:     p.LocalASN,
			AuthPassword: p.Password,
		},
		Timers: &api.Timers{Config: &api.TimersConfig{
			ConnectRetry:           uint64(p.ConnectRetry / time.Second),
			IdleHoldTimeAfterReset: uint64(idleHoldAfterReset / time.Second),
			HoldTime:               uint64(p.HoldTime / time.Second),
			KeepaliveInterval:      uint64(p.Keepalive / time.Second),
		}},
		Transport: &api.Transport{
			RemotePort:  uint32(p.Port),
			PassiveMode: p.Passive,
		},
		AfiSafis: afiSafis,
	}
	if p.Interface != "" {
		out.Conf.NeighborInterface = p.Interface
	} else {
		out.Conf.NeighborAddress = p.Address.String()
	}
	if p.SourceAddress.IsValid() {
		out.Transport.LocalAddress = p.SourceAddress.String()
	}
	switch {
	case p.TTLSecurity:
		// gobgp sends with TTL 255 and sets IP_MINTTL (IPV6_MINHOPCOUNT) on the session's
		// socket; it refuses multihop alongside, which TTL 255 makes needless anyway.
		out.TtlSecurity = &api.TtlSecurity{Enabled: true, TtlMin: uint32(minTTL(p.MultihopTTL))}
	case p.MultihopTTL > 0:
		out.EbgpMultihop = &api.EbgpMultihop{Enabled: true, MultihopTtl: uint32(p.MultihopTTL)}
	}
	if p.BFD.Enabled && bfd {
		// gobgp v4's native BFD (RFC 5880/5881): intervals in microseconds.
		out.Bfd = &api.BfdPeerConfig{
			Enabled:                  true,
			DesiredMinimumTxInterval: uint32(p.BFD.MinTx / time.Microsecond),
			RequiredMinimumReceive:   uint32(p.BFD.MinRx / time.Microsecond),
			DetectionMultiplier:      p.BFD.Multiplier,
		}
	}
	if p.GracefulRestart {
		out.GracefulRestart = &api.GracefulRestart{Enabled: true, RestartTime: uint32(gracefulRestartTime / time.Second),
			DeferralTime: uint32(restartDeferral / time.Second)}
		for _, af := range afiSafis {
			af.MpGracefulRestart = &api.MpGracefulRestart{Config: &api.MpGracefulRestartConfig{Enabled: true}}
		}
	}
	return out
}

// deletePeer removes the session of the peer keyed k from gobgp. An unnumbered peer is
// deleted by the neighbour address gobgp resolved when it was added (gobgp would resolve the
// interface again, and fail once the neighbour is gone).
func (s *Speaker) deletePeer(ctx context.Context, k peerKey) error {
	iface := interfaceOf(k)
	if iface == "" {
		return s.server.DeletePeer(ctx, &api.DeletePeerRequest{Address: k.String()})
	}
	var addr string
	err := s.server.ListPeer(ctx, &api.ListPeerRequest{}, func(p *api.Peer) {
		if p.GetConf().GetNeighborInterface() == iface {
			addr = p.GetState().GetNeighborAddress()
		}
	})
	if err != nil {
		return err
	}
	if addr == "" {
		return nil // gone already
	}
	return s.server.DeletePeer(ctx, &api.DeletePeerRequest{Address: addr})
}

// minTTL is the lowest TTL a packet from a peer hops away (1 when 0: directly connected) has
// when it was sent with 255 (RFC 5082).
func minTTL(hops uint8) uint8 { return 255 - (max(hops, 1) - 1) }

// familyOf returns the address family that carries a route to or a session with a.
func familyOf(a netip.Addr) bgp.Family {
	if a.Is4() {
		return bgp.RF_IPv4_UC
	}
	return bgp.RF_IPv6_UC
}

func sortedKeys[V any](m map[netip.Addr]V) []netip.Addr {
	keys := make([]netip.Addr, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.SortFunc(keys, netip.Addr.Compare)
	return keys
}
