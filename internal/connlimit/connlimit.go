// Package connlimit bounds the connections a listener hands out that have not finished their
// handshake, so that a flood of connections that never finish it costs a fixed amount of
// memory and never keeps a real client out: at most PerAddr such connections per source
// address and at most Pending in all; a new connection over either bound closes the oldest
// pending one (of its address, or of all), never itself. A connection leaves the pending set
// when the server calls Authenticated on it (after its TLS handshake); authenticated
// connections are never closed by this package and count against no bound. It decides
// nothing about who may connect.
//
// Closing the newest instead (refusing at once) let anything sharing a client's source
// address keep that client out for good: a pod SNATed to the address of the node of a
// hostNetwork CCM held PerAddr idle connections, and the CCM's own were closed (issue 30,
// fault 5). Closing the oldest, a client that finishes its handshake gets in unless the flood
// opens PerAddr connections from its address within the handshake's milliseconds, and does so
// for as long as the client retries (Evicted counts them).
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
	byAddr  map[netip.Addr]*list.List // pending connections of each address, oldest first
	waiting *list.List                // every pending connection, oldest first
	open    int

	evicted atomic.Uint64
}

// New wraps l.
func New(l net.Listener, perAddr, pending int) *Listener {
	return &Listener{Listener: l, perAddr: max(perAddr, 1), pending: max(pending, 1), byAddr: map[netip.Addr]*list.List{}, waiting: list.New()}
}

// Accept returns the next connection, closing the oldest pending ones over the bounds.
func (l *Listener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	wc := &conn{Conn: c, l: l, addr: addrOf(c.RemoteAddr())}
	var evict []*conn
	l.mu.Lock()
	if q := l.byAddr[wc.addr]; q != nil && q.Len() >= l.perAddr {
		evict = append(evict, l.settleLocked(q.Front().Value.(*conn)))
	}
	if l.waiting.Len() >= l.pending {
		evict = append(evict, l.settleLocked(l.waiting.Front().Value.(*conn)))
	}
	q := l.byAddr[wc.addr]
	if q == nil {
		q = list.New()
		l.byAddr[wc.addr] = q
	}
	wc.inAddr, wc.inAll = q.PushBack(wc), l.waiting.PushBack(wc)
	l.open++
	l.mu.Unlock()
	for _, e := range evict {
		l.evicted.Add(1)
		e.Close()
	}
	return wc, nil
}

// settleLocked takes c out of the pending set; it returns c. The caller holds mu.
func (l *Listener) settleLocked(c *conn) *conn {
	if c.inAll == nil {
		return c
	}
	l.waiting.Remove(c.inAll)
	if q := l.byAddr[c.addr]; q != nil {
		q.Remove(c.inAddr)
		if q.Len() == 0 {
			delete(l.byAddr, c.addr)
		}
	}
	c.inAll, c.inAddr = nil, nil
	return c
}

// Evicted counts the connections closed, still in their handshake, to make room for a newer
// one (of their address, or of all).
func (l *Listener) Evicted() uint64 { return l.evicted.Load() }

// Open returns how many connections are open, and how many of them are still pending.
func (l *Listener) Open() (open, pending int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.open, l.waiting.Len()
}

// Authenticated takes c, a connection this package's Listener returned, out of the pending
// set: it is never closed by the Listener and counts against no bound. Other connections are
// left alone.
func Authenticated(c net.Conn) {
	wc, ok := c.(*conn)
	if !ok {
		return
	}
	wc.l.mu.Lock()
	defer wc.l.mu.Unlock()
	wc.l.settleLocked(wc)
}

type conn struct {
	net.Conn
	l             *Listener
	addr          netip.Addr
	inAddr, inAll *list.Element // in l.byAddr[addr] and l.waiting while pending
	once          sync.Once
}

func (c *conn) Close() error {
	c.once.Do(func() {
		c.l.mu.Lock()
		c.l.settleLocked(c)
		c.l.open--
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
