// Package harness holds what every metalvip test harness does one way: waiting for a condition
// (Eventually) and the frame of a program that drives the harnesses outside `go test` (the
// demos and benchmarks). Its subpackages do the rest once: pki writes certificates, proc reads
// /proc, probe measures what a client sees, figure formats a report's figures. It starts no
// API server, lab or cluster itself: test/kubeapi, test/lab and test/cluster do.
package harness

import (
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
