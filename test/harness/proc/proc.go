// Package proc reads what Linux says of a process (/proc/PID/status and /proc/PID/stat) and of
// the machine (load, CPU model, memory, kernel) for the harnesses' figures: one parser for each
// file, so that two measurements of the same process cannot disagree on how they read it. It
// reads only; it never signals or changes a process.
package proc

import (
	"bytes"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"
)

// Status returns the fields of /proc/PID/status by name (without the colon), their values
// trimmed ("VmRSS" -> "5412 kB").
func Status(pid int) (map[string]string, error) {
	// The process may be `ip netns exec` that exec'd the binary: same pid.
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return nil, err
	}
	fields := map[string]string{}
	for l := range strings.SplitSeq(string(b), "\n") {
		if k, v, ok := strings.Cut(l, ":"); ok {
			fields[k] = strings.TrimSpace(v)
		}
	}
	return fields, nil
}

// Memory is a process's resident memory, in bytes.
type Memory struct {
	RSS  int64 // resident now (VmRSS)
	HWM  int64 // the peak of RSS (VmHWM)
	Anon int64 // heap and stacks (RssAnon)
	File int64 // pages of files, its binary's among them (RssFile)
}

// MemoryOf reads a process's resident memory; an error when it has none (a kernel thread) or
// cannot be read (it has exited).
func MemoryOf(pid int) (Memory, error) {
	st, err := Status(pid)
	if err != nil {
		return Memory{}, err
	}
	if _, ok := st["VmRSS"]; !ok {
		return Memory{}, fmt.Errorf("/proc/%d/status: no VmRSS", pid)
	}
	kb := func(name string) int64 {
		n, _ := strconv.ParseInt(strings.TrimSuffix(st[name], " kB"), 10, 64)
		return n << 10
	}
	return Memory{RSS: kb("VmRSS"), HWM: kb("VmHWM"), Anon: kb("RssAnon"), File: kb("RssFile")}, nil
}

// CapEff reads a process's effective capabilities.
func CapEff(pid int) (uint64, error) {
	st, err := Status(pid)
	if err != nil {
		return 0, err
	}
	v, ok := st["CapEff"]
	if !ok {
		return 0, fmt.Errorf("/proc/%d/status: no CapEff", pid)
	}
	return strconv.ParseUint(v, 16, 64)
}

// CPU is a process's user and system CPU so far.
func CPU(pid int) (time.Duration, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	// The command (field 2) is in parentheses and may hold spaces: count from its end.
	i := bytes.LastIndexByte(b, ')')
	if i < 0 || i+2 > len(b) {
		return 0, fmt.Errorf("/proc/%d/stat: no command", pid)
	}
	f := strings.Fields(string(b[i+2:]))
	if len(f) < 13 {
		return 0, fmt.Errorf("/proc/%d/stat: %d fields", pid, len(f))
	}
	u, err := strconv.ParseInt(f[11], 10, 64)
	if err != nil {
		return 0, fmt.Errorf("/proc/%d/stat utime: %w", pid, err)
	}
	s, err := strconv.ParseInt(f[12], 10, 64)
	if err != nil {
		return 0, fmt.Errorf("/proc/%d/stat stime: %w", pid, err)
	}
	return time.Duration(u+s) * 10 * time.Millisecond, nil // clock ticks (USER_HZ is 100 on Linux)
}

// CPUSeconds is CPU in seconds, 0 when it cannot be read (the process has exited).
func CPUSeconds(pid int) float64 {
	d, _ := CPU(pid)
	return d.Seconds()
}

// LoadAverage is /proc/loadavg's 1, 5 and 15 minute figures.
func LoadAverage() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "unknown"
	}
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return "unknown"
	}
	return strings.Join(f[:3], " ")
}

// CPUModel is the machine's CPU model name.
func CPUModel() string {
	b, _ := os.ReadFile("/proc/cpuinfo")
	for l := range strings.SplitSeq(string(b), "\n") {
		if strings.HasPrefix(l, "model name") {
			if _, v, ok := strings.Cut(l, ":"); ok {
				return strings.TrimSpace(v)
			}
		}
	}
	return "unknown CPU"
}

// MemTotal is the machine's memory, in GiB.
func MemTotal() string {
	b, _ := os.ReadFile("/proc/meminfo")
	for l := range strings.SplitSeq(string(b), "\n") {
		if strings.HasPrefix(l, "MemTotal:") {
			f := strings.Fields(l)
			kb, _ := strconv.ParseInt(f[1], 10, 64)
			return fmt.Sprintf("%.0f GiB", float64(kb)/(1<<20))
		}
	}
	return "unknown"
}

// Kernel is the running kernel's release.
func Kernel() string {
	b, _ := os.ReadFile("/proc/sys/kernel/osrelease")
	return strings.TrimSpace(string(b))
}
