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

func TestAnAddressOverItsShareIsClosedAtOnceAndOthersStillGetIn(t *testing.T) {
	l, got := serve(t, 2, 100)
	a, b := netip.MustParseAddr("127.0.0.2"), netip.MustParseAddr("127.0.0.3")
	first, second := dial(t, l, a), dial(t, l, a)
	serverFirst := accept(t, got)
	accept(t, got)
	third := dial(t, l, a)
	if !closedByServer(third) {
		t.Error("a third connection from one address was not closed")
	}
	if closedByServer(first) || closedByServer(second) {
		t.Error("the address's first two connections were closed")
	}
	dial(t, l, b)
	accept(t, got)
	if l.Refused() != 1 {
		t.Errorf("refused %d; want 1", l.Refused())
	}
	// A connection the server closes makes room for another from the same address.
	serverFirst.Close()
	fourth := dial(t, l, a)
	accept(t, got)
	if closedByServer(fourth) {
		t.Error("a connection was refused though its address is under its share again")
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
