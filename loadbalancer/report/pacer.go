package report

import (
	"context"
	"sync"
	"time"
)

// Pacing of reports while Services are being given addresses. On 2 cores the API server is
// the limit of a create burst, and every write the CCM makes during it takes CPU from the
// creates and from the allocations users wait for (make bench: a Service's Announced
// condition costs the API server 4.7 ms by server-side apply, its IPAllocated Event 1.8 ms, a
// create 7.4 ms). So while allocations are being written, reports go at ReportsPerSecond, and
// the rest once no allocation was written for ReportsQuiet. Nothing is dropped: the
// announcement itself (the agents' state) is never held, only the report of it; Warning
// Events are never paced.
const (
	ReportsPerSecond = 10
	ReportsQuiet     = 500 * time.Millisecond
)

// Pacer paces reports behind allocations. A nil Pacer never waits.
type Pacer struct {
	quiet time.Duration
	every time.Duration

	mu   sync.Mutex
	last time.Time // the last allocation written
	next time.Time // when the next report may go while allocations run
}

// NewPacer returns a Pacer that, while an allocation was written within quiet, lets perSecond
// reports through.
func NewPacer(quiet time.Duration, perSecond float64) *Pacer {
	return &Pacer{quiet: quiet, every: time.Duration(float64(time.Second) / perSecond)}
}

// Allocating notes that an allocation was written now.
func (p *Pacer) Allocating() {
	if p == nil {
		return
	}
	p.mu.Lock()
	p.last = time.Now()
	p.mu.Unlock()
}

// Wait returns when a report may be written, or with ctx's error.
func (p *Pacer) Wait(ctx context.Context) error {
	if p == nil {
		return ctx.Err()
	}
	for {
		p.mu.Lock()
		now := time.Now()
		idle := now.Sub(p.last)
		if idle >= p.quiet {
			p.mu.Unlock()
			return ctx.Err()
		}
		if !now.Before(p.next) {
			p.next = now.Add(p.every)
			p.mu.Unlock()
			return ctx.Err()
		}
		wait := min(p.next.Sub(now), p.quiet-idle)
		p.mu.Unlock()
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return ctx.Err()
		case <-t.C:
		}
	}
}
