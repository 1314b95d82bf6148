// Package probe measures what a client sees of a Service: one HTTP prober (a GET on a new
// connection every interval, from a lab host's namespace) and one way to read an outage from
// any probe's attempts (ICMP, HTTP). It judges nothing: the tests decide what an outage may be.
package probe

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

	"github.com/metalvip/metalvip/test/harness"
)

// Namespace is where the probes are sent from: a lab host (*lab.Host).
type Namespace interface {
	Do(fn func() error) error
}

// Attempt is one probe: when it was sent, whether its outcome is known (answered, failed or
// timed out), whether it was answered and by whom (the answer's body, for HTTP).
type Attempt struct {
	Sent time.Time
	Done bool
	OK   bool
	By   string
}

// Outage is what a client saw of the attempts sent over a span.
type Outage struct {
	// Longest is the longest run of attempts not answered, from the first of the run to the
	// first answered after it; a run still open at the end counts to its last attempt, plus
	// an interval.
	Longest time.Duration
	Lost    int      // attempts not answered
	Sent    int      // attempts whose outcome is known
	By      []string // who answered, in order, each named once per run of answers
	// Open says the last run of attempts not answered was still open at the end: the client
	// was not answered again.
	Open bool
}

// OutageOf reads the outage of the attempts sent from from to to, sent every interval; those
// whose outcome is not known yet count neither way.
func OutageOf(attempts []Attempt, from, to time.Time, interval time.Duration) Outage {
	var o Outage
	var start, last time.Time
	for _, a := range attempts {
		if !a.Done || a.Sent.Before(from) || a.Sent.After(to) {
			continue
		}
		o.Sent++
		last = a.Sent
		if !a.OK {
			o.Lost++
			if start.IsZero() {
				start = a.Sent
			}
			continue
		}
		if n := len(o.By); n == 0 || o.By[n-1] != a.By {
			o.By = append(o.By, a.By)
		}
		if !start.IsZero() {
			o.Longest = max(o.Longest, a.Sent.Sub(start))
			start = time.Time{}
		}
	}
	if !start.IsZero() {
		o.Longest = max(o.Longest, last.Sub(start)+interval)
		o.Open = true
	}
	return o
}

// HTTP opens a new TCP connection to a target from a namespace every interval and asks it for
// one HTTP answer (GET /), to measure outages as a client opening connections sees them. Each
// attempt not answered with 200 within its timeout is lost; attempts overlap (a connect to a
// dead node's MAC would otherwise hold the next ones back).
type HTTP struct {
	target   netip.AddrPort
	interval time.Duration
	timeout  time.Duration

	mu       sync.Mutex
	attempts []Attempt
	lastErr  string

	tick chan int
	stop chan struct{}
	once sync.Once // closes stop
	done sync.WaitGroup
	errs chan error
}

// StartHTTP starts probing target from ns every interval, for at most limit attempts, each
// given timeout to be answered. Stop it with Stop.
func StartHTTP(ns Namespace, target netip.AddrPort, interval, timeout time.Duration, limit int) (*HTTP, error) {
	if interval <= 0 || timeout <= 0 || limit <= 0 {
		return nil, errors.New("HTTP probe: interval, timeout and limit must be positive")
	}
	p := &HTTP{target: target, interval: interval, timeout: timeout,
		tick: make(chan int, 64), stop: make(chan struct{}), errs: make(chan error, 1)}
	// Enough workers that an attempt always finds one free while the others wait out their
	// timeouts. Each stays in the namespace (its thread locked there), so its sockets are its.
	workers := int(timeout/interval) + 4
	for range workers {
		p.done.Add(1)
		go func() {
			defer p.done.Done()
			if err := ns.Do(p.work); err != nil {
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

func (p *HTTP) send(limit int) {
	defer p.done.Done()
	defer close(p.tick)
	for i := range harness.Every(p.stop, p.interval, limit) {
		p.mu.Lock()
		p.attempts = append(p.attempts, Attempt{Sent: time.Now()})
		p.mu.Unlock()
		select {
		case p.tick <- i:
		default:
			// No worker free: the attempt is not made and counts as lost.
			p.finish(i, "", errors.New("no worker free to make the attempt"))
		}
	}
}

// work makes attempts until the ticks end.
func (p *HTTP) work() error {
	for i := range p.tick {
		body, err := get(p.target, p.timeout)
		p.finish(i, body, err)
	}
	return nil
}

func (p *HTTP) finish(i int, body string, err error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.attempts[i].Done = true
	if err != nil {
		p.lastErr = err.Error()
		return
	}
	p.attempts[i].OK, p.attempts[i].By = true, body
}

// Stop stops probing and waits for the attempts under way (at most the timeout); it returns an
// error if a worker could not enter the namespace.
func (p *HTTP) Stop() (err error) {
	p.once.Do(func() {
		close(p.stop)
		p.done.Wait()
		select {
		case err = <-p.errs:
		default:
		}
	})
	return err
}

// Answered reports whether the last attempt whose outcome is known was answered.
func (p *HTTP) Answered() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	for i := len(p.attempts) - 1; i >= 0; i-- {
		if p.attempts[i].Done {
			return p.attempts[i].OK
		}
	}
	return false
}

// Steady returns who answered every attempt made over window, up to the timeout ago (the later
// ones may be under way); empty when they were not all answered by one.
func (p *HTTP) Steady(window time.Duration) string {
	p.mu.Lock()
	defer p.mu.Unlock()
	to := time.Now().Add(-p.timeout)
	from := to.Add(-window)
	if len(p.attempts) == 0 || p.attempts[0].Sent.After(from) {
		return ""
	}
	by := ""
	for _, a := range p.attempts {
		if a.Sent.Before(from) || a.Sent.After(to) {
			continue
		}
		if !a.OK || by != "" && a.By != by {
			return ""
		}
		by = a.By
	}
	return by
}

// Outage is the outage over the attempts sent after since (see OutageOf).
func (p *HTTP) Outage(since time.Time) Outage { return p.OutageBetween(since, time.Now()) }

// OutageBetween is the outage over the attempts sent from from to to (see OutageOf).
func (p *HTTP) OutageBetween(from, to time.Time) Outage {
	p.mu.Lock()
	defer p.mu.Unlock()
	return OutageOf(p.attempts, from, to, p.interval)
}

// Served returns how many attempts each answer (body) answered.
func (p *HTTP) Served() map[string]int {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := map[string]int{}
	for _, a := range p.attempts {
		if a.OK {
			out[a.By]++
		}
	}
	return out
}

// LastError is the last failure an attempt saw, for messages.
func (p *HTTP) LastError() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.lastErr
}

// Get fetches http://target/ once from ns, on a new connection, and returns the body of a 200
// answer, trimmed.
func Get(ns Namespace, target netip.AddrPort, timeout time.Duration) (string, error) {
	var body string
	err := ns.Do(func() error {
		var err error
		body, err = get(target, timeout)
		return err
	})
	return body, err
}

// get is Get in the caller's namespace.
func get(target netip.AddrPort, timeout time.Duration) (string, error) {
	deadline := time.Now().Add(timeout)
	c, err := net.DialTimeout("tcp", target.String(), timeout)
	if err != nil {
		return "", fmt.Errorf("GET http://%s/: %w", target, err)
	}
	defer c.Close()
	_ = c.SetDeadline(deadline)
	if _, err := fmt.Fprintf(c, "GET / HTTP/1.1\r\nHost: %s\r\nConnection: close\r\n\r\n", target); err != nil {
		return "", fmt.Errorf("GET http://%s/: %w", target, err)
	}
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		return "", fmt.Errorf("GET http://%s/: %w", target, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 4096))
	if err != nil {
		return "", fmt.Errorf("GET http://%s/: %w", target, err)
	}
	if resp.StatusCode != http.StatusOK {
		return "", fmt.Errorf("GET http://%s/: %s: %q", target, resp.Status, b)
	}
	return strings.TrimSpace(string(b)), nil
}
