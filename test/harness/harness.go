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
	start := time.Now()
	for !cond() {
		if time.Since(start) > timeout {
			t.Fatalf("%s: not within %s", what, timeout)
		}
		time.Sleep(20 * time.Millisecond)
	}
	return time.Since(start)
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
