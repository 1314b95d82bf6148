package lab

import (
	"fmt"
	"io"
	"net"
	"net/http"
	"time"

	"github.com/metalvip/metalvip/test/testenv"
)

// ServeHTTP serves HTTP on port on every address of h (VIPs included: nodes accept traffic for
// the lab's VIP ranges) until the test ends; every answer's body is h's name, so a client
// knows which node answered.
func (h *Host) ServeHTTP(t testenv.TB, port uint16) {
	t.Helper()
	ln := h.listen(t, port)
	srv := &http.Server{
		Handler: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
			w.Header().Set("Connection", "close")
			_, _ = io.WriteString(w, h.Name)
		}),
		ReadHeaderTimeout: time.Second,
	}
	done := make(chan struct{})
	go func() { defer close(done); _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Close(); <-done })
}

// listen listens on TCP port on every address of h, or fails t. The listening socket is made in
// h's namespace and stays there; accepting and serving need no namespace of their own.
func (h *Host) listen(t testenv.TB, port uint16) net.Listener {
	t.Helper()
	var ln net.Listener
	if err := h.Do(func() error {
		var err error
		ln, err = net.Listen("tcp", fmt.Sprintf(":%d", port))
		return err
	}); err != nil {
		t.Fatalf("lab: listen on %s port %d: %v", h.Name, port, err)
	}
	return ln
}
