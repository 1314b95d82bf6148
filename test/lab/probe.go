package lab

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"sync"
	"time"

	"golang.org/x/net/icmp"
	"golang.org/x/net/ipv4"

	"github.com/metalvip/metalvip/test/harness"
	"github.com/metalvip/metalvip/test/harness/probe"
)

// Prober sends an ICMP echo request to a target every interval from a host and records which
// were answered, to measure outages as a client sees them.
type Prober struct {
	target   netip.Addr
	interval time.Duration
	conn     *icmp.PacketConn
	id       int

	mu      sync.Mutex
	sent    []time.Time // by sequence number
	replied []bool

	stop chan struct{}
	once sync.Once // closes stop
	done sync.WaitGroup
}

// Probe starts probing target (IPv4) from h every interval, for at most limit probes. Stop it
// with Stop.
func (h *Host) Probe(target netip.Addr, interval time.Duration, limit int) (*Prober, error) {
	if !target.Is4() {
		return nil, errors.New("probe: IPv4 targets only")
	}
	p := &Prober{target: target, interval: interval, id: os.Getpid() & 0xffff, stop: make(chan struct{})}
	if err := h.Do(func() error {
		var err error
		p.conn, err = icmp.ListenPacket("ip4:icmp", "0.0.0.0")
		return err
	}); err != nil {
		return nil, fmt.Errorf("probe socket: %w", err)
	}
	p.done.Add(2)
	go p.send(limit)
	go p.receive()
	return p, nil
}

func (p *Prober) send(limit int) {
	defer p.done.Done()
	for seq := range harness.Every(p.stop, p.interval, limit) {
		msg := icmp.Message{Type: ipv4.ICMPTypeEcho, Body: &icmp.Echo{ID: p.id, Seq: seq & 0xffff, Data: binary.BigEndian.AppendUint32(nil, uint32(seq))}}
		b, _ := msg.Marshal(nil)
		p.mu.Lock()
		p.sent = append(p.sent, time.Now())
		p.replied = append(p.replied, false)
		p.mu.Unlock()
		_, _ = p.conn.WriteTo(b, &net.IPAddr{IP: p.target.AsSlice()})
	}
}

func (p *Prober) receive() {
	defer p.done.Done()
	buf := make([]byte, 1500)
	for {
		n, from, err := p.conn.ReadFrom(buf)
		if err != nil {
			return
		}
		if ip, ok := from.(*net.IPAddr); !ok || !ip.IP.Equal(p.target.AsSlice()) {
			continue
		}
		m, err := icmp.ParseMessage(1, buf[:n])
		if err != nil || m.Type != ipv4.ICMPTypeEchoReply {
			continue
		}
		e, ok := m.Body.(*icmp.Echo)
		if !ok || e.ID != p.id || len(e.Data) < 4 {
			continue
		}
		seq := int(binary.BigEndian.Uint32(e.Data))
		p.mu.Lock()
		if seq < len(p.replied) {
			p.replied[seq] = true
		}
		p.mu.Unlock()
	}
}

// Stop stops probing; replies still in flight for the last 200 ms are waited for.
func (p *Prober) Stop() {
	p.once.Do(func() {
		close(p.stop)
		time.Sleep(200 * time.Millisecond)
		p.conn.Close()
		p.done.Wait()
	})
}

// Answered reports whether the last probe sent at least 100 ms ago was answered (a reply
// normally takes well under a millisecond).
func (p *Prober) Answered() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	for i := len(p.sent) - 1; i >= 0; i-- {
		if time.Since(p.sent[i]) >= 100*time.Millisecond {
			return p.replied[i]
		}
	}
	return false
}

// Outage returns the longest run of unanswered probes after since, as time from the first
// unanswered probe to the first answered one after it (a run still open counts to its last
// probe, plus an interval), and how many probes were lost in all. A probe sent less than 100
// ms ago and not answered yet counts neither way.
func (p *Prober) Outage(since time.Time) (longest time.Duration, lost int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	attempts := make([]probe.Attempt, len(p.sent))
	for i, at := range p.sent {
		attempts[i] = probe.Attempt{Sent: at, OK: p.replied[i], Done: p.replied[i] || time.Since(at) >= 100*time.Millisecond}
	}
	o := probe.OutageOf(attempts, since, time.Now(), p.interval)
	return o.Longest, o.Lost
}
