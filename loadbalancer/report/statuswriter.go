package report

import (
	"context"
	"sync"

	"k8s.io/client-go/util/workqueue"
	"k8s.io/klog/v2"
)

// Writer writes status off the deciding loop: the loop sets the latest write for a key
// (a Service's condition, a pool's), and workers apply it; a newer write replaces one not yet
// made, and failures retry with backoff. So a slow or failing API server never holds up what
// the agents are told. Paced writes (reports that may wait while allocations are being
// written) have their own queue and workers, so they never hold up the others; the write made
// is the latest set by the time the pacer lets it go.
type Writer struct {
	queue, paced workqueue.TypedRateLimitingInterface[string]
	pacer        *Pacer

	mu      sync.Mutex
	pending map[string]*parts
}

// Parts a key's write may have: a Service's ServiceAnnouncement and its Announced condition
// are two parts of one item (one queue entry, which costs more memory than either write
// while thousands wait for the pacer); each part is the latest set, and one made is not made
// again when another fails. Parts are made in this order: the record before the condition,
// whose write brings the Service back to the announcer, which by then has seen the record
// (the other way round it wrote the record again: make bench, 1.29 record writes a Service).
const (
	PartRecord = iota
	PartStatus
	numParts
)

type parts [numParts]func(context.Context) error

// NewWriter returns a writer whose queues are named after name; pacer holds paced writes back.
func NewWriter(name string, pacer *Pacer) *Writer {
	q := func(name string) workqueue.TypedRateLimitingInterface[string] {
		return workqueue.NewTypedRateLimitingQueueWithConfig(workqueue.DefaultTypedControllerRateLimiter[string](),
			workqueue.TypedRateLimitingQueueConfig[string]{Name: name})
	}
	return &Writer{queue: q(name), paced: q(name + "-paced"), pacer: pacer, pending: map[string]*parts{}}
}

// Set makes write the next write for key.
func (w *Writer) Set(key string, write func(context.Context) error) {
	w.set(w.queue, key, PartStatus, write)
}

// SetPaced makes write the next write for key, made when the pacer lets it. A key is always
// set paced or always not.
func (w *Writer) SetPaced(key string, write func(context.Context) error) {
	w.SetPacedPart(key, PartStatus, write)
}

// SetPacedPart makes write the next write of key's part, made when the pacer lets it, with
// the key's other parts.
func (w *Writer) SetPacedPart(key string, part int, write func(context.Context) error) {
	w.set(w.paced, key, part, write)
}

func (w *Writer) set(q workqueue.TypedRateLimitingInterface[string], key string, part int, write func(context.Context) error) {
	w.mu.Lock()
	p := w.pending[key]
	if p == nil {
		p = &parts{}
		w.pending[key] = p
	}
	p[part] = write
	w.mu.Unlock()
	q.Add(key)
}

// Run applies writes with n workers a queue until ctx ends.
func (w *Writer) Run(ctx context.Context, n int) {
	go func() { <-ctx.Done(); w.queue.ShutDown(); w.paced.ShutDown() }()
	var wg sync.WaitGroup
	for _, q := range []workqueue.TypedRateLimitingInterface[string]{w.queue, w.paced} {
		for range n {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for w.next(ctx, q) {
				}
			}()
		}
	}
	wg.Wait()
}

func (w *Writer) next(ctx context.Context, q workqueue.TypedRateLimitingInterface[string]) bool {
	key, quit := q.Get()
	if quit {
		return false
	}
	defer q.Done(key)
	if q == w.paced && w.pacer.Wait(ctx) != nil {
		return false
	}
	w.mu.Lock()
	p := w.pending[key]
	delete(w.pending, key)
	w.mu.Unlock()
	if p == nil {
		return true
	}
	failed := false
	for i, write := range p {
		if write == nil {
			continue
		}
		if err := write(ctx); err != nil {
			if ctx.Err() != nil {
				return false
			}
			klog.V(2).InfoS("Status write failed; retrying", "key", key, "part", i, "err", err)
			failed = true
			continue
		}
		p[i] = nil
	}
	if !failed {
		q.Forget(key)
		return true
	}
	// What failed is made again, unless a newer write of the same part was set meanwhile.
	w.mu.Lock()
	if newer := w.pending[key]; newer != nil {
		for i, write := range p {
			if newer[i] == nil {
				newer[i] = write
			}
		}
	} else {
		w.pending[key] = p
	}
	w.mu.Unlock()
	q.AddRateLimited(key)
	return true
}

// TakePending drops the writes not made yet and says how many there were (each part counts): for a test that
// runs a controller's rounds by hand and counts its writes without making them.
func (w *Writer) TakePending() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	n := 0
	for _, p := range w.pending {
		for _, write := range p {
			if write != nil {
				n++
			}
		}
	}
	clear(w.pending)
	return n
}
