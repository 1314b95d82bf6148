package main

import (
	"bufio"
	"fmt"
	"os"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
	"k8s.io/klog/v2"
)

// releaseStartupPages tells the kernel that this process no longer needs the pages of its
// binary that it has read so far (MADV_PAGEOUT on the executable's read-only mappings). Most
// were read once, at start-up: package initialisation registers every Kubernetes API group's
// types the client libraries link in, and the framework parses its flags and options; that is
// most of the CCM's resident memory (docs/benchmarks.md: 55 of 86 MiB at 1,000 Services were
// pages of the binary). Pages used again come back from the file on first use (a page fault);
// only those count in the resident set afterwards. Nothing else changes: the pages are clean
// (the file's), so nothing is written. Kernels before 5.4 do not know the advice: the
// pages then stay, as before.
func releaseStartupPages() {
	before := statusKB("RssFile:")
	n, err := pageOutExecutable()
	if err != nil {
		klog.V(2).InfoS("Could not release the binary's start-up pages", "err", err)
		return
	}
	klog.V(2).InfoS("Released the binary's start-up pages", "mappings", n, "residentFileKiBBefore", before, "residentFileKiBAfter", statusKB("RssFile:"))
}

// pageOutExecutable advises MADV_PAGEOUT on every read-only mapping of the executable and
// returns how many there were.
func pageOutExecutable() (int, error) {
	exe, err := os.Executable()
	if err != nil {
		return 0, err
	}
	f, err := os.Open("/proc/self/maps")
	if err != nil {
		return 0, err
	}
	defer f.Close()
	n := 0
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		// start-end perms offset dev inode path
		fields := strings.Fields(sc.Text())
		if len(fields) < 6 || fields[5] != exe || strings.Contains(fields[1], "w") {
			continue
		}
		from, to, ok := strings.Cut(fields[0], "-")
		if !ok {
			continue
		}
		start, err1 := strconv.ParseUint(from, 16, 64)
		end, err2 := strconv.ParseUint(to, 16, 64)
		if err1 != nil || err2 != nil || end <= start {
			continue
		}
		// A raw system call: the range is this process's own mapping, named by address.
		if _, _, errno := unix.Syscall(unix.SYS_MADVISE, uintptr(start), uintptr(end-start), unix.MADV_PAGEOUT); errno != 0 {
			return n, fmt.Errorf("madvise %s: %w", fields[0], errno)
		}
		n++
	}
	return n, sc.Err()
}

// statusKB reads a size in kB from /proc/self/status (-1 when it cannot).
func statusKB(key string) int64 {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return -1
	}
	for line := range strings.Lines(string(b)) {
		if v, ok := strings.CutPrefix(line, key); ok {
			kb, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			if err == nil {
				return kb
			}
		}
	}
	return -1
}
