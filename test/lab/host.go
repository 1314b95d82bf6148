package lab

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/metalvip/metalvip/test/testenv"
)

// DialContext dials address from inside h's namespace; the connection stays in it (an
// http.Transport's DialContext).
func (h *Host) DialContext(ctx context.Context, network, address string) (net.Conn, error) {
	var conn net.Conn
	err := h.Do(func() error {
		var d net.Dialer
		var err error
		conn, err = d.DialContext(ctx, network, address)
		return err
	})
	return conn, err
}

// DialTCP dials address by TCP from inside h's namespace (grpc.WithContextDialer).
func (h *Host) DialTCP(ctx context.Context, address string) (net.Conn, error) {
	return h.DialContext(ctx, "tcp", address)
}

// MAC is the hardware address of h's eth0, or fails t.
func (h *Host) MAC(t testenv.TB) string {
	t.Helper()
	var mac string
	if err := h.Do(func() error {
		ifi, err := net.InterfaceByName("eth0")
		if err == nil {
			mac = ifi.HardwareAddr.String()
		}
		return err
	}); err != nil {
		t.Fatalf("MAC of %s: %v", h.Name, err)
	}
	return mac
}

// Run runs a command in the host's namespace and returns its combined output.
func (h *Host) Run(ctx context.Context, name string, args ...string) ([]byte, error) {
	cmd := h.Command(ctx, name, args...)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	if err != nil {
		return out.Bytes(), fmt.Errorf("%s: %s %s: %v: %s", h.Name, name, strings.Join(args, " "), err, bytes.TrimSpace(out.Bytes()))
	}
	return out.Bytes(), nil
}

// Command returns a command that runs in the host's namespace.
func (h *Host) Command(ctx context.Context, name string, args ...string) *exec.Cmd {
	return exec.CommandContext(ctx, "ip", append([]string{"netns", "exec", h.NS, name}, args...)...)
}

// Do runs fn on an OS thread switched into the host's namespace. Sockets fn opens belong to
// the namespace for their whole life, so a test can open them in Do and use them anywhere.
func (h *Host) Do(fn func() error) error {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		orig, err := os.Open("/proc/thread-self/ns/net")
		if err != nil {
			errc <- err
			runtime.UnlockOSThread()
			return
		}
		defer orig.Close()
		target, err := os.Open(filepath.Join("/run/netns", h.NS))
		if err != nil {
			errc <- err
			runtime.UnlockOSThread()
			return
		}
		defer target.Close()
		if err := unix.Setns(int(target.Fd()), unix.CLONE_NEWNET); err != nil {
			errc <- fmt.Errorf("enter %s: %w", h.NS, err)
			runtime.UnlockOSThread()
			return
		}
		err = fn()
		if rerr := unix.Setns(int(orig.Fd()), unix.CLONE_NEWNET); rerr != nil {
			// The thread stays locked and dies with this goroutine: it is in the wrong namespace.
			errc <- errors.Join(err, fmt.Errorf("leave %s: %w", h.NS, rerr))
			return
		}
		runtime.UnlockOSThread()
		errc <- err
	}()
	return <-errc
}

// Forward listens on listen (such as "127.0.0.1:6443") inside the host's namespace and
// relays every connection to target, dialled from the test binary's own namespace: a process
// in the lab reaches a server outside it (the test's API server) without any route out of the
// lab. It stops when the test ends.
func (h *Host) Forward(t testenv.TB, listen, target string) {
	t.Helper()
	var lis net.Listener
	if err := h.Do(func() error {
		var err error
		lis, err = net.Listen("tcp", listen)
		return err
	}); err != nil {
		t.Fatalf("forward on %s in %s: %v", listen, h.Name, err)
	}
	t.Cleanup(func() { lis.Close() })
	go func() {
		for {
			c, err := lis.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				d, err := net.DialTimeout("tcp", target, 5*time.Second)
				if err != nil {
					return
				}
				defer d.Close()
				done := make(chan struct{}, 2)
				go func() { _, _ = io.Copy(d, c); done <- struct{}{} }()
				go func() { _, _ = io.Copy(c, d); done <- struct{}{} }()
				<-done
			}()
		}
	}()
}

// Start starts a long-running process in the host's namespace. It is stopped (SIGTERM, then
// SIGKILL) when the test ends or the lab is torn down, whichever comes first.
func (h *Host) Start(t testenv.TB, name, bin string, args ...string) *testenv.Proc {
	t.Helper()
	p := testenv.StartProc(t, h.Name+"-"+name, h.Command(context.Background(), bin, args...))
	h.lab.procs = append(h.lab.procs, p)
	return p
}

// Ping sends count pings to addr and reports whether any came back.
func (h *Host) Ping(ctx context.Context, addr netip.Addr, count int) error {
	_, err := h.Run(ctx, "ping", "-n", "-q", "-c", strconv.Itoa(count), "-i", "0.2", "-W", "1", addr.String())
	return err
}

func (h *Host) addrs(dev string, prefixes ...netip.Prefix) error {
	for _, p := range prefixes {
		args := []string{"-n", h.NS, "addr", "add", p.String(), "dev", dev}
		if p.Addr().Is6() {
			args = append(args, "nodad")
		}
		if err := ip(args...); err != nil {
			return err
		}
	}
	return ip("-n", h.NS, "link", "set", dev, "up")
}

func (h *Host) defaultRoutes(v4, v6 string) error {
	if err := ip("-n", h.NS, "route", "add", "default", "via", v4); err != nil {
		return err
	}
	return ip("-n", h.NS, "-6", "route", "add", "default", "via", v6)
}

func (h *Host) sysctls(kv map[string]string) error {
	args := []string{"netns", "exec", h.NS, "sysctl", "-q", "-w"}
	for k, v := range kv {
		args = append(args, k+"="+v)
	}
	return ip(args...)
}
