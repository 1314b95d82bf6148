package probe

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"testing"
	"time"
)

// Long connections stay unbroken while the server answers on them, and each counts broken once
// the server closes it (as a node that does not know the connection resets it).
func TestLongConnectionsCountEachBreakOnce(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { fmt.Fprintln(w, "pod-a node1") }))
	defer srv.Close()
	target := netip.MustParseAddrPort(srv.Listener.Addr().String())
	l, err := StartLong(here{}, target, 3, 10*time.Millisecond, time.Second, 1000)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Stop()
	deadline := time.Now().Add(10 * time.Second)
	for l.Asked() < 30 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if n, first := l.Broken(); n != 0 || l.Asked() < 30 {
		t.Fatalf("%d of 3 broken (%s) after %d asks; want none broken after 30", n, first, l.Asked())
	}
	srv.CloseClientConnections()
	for time.Now().Before(deadline) {
		if n, _ := l.Broken(); n == 3 {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	l.Stop()
	if n, first := l.Broken(); n != 3 || first == "" {
		t.Errorf("%d of 3 broken (%q) after the server closed them all", n, first)
	}
}
