package lab

import (
	"errors"
	"net"
	"net/netip"
	"slices"
	"sync"
	"time"

	"github.com/mdlayher/arp"
)

// NeighborRound is one request for a VIP (ARP for IPv4, NDP for IPv6) and the MACs that
// answered it.
type NeighborRound struct {
	VIP  netip.Addr
	At   time.Time
	MACs []string
}

// NeighborWatch asks for every one of its VIPs (by ARP or NDP) every interval from one host
// and keeps each request with the MACs that answered it (until the next request for that VIP):
// the wire's own record of who answers what, for checking invariants without trusting any
// agent.
type NeighborWatch struct {
	arp      *arp.Client // nil without IPv4 VIPs
	ndp      *ndpAsker   // nil without IPv6 VIPs
	vips     []netip.Addr
	interval time.Duration

	mu     sync.Mutex
	rounds []NeighborRound
	last   map[netip.Addr]int // VIP -> index of its latest round

	stop chan struct{}
	wg   sync.WaitGroup
}

// WatchNeighbors starts asking for vips from h every interval, for at most limit rounds.
func (h *Host) WatchNeighbors(vips []netip.Addr, interval time.Duration, limit int) (*NeighborWatch, error) {
	w := &NeighborWatch{vips: slices.Clone(vips), interval: interval, last: map[netip.Addr]int{}, stop: make(chan struct{})}
	var err error
	if slices.ContainsFunc(vips, netip.Addr.Is4) {
		if w.arp, err = h.DialARP(); err != nil {
			return nil, err
		}
		w.wg.Add(1)
		go w.receive(w.readARP)
	}
	if slices.ContainsFunc(vips, netip.Addr.Is6) {
		if w.ndp, err = h.dialNDP(); err != nil {
			w.Stop()
			return nil, err
		}
		w.wg.Add(1)
		go w.receive(w.ndp.read)
	}
	w.wg.Add(1)
	go w.send(limit)
	return w, nil
}

func (w *NeighborWatch) send(limit int) {
	defer w.wg.Done()
	t := time.NewTicker(w.interval)
	defer t.Stop()
	for range limit {
		for _, vip := range w.vips {
			w.mu.Lock()
			w.last[vip] = len(w.rounds)
			w.rounds = append(w.rounds, NeighborRound{VIP: vip, At: time.Now()})
			w.mu.Unlock()
			if vip.Is4() {
				_ = w.arp.Request(vip)
			} else {
				_ = w.ndp.request(vip)
			}
		}
		select {
		case <-w.stop:
			return
		case <-t.C:
		}
	}
}

// readARP returns the next ARP reply until deadline. Announcements (gratuitous ARP, whose
// target is the VIP itself) are not answers: ok false.
func (w *NeighborWatch) readARP(deadline time.Time) (vip netip.Addr, mac string, ok bool, err error) {
	_ = w.arp.SetReadDeadline(deadline)
	p, _, err := w.arp.Read()
	if err != nil {
		var ne net.Error
		if errors.As(err, &ne) && ne.Timeout() {
			return netip.Addr{}, "", false, err
		}
		return netip.Addr{}, "", false, nil // a frame that is not ARP
	}
	if p.Operation != arp.OperationReply || p.TargetIP == p.SenderIP {
		return netip.Addr{}, "", false, nil
	}
	return p.SenderIP, p.SenderHardwareAddr.String(), true, nil
}

func (w *NeighborWatch) receive(read func(time.Time) (netip.Addr, string, bool, error)) {
	defer w.wg.Done()
	for {
		select {
		case <-w.stop:
			return
		default:
		}
		vip, mac, ok, err := read(time.Now().Add(100 * time.Millisecond))
		if err != nil || !ok {
			continue
		}
		w.mu.Lock()
		if i, known := w.last[vip]; known && !slices.Contains(w.rounds[i].MACs, mac) {
			w.rounds[i].MACs = append(w.rounds[i].MACs, mac)
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
		out[i] = NeighborRound{VIP: r.VIP, At: r.At, MACs: slices.Clone(r.MACs)}
	}
	return out
}

// Stop stops asking; answers in flight for one more interval are waited for.
func (w *NeighborWatch) Stop() {
	select {
	case <-w.stop:
		return
	default:
	}
	time.Sleep(w.interval)
	close(w.stop)
	w.wg.Wait()
	if w.arp != nil {
		w.arp.Close()
	}
	if w.ndp != nil {
		_ = w.ndp.close()
	}
}
