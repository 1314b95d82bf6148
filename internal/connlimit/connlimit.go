// Package connlimit bounds the connections a listener hands out, so that a flood of
// connections that never finish their handshake costs a fixed amount of memory and never keeps
// a real client out: at most PerAddr connections per source address (more are closed at once,
// never queued), and at most Pending connections not yet authenticated (a new one closes the
// oldest). A connection leaves the pending set when the server calls Authenticated on it (after
// its TLS handshake); authenticated connections are never evicted. It decides nothing about who
// may connect.
package connlimit

import (
	"container/list"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
)

// Listener is a net.Listener with the bounds above.
type Listener struct {
	net.Listener
	perAddr, pending int

	mu      sync.Mutex
	byAddr  map[netip.Addr]int
	waiting *list.List // of *conn, oldest first

	refused, evicted atomic.Uint64
}

// New wraps l.
func New(l net.Listener, perAddr, pending int) *Listener {
	return &Listener{Listener: l, perAddr: perAddr, pending: pending, byAddr: map[netip.Addr]int{}, waiting: list.New()}
}

// Accept returns the next connection within the bounds; those over them are closed at once.
func (l *Listener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		addr := addrOf(c.RemoteAddr())
		l.mu.Lock()
		if l.byAddr[addr] >= l.perAddr {
			l.mu.Unlock()
			l.refused.Add(1)
			c.Close()
			continue
		}
		l.byAddr[addr]++
		var evict *conn
		if l.waiting.Len() >= l.pending {
			evict = l.waiting.Front().Value.(*conn)
			l.waiting.Remove(evict.elem)
			evict.elem = nil
		}
		wc := &conn{Conn: c, l: l, addr: addr}
		wc.elem = l.waiting.PushBack(wc)
		l.mu.Unlock()
		if evict != nil {
			l.evicted.Add(1)
			evict.Close()
		}
		return wc, nil
	}
}

// Refused counts the connections closed because their address had PerAddr already; Evicted
// those closed, still in their handshake, to make room for a newer one.
func (l *Listener) Refused() uint64 { return l.refused.Load() }
func (l *Listener) Evicted() uint64 { return l.evicted.Load() }

// Open returns how many connections are open, and how many of them are still pending.
func (l *Listener) Open() (open, pending int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, n := range l.byAddr {
		open += n
	}
	return open, l.waiting.Len()
}

// Authenticated takes c, a connection this package's Listener returned, out of the pending
// set: it is never evicted. Other connections are left alone.
func Authenticated(c net.Conn) {
	wc, ok := c.(*conn)
	if !ok {
		return
	}
	wc.l.mu.Lock()
	defer wc.l.mu.Unlock()
	if wc.elem != nil {
		wc.l.waiting.Remove(wc.elem)
		wc.elem = nil
	}
}

type conn struct {
	net.Conn
	l    *Listener
	addr netip.Addr
	elem *list.Element // in l.waiting while pending
	once sync.Once
}

func (c *conn) Close() error {
	c.once.Do(func() {
		c.l.mu.Lock()
		if c.elem != nil {
			c.l.waiting.Remove(c.elem)
			c.elem = nil
		}
		if c.l.byAddr[c.addr]--; c.l.byAddr[c.addr] <= 0 {
			delete(c.l.byAddr, c.addr)
		}
		c.l.mu.Unlock()
	})
	return c.Conn.Close()
}

func addrOf(a net.Addr) netip.Addr {
	if ta, ok := a.(*net.TCPAddr); ok {
		ip, _ := netip.AddrFromSlice(ta.IP)
		return ip.Unmap()
	}
	ap, err := netip.ParseAddrPort(a.String())
	if err != nil {
		return netip.Addr{}
	}
	return ap.Addr().Unmap()
}
