package lab

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/metalvip/metalvip/test/testenv"
)

// ServeName listens on TCP port in the host's namespace, on every address (a node accepts
// VIPs through its local route), as a stand-in for a Service's endpoints: every connection
// is told the host's name on its first line, then each byte it sends is echoed back, so a
// client can tell which node serves it and whether its connection still lives. It stops,
// closing every connection, when the test ends.
func (h *Host) ServeName(t testenv.TB, port uint16) {
	t.Helper()
	ln := h.listen(t, port)
	var mu sync.Mutex
	conns := map[net.Conn]bool{}
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns[c] = true
			mu.Unlock()
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer func() { mu.Lock(); delete(conns, c); mu.Unlock(); c.Close() }()
				if _, err := fmt.Fprintf(c, "%s\n", h.Name); err != nil {
					return
				}
				buf := make([]byte, 64)
				for {
					n, err := c.Read(buf)
					if err != nil {
						return
					}
					if _, err := c.Write(buf[:n]); err != nil {
						return
					}
				}
			}()
		}
	}()
	t.Cleanup(func() {
		ln.Close()
		mu.Lock()
		for c := range conns {
			c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
}

// NameConn is a connection to a ServeName server.
type NameConn struct {
	net.Conn
	// Server is the name the server gave: the node that serves the connection.
	Server string
	r      *bufio.Reader
}

// DialName connects from the host's namespace to addr and reads the serving node's name,
// within timeout.
func (h *Host) DialName(addr netip.AddrPort, timeout time.Duration) (*NameConn, error) {
	var c net.Conn
	if err := h.Do(func() error {
		var err error
		c, err = (&net.Dialer{Timeout: timeout}).Dial("tcp", addr.String())
		return err
	}); err != nil {
		return nil, err
	}
	_ = c.SetDeadline(time.Now().Add(timeout))
	r := bufio.NewReader(c)
	line, err := r.ReadString('\n')
	if err != nil {
		c.Close()
		return nil, fmt.Errorf("read the server's name: %w", err)
	}
	_ = c.SetDeadline(time.Time{})
	return &NameConn{Conn: c, Server: strings.TrimSpace(line), r: r}, nil
}

// Check sends one byte and waits for its echo within timeout: nil while the connection
// lives, an error once it was reset or timed out.
func (c *NameConn) Check(timeout time.Duration) error {
	_ = c.SetDeadline(time.Now().Add(timeout))
	defer func() { _ = c.SetDeadline(time.Time{}) }()
	if _, err := c.Write([]byte{'.'}); err != nil {
		return err
	}
	b, err := c.r.ReadByte()
	if err != nil {
		return err
	}
	if b != '.' {
		return errors.New("echo garbled")
	}
	return nil
}

// Split opens n connections one after another from the host to addr, each closed once it
// named its server, and counts them by server; failed counts those that did not connect or
// say a name. It stops early when ctx ends.
func (h *Host) Split(ctx context.Context, addr netip.AddrPort, n int) (byServer map[string]int, failed int) {
	byServer = map[string]int{}
	for range n {
		if ctx.Err() != nil {
			failed++
			continue
		}
		c, err := h.DialName(addr, 2*time.Second)
		if err != nil {
			failed++
			continue
		}
		byServer[c.Server]++
		c.Close()
	}
	return byServer, failed
}

// RouteWeights returns the router's kernel route to dst as next hop -> weight (1 where the
// route names none), and the route as ip prints it.
func (l *Lab) RouteWeights(dst string) (map[netip.Addr]int, string, error) {
	out, err := l.Router.Run(context.Background(), "ip", "route", "show", dst)
	if err != nil {
		return nil, string(out), err
	}
	weights := map[netip.Addr]int{}
	for _, line := range strings.Split(string(out), "\n") {
		f := strings.Fields(line)
		for i := 0; i+1 < len(f); i++ {
			if f[i] != "via" {
				continue
			}
			hop, err := netip.ParseAddr(f[i+1])
			if err != nil {
				continue
			}
			w := 1
			for j := i + 2; j+1 < len(f); j++ {
				if f[j] == "weight" {
					w, _ = strconv.Atoi(f[j+1])
				}
			}
			weights[hop] = w
		}
	}
	return weights, strings.TrimSpace(string(out)), nil
}
