package lab

import (
	"net/netip"
	"slices"
	"sync"
	"time"

	"github.com/mdlayher/arp"
)

// ARPRound is one ARP request for a VIP and the MACs that answered it.
type ARPRound struct {
	VIP  netip.Addr
	At   time.Time
	MACs []string
}

// ARPWatch asks for every one of its VIPs by ARP every interval from one host and keeps each
// request with the MACs that answered it (until the next request for that VIP): the wire's own
// record of who answers what, for checking invariants without trusting any agent.
type ARPWatch struct {
	c        *arp.Client
	vips     []netip.Addr
	interval time.Duration

	mu     sync.Mutex
	rounds []ARPRound
	last   map[netip.Addr]int // VIP -> index of its latest round

	stop chan struct{}
	wg   sync.WaitGroup
}

// WatchARP starts asking for vips (IPv4) from h every interval, for at most limit rounds.
func (h *Host) WatchARP(vips []netip.Addr, interval time.Duration, limit int) (*ARPWatch, error) {
	c, err := h.DialARP()
	if err != nil {
		return nil, err
	}
	w := &ARPWatch{c: c, vips: slices.Clone(vips), interval: interval, last: map[netip.Addr]int{}, stop: make(chan struct{})}
	w.wg.Add(2)
	go w.send(limit)
	go w.receive()
	return w, nil
}

func (w *ARPWatch) send(limit int) {
	defer w.wg.Done()
	t := time.NewTicker(w.interval)
	defer t.Stop()
	for range limit {
		for _, vip := range w.vips {
			w.mu.Lock()
			w.last[vip] = len(w.rounds)
			w.rounds = append(w.rounds, ARPRound{VIP: vip, At: time.Now()})
			w.mu.Unlock()
			_ = w.c.Request(vip)
		}
		select {
		case <-w.stop:
			return
		case <-t.C:
		}
	}
}

func (w *ARPWatch) receive() {
	defer w.wg.Done()
	for {
		select {
		case <-w.stop:
			return
		default:
		}
		_ = w.c.SetReadDeadline(time.Now().Add(100 * time.Millisecond))
		p, _, err := w.c.Read()
		if err != nil {
			continue
		}
		// Announcements (gratuitous ARP, whose target is the VIP itself) are not answers.
		if p.Operation != arp.OperationReply || p.TargetIP == p.SenderIP {
			continue
		}
		w.mu.Lock()
		if i, ok := w.last[p.SenderIP]; ok {
			if mac := p.SenderHardwareAddr.String(); !slices.Contains(w.rounds[i].MACs, mac) {
				w.rounds[i].MACs = append(w.rounds[i].MACs, mac)
			}
		}
		w.mu.Unlock()
	}
}

// Rounds returns the rounds so far, oldest first (the latest of each VIP may still get
// answers).
func (w *ARPWatch) Rounds() []ARPRound {
	w.mu.Lock()
	defer w.mu.Unlock()
	out := make([]ARPRound, len(w.rounds))
	for i, r := range w.rounds {
		out[i] = ARPRound{VIP: r.VIP, At: r.At, MACs: slices.Clone(r.MACs)}
	}
	return out
}

// Stop stops asking; answers in flight for one more interval are waited for.
func (w *ARPWatch) Stop() {
	select {
	case <-w.stop:
		return
	default:
	}
	time.Sleep(w.interval)
	close(w.stop)
	w.wg.Wait()
	w.c.Close()
}
