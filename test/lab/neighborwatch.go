package lab

import (
	"net/netip"
	"slices"
	"sync"
	"time"

	"github.com/metalvip/metalvip/test/harness"
)

// NeighborRound is one request for a VIP (ARP for IPv4, NDP for IPv6) and the MACs that
// answered it.
type NeighborRound struct {
	VIP  netip.Addr
	At   time.Time
	MACs []string // each once
	// Replies counts the answers the host got for the VIP while this round was the latest:
	// with no other asker on the host at once, more than one means more than one answerer,
	// also when they answer with one MAC (a virtual MAC). (ARP and NDP answers carry no
	// request id: another asker's answers count too.)
	Replies int
}

// NeighborWatch asks for every one of its VIPs (by ARP or NDP) every interval from one host
// and keeps each request with the MACs that answered it (until the next request for that VIP):
// the wire's own record of who answers what, for checking invariants without trusting any
// agent.
type NeighborWatch struct {
	arp      asker // nil without IPv4 VIPs
	ndp      asker // nil without IPv6 VIPs
	vips     []netip.Addr
	interval time.Duration

	mu     sync.Mutex
	rounds []NeighborRound
	last   map[netip.Addr]int // VIP -> index of its latest round

	stop chan struct{}
	once sync.Once // closes stop
	wg   sync.WaitGroup
}

// WatchNeighbors starts asking for vips from h every interval, for at most limit rounds.
func (h *Host) WatchNeighbors(vips []netip.Addr, interval time.Duration, limit int) (*NeighborWatch, error) {
	w := &NeighborWatch{vips: slices.Clone(vips), interval: interval, last: map[netip.Addr]int{}, stop: make(chan struct{})}
	var err error
	if slices.ContainsFunc(vips, netip.Addr.Is4) {
		if w.arp, err = h.dialAsker(false); err != nil {
			return nil, err
		}
		w.wg.Add(1)
		go w.receive(w.arp)
	}
	if slices.ContainsFunc(vips, netip.Addr.Is6) {
		if w.ndp, err = h.dialAsker(true); err != nil {
			if w.arp != nil {
				_ = w.arp.close()
			}
			return nil, err
		}
		w.wg.Add(1)
		go w.receive(w.ndp)
	}
	w.wg.Add(1)
	go w.send(limit)
	return w, nil
}

func (w *NeighborWatch) send(limit int) {
	defer w.wg.Done()
	for range harness.Every(w.stop, w.interval, limit) {
		for _, vip := range w.vips {
			w.mu.Lock()
			w.last[vip] = len(w.rounds)
			w.rounds = append(w.rounds, NeighborRound{VIP: vip, At: time.Now()})
			w.mu.Unlock()
			if vip.Is4() {
				_ = w.arp.request(vip)
			} else {
				_ = w.ndp.request(vip)
			}
		}
	}
}

func (w *NeighborWatch) receive(a asker) {
	defer w.wg.Done()
	for !harness.Stopped(w.stop) {
		vip, mac, ok, err := a.read(time.Now().Add(100 * time.Millisecond))
		if err != nil || !ok {
			continue
		}
		w.mu.Lock()
		if i, known := w.last[vip]; known {
			w.rounds[i].Replies++
			if !slices.Contains(w.rounds[i].MACs, mac) {
				w.rounds[i].MACs = append(w.rounds[i].MACs, mac)
			}
		}
		w.mu.Unlock()
	}
}

// Rounds returns the rounds so far, oldest first (the latest of each VIP may still get
// answers).
func (w *NeighborWatch) Rounds() []NeighborRound {
	w.mu.Lock()
	defer w.mu.Unlock()
	out := make([]NeighborRound, len(w.rounds))
	for i, r := range w.rounds {
		out[i] = NeighborRound{VIP: r.VIP, At: r.At, MACs: slices.Clone(r.MACs), Replies: r.Replies}
	}
	return out
}

// Stop stops asking; answers in flight for one more interval are waited for.
func (w *NeighborWatch) Stop() {
	w.once.Do(func() {
		time.Sleep(w.interval)
		close(w.stop)
		w.wg.Wait()
		if w.arp != nil {
			_ = w.arp.close()
		}
		if w.ndp != nil {
			_ = w.ndp.close()
		}
	})
}
