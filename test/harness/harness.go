// Package harness holds what every metalvip test harness does one way: waiting for a condition
// (Eventually), pacing a loop that runs until stopped (Every, Ticks, Stopped) and the frame of a program that drives the harnesses outside `go test` (the
// demos and benchmarks). Its subpackages do the rest once: pki writes certificates, proc reads
// /proc, probe measures what a client sees, figure formats a report's figures. It starts no
// API server, lab or cluster itself: test/kubeapi, test/lab and test/cluster do.
package harness

import (
	"iter"
	"sync"
	"time"

	"github.com/metalvip/metalvip/test/testenv"
)

// Eventually polls cond every 20 ms for up to timeout and returns how long it took; it fails t
// with what was waited for when cond never held.
func Eventually(t testenv.TB, timeout time.Duration, what string, cond func() bool) time.Duration {
	t.Helper()
	took, ok := Within(timeout, cond)
	if !ok {
		t.Fatalf("%s: not within %s", what, timeout)
	}
	return took
}

// Within polls cond every 20 ms for up to timeout, and says whether it held and how long that
// took: Eventually for a caller that goes on when it does not (a soak that records a
// violation and carries on).
func Within(timeout time.Duration, cond func() bool) (time.Duration, bool) {
	return WithinEvery(timeout, 20*time.Millisecond, cond)
}

// WithinEvery is Within polling every every, for a cond that costs (one that asks the wire).
func WithinEvery(timeout, every time.Duration, cond func() bool) (time.Duration, bool) {
	start := time.Now()
	for !cond() {
		if time.Since(start) > timeout {
			return time.Since(start), false
		}
		time.Sleep(every)
	}
	return time.Since(start), true
}

// Parallel calls f(i) for every i from 0 to n-1 from workers goroutines at once (worker k takes
// k, k+workers, ...), as that many clients would, and returns when all calls have.
func Parallel(workers, n int, f func(i int)) {
	var wg sync.WaitGroup
	for k := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := k; i < n; i += workers {
				f(i)
			}
		}()
	}
	wg.Wait()
}

// Every yields 0, 1, ... up to rounds-1: the first at once, each next one interval after the
// last, until stop is closed (which ends the wait after a round).
func Every(stop <-chan struct{}, interval time.Duration, rounds int) iter.Seq[int] {
	return func(yield func(int) bool) {
		t := time.NewTicker(interval)
		defer t.Stop()
		for i := range rounds {
			if !yield(i) {
				return
			}
			select {
			case <-stop:
				return
			case <-t.C:
			}
		}
	}
}

// Ticks yields 0, 1, ... up to rounds-1, one every interval (the first after one interval),
// until stop is closed.
func Ticks(stop <-chan struct{}, interval time.Duration, rounds int) iter.Seq[int] {
	return func(yield func(int) bool) {
		t := time.NewTicker(interval)
		defer t.Stop()
		for i := range rounds {
			select {
			case <-stop:
				return
			case <-t.C:
			}
			if !yield(i) {
				return
			}
		}
	}
}

// Stopped reports whether stop is closed, without waiting.
func Stopped(stop <-chan struct{}) bool {
	select {
	case <-stop:
		return true
	default:
		return false
	}
}
