package probe

import (
	"io"
	"net"
	"net/http"
	"net/netip"
	"slices"
	"sync/atomic"
	"testing"
	"time"
)

// here is this process's own namespace.
type here struct{}

func (here) Do(fn func() error) error { return fn() }

func TestAnOutageIsTheLongestRunOfLostAttempts(t *testing.T) {
	t0 := time.Unix(1000, 0)
	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }
	attempts := []Attempt{
		{Sent: at(0), Done: true, OK: true, By: "node1"},
		{Sent: at(10), Done: true},
		{Sent: at(20), Done: true},
		{Sent: at(30), Done: true, OK: true, By: "node2"},
		{Sent: at(40), Done: true, OK: true, By: "node2"},
		{Sent: at(50), Done: true},
		{Sent: at(60)}, // under way: neither lost nor answered
	}
	o := OutageOf(attempts, t0, at(100), 10*time.Millisecond)
	if o.Longest != 20*time.Millisecond || o.Lost != 3 || o.Sent != 6 || !slices.Equal(o.By, []string{"node1", "node2"}) {
		t.Errorf("outage %+v: want 20ms, 3 lost of 6, node1 then node2", o)
	}
	if !o.Open {
		t.Errorf("the attempt at 50 ms was lost and none after it answered: the outage is open")
	}
	if o := OutageOf(attempts[:3], t0, at(100), 10*time.Millisecond); o.Longest != 20*time.Millisecond || !o.Open {
		t.Errorf("a run still open at the end: %s (open: %v), want to its last attempt plus an interval (20ms), open", o.Longest, o.Open)
	}
	if o := OutageOf(attempts[:5], t0, at(100), 10*time.Millisecond); o.Open {
		t.Errorf("the client was answered again at 30 ms: the outage is not open")
	}
}

func TestTheHTTPProberSeesAnAnswerStopAndComeBack(t *testing.T) {
	var down atomic.Bool
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		if down.Load() {
			w.WriteHeader(http.StatusServiceUnavailable)
			return
		}
		_, _ = io.WriteString(w, "node1\n")
	})}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { srv.Close() })
	target := netip.MustParseAddrPort(ln.Addr().String())

	if body, err := Get(here{}, target, time.Second); err != nil || body != "node1" {
		t.Fatalf("Get: %q, %v", body, err)
	}
	p, err := StartHTTP(here{}, target, 5*time.Millisecond, time.Second, 1000)
	if err != nil {
		t.Fatal(err)
	}
	wait := func(what string, cond func() bool) {
		t.Helper()
		for start := time.Now(); !cond(); time.Sleep(5 * time.Millisecond) {
			if time.Since(start) > 5*time.Second {
				t.Fatalf("%s: not within 5s (last error %s)", what, p.LastError())
			}
		}
	}
	wait("answered", p.Answered)
	down.Store(true)
	since := time.Now()
	wait("no longer answered", func() bool { return !p.Answered() })
	time.Sleep(50 * time.Millisecond)
	down.Store(false)
	wait("answered again", func() bool { return p.Answered() && p.Outage(since).Lost > 0 })
	if err := p.Stop(); err != nil {
		t.Fatal(err)
	}
	o := p.Outage(since)
	// The outage runs from one attempt's sending to another's, on the prober's 5-ms grid: an
	// attempt sent just before the server came back may be answered (a CI run measured 29.8 ms
	// for a 30-ms pause). Down for 50 ms, at least 40 ms are seen.
	if o.Longest < 40*time.Millisecond || o.Lost == 0 || !slices.Equal(o.By, []string{"node1"}) {
		t.Errorf("outage %+v: want at least 40ms (down 50ms, probed every 5ms) and node1 answering after", o)
	}
	if p.Served()["node1"] == 0 || p.LastError() == "" {
		t.Errorf("served %v, last error %q", p.Served(), p.LastError())
	}
}
