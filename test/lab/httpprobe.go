package lab

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"strings"
	"sync"
	"time"

	"github.com/metalvip/metalvip/test/testenv"
)

// ServeHTTP serves HTTP on port on every address of h (VIPs included: nodes accept traffic for
// the lab's VIP ranges) until the test ends; every answer's body is h's name, so a client
// knows which node answered.
func (h *Host) ServeHTTP(t testenv.TB, port uint16) {
	t.Helper()
	var ln net.Listener
	// The listening socket is made in h's namespace and stays there; accepting and serving
	// need no namespace of their own.
	if err := h.Do(func() error {
		var err error
		ln, err = net.Listen("tcp", fmt.Sprintf(":%d", port))
		return err
	}); err != nil {
		t.Fatalf("HTTP server on %s: %v", h.Name, err)
	}
	srv := &http.Server{
		Handler: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
			w.Header().Set("Connection", "close")
			_, _ = io.WriteString(w, h.Name)
		}),
		ReadHeaderTimeout: time.Second,
	}
	done := make(chan struct{})
	go func() { defer close(done); _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Close(); <-done })
}

// HTTPProber opens a new TCP connection to a target from a host every interval and asks it
// for one HTTP answer, to measure outages as a client opening connections sees them. Each
// attempt that has no answer within its timeout counts as lost; attempts overlap (a connect to
// a dead node's MAC would otherwise hold the next ones back).
type HTTPProber struct {
	target   netip.AddrPort
	interval time.Duration
	timeout  time.Duration

	mu      sync.Mutex
	sent    []time.Time // by attempt
	replied []bool
	by      []string // the node that answered

	tick chan int
	stop chan struct{}
	done sync.WaitGroup
	errs chan error
}

// HTTPProbe starts probing target from h every interval, for at most limit attempts, each
// given timeout to be answered. Stop it with Stop.
func (h *Host) HTTPProbe(target netip.AddrPort, interval, timeout time.Duration, limit int) (*HTTPProber, error) {
	if interval <= 0 || timeout <= 0 || limit <= 0 {
		return nil, errors.New("HTTP probe: interval, timeout and limit must be positive")
	}
	p := &HTTPProber{target: target, interval: interval, timeout: timeout,
		tick: make(chan int, 64), stop: make(chan struct{}), errs: make(chan error, 1)}
	// Enough workers that an attempt always finds one free while the others wait out their
	// timeouts. Each stays in h's namespace (its thread locked there), so its sockets are h's.
	workers := int(timeout/interval) + 4
	for range workers {
		p.done.Add(1)
		go func() {
			defer p.done.Done()
			if err := h.Do(p.work); err != nil {
				select {
				case p.errs <- err:
				default:
				}
			}
		}()
	}
	p.done.Add(1)
	go p.send(limit)
	return p, nil
}

func (p *HTTPProber) send(limit int) {
	defer p.done.Done()
	defer close(p.tick)
	t := time.NewTicker(p.interval)
	defer t.Stop()
	for i := 0; i < limit; i++ {
		p.mu.Lock()
		p.sent = append(p.sent, time.Now())
		p.replied = append(p.replied, false)
		p.by = append(p.by, "")
		p.mu.Unlock()
		select {
		case p.tick <- i:
		default:
			// No worker free: the attempt is not made and counts as lost.
		}
		select {
		case <-p.stop:
			return
		case <-t.C:
		}
	}
}

// work makes attempts until the ticks end.
func (p *HTTPProber) work() error {
	for i := range p.tick {
		node, ok := p.attempt()
		if ok {
			p.mu.Lock()
			p.replied[i], p.by[i] = true, node
			p.mu.Unlock()
		}
	}
	return nil
}

func (p *HTTPProber) attempt() (string, bool) {
	deadline := time.Now().Add(p.timeout)
	c, err := net.DialTimeout("tcp", p.target.String(), p.timeout)
	if err != nil {
		return "", false
	}
	defer c.Close()
	_ = c.SetDeadline(deadline)
	if _, err := fmt.Fprintf(c, "GET / HTTP/1.1\r\nHost: %s\r\nConnection: close\r\n\r\n", p.target); err != nil {
		return "", false
	}
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		return "", false
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 256))
	if err != nil || resp.StatusCode != http.StatusOK {
		return "", false
	}
	return strings.TrimSpace(string(body)), true
}

// Stop stops probing and waits for the attempts under way (at most the timeout); it returns an
// error if a worker could not enter the host's namespace.
func (p *HTTPProber) Stop() error {
	select {
	case <-p.stop:
		return nil
	default:
	}
	close(p.stop)
	p.done.Wait()
	select {
	case err := <-p.errs:
		return err
	default:
		return nil
	}
}

// Answered reports whether the last attempt made at least the timeout ago was answered.
func (p *HTTPProber) Answered() bool { return p.Answerer() != "" }

// Answerer is the node that answered the last attempt made at least the timeout ago; empty
// when none did.
func (p *HTTPProber) Answerer() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	for i := len(p.sent) - 1; i >= 0; i-- {
		if time.Since(p.sent[i]) >= p.timeout {
			return p.by[i]
		}
	}
	return ""
}

// Steady returns the node that answered every attempt made over window, up to the timeout
// ago (the later ones may be under way); empty when they were not all answered by one node.
func (p *HTTPProber) Steady(window time.Duration) string {
	p.mu.Lock()
	defer p.mu.Unlock()
	to := time.Now().Add(-p.timeout)
	from := to.Add(-window)
	if len(p.sent) == 0 || p.sent[0].After(from) {
		return ""
	}
	node := ""
	for i, at := range p.sent {
		if at.Before(from) || at.After(to) {
			continue
		}
		if !p.replied[i] || node != "" && p.by[i] != node {
			return ""
		}
		node = p.by[i]
	}
	return node
}

// Outage returns the longest run of unanswered attempts made after since, as time from the
// first unanswered attempt to the first answered one after it, how many were lost in all, and
// which nodes answered the attempts after since (in order, each named once per run).
func (p *HTTPProber) Outage(since time.Time) (longest time.Duration, lost int, answerers []string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	var start time.Time
	for i, at := range p.sent {
		if at.Before(since) {
			continue
		}
		if !p.replied[i] {
			lost++
			if start.IsZero() {
				start = at
			}
			continue
		}
		if n := len(answerers); n == 0 || answerers[n-1] != p.by[i] {
			answerers = append(answerers, p.by[i])
		}
		if !start.IsZero() {
			longest = max(longest, at.Sub(start))
			start = time.Time{}
		}
	}
	return longest, lost, answerers
}
