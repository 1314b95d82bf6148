package lab

import (
	"bufio"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/metalvip/metalvip/test/testenv"
)

// Source is one connection a SourceLog accepted: when, from which address and port, and the
// first line the client sent (the cluster tests' clients send their pod and node).
type Source struct {
	At   time.Time
	From netip.Addr
	Port uint16
	Line string
}

// SourceLog records the source address of every TCP connection to a port of a host.
type SourceLog struct {
	mu      sync.Mutex
	sources []Source
	limit   int
}

// RecordSources listens on TCP port on every address of h until the test ends and records
// each connection's source address and first line (at most 256 bytes, read within a second),
// keeping the last limit.
func (h *Host) RecordSources(t testenv.TB, port uint16, limit int) *SourceLog {
	t.Helper()
	ln := h.listen(t, port)
	l := &SourceLog{limit: limit}
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			at := time.Now()
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer c.Close()
				_ = c.SetReadDeadline(time.Now().Add(time.Second))
				line, _ := bufio.NewReaderSize(c, 256).ReadString('\n')
				from, _ := netip.ParseAddrPort(c.RemoteAddr().String())
				l.add(Source{At: at, From: from.Addr().Unmap(), Port: from.Port(), Line: strings.TrimSpace(line)})
			}()
		}
	}()
	t.Cleanup(func() { _ = ln.Close(); wg.Wait() })
	return l
}

func (l *SourceLog) add(s Source) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.sources) >= l.limit {
		l.sources = append(l.sources[:0], l.sources[len(l.sources)/2:]...)
	}
	l.sources = append(l.sources, s)
}

// Since returns the connections accepted at or after t whose line has prefix, in the order
// they were accepted.
func (l *SourceLog) Since(t time.Time, prefix string) []Source {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []Source
	for _, s := range l.sources {
		if !s.At.Before(t) && strings.HasPrefix(s.Line, prefix) {
			out = append(out, s)
		}
	}
	slices.SortStableFunc(out, func(a, b Source) int { return a.At.Compare(b.At) })
	return out
}
