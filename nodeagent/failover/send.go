package failover

import (
	"net/netip"
	"slices"
	"time"

	"k8s.io/klog/v2"
)

// out is one heartbeat to send.
type out struct {
	b  []byte
	to netip.AddrPort
}

// send sends one heartbeat to every peer that has a key.
func (m *Monitor) send(now time.Time) {
	mine := m.id.current()
	m.mu.Lock()
	if len(m.peers) == 0 {
		m.mu.Unlock()
		return
	}
	seq := m.id.nextSeq()
	deadline := m.deadline()
	var msgs []out
	for _, p := range m.peers {
		if len(p.keys) == 0 || p.addr.Is4() != m.cfg.Listen.Addr().Is4() {
			continue
		}
		// Sign with the newest key of this node the peer has shown it knows (it used it),
		// else with the oldest, which every peer that knows any key of this node knows.
		sign := mine[len(mine)-1]
		if p.usesOK {
			if i := slices.IndexFunc(mine, func(k *ownKey) bool { return k.id == p.usesMine }); i >= 0 {
				sign = mine[i]
			}
		}
		theirs := p.keys[0]
		pr := m.pairOf(p, sign, theirs)
		if pr == nil {
			continue
		}
		f := frame{from: sign.id, to: theirs.id, at: seqKey{m.id.Boot(), seq}, nonce: nonce(), restart: m.restart}
		if now.Sub(p.verified) <= deadline {
			f.echo = p.echo
		}
		if m.announced[p.node] && !p.departing {
			f.flags |= flagAlive
		}
		f.flags |= p.lapses % lapseModulo << lapseShift
		p.sent[p.sentN%sendRing] = sentHeartbeat{nonce: f.nonce, at: now}
		p.sentN++
		msgs = append(msgs, out{appendFrame(make([]byte, 0, frameSize), f, pr.send), netip.AddrPortFrom(p.addr, m.cfg.Listen.Port())})
	}
	m.mu.Unlock()
	for _, o := range msgs {
		if err := m.conn.send(o.b, o.to); err != nil {
			klog.V(4).InfoS("Heartbeat send failed", "to", o.to, "err", err)
			continue
		}
		m.sent.Add(1)
		if m.cfg.sent != nil {
			m.cfg.sent(o.b, o.to)
		}
	}
}

func (m *Monitor) deadline() time.Duration { return time.Duration(m.cfg.Misses) * m.cfg.Interval }
