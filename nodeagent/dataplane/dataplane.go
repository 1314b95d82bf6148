// Package dataplane tells whether the node's data plane serves the Services it would be sent
// traffic for: kube-proxy's /healthz (its rules are in sync with the API), and, for each
// Service with externalTrafficPolicy Local this node stands for, the Service's health check
// node port, where kube-proxy says whether the rules it has written send the Service's
// traffic to endpoints on this node. A load balancer that sends a node traffic before then
// loses it (kube-proxy drops an ETP Local Service's traffic on a node it believes has no
// local endpoint); cloud load balancers check the same ports (KEP-3836).
//
// The checker only observes; what follows from it is the CCM's (a node whose kube-proxy is
// not healthy gets no VIP, a candidate not serving a Service yet is asked last) and is told
// through the agent's GetState.
package dataplane

import (
	"context"
	"fmt"
	"io"
	"maps"
	"net"
	"net/http"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"k8s.io/klog/v2"
)

// Config configures a Checker.
type Config struct {
	// Healthz is kube-proxy's health URL (http://127.0.0.1:10256/healthz); empty: kube-proxy
	// is not checked (the node counts as ready) and no health check node port either.
	Healthz string
	// PortHost is where the health check node ports answer: the node's address.
	PortHost netip.Addr
	// Interval is how often kube-proxy's /healthz is asked; a port that serves is asked twice
	// as often (all of them at most 200 times a second together), one that does not serve
	// yet four times. 0: 1 s.
	Interval time.Duration
	// Timeout bounds each request; 0: 1 s.
	Timeout time.Duration
	// Misses is how many answers in a row /healthz must fail before kube-proxy counts as not
	// healthy (one slow answer on a busy node, or kube-proxy restarting, is not a broken data
	// plane); 0: 2.
	Misses int
	// OnChange is called (without locks held) when Status changes.
	OnChange func()
}

// Status is what the checker knows now.
type Status struct {
	// Checked says kube-proxy is checked (Config.Healthz is set).
	Checked bool
	// Ready says kube-proxy's /healthz answers 200, or failed fewer than Config.Misses times
	// in a row since it did or since the start (always, unchecked).
	Ready bool
	// Detail says why not ready.
	Detail string
	// Since is when Ready last changed (the start: the checker's start).
	Since time.Time
	// Serving and Waiting are the health check node ports asked for (SetPorts) whose
	// answer says this node has local endpoints, and those it does not yet (or did not
	// answer), sorted.
	Serving, Waiting []uint16
}

// Checker asks kube-proxy, in a loop, until Close.
type Checker struct {
	cfg    Config
	client *http.Client

	mu       sync.Mutex
	ready    bool
	detail   string
	since    time.Time
	misses   int
	ports    map[uint16]*port
	wake     chan struct{}
	stop     chan struct{}
	done     chan struct{}
	healthAt time.Time
}

type port struct {
	serving bool
	misses  int       // failed answers in a row
	next    time.Time // when it is asked next
}

// New starts a checker. Unchecked (no Healthz), it asks nothing and Status says ready.
func New(cfg Config) *Checker {
	if cfg.Interval <= 0 {
		cfg.Interval = time.Second
	}
	if cfg.Timeout <= 0 {
		cfg.Timeout = time.Second
	}
	if cfg.Misses <= 0 {
		cfg.Misses = 2
	}
	c := &Checker{
		cfg: cfg,
		client: &http.Client{
			Timeout: cfg.Timeout,
			// Its own connections, never a proxy from the environment: these are the node's
			// own ports.
			Transport: &http.Transport{Proxy: nil, DialContext: (&net.Dialer{Timeout: cfg.Timeout}).DialContext,
				MaxIdleConnsPerHost: 2, IdleConnTimeout: 30 * time.Second, DisableCompression: true},
		},
		// Ready until kube-proxy fails Misses times in a row, from the start too: an agent
		// restarting beside a healthy kube-proxy must not say otherwise before it asked (the
		// CCM would move the node's VIPs away).
		ready:  true,
		since:  time.Now(),
		ports:  map[uint16]*port{},
		wake:   make(chan struct{}, 1),
		stop:   make(chan struct{}),
		done:   make(chan struct{}),
		detail: "kube-proxy is not checked",
	}
	if cfg.Healthz == "" {
		close(c.done)
		return c
	}
	c.detail = ""
	go c.loop()
	return c
}

// Status returns what the checker knows now.
func (c *Checker) Status() Status {
	c.mu.Lock()
	defer c.mu.Unlock()
	s := Status{Checked: c.cfg.Healthz != "", Ready: c.ready, Detail: c.detail, Since: c.since}
	for _, p := range slices.Sorted(maps.Keys(c.ports)) {
		if c.ports[p].serving {
			s.Serving = append(s.Serving, p)
		} else {
			s.Waiting = append(s.Waiting, p)
		}
	}
	return s
}

// SetPorts sets the health check node ports to ask (those of the ETP Local Services this
// node stands for); a port new here is asked at once and waits until it says serving. Unchecked,
// it keeps nothing.
func (c *Checker) SetPorts(ports []uint16) {
	if c.cfg.Healthz == "" {
		return
	}
	c.mu.Lock()
	changed := false
	want := map[uint16]bool{}
	for _, p := range ports {
		if p == 0 {
			continue
		}
		want[p] = true
		if _, ok := c.ports[p]; !ok {
			c.ports[p] = &port{}
			changed = true
		}
	}
	for p := range c.ports {
		if !want[p] {
			delete(c.ports, p)
			changed = true
		}
	}
	c.mu.Unlock()
	if changed {
		select {
		case c.wake <- struct{}{}:
		default:
		}
		c.changed()
	}
}

// Close stops the checker.
func (c *Checker) Close() {
	select {
	case <-c.stop:
	default:
		close(c.stop)
	}
	<-c.done
}

func (c *Checker) changed() {
	if c.cfg.OnChange != nil {
		c.cfg.OnChange()
	}
}

func (c *Checker) loop() {
	defer close(c.done)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		<-c.stop
		cancel()
	}()
	fast := c.cfg.Interval / 4
	t := time.NewTimer(0)
	defer t.Stop()
	for {
		select {
		case <-c.stop:
			return
		case <-t.C:
		case <-c.wake:
		}
		now := time.Now()
		changed := false
		if !now.Before(c.healthAt) {
			changed = c.checkHealth(ctx) || changed
			c.healthAt = time.Now().Add(c.cfg.Interval)
		}
		c.mu.Lock()
		var due []uint16
		for p, st := range c.ports {
			if !now.Before(st.next) {
				due = append(due, p)
			}
		}
		c.mu.Unlock()
		slices.Sort(due)
		for _, p := range due {
			if ctx.Err() != nil {
				return
			}
			ok, said := c.serves(ctx, p)
			c.mu.Lock()
			if st, known := c.ports[p]; known {
				if ok {
					st.misses = 0
				} else {
					st.misses++
				}
				// kube-proxy's 503 says it has no local endpoint (the pod went, or its
				// replacement is not in the rules yet): at once. No answer at all (kube-proxy
				// restarting) only after portMisses in a row.
				if serving := ok || st.serving && !said && st.misses < portMisses; serving != st.serving {
					st.serving, changed = serving, true
					klog.V(2).InfoS("kube-proxy health check node port", "port", p, "localEndpoints", serving)
				}
				if st.serving {
					// Twice a second per port, at most servingRate for them all (a node
					// with a thousand Local Services asks each every 5 s).
					st.next = time.Now().Add(max(c.cfg.Interval/2, time.Duration(len(c.ports))*time.Second/servingRate))
				} else {
					st.next = time.Now().Add(max(fast, time.Duration(len(c.ports))*time.Second/(2*servingRate)))
				}
			}
			c.mu.Unlock()
		}
		if changed {
			c.changed()
		}
		// The next due: kube-proxy's health, or the soonest port.
		c.mu.Lock()
		next := c.healthAt
		for _, st := range c.ports {
			if st.next.Before(next) {
				next = st.next
			}
		}
		c.mu.Unlock()
		t.Reset(max(time.Until(next), 10*time.Millisecond))
	}
}

// checkHealth asks kube-proxy's /healthz once and reports whether Ready changed.
func (c *Checker) checkHealth(ctx context.Context) bool {
	ok, detail := c.get(ctx, c.cfg.Healthz)
	c.mu.Lock()
	defer c.mu.Unlock()
	if ok {
		c.misses = 0
	} else {
		c.misses++
	}
	switch {
	case ok && !c.ready:
		c.ready, c.detail, c.since = true, "", time.Now()
		klog.InfoS("kube-proxy healthy: this node may take VIPs", "url", c.cfg.Healthz)
		return true
	case !ok && c.ready && c.misses >= c.cfg.Misses:
		c.ready, c.detail, c.since = false, detail, time.Now()
		klog.InfoS("kube-proxy not healthy: this node takes no VIP while it is not", "url", c.cfg.Healthz, "detail", detail)
		return true
	case !ok && !c.ready:
		// Said again (its body carries the time): kept, not told as a change.
		c.detail = detail
	}
	return false
}

// serves asks the health check node port whether kube-proxy sends the Service's traffic to
// endpoints on this node: 200 (ok), or another answer such as its 503 when it has none
// (said: kube-proxy answered, not a failure to reach it).
func (c *Checker) serves(ctx context.Context, p uint16) (ok, said bool) {
	ok, detail := c.get(ctx, "http://"+net.JoinHostPort(c.cfg.PortHost.String(), strconv.Itoa(int(p)))+"/")
	return ok, strings.HasPrefix(detail, "kube-proxy answers ")
}

// servingRate bounds the requests per second for the ports that serve already (twice that
// for those that wait).
const servingRate = 200

// portMisses is how many times in a row a health check node port that served must fail to
// answer before it counts as not serving.
const portMisses = 2

// get reports whether url answers 200, else what it did.
func (c *Checker) get(ctx context.Context, url string) (bool, string) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return false, err.Error()
	}
	resp, err := c.client.Do(req)
	if err != nil {
		return false, fmt.Sprintf("kube-proxy does not answer: %v", err)
	}
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return false, fmt.Sprintf("kube-proxy answers %s: %.200s", resp.Status, body)
	}
	return true, ""
}
