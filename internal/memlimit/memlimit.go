// Package memlimit gives the Go runtime a soft memory limit below the container's, so that the
// collector runs harder as the process nears its cgroup's limit instead of letting the heap
// double past it and the kernel kill the process.
//
// Measured (docs/benchmarks-scale.md): the CCM's resident memory is 2.3 times its live heap,
// because Go's collector lets the heap grow to twice what survived the last collection before
// it runs again. At 10,000 Services on 1,000 nodes that is 580 MiB resident, past the chart's
// 512 MiB limit, with a live heap a third of it.
package memlimit

import (
	"fmt"
	"os"
	"runtime/debug"
	"strconv"
	"strings"

	"k8s.io/klog/v2"
)

// cgroupFile is where cgroup v2 says the memory limit of the process's cgroup (a container's);
// a variable for the tests. cgroup v1 hosts give no limit here.
var cgroupFile = "/sys/fs/cgroup/memory.max"

// Share is the part of the cgroup's limit given to the runtime: the rest is for what the Go
// heap does not count (the binary's pages, thread stacks outside the heap, the kernel's
// buffers charged to the cgroup).
const Share = 0.9

// Set gives the runtime a soft limit of Share of the cgroup's memory limit, unless GOMEMLIMIT
// is set (the operator's choice) or there is no limit. It returns the limit set, 0 for none,
// and why not.
func Set() (int64, string) {
	if v := os.Getenv("GOMEMLIMIT"); v != "" {
		return 0, "GOMEMLIMIT=" + v + " is set"
	}
	b, err := os.ReadFile(cgroupFile)
	if err != nil {
		return 0, fmt.Sprintf("no cgroup v2 memory limit (%v)", err)
	}
	limit, ok, err := parse(string(b))
	if err != nil {
		return 0, fmt.Sprintf("%s: %v", cgroupFile, err)
	}
	if !ok {
		return 0, "the cgroup has no memory limit"
	}
	soft := int64(float64(limit) * Share)
	debug.SetMemoryLimit(soft)
	return soft, ""
}

// SetAndLog is Set, and says what it did.
func SetAndLog() {
	if soft, why := Set(); soft > 0 {
		klog.InfoS("Go memory limit set below the container's: the collector runs harder near it", "softLimitMiB", soft>>20, "share", Share)
	} else {
		// At Info: the CCM calls this before its -v flag is applied.
		klog.InfoS("Go memory limit not taken from the container", "reason", why)
	}
}

// parse reads memory.max: a count of bytes, or "max" for none.
func parse(s string) (int64, bool, error) {
	s = strings.TrimSpace(s)
	if s == "max" {
		return 0, false, nil
	}
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil || n <= 0 {
		return 0, false, fmt.Errorf("%q is not a memory limit", s)
	}
	return n, true, nil
}
