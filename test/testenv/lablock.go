package testenv

import (
	"fmt"
	"os"
	"path/filepath"
	"syscall"
	"time"
)

// LabLock makes the packages whose tests measure time on the wire (the lab's failovers,
// rolling updates, fault soaks) run one at a time on this machine: `go test ./...` runs two
// packages at once, and on a 2-core machine two such packages starve each other's daemons
// (heartbeats every 50 ms, BFD) into takeovers that no fault caused. Called first in such a
// package's TestMain; the lock holds until the process exits. Other packages (unit tests, the
// API server's) still run beside it.
func LabLock(pkg string) {
	if lockFile != nil {
		return // held already
	}
	path := filepath.Join(os.TempDir(), "metalvip-lab.lock")
	f, err := os.OpenFile(path, os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		fmt.Fprintf(os.Stderr, "%s: lab lock %s: %v (running without it)\n", pkg, path, err)
		return
	}
	start := time.Now()
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		fmt.Fprintf(os.Stderr, "%s: waiting for the lab lock (%s): another timing-sensitive package runs\n", pkg, path)
		if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX); err != nil {
			fmt.Fprintf(os.Stderr, "%s: lab lock %s: %v (running without it)\n", pkg, path, err)
			return
		}
		fmt.Fprintf(os.Stderr, "%s: lab lock taken after %s\n", pkg, time.Since(start).Round(time.Second))
	}
	// f stays open (referenced, so no finalizer closes it): the lock is the process's until
	// it exits.
	lockFile = f
}

// lockFile keeps the lab lock's file open, and so the lock held, for the process's life.
var lockFile *os.File
