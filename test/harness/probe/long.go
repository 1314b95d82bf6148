package probe

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/metalvip/metalvip/test/harness"
)

// Long is a set of long-lived HTTP connections (keep-alive) from a lab host to a Service: each
// is asked again every interval on the same connection, and a connection that fails once (reset,
// closed, not answered within the timeout) counts as broken from then on. A VIP that moves to
// another node breaks the connections of an externalTrafficPolicy Cluster Service: the new
// node's conntrack does not know them. Read it after Stop.
type Long struct {
	target netip.AddrPort
	conns  []*longConn
	stop   chan struct{}
	once   sync.Once
	wg     sync.WaitGroup

	mu       sync.Mutex
	brokenAt []time.Time // per connection; zero while it lives
	why      []string
	asked    int
}

type longConn struct {
	c  net.Conn
	rd *bufio.Reader
	by string // who answered its first request (the workload names its pod and node)
}

// StartLong opens n connections from ns to target, asks each once, then asks every one again
// every interval until Stop (at most rounds times).
func StartLong(ns Namespace, target netip.AddrPort, n int, interval, timeout time.Duration, rounds int) (*Long, error) {
	l := &Long{target: target, stop: make(chan struct{}), brokenAt: make([]time.Time, n), why: make([]string, n)}
	for i := range n {
		var c net.Conn
		if err := ns.Do(func() error {
			var err error
			c, err = net.DialTimeout("tcp", target.String(), timeout)
			return err
		}); err != nil {
			l.closeAll()
			return nil, fmt.Errorf("long connection %d to %s: %w", i, target, err)
		}
		lc := &longConn{c: c, rd: bufio.NewReader(c)}
		l.conns = append(l.conns, lc)
		var err error
		if lc.by, err = lc.ask(target, timeout); err != nil {
			l.closeAll()
			return nil, fmt.Errorf("long connection %d to %s: %w", i, target, err)
		}
	}
	l.wg.Add(1)
	go func() {
		defer l.wg.Done()
		for range harness.Ticks(l.stop, interval, rounds) {
			for i, lc := range l.conns {
				l.mu.Lock()
				broken := !l.brokenAt[i].IsZero()
				l.mu.Unlock()
				if broken {
					continue
				}
				_, err := lc.ask(target, timeout)
				l.mu.Lock()
				l.asked++
				if err != nil {
					l.brokenAt[i], l.why[i] = time.Now(), err.Error()
				}
				l.mu.Unlock()
			}
		}
	}()
	return l, nil
}

// ask sends one GET on the connection and reads the answer.
func (lc *longConn) ask(target netip.AddrPort, timeout time.Duration) (string, error) {
	_ = lc.c.SetDeadline(time.Now().Add(timeout))
	if _, err := fmt.Fprintf(lc.c, "GET / HTTP/1.1\r\nHost: %s\r\n\r\n", target); err != nil {
		return "", err
	}
	resp, err := http.ReadResponse(lc.rd, nil)
	if err != nil {
		return "", err
	}
	b, err := io.ReadAll(io.LimitReader(resp.Body, 4096))
	resp.Body.Close()
	if err != nil {
		return "", err
	}
	if resp.StatusCode != http.StatusOK {
		return "", fmt.Errorf("%s", resp.Status)
	}
	return strings.TrimSpace(string(b)), nil
}

// Stop ends the asking and closes the connections; later calls do nothing.
func (l *Long) Stop() {
	l.once.Do(func() { close(l.stop) })
	l.wg.Wait()
	l.closeAll()
}

func (l *Long) closeAll() {
	for _, lc := range l.conns {
		lc.c.Close()
	}
}

// Broken returns how many connections broke, and when and why the first did ("" if none).
func (l *Long) Broken() (int, string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	n, first := 0, ""
	var at time.Time
	for i, t := range l.brokenAt {
		if t.IsZero() {
			continue
		}
		n++
		if at.IsZero() || t.Before(at) {
			at, first = t, fmt.Sprintf("%s at %s: %s", l.target, t.Format("15:04:05.000"), l.why[i])
		}
	}
	return n, first
}

// Breaks lists each broken connection: when, who served it, why; in the order they broke.
func (l *Long) Breaks() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	type brk struct {
		at   time.Time
		line string
	}
	var bs []brk
	for i, t := range l.brokenAt {
		if !t.IsZero() {
			bs = append(bs, brk{t, fmt.Sprintf("%s served by %q: %s", t.Format("15:04:05.000"), l.conns[i].by, l.why[i])})
		}
	}
	slices.SortFunc(bs, func(a, b brk) int { return a.at.Compare(b.at) })
	out := make([]string, len(bs))
	for i, b := range bs {
		out[i] = b.line
	}
	return out
}

// Asked is how many times the connections were asked again after they opened.
func (l *Long) Asked() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.asked
}

// Len is how many connections there are.
func (l *Long) Len() int { return len(l.conns) }
