package agentlab

import (
	"context"
	"encoding/binary"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"sort"
	"sync"
	"testing"
	"time"

	"github.com/mdlayher/arp"
	"golang.org/x/net/ipv4"

	agentv1 "github.com/metalvip/metalvip/proto/metalvip/agent/v1"
	"github.com/metalvip/metalvip/test/harness"
	"github.com/metalvip/metalvip/test/harness/proc"
	"github.com/metalvip/metalvip/test/lab"
)

// Helpers that watch and attack the wire: an ARP prober that counts who answers, resident
// memory of an agent, raw IPv4 UDP to send from any source and to capture heartbeats.

// arpProbe asks for a VIP by ARP from a host every interval and records the requests and the
// replies, to count per request who answered.
type arpProbe struct {
	vip      netip.Addr
	interval time.Duration
	c        *arp.Client

	mu      sync.Mutex
	sent    []time.Time
	replies []arpReply

	stop chan struct{}
	once sync.Once // closes stop
	wg   sync.WaitGroup
}

type arpReply struct {
	mac string
	at  time.Time // when read
}

// probeARP starts asking for vip from h every interval, for at most limit requests.
func probeARP(t *testing.T, h *lab.Host, vip netip.Addr, interval time.Duration, limit int) *arpProbe {
	t.Helper()
	c, err := h.DialARP()
	if err != nil {
		t.Fatal(err)
	}
	p := &arpProbe{vip: vip, interval: interval, c: c, stop: make(chan struct{})}
	p.wg.Add(2)
	go p.receive()
	go p.send(limit)
	t.Cleanup(p.Stop)
	return p
}

func (p *arpProbe) send(limit int) {
	defer p.wg.Done()
	for range harness.Every(p.stop, p.interval, limit) {
		p.mu.Lock()
		p.sent = append(p.sent, time.Now())
		p.mu.Unlock()
		_ = p.c.Request(p.vip)
	}
}

func (p *arpProbe) receive() {
	defer p.wg.Done()
	for !harness.Stopped(p.stop) {
		_ = p.c.SetReadDeadline(time.Now().Add(100 * time.Millisecond))
		pkt, _, err := p.c.Read()
		if err != nil {
			continue
		}
		// Announcements (gratuitous ARP, whose target is the VIP itself) are not answers.
		if pkt.Operation != arp.OperationReply || pkt.SenderIP != p.vip || pkt.TargetIP == p.vip {
			continue
		}
		p.mu.Lock()
		p.replies = append(p.replies, arpReply{mac: pkt.SenderHardwareAddr.String(), at: time.Now()})
		p.mu.Unlock()
	}
}

// Stop stops probing; answers in flight for one more interval are waited for.
func (p *arpProbe) Stop() {
	p.once.Do(func() {
		time.Sleep(p.interval)
		close(p.stop)
		p.wg.Wait()
		p.c.Close()
	})
}

// replyWindow is how long after a request its reply may be read: a reader the scheduler
// delays reads several replies at once.
const replyWindow = 200 * time.Millisecond

// answers assigns every reply to a request. An answering node sends one reply per request, a
// reply is read after the request it answers, and replies read together answer the latest
// requests: so, latest first, each reply of a MAC goes to the latest request sent before it
// was read and before the request its next reply went to, if that request was sent at most
// replyWindow before. The caller holds mu.
func (p *arpProbe) answers() [][]string {
	out := make([][]string, len(p.sent))
	byMAC := map[string][]time.Time{}
	for _, r := range p.replies {
		byMAC[r.mac] = append(byMAC[r.mac], r.at)
	}
	for mac, reads := range byMAC {
		bound := len(p.sent) // requests at or after bound are taken
		for k := len(reads) - 1; k >= 0; k-- {
			j := sort.Search(len(p.sent), func(i int) bool { return p.sent[i].After(reads[k]) }) - 1
			j = min(j, bound-1)
			if j < 0 || p.sent[j].Before(reads[k].Add(-replyWindow)) {
				continue // answers nothing we asked in time
			}
			out[j] = append(out[j], mac)
			bound = j
		}
	}
	return out
}

// arpCount is what an arpProbe saw over a period.
type arpCount struct {
	Requests, Unanswered, Double int
	ByMAC                        map[string]int
	// LongestUnanswered and LongestDouble are the longest runs of requests answered by
	// nobody, and by two MACs or more, from the first such request to the next other one.
	LongestUnanswered, LongestDouble time.Duration
	FirstAnswerBy                    map[string]time.Time // when each MAC first answered
}

func (c arpCount) String() string {
	return fmt.Sprintf("%d requests: %d unanswered (longest %s), %d answered twice (longest %s), by MAC %v",
		c.Requests, c.Unanswered, c.LongestUnanswered.Round(time.Millisecond), c.Double, c.LongestDouble.Round(time.Millisecond), c.ByMAC)
}

// count counts the requests sent in [from, to), leaving out those sent in the last
// replyWindow (their answers may not be in yet).
func (p *arpProbe) count(from, to time.Time) arpCount {
	p.mu.Lock()
	defer p.mu.Unlock()
	if limit := time.Now().Add(-replyWindow); to.After(limit) {
		to = limit
	}
	answers := p.answers()
	c := arpCount{ByMAC: map[string]int{}, FirstAnswerBy: map[string]time.Time{}}
	var noneSince, doubleSince time.Time
	end := func(since *time.Time, at time.Time, longest *time.Duration) {
		if !since.IsZero() {
			*longest = max(*longest, at.Sub(*since))
			*since = time.Time{}
		}
	}
	for i, at := range p.sent {
		if at.Before(from) || !at.Before(to) {
			continue
		}
		c.Requests++
		macs := answers[i]
		for _, m := range macs {
			c.ByMAC[m]++
			if _, ok := c.FirstAnswerBy[m]; !ok {
				c.FirstAnswerBy[m] = at
			}
		}
		switch {
		case len(macs) == 0:
			c.Unanswered++
			end(&doubleSince, at, &c.LongestDouble)
			if noneSince.IsZero() {
				noneSince = at
			}
		case len(macs) > 1:
			c.Double++
			end(&noneSince, at, &c.LongestUnanswered)
			if doubleSince.IsZero() {
				doubleSince = at
			}
		default:
			end(&noneSince, at, &c.LongestUnanswered)
			end(&doubleSince, at, &c.LongestDouble)
		}
	}
	end(&noneSince, to, &c.LongestUnanswered)
	end(&doubleSince, to, &c.LongestDouble)
	return c
}

// peakRSS samples a process's resident memory every 50 ms until stop closes, and returns the
// peak on done.
func peakRSS(pid int, stop <-chan struct{}) <-chan int64 {
	done := make(chan int64, 1)
	go func() {
		var peak int64
		t := time.NewTicker(50 * time.Millisecond)
		defer t.Stop()
		for {
			if m, err := proc.MemoryOf(pid); err == nil {
				peak = max(peak, m.RSS)
			}
			select {
			case <-stop:
				done <- peak
				return
			case <-t.C:
			}
		}
	}()
	return done
}

// rawSender sends IPv4 UDP datagrams with any source address and TTL, from a host.
type rawSender struct {
	c *ipv4.RawConn
}

func newRawSender(t *testing.T, h *lab.Host) *rawSender {
	t.Helper()
	var rc *ipv4.RawConn
	if err := h.Do(func() error {
		pc, err := net.ListenPacket("ip4:17", "0.0.0.0")
		if err != nil {
			return err
		}
		rc, err = ipv4.NewRawConn(pc)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { rc.Close() })
	return &rawSender{rc}
}

// send sends one UDP datagram from src:srcPort to dst:dstPort with ttl (UDP checksum 0: none).
func (s *rawSender) send(src, dst netip.AddrPort, ttl int, payload []byte) error {
	udp := make([]byte, 8, 8+len(payload))
	binary.BigEndian.PutUint16(udp[0:], src.Port())
	binary.BigEndian.PutUint16(udp[2:], dst.Port())
	binary.BigEndian.PutUint16(udp[4:], uint16(8+len(payload)))
	udp = append(udp, payload...)
	h := &ipv4.Header{Version: 4, Len: ipv4.HeaderLen, TotalLen: ipv4.HeaderLen + len(udp), TTL: ttl, Protocol: 17,
		Src: src.Addr().AsSlice(), Dst: dst.Addr().AsSlice()}
	return s.c.WriteTo(h, udp, nil)
}

// capture keeps the UDP payloads a host receives on port from src, from when it starts until
// stop is called.
type capture struct {
	mu   sync.Mutex
	got  [][]byte
	conn net.PacketConn
	done chan struct{}
}

func captureUDP(t *testing.T, h *lab.Host, src netip.Addr, port uint16) *capture {
	t.Helper()
	c := &capture{done: make(chan struct{})}
	if err := h.Do(func() error {
		var err error
		c.conn, err = net.ListenPacket("ip4:17", "0.0.0.0")
		return err
	}); err != nil {
		t.Fatal(err)
	}
	go func() {
		defer close(c.done)
		buf := make([]byte, 2048)
		for {
			n, from, err := c.conn.ReadFrom(buf)
			if err != nil {
				return
			}
			ip, ok := from.(*net.IPAddr)
			if !ok || n < 8 || binary.BigEndian.Uint16(buf[2:]) != port {
				continue
			}
			if a, _ := netip.AddrFromSlice(ip.IP); a.Unmap() != src {
				continue
			}
			c.mu.Lock()
			c.got = append(c.got, slices.Clone(buf[8:n]))
			c.mu.Unlock()
		}
	}()
	t.Cleanup(c.stop)
	return c
}

func (c *capture) stop() {
	c.conn.Close()
	<-c.done
}

func (c *capture) packets() [][]byte {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Clone(c.got)
}

// heartbeatsOn turns on heartbeats in states: 50 ms, dead after 3 misses, and as peers every
// other agent with the keys it reports in GetState, as the CCM does.
func heartbeatsOn(t *testing.T, st *agentv1.DesiredState, self *agent, all []*agent) *agentv1.DesiredState {
	t.Helper()
	st.L2 = &agentv1.L2Options{HeartbeatIntervalMs: 50, HeartbeatMisses: 3}
	st.HeartbeatPeers = nil
	for _, o := range all {
		if o == self {
			continue
		}
		st.HeartbeatPeers = append(st.HeartbeatPeers, &agentv1.HeartbeatPeer{Node: o.host.Name, Address: o.host.IPv4.String(), PublicKeys: o.keys(t)})
	}
	return st
}

// keys returns the agent's heartbeat public keys, as it last reported them (they stay across
// restarts: they live in its state directory).
func (a *agent) keys(t *testing.T) [][]byte {
	t.Helper()
	if a.pub == nil || a.alive() {
		a.pub = a.getState(t).GetHeartbeatPublicKeys()
	}
	return a.pub
}

// getState returns the agent's state, failing the test if it cannot.
func (a *agent) getState(t *testing.T) *agentv1.GetStateResponse {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	st, err := a.client.GetState(ctx, &agentv1.GetStateRequest{})
	if err != nil {
		t.Fatalf("GetState of %s: %v", a.host.Name, err)
	}
	return st
}

// alive reports whether the agent's process runs.
func (a *agent) alive() bool {
	select {
	case <-a.proc.Done():
		return false
	default:
		return true
	}
}
