package kubecluster

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"strings"
	"sync"
	"time"

	"github.com/metalvip/metalvip/test/lab"
)

// HTTPProbe sends GET http://target/ from a lab host every interval, each on a new connection
// (a new flow, as a new client would be), and records which were answered, to measure outages
// as a client of the Service sees them. Probes run concurrently: one waiting for its timeout
// does not delay the next.
type HTTPProbe struct {
	target   netip.Addr
	interval time.Duration
	client   *http.Client

	mu      sync.Mutex
	sent    []time.Time
	ok      []bool
	bodies  map[string]int // answers by body (the pod and node that served)
	lastErr string

	stop    chan struct{}
	stopped sync.Once
	wg      sync.WaitGroup
}

// ProbeHTTP starts probing target from h every interval, for at most limit probes, each given
// timeout to answer. Stop it with Stop.
func ProbeHTTP(h *lab.Host, target netip.Addr, interval, timeout time.Duration, limit int) *HTTPProbe {
	dial := func(ctx context.Context, network, addr string) (net.Conn, error) {
		var conn net.Conn
		err := h.Do(func() error {
			d := net.Dialer{Timeout: timeout}
			var err error
			conn, err = d.DialContext(ctx, network, addr)
			return err
		})
		return conn, err
	}
	p := &HTTPProbe{target: target, interval: interval, bodies: map[string]int{}, stop: make(chan struct{}),
		client: &http.Client{Timeout: timeout, Transport: &http.Transport{DialContext: dial, DisableKeepAlives: true}}}
	p.wg.Add(1)
	go p.run(limit)
	return p
}

func (p *HTTPProbe) run(limit int) {
	defer p.wg.Done()
	t := time.NewTicker(p.interval)
	defer t.Stop()
	for i := 0; i < limit; i++ {
		p.mu.Lock()
		p.sent = append(p.sent, time.Now())
		p.ok = append(p.ok, false)
		p.mu.Unlock()
		p.wg.Add(1)
		go p.one(i)
		select {
		case <-p.stop:
			return
		case <-t.C:
		}
	}
}

func (p *HTTPProbe) one(i int) {
	defer p.wg.Done()
	resp, err := p.client.Get("http://" + p.target.String() + "/")
	if err != nil {
		p.mu.Lock()
		p.lastErr = err.Error()
		p.mu.Unlock()
		return
	}
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 256))
	resp.Body.Close()
	p.mu.Lock()
	defer p.mu.Unlock()
	if resp.StatusCode == http.StatusOK {
		p.ok[i] = true
		p.bodies[strings.TrimSpace(string(body))]++
	} else {
		p.lastErr = resp.Status
	}
}

// Stop stops probing and waits for the probes in flight.
func (p *HTTPProbe) Stop() {
	p.stopped.Do(func() { close(p.stop) })
	p.wg.Wait()
	p.client.CloseIdleConnections()
}

// Answered reports whether the last probe that has had its full time was answered.
func (p *HTTPProbe) Answered() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	for i := len(p.sent) - 1; i >= 0; i-- {
		if time.Since(p.sent[i]) >= p.client.Timeout+50*time.Millisecond {
			return p.ok[i]
		}
	}
	return false
}

// Outage returns the longest run of unanswered probes sent after since, from the first
// unanswered one to the first answered one after it (a run still open at the end counts up to
// the last probe), and how many probes were lost in all, of how many sent.
func (p *HTTPProbe) Outage(since time.Time) (longest time.Duration, lost, sent int) {
	return p.OutageBetween(since, time.Now())
}

// OutageBetween is Outage for the probes sent from from to to.
func (p *HTTPProbe) OutageBetween(from, to time.Time) (longest time.Duration, lost, sent int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	var start time.Time
	var last time.Time
	for i, at := range p.sent {
		if at.Before(from) || at.After(to) {
			continue
		}
		sent++
		last = at
		if !p.ok[i] {
			lost++
			if start.IsZero() {
				start = at
			}
			continue
		}
		if !start.IsZero() {
			longest = max(longest, at.Sub(start))
			start = time.Time{}
		}
	}
	if !start.IsZero() {
		longest = max(longest, last.Sub(start)+p.interval)
	}
	return longest, lost, sent
}

// Served returns how many answers each body (pod and node) gave.
func (p *HTTPProbe) Served() map[string]int {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := make(map[string]int, len(p.bodies))
	for k, v := range p.bodies {
		out[k] = v
	}
	return out
}

// LastError is the last failure a probe saw, for messages.
func (p *HTTPProbe) LastError() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.lastErr
}

// Get fetches http://target/ once from h and returns the body.
func Get(h *lab.Host, target netip.Addr, timeout time.Duration) (string, error) {
	return GetFrom(h, netip.AddrPortFrom(target, 80), timeout)
}

// GetFrom fetches http://target/ once from h and returns the body of a 200 answer.
func GetFrom(h *lab.Host, target netip.AddrPort, timeout time.Duration) (string, error) {
	var body string
	err := h.Do(func() error {
		d := net.Dialer{Timeout: timeout}
		conn, err := d.Dial("tcp", target.String())
		if err != nil {
			return err
		}
		defer conn.Close()
		_ = conn.SetDeadline(time.Now().Add(timeout))
		if _, err := fmt.Fprintf(conn, "GET / HTTP/1.0\r\nHost: %s\r\n\r\n", target.Addr()); err != nil {
			return err
		}
		b, err := io.ReadAll(io.LimitReader(conn, 4096))
		if err != nil {
			return err
		}
		head, rest, ok := strings.Cut(string(b), "\r\n\r\n")
		if !ok || !strings.Contains(strings.SplitN(head, "\r\n", 2)[0], " 200 ") {
			return fmt.Errorf("GET http://%s/: unexpected answer %q", target, b)
		}
		body = strings.TrimSpace(rest)
		return nil
	})
	return body, err
}
