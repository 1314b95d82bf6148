package lab

import (
	"net/netip"
	"sync"
	"time"

	"github.com/metalvip/metalvip/test/harness"
	"github.com/metalvip/metalvip/test/testenv"
)

// Traffic is a client's TCP traffic to a ServeName address, as during a drain: long
// connections checked every 100 ms (ResetAt: when each was found reset), and a new
// connection every 50 ms (News: when, and which server took it). Read it after Stop.
type Traffic struct {
	mu      sync.Mutex
	Long    []*NameConn
	ResetAt []time.Time // per long connection; zero while it lives
	News    []NewConn
	stop    chan struct{}
	once    sync.Once // closes stop
	wg      sync.WaitGroup
}

// NewConn is one of the new connections.
type NewConn struct {
	At     time.Time
	Server string // "" when it failed
}

// StartTraffic opens long connections from the host to addr, then starts checking them and
// opening new ones until Stop (or the test's end, or about 200 s).
func StartTraffic(t testenv.TB, from *Host, addr netip.AddrPort, long int) *Traffic {
	t.Helper()
	d := &Traffic{stop: make(chan struct{})}
	for range long {
		c, err := from.DialName(addr, 5*time.Second)
		if err != nil {
			t.Fatalf("long connection: %v", err)
		}
		d.Long = append(d.Long, c)
	}
	d.ResetAt = make([]time.Time, long)
	d.wg.Add(2)
	go func() { // checks, bounded by stop and by 2,000 rounds
		defer d.wg.Done()
		for range harness.Ticks(d.stop, 100*time.Millisecond, 2000) {
			for i, c := range d.Long {
				d.mu.Lock()
				dead := !d.ResetAt[i].IsZero()
				d.mu.Unlock()
				if dead {
					continue
				}
				if err := c.Check(time.Second); err != nil {
					d.mu.Lock()
					d.ResetAt[i] = time.Now()
					d.mu.Unlock()
				}
			}
		}
	}()
	go func() { // new connections, bounded likewise
		defer d.wg.Done()
		for range harness.Ticks(d.stop, 50*time.Millisecond, 4000) {
			nc := NewConn{At: time.Now()}
			if c, err := from.DialName(addr, time.Second); err == nil {
				nc.Server = c.Server
				c.Close()
			}
			d.mu.Lock()
			d.News = append(d.News, nc)
			d.mu.Unlock()
		}
	}()
	t.Cleanup(d.Stop)
	return d
}

// Stop ends the traffic and closes the long connections; later calls do nothing.
func (d *Traffic) Stop() {
	d.once.Do(func() { close(d.stop) })
	d.wg.Wait()
	for _, c := range d.Long {
		c.Close()
	}
}
