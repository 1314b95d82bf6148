package bgp

import (
	"context"
	"net/netip"
	"time"

	api "github.com/osrg/gobgp/v4/api"
	"k8s.io/klog/v2"
)

// BFD is armed per session, not per peer: a peer's BFD runs in gobgp only while its BGP
// session is established, starting bfdSettle after the session came up, and is removed
// when the session drops. Two behaviours make this necessary (gobgp v4.8.0 with FRR 8.4):
//
//   - FRR opens a BFD session for a dynamic (listen range) neighbor when BGP comes up,
//     sends one packet, and replaces it within the millisecond by one bound to the local
//     address, with a new discriminator. gobgp latches the first discriminator and drops
//     every later packet from the replacement (its check against a foreign remote), so BFD
//     never comes up.
//   - gobgp resets the BGP session when BFD times out in Init, not only from Up, so the
//     stuck session above turns into a BGP flap every few seconds.
//
// Arming after the session settles misses the short-lived session; disarming on session
// loss starts every session's BFD afresh, with no stale discriminator.
const bfdSettle = 500 * time.Millisecond

// bfdHoldMargin is added to the BFD detection time a restarted speaker waits out before its
// first session to a graceful-restart peer (see deferFirstSession).
const bfdHoldMargin = 500 * time.Millisecond

// bfdLoop arms and disarms BFD as sessions come and go, until ctx ends. It owns no state:
// it works under s.mu, like SetPeers.
func (s *Speaker) bfdLoop(ctx context.Context) {
	defer close(s.bfdDone)
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for {
		next := s.reconcileBFD(ctx)
		if next <= 0 {
			next = time.Hour
		}
		timer.Reset(next)
		select {
		case <-ctx.Done():
			return
		case <-s.bfdKick:
		case <-timer.C:
		}
	}
}

// kickBFD asks bfdLoop to look at the sessions again.
func (s *Speaker) kickBFD() {
	select {
	case s.bfdKick <- struct{}{}:
	default:
	}
}

// reconcileBFD arms BFD for settled established sessions and disarms it for the others. It
// returns when it next needs to run (0: only when kicked).
func (s *Speaker) reconcileBFD(ctx context.Context) time.Duration {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return 0
	}
	var next time.Duration
	soonest := func(d time.Duration) {
		if next == 0 || d < next {
			next = d
		}
	}
	now := time.Now()
	for addr, d := range s.deferred {
		if wait := d.until.Sub(now); wait > 0 {
			soonest(wait)
			continue
		}
		p := s.peers[addr]
		if err := s.addPeer(ctx, p, d.restarting); err != nil {
			if p.Interface == "" {
				klog.ErrorS(err, "Cannot add a deferred BGP peer")
				soonest(time.Second)
				continue
			}
			// Unnumbered: the link has no single link-local neighbour (yet). Say so in the
			// session's state, solicit again, and retry.
			s.stateMu.Lock()
			if cur, ok := s.sessions[addr]; ok && cur.LastError != err.Error() {
				cur.LastError = err.Error()
				klog.InfoS("Unnumbered BGP peer not resolved yet; retrying", "interface", p.Interface, "err", err)
			}
			s.stateMu.Unlock()
			solicitNeighbours(p.Interface)
			d.until = now.Add(unnumberedRetry)
			s.deferred[addr] = d
			soonest(unnumberedRetry)
			continue
		}
		klog.V(2).InfoS("BGP session no longer deferred", "peer", p.Name())
		delete(s.deferred, addr)
	}
	for addr, p := range s.peers {
		if _, waiting := s.deferred[addr]; p.Interface == "" || waiting {
			continue
		}
		// An unnumbered session that is down may wait for a router that forgot this node.
		s.stateMu.Lock()
		up := s.sessions[addr] != nil && s.sessions[addr].Established()
		s.stateMu.Unlock()
		if up {
			delete(s.solicited, addr)
			continue
		}
		if wait := s.solicited[addr].Add(unnumberedRetry).Sub(now); wait > 0 {
			soonest(wait)
			continue
		}
		solicitNeighbours(p.Interface)
		s.solicited[addr] = now
		soonest(unnumberedRetry)
	}
	for addr, p := range s.peers {
		if !p.BFD.Enabled {
			continue
		}
		s.stateMu.Lock()
		var st SessionState
		if cur, ok := s.sessions[addr]; ok {
			st = cur.SessionState
		}
		s.stateMu.Unlock()
		armed := s.bfdArmed[addr]
		want := st.Established()
		if want == armed {
			continue
		}
		if want {
			if wait := st.Since.Add(bfdSettle).Sub(now); wait > 0 {
				soonest(wait)
				continue
			}
		}
		if _, err := s.server.UpdatePeer(ctx, &api.UpdatePeerRequest{Peer: apiPeer(p, want)}); err != nil {
			klog.ErrorS(err, "Cannot switch BFD", "peer", p.Name(), "on", want)
			soonest(time.Second)
			continue
		}
		klog.V(2).InfoS("BFD", "peer", p.Name(), "armed", want)
		if want {
			s.bfdArmed[addr] = true
		} else {
			delete(s.bfdArmed, addr)
		}
	}
	return next
}

// bfdStateOf is a session's BFD state: gobgp's when it runs BFD for the peer, Down when BFD
// is configured but not armed (yet), empty when BFD is off.
func bfdStateOf(configured bool, running map[netip.Addr]string, addr netip.Addr) string {
	if st, ok := running[addr]; ok {
		return st
	}
	if configured {
		return "Down"
	}
	return ""
}
