package lab

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"sort"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/metalvip/metalvip/test/harness"
)

// Frame is one frame seen arriving at a switch port, with the kernel's receive time.
type Frame struct {
	At     time.Time
	Port   string     // the switch port, p-<host>
	Op     uint16     // the ARP operation, 0 for a frame that is not ARP
	Sender netip.Addr // the ARP sender and target addresses
	Target netip.Addr
}

// Frames is what a Capture saw, in time order.
type Frames struct {
	FromMAC  []Frame // frames from the captured MAC, at the nodes' ports
	Requests []Frame // the client's ARP requests for the captured VIP
}

// Run is a stretch of frames from the captured MAC all from one port.
type Run struct {
	Port        string
	First, Last time.Time
	N           int
}

// Runs groups the frames from the captured MAC into runs by port.
func (f Frames) Runs() []Run {
	var out []Run
	for _, fr := range f.FromMAC {
		if len(out) > 0 && out[len(out)-1].Port == fr.Port {
			r := &out[len(out)-1]
			r.Last, r.N = fr.At, r.N+1
			continue
		}
		out = append(out, Run{Port: fr.Port, First: fr.At, Last: fr.At, N: 1})
	}
	return out
}

// DoubleAnswers counts the client's requests whose replies from the captured MAC (until the
// next request) came from two ports, and returns it with the number of requests seen.
func (f Frames) DoubleAnswers(client netip.Addr) (doubles, asked int) {
	j := 0
	for i, rq := range f.Requests {
		end := time.Time{}
		if i+1 < len(f.Requests) {
			end = f.Requests[i+1].At
		}
		ports := map[string]bool{}
		for ; j < len(f.FromMAC) && (end.IsZero() || f.FromMAC[j].At.Before(end)); j++ {
			fr := f.FromMAC[j]
			if fr.Op == 2 && fr.Target == client && !fr.At.Before(rq.At) {
				ports[fr.Port] = true
			}
		}
		if len(ports) > 1 {
			doubles++
		}
	}
	return doubles, len(f.Requests)
}

// Interleaved counts the runs of at most two frames between two runs of one other port, all
// within one interval: the mark of two nodes sending from one MAC at once. (A node's tenure
// opens with a gratuitous ARP request and reply and goes on answering an asker.)
func Interleaved(runs []Run, interval time.Duration) int {
	n := 0
	for i := 1; i+1 < len(runs); i++ {
		if runs[i-1].Port == runs[i+1].Port && runs[i].N <= 2 && runs[i+1].First.Sub(runs[i-1].Last) < interval {
			n++
		}
	}
	return n
}

// RunNames lists runs as "node1 12, node2 30, ...".
func RunNames(rs []Run) string {
	var b strings.Builder
	for i, r := range rs {
		if i > 0 {
			b.WriteString(", ")
		}
		fmt.Fprintf(&b, "%s %d", strings.TrimPrefix(r.Port, "p-"), r.N)
	}
	return b.String()
}

// Capture reads every frame arriving at the switch from the nodes' and the client's ports
// (packet sockets in the switch's namespace, kernel timestamps), keeping those from a MAC and
// the client's ARP requests for a VIP.
type Capture struct {
	mac  net.HardwareAddr
	vip  netip.Addr
	mu   sync.Mutex
	got  Frames
	fds  []int
	done chan struct{}
	wg   sync.WaitGroup
}

// CaptureFrom starts capturing frames from mac, and the client's requests for vip. Stop it
// with Stop; the lab's end stops it too.
func (l *Lab) CaptureFrom(mac net.HardwareAddr, vip netip.Addr) (*Capture, error) {
	cp := &Capture{mac: mac, vip: vip, done: make(chan struct{})}
	ports := []string{"p-" + l.Client.Name}
	for _, n := range l.Nodes {
		ports = append(ports, "p-"+n.Name)
	}
	for _, port := range ports {
		var fd int
		err := l.Switch.Do(func() error {
			ifi, err := net.InterfaceByName(port)
			if err != nil {
				return err
			}
			if fd, err = unix.Socket(unix.AF_PACKET, unix.SOCK_RAW, int(htons(unix.ETH_P_ALL))); err != nil {
				return err
			}
			return errors.Join(
				unix.Bind(fd, &unix.SockaddrLinklayer{Protocol: htons(unix.ETH_P_ALL), Ifindex: ifi.Index}),
				unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_TIMESTAMPNS, 1),
				unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &unix.Timeval{Usec: 100000}))
		})
		if err != nil {
			cp.Stop()
			return nil, fmt.Errorf("capture on %s: %w", port, err)
		}
		cp.fds = append(cp.fds, fd)
		cp.wg.Add(1)
		go cp.read(fd, port, port == "p-"+l.Client.Name)
	}
	l.t.Cleanup(func() { cp.Stop() })
	return cp, nil
}

func (cp *Capture) read(fd int, port string, client bool) {
	defer cp.wg.Done()
	buf, oob := make([]byte, 2048), make([]byte, 128)
	for !harness.Stopped(cp.done) {
		n, oobn, _, from, err := unix.Recvmsg(fd, buf, oob, 0)
		if err != nil {
			continue // the timeout, to look at done
		}
		if ll, ok := from.(*unix.SockaddrLinklayer); !ok || ll.Pkttype == unix.PACKET_OUTGOING || n < 14 {
			continue
		}
		fr := Frame{At: timestamp(oob[:oobn]), Port: port}
		b := buf[:n]
		if binary.BigEndian.Uint16(b[12:14]) == unix.ETH_P_ARP && n >= 42 {
			fr.Op = binary.BigEndian.Uint16(b[20:22])
			fr.Sender = netip.AddrFrom4([4]byte(b[28:32]))
			fr.Target = netip.AddrFrom4([4]byte(b[38:42]))
		}
		cp.mu.Lock()
		switch {
		case client && fr.Op == 1 && fr.Target == cp.vip:
			cp.got.Requests = append(cp.got.Requests, fr)
		case !client && bytes.Equal(b[6:12], cp.mac):
			cp.got.FromMAC = append(cp.got.FromMAC, fr)
		}
		cp.mu.Unlock()
	}
}

func timestamp(oob []byte) time.Time {
	if msgs, err := unix.ParseSocketControlMessage(oob); err == nil {
		for _, m := range msgs {
			if m.Header.Level == unix.SOL_SOCKET && m.Header.Type == unix.SO_TIMESTAMPNS && len(m.Data) >= 16 {
				sec, nsec := binary.NativeEndian.Uint64(m.Data[0:8]), binary.NativeEndian.Uint64(m.Data[8:16])
				return time.Unix(int64(sec), int64(nsec))
			}
		}
	}
	return time.Now()
}

// Stop ends the capture and returns what it saw, in time order.
func (cp *Capture) Stop() Frames {
	select {
	case <-cp.done:
	default:
		close(cp.done)
		cp.wg.Wait()
		for _, fd := range cp.fds {
			unix.Close(fd)
		}
	}
	cp.mu.Lock()
	defer cp.mu.Unlock()
	for _, s := range [][]Frame{cp.got.FromMAC, cp.got.Requests} {
		sort.Slice(s, func(i, j int) bool { return s[i].At.Before(s[j].At) })
	}
	return cp.got
}

// AskEvery asks for vip by ARP from the host every interval, from a packet socket (the host's
// own neighbour entry stays as it is), until the returned stop is called or the test ends.
func (h *Host) AskEvery(vip netip.Addr, every time.Duration) (stop func(), err error) {
	c, err := h.DialARP()
	if err != nil {
		return nil, err
	}
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(2)
	go func() { // drain the replies
		defer wg.Done()
		for {
			_ = c.SetReadDeadline(time.Now().Add(100 * time.Millisecond))
			if _, _, err := c.Read(); err != nil {
				if !IsTimeout(err) {
					return
				}
			}
			if harness.Stopped(done) {
				return
			}
		}
	}()
	go func() {
		defer wg.Done()
		for range harness.Every(done, every, 100000) { // bounded: 2000 s at 20 ms
			_ = c.Request(vip)
		}
	}()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			close(done)
			wg.Wait()
			c.Close()
		})
	}
	h.lab.t.Cleanup(stop)
	return stop, nil
}
