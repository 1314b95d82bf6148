package connlimit

import (
	"net"
	"net/netip"
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// serve accepts on a Listener and keeps every connection it gets until the test ends.
func serve(t *testing.T, perAddr, pending int) (*Listener, chan net.Conn) {
	t.Helper()
	tcp, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	l := New(tcp, perAddr, pending)
	got := make(chan net.Conn, 100)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			got <- c
		}
	}()
	t.Cleanup(func() {
		l.Close()
		<-done
		close(got)
		for c := range got {
			c.Close()
		}
	})
	return l, got
}

func dial(t *testing.T, l *Listener, from netip.Addr) net.Conn {
	t.Helper()
	d := net.Dialer{LocalAddr: net.TCPAddrFromAddrPort(netip.AddrPortFrom(from, 0)), Timeout: time.Second}
	c, err := d.Dial("tcp", l.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// closedByServer reports whether the server closed c within a short while.
func closedByServer(c net.Conn) bool {
	_ = c.SetReadDeadline(time.Now().Add(300 * time.Millisecond))
	_, err := c.Read(make([]byte, 1))
	if ne, ok := err.(net.Error); ok && ne.Timeout() {
		return false
	}
	return err != nil
}

func accept(t *testing.T, got chan net.Conn) net.Conn {
	t.Helper()
	select {
	case c := <-got:
		return c
	case <-time.After(2 * time.Second):
		t.Fatal("no connection accepted")
		return nil
	}
}

// Issue 30, fault 5: anything sharing the CCM's source address (a pod SNATed to the address
// of a hostNetwork CCM's node) held PerAddr connections open without a handshake, and the
// CCM's own were closed at once: the node was unreachable for good. Now a new connection
// closes its address's oldest pending one: the CCM's gets in and, once authenticated, stays.
func TestANeighbourSharingTheCCMsAddressCannotKeepItOut(t *testing.T) {
	l, got := serve(t, 2, 100)
	shared, other := netip.MustParseAddr("127.0.0.2"), netip.MustParseAddr("127.0.0.3")
	stalled := []net.Conn{dial(t, l, shared), dial(t, l, shared)}
	accept(t, got)
	accept(t, got)
	ccm := dial(t, l, shared)
	serverCCM := accept(t, got)
	if closedByServer(ccm) {
		t.Fatal("the CCM's connection was closed: the neighbour's stalled ones keep it out")
	}
	if !closedByServer(stalled[0]) || closedByServer(stalled[1]) {
		t.Error("want the oldest stalled connection of the address closed, the other kept")
	}
	Authenticated(serverCCM)
	// The neighbour opens more: its own pending ones make room, never the authenticated one.
	for range 4 {
		dial(t, l, shared)
		accept(t, got)
	}
	if closedByServer(ccm) {
		t.Error("the authenticated connection was closed by newer ones from its address")
	}
	dial(t, l, other)
	accept(t, got)
	if l.Evicted() != 4 {
		t.Errorf("evicted %d; want 4 (the address's pending ones over its 2)", l.Evicted())
	}
	if open, pending := l.Open(); open != 4 || pending != 3 {
		t.Errorf("open %d, pending %d; want 4 (the CCM, the address's 2 newest, the other) and 3", open, pending)
	}
}

func TestThePendingOldestMakesRoomAndAnAuthenticatedOneStays(t *testing.T) {
	l, got := serve(t, 10, 2)
	addr := func(i int) netip.Addr { return netip.AddrFrom4([4]byte{127, 0, 0, byte(10 + i)}) }
	authed := dial(t, l, addr(0))
	Authenticated(accept(t, got))
	oldest := dial(t, l, addr(1))
	accept(t, got)
	dial(t, l, addr(2))
	accept(t, got)
	// A third pending connection: the oldest pending one goes, the authenticated one stays.
	newest := dial(t, l, addr(3))
	accept(t, got)
	if !closedByServer(oldest) {
		t.Error("the oldest pending connection was not closed to make room")
	}
	if closedByServer(authed) || closedByServer(newest) {
		t.Error("an authenticated or the newest connection was closed")
	}
	if l.Evicted() != 1 {
		t.Errorf("evicted %d; want 1", l.Evicted())
	}
	if open, pending := l.Open(); open != 3 || pending != 2 {
		t.Errorf("open %d, pending %d; want 3 and 2", open, pending)
	}
}
