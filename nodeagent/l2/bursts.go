package l2

import (
	"net/netip"
	"slices"
	"time"
)

// announce tells the segment once that this node has vip, on each of names where it is owned
// and answered for every client (per-client VIPs are never announced). It holds mu while it
// sends, so that nothing goes out for a VIP after the Set that drops it has returned (the next
// owner of a virtual MAC relies on that).
func (s *Speaker) announce(vip netip.Addr, names []string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.announceLocked(vip, names)
}

// announceLocked is announce with mu held.
func (s *Speaker) announceLocked(vip netip.Addr, names []string) {
	for _, n := range names {
		ifc := s.ifaces[n]
		if ifc == nil {
			continue
		}
		ans, own := (*ifc.owned.Load())[vip]
		if !own || !ans.announced() {
			continue
		}
		if vip.Is4() {
			s.announceARP(ifc, vip, ans.mac)
		} else {
			s.announceNDP(ifc, vip, ans.mac)
		}
	}
}

// pendingBurst is a VIP just taken over, still to be announced left times, next at due.
type pendingBurst struct {
	vip  netip.Addr
	left int
	due  time.Time
}

// burstBatch is how many VIPs burstLoop announces per hold of mu: a Set waits for at most
// that many (a few hundred microseconds), not for a whole takeover of thousands.
const burstBatch = 64

// scheduleBursts has each of added announced Burst times, BurstInterval apart, the first at
// once; a VIP already scheduled starts again. The caller holds mu. One goroutine, burstLoop,
// sends every burst: a takeover of a thousand VIPs (a peer of a node holding them missed its
// heartbeats) once started a goroutine per VIP, which all woke together, queued for mu, and
// starved the heartbeats of CPU until the peers took each other for dead in turn.
func (s *Speaker) scheduleBursts(added []netip.Addr) {
	restart := make(map[netip.Addr]bool, len(added))
	for _, a := range added {
		restart[a] = true
	}
	s.bursts = slices.DeleteFunc(s.bursts, func(b pendingBurst) bool { return s.owned[b.vip] == nil || restart[b.vip] })
	if len(added) == 0 {
		return
	}
	now := time.Now()
	for _, a := range added {
		s.bursts = append(s.bursts, pendingBurst{vip: a, left: s.opts.Burst, due: now})
	}
	select {
	case s.burstKick <- struct{}{}:
	default:
	}
}

// burstLoop sends the takeover bursts as they fall due.
func (s *Speaker) burstLoop() {
	defer s.wg.Done()
	t := time.NewTimer(time.Hour)
	defer t.Stop()
	for {
		select {
		case <-s.stop:
			return
		case <-s.burstKick:
		case <-t.C:
		}
		wait := time.Hour
		if next := s.sendDueBursts(); !next.IsZero() {
			wait = max(time.Until(next), 0)
		}
		t.Reset(wait)
	}
}

// sendDueBursts announces the VIPs whose burst is due, burstBatch at a time under mu, and
// returns when the next is due (zero: none is left).
func (s *Speaker) sendDueBursts() time.Time {
	for {
		s.mu.Lock()
		now := time.Now()
		sent := 0
		// Earliest due first: a VIP not yet announced at all goes before another's repeat,
		// however slowly the first batches went out.
		slices.SortStableFunc(s.bursts, func(a, b pendingBurst) int { return a.due.Compare(b.due) })
		for i := range s.bursts {
			b := &s.bursts[i]
			if b.due.After(now) || sent == burstBatch {
				break
			}
			s.announceLocked(b.vip, s.owned[b.vip])
			b.left--
			b.due = now.Add(s.opts.BurstInterval)
			sent++
		}
		s.bursts = slices.DeleteFunc(s.bursts, func(b pendingBurst) bool { return b.left <= 0 })
		var next time.Time
		for _, b := range s.bursts {
			if next.IsZero() || b.due.Before(next) {
				next = b.due
			}
		}
		s.mu.Unlock()
		if sent < burstBatch || s.stopped() {
			return next
		}
	}
}

// SetRefresh changes how often owned VIPs are announced again; d <= 0 restores the default
// given at New.
func (s *Speaker) SetRefresh(d time.Duration) {
	if d <= 0 {
		d = s.opts.Refresh
	}
	select {
	case <-s.refresh:
	default:
	}
	s.refresh <- d
}

func (s *Speaker) refreshLoop() {
	defer s.wg.Done()
	period := s.opts.Refresh
	t := time.NewTicker(period)
	defer t.Stop()
	for {
		select {
		case <-s.stop:
			return
		case d := <-s.refresh:
			if d != period {
				period = d
				t.Reset(d)
			}
		case <-t.C:
			for vip, names := range s.Owned() {
				s.announce(vip, names)
			}
		}
	}
}
