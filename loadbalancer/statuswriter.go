package loadbalancer

import (
	"context"
	"sync"

	"k8s.io/client-go/util/workqueue"
	"k8s.io/klog/v2"
)

// statusWriter writes status off the deciding loop: the loop sets the latest write for a key
// (a Service's condition, a pool's), and workers apply it; a newer write replaces one not yet
// made, and failures retry with backoff. So a slow or failing API server never holds up what
// the agents are told.
type statusWriter struct {
	queue workqueue.TypedRateLimitingInterface[string]

	mu      sync.Mutex
	pending map[string]func(context.Context) error
}

func newStatusWriter(name string) *statusWriter {
	return &statusWriter{
		queue: workqueue.NewTypedRateLimitingQueueWithConfig(workqueue.DefaultTypedControllerRateLimiter[string](),
			workqueue.TypedRateLimitingQueueConfig[string]{Name: name}),
		pending: map[string]func(context.Context) error{},
	}
}

// Set makes write the next write for key.
func (w *statusWriter) Set(key string, write func(context.Context) error) {
	w.mu.Lock()
	w.pending[key] = write
	w.mu.Unlock()
	w.queue.Add(key)
}

// Run applies writes with n workers until ctx ends.
func (w *statusWriter) Run(ctx context.Context, n int) {
	go func() { <-ctx.Done(); w.queue.ShutDown() }()
	var wg sync.WaitGroup
	for range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for w.next(ctx) {
			}
		}()
	}
	wg.Wait()
}

func (w *statusWriter) next(ctx context.Context) bool {
	key, quit := w.queue.Get()
	if quit {
		return false
	}
	defer w.queue.Done(key)
	w.mu.Lock()
	write := w.pending[key]
	delete(w.pending, key)
	w.mu.Unlock()
	if write == nil {
		return true
	}
	if err := write(ctx); err != nil {
		if ctx.Err() != nil {
			return false
		}
		klog.V(2).InfoS("Status write failed; retrying", "key", key, "err", err)
		w.mu.Lock()
		if _, newer := w.pending[key]; !newer {
			w.pending[key] = write
		}
		w.mu.Unlock()
		w.queue.AddRateLimited(key)
		return true
	}
	w.queue.Forget(key)
	return true
}
