package dataplane

import (
	"net/http"
	"net/http/httptest"
	"net/netip"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// fakeProxy answers as kube-proxy's health servers do: 200 when ok, 503 otherwise.
func fakeProxy(t *testing.T, ok *atomic.Bool) *httptest.Server {
	t.Helper()
	s := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		if ok.Load() {
			w.WriteHeader(http.StatusOK)
			_, _ = w.Write([]byte(`{"localEndpoints": 1}`))
			return
		}
		w.WriteHeader(http.StatusServiceUnavailable)
		_, _ = w.Write([]byte(`{"localEndpoints": 0}`))
	}))
	t.Cleanup(s.Close)
	return s
}

func portOf(t *testing.T, s *httptest.Server) uint16 {
	t.Helper()
	u, err := url.Parse(s.URL)
	if err != nil {
		t.Fatal(err)
	}
	p, err := strconv.Atoi(u.Port())
	if err != nil {
		t.Fatal(err)
	}
	return uint16(p)
}

func waitFor(t *testing.T, c *Checker, what string, cond func(Status) bool) Status {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		s := c.Status()
		if cond(s) {
			return s
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within 10s; status %+v", what, s)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func TestUncheckedIsReadyAndAsksNothing(t *testing.T) {
	c := New(Config{})
	defer c.Close()
	c.SetPorts([]uint16{30000})
	s := c.Status()
	if s.Checked || !s.Ready || len(s.Waiting)+len(s.Serving) != 0 {
		t.Fatalf("unchecked: %+v", s)
	}
}

func TestKubeProxyHealthAndLocalEndpoints(t *testing.T) {
	var healthy, svcA, svcB atomic.Bool
	healthy.Store(true)
	svcA.Store(true)
	hz, a, b := fakeProxy(t, &healthy), fakeProxy(t, &svcA), fakeProxy(t, &svcB)
	var changes atomic.Int32
	c := New(Config{Healthz: hz.URL + "/healthz", PortHost: netip.MustParseAddr("127.0.0.1"), Interval: 100 * time.Millisecond,
		OnChange: func() { changes.Add(1) }})
	defer c.Close()
	waitFor(t, c, "healthy", func(s Status) bool { return s.Checked && s.Ready })

	pa, pb := portOf(t, a), portOf(t, b)
	c.SetPorts([]uint16{pa, pb, 0})
	s := waitFor(t, c, "a serves", func(s Status) bool { return slices.Equal(s.Serving, []uint16{pa}) })
	if !slices.Equal(s.Waiting, []uint16{pb}) {
		t.Errorf("b waits: %+v", s)
	}
	svcB.Store(true)
	waitFor(t, c, "b serves", func(s Status) bool { return len(s.Serving) == 2 && len(s.Waiting) == 0 })

	// kube-proxy stale: not ready after the misses, with what it said.
	before := changes.Load()
	healthy.Store(false)
	s = waitFor(t, c, "not healthy", func(s Status) bool { return !s.Ready })
	if !strings.Contains(s.Detail, "503") {
		t.Errorf("detail %q does not say what kube-proxy answered", s.Detail)
	}
	if changes.Load() == before {
		t.Error("OnChange not called when kube-proxy became unhealthy")
	}
	// Said again and again while unhealthy: no change told each time.
	settled := changes.Load()
	time.Sleep(500 * time.Millisecond)
	if n := changes.Load() - settled; n != 0 {
		t.Errorf("%d changes told while kube-proxy stayed unhealthy", n)
	}
	healthy.Store(true)
	waitFor(t, c, "healthy again", func(s Status) bool { return s.Ready })

	// A port no longer asked for is forgotten; kube-proxy gone: its port waits.
	c.SetPorts([]uint16{pb})
	waitFor(t, c, "a forgotten", func(s Status) bool { return slices.Equal(s.Serving, []uint16{pb}) && len(s.Waiting) == 0 })
	b.Close()
	waitFor(t, c, "b gone", func(s Status) bool { return slices.Equal(s.Waiting, []uint16{pb}) })
}

// One failed answer is not a broken data plane.
func TestOneMissIsNotUnhealthy(t *testing.T) {
	var n atomic.Int32
	hz := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		if n.Add(1)%2 == 0 {
			w.WriteHeader(http.StatusServiceUnavailable)
		}
	}))
	defer hz.Close()
	c := New(Config{Healthz: hz.URL, Interval: 50 * time.Millisecond})
	defer c.Close()
	waitFor(t, c, "healthy", func(s Status) bool { return s.Ready })
	deadline := time.Now().Add(time.Second)
	for time.Now().Before(deadline) {
		if !c.Status().Ready {
			t.Fatal("not ready after a single miss between good answers")
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// A port that served and fails to answer once (kube-proxy busy) still serves; kube-proxy's
// 503 (its endpoint went) makes it wait at once.
func TestAPortWaitsOnKubeProxysNoNotOnOneFailedAnswer(t *testing.T) {
	var n atomic.Int32
	var gone atomic.Bool
	svc := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		switch {
		case gone.Load():
			w.WriteHeader(http.StatusServiceUnavailable)
		case n.Add(1)%2 == 0:
			// No answer: the connection dropped.
			if conn, _, err := w.(http.Hijacker).Hijack(); err == nil {
				conn.Close()
			}
		}
	}))
	defer svc.Close()
	hz := fakeProxy(t, new(atomic.Bool))
	c := New(Config{Healthz: hz.URL, PortHost: netip.MustParseAddr("127.0.0.1"), Interval: 100 * time.Millisecond, Misses: 1000})
	defer c.Close()
	p := portOf(t, svc)
	c.SetPorts([]uint16{p})
	waitFor(t, c, "serving", func(s Status) bool { return slices.Equal(s.Serving, []uint16{p}) })
	deadline := time.Now().Add(time.Second)
	for time.Now().Before(deadline) {
		if s := c.Status(); len(s.Serving) != 1 {
			t.Fatalf("not serving after single failed answers between good ones: %+v", s)
		}
		time.Sleep(5 * time.Millisecond)
	}
	gone.Store(true)
	start := time.Now()
	waitFor(t, c, "waiting", func(s Status) bool { return slices.Equal(s.Waiting, []uint16{p}) })
	if n.Load() < 4 {
		t.Errorf("only %d answers before the 503", n.Load())
	}
	t.Logf("waiting %s after kube-proxy said 503", time.Since(start).Round(time.Millisecond))
}
