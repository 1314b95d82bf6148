package failover

import (
	"crypto/rand"
	"encoding/binary"
	"errors"
	"net"
	"slices"
	"time"

	"k8s.io/klog/v2"
)

func (m *Monitor) receive() {
	defer m.wg.Done()
	var dgs []datagram
	for {
		var err error
		dgs, err = m.conn.readBatch(dgs[:0])
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			select {
			case <-m.stop:
				return
			default:
			}
			continue
		}
		if m.handle(dgs, time.Now()) {
			m.poke()
		}
	}
}

func (m *Monitor) refuse(reason int) { m.refused[reason].Add(1) }

// handle checks a batch of datagrams, cheapest checks first, and records what the verified
// ones prove. It reports whether any proved something.
//
// Heartbeats are sent with TTL 255 and taken only with TTL 255 (on-link). A datagram meets the
// cheap checks first (size, TTL, a known peer's source address, the frame's keys, replay and
// freshness pre-checks) and only then the MAC, which costs less than the kernel's delivery of
// the datagram (BenchmarkRefusingAFlood), so every datagram that passes the pre-checks is
// verified: a per-source budget of MAC checks would let anyone who spoofs a peer's address
// crowd out that peer's real heartbeats, the very failover it must not cause. Refusals are
// counted by reason. A verified heartbeat that echoes nothing still tells whether its sender
// counts this node alive (dissent, see PeerView.Alive): such a heartbeat may make this node
// yield, never take over.
func (m *Monitor) handle(dgs []datagram, now time.Time) bool {
	mine := m.id.current()
	proved := false
	m.mu.Lock()
	defer m.mu.Unlock()
	freshFor := m.deadline() + maxEchoAgeRatio*m.cfg.Interval
	for _, d := range dgs {
		if !sizeOK(d.data) {
			m.refuse(iSize)
			continue
		}
		if d.ttl != onLinkTTL {
			m.refuse(iTTL)
			continue
		}
		p := m.byAddr[d.from]
		if p == nil {
			m.refuse(iSource)
			continue
		}
		f, err := parseFrame(d.data)
		if err != nil {
			m.refuse(iVersion)
			continue
		}
		ki := slices.IndexFunc(p.keys, func(k peerKey) bool { return k.id == f.from })
		mi := slices.IndexFunc(mine, func(k *ownKey) bool { return k.id == f.to })
		if ki < 0 || mi < 0 {
			m.refuse(iKey)
			continue
		}
		if last, ok := p.last[f.from]; ok && !f.at.after(last) {
			m.refuse(iReplay)
			continue
		}
		var echoed time.Time
		if f.echo != 0 {
			if echoed = p.sentAt(f.echo); echoed.IsZero() || now.Sub(echoed) > freshFor {
				m.refuse(iStale)
				continue
			}
		}
		pr := m.pairOf(p, mine[mi], p.keys[ki])
		if pr == nil || !macOK(d.data, pr.recv, pr.sum[:]) {
			m.refuse(iMAC)
			continue
		}
		p.last[f.from] = f.at
		p.verified, p.echo = now, f.nonce
		p.usesMine, p.usesOK = f.to, true
		// Verified and in order: the lapse count is the peer's, whatever the echo.
		if l := f.flags >> lapseShift; !p.heardLapses || l != p.theirLapses {
			if p.heardLapses {
				p.lapsed++
				proved = true // evaluate now: the peer may have answered this node's VIPs
			}
			p.theirLapses, p.heardLapses = l, true
		}
		// Whatever the echo, the peer is running and says whether it counts this node alive:
		// one that does not may answer what this node would (dissents). The first heartbeat
		// of a peer's boot is sent before it has decided anything and is no dissent.
		firstOfBoot := f.at.boot != p.boot
		p.boot = f.at.boot
		if dissent := f.flags&flagAlive == 0 && !firstOfBoot; dissent != p.dissent {
			p.dissent = dissent
			proved = true
		}
		if echoed.IsZero() {
			m.unproven.Add(1)
			continue
		}
		// The peer was alive after it heard this node's heartbeat sent at echoed, and no
		// later than one interval after (it echoes the latest it heard): a dead node is
		// counted alive at most that long after its death.
		proof := echoed.Add(m.cfg.Interval)
		if proof.After(now) {
			proof = now
		}
		if !p.proven || proof.After(p.proof) {
			p.proof, p.proven = proof, true
		}
		if m.cfg.OnRTT != nil {
			m.cfg.OnRTT(now.Sub(echoed))
		}
		p.sees = f.flags&flagAlive != 0
		p.noteRestart(f, proof, m.cfg.Node)
		m.accepted.Add(1)
		proved = true
	}
	return proved
}

// noteRestart records what a proven heartbeat, proving its sender alive at proof, says of a
// restart: a notice holds the peer alive for its grace from then; a heartbeat without one (the
// next boot's, once the peer is back) shortens the hold to ReturnSettle from then (never past
// the grace), and one past that ends it.
func (p *peer) noteRestart(f frame, proof time.Time, self string) {
	if f.restart == 0 {
		switch {
		case p.restartUntil.IsZero():
		case p.backSince.IsZero():
			klog.InfoS("Peer back from its restart", "node", self, "peer", p.node, "boot", f.at.boot, "settle", ReturnSettle)
			p.backSince = proof
			if settled := proof.Add(ReturnSettle); settled.Before(p.restartUntil) {
				p.restartUntil = settled
			}
		case !proof.Before(p.restartUntil):
			p.restartUntil, p.backSince = time.Time{}, time.Time{}
		}
		return
	}
	p.backSince = time.Time{}
	grace := min(time.Duration(f.restart)*time.Millisecond, MaxRestartGrace)
	if p.restartUntil.IsZero() {
		klog.InfoS("Peer restarting: it counts alive, its VIPs wait for it", "node", self, "peer", p.node, "grace", grace)
	}
	p.restartUntil = proof.Add(grace)
}

// sentAt returns when this node sent the peer the heartbeat with nonce; zero if it did not
// recently.
func (p *peer) sentAt(nonce uint64) time.Time {
	for _, s := range p.sent {
		if s.nonce == nonce {
			return s.at
		}
	}
	return time.Time{}
}

// nonce returns a random non-zero nonce.
func nonce() uint64 {
	var b [8]byte
	for {
		_, _ = rand.Read(b[:])
		if n := binary.BigEndian.Uint64(b[:]); n != 0 {
			return n
		}
	}
}
