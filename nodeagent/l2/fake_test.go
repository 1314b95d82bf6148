package l2

import (
	"fmt"
	"net"
	"net/netip"
	"sync"
	"testing"
	"time"

	"github.com/mdlayher/arp"
	"github.com/mdlayher/ethernet"
	"github.com/mdlayher/ndp"
	"golang.org/x/net/ipv6"
)

// Fake packet connections: the speaker's decisions test on them without root. They hand the
// receive loop one packet at a time and wait until it has dealt with it, so a test reads the
// outcome without sleeping.

var (
	nodeMAC   = net.HardwareAddr{0x02, 0, 0, 0, 0, 0x11}
	node2MAC  = net.HardwareAddr{0x02, 0, 0, 0, 0, 0x12}
	clientMAC = net.HardwareAddr{0x02, 0, 0, 0, 0, 0x64}
)

// delivery is one packet for a receive loop; done closes when the loop asks for the next one.
type delivery struct {
	arp  *arp.Packet
	eth  *ethernet.Frame
	ndp  ndp.Message
	cm   *ipv6.ControlMessage
	from netip.Addr
	done chan struct{}
}

type fakeConn struct {
	t      *testing.T
	in     chan delivery
	closed chan struct{}
	once   sync.Once

	mu      sync.Mutex
	pending chan struct{} // done of the packet being dealt with
	sentARP []sentARP
	sentNDP []sentNDP
	groups  map[netip.Addr]bool
}

type sentARP struct {
	p  *arp.Packet
	to net.HardwareAddr
}

type sentNDP struct {
	m  ndp.Message
	to netip.Addr
	// from and toMAC, for advertisements sent in frames of their own (from a virtual MAC).
	from, toMAC net.HardwareAddr
}

// fakeFrames records what a frame connection sends, with the fake's sentNDP.
type fakeFrames struct{ *fakeConn }

func (f fakeFrames) WriteNDP(m ndp.Message, src, dstMAC net.HardwareAddr, dst netip.Addr) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.sentNDP = append(f.sentNDP, sentNDP{m: m, to: dst, from: src, toMAC: dstMAC})
	return nil
}

func newFakeConn(t *testing.T) *fakeConn {
	return &fakeConn{t: t, in: make(chan delivery), closed: make(chan struct{}), groups: map[netip.Addr]bool{}}
}

// next hands the loop the next packet, marking the one before dealt with.
func (f *fakeConn) next() (delivery, bool) {
	f.mu.Lock()
	if f.pending != nil {
		close(f.pending)
		f.pending = nil
	}
	f.mu.Unlock()
	select {
	case d := <-f.in:
		f.mu.Lock()
		f.pending = d.done
		f.mu.Unlock()
		return d, true
	case <-f.closed:
		return delivery{}, false
	}
}

func (f *fakeConn) deliver(d delivery) {
	f.t.Helper()
	d.done = make(chan struct{})
	select {
	case f.in <- d:
	case <-time.After(5 * time.Second):
		f.t.Fatal("the speaker did not read the packet within 5 s")
	}
	select {
	case <-d.done:
	case <-time.After(5 * time.Second):
		f.t.Fatal("the speaker did not deal with the packet within 5 s")
	}
}

func (f *fakeConn) Read() (*arp.Packet, *ethernet.Frame, error) {
	d, ok := f.next()
	if !ok {
		return nil, nil, net.ErrClosed
	}
	return d.arp, d.eth, nil
}

func (f *fakeConn) ReadFrom() (ndp.Message, *ipv6.ControlMessage, netip.Addr, error) {
	d, ok := f.next()
	if !ok {
		return nil, nil, netip.Addr{}, net.ErrClosed
	}
	return d.ndp, d.cm, d.from, nil
}

func (f *fakeConn) WriteTo(p *arp.Packet, to net.HardwareAddr) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.sentARP = append(f.sentARP, sentARP{p: p, to: to})
	return nil
}

func (f *fakeConn) Close() error {
	f.once.Do(func() { close(f.closed) })
	return nil
}

// ndpConn view of the same fake.
type fakeNDP struct{ *fakeConn }

func (f fakeNDP) WriteTo(m ndp.Message, _ *ipv6.ControlMessage, dst netip.Addr) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.sentNDP = append(f.sentNDP, sentNDP{m: m, to: dst})
	return nil
}

func (f fakeNDP) JoinGroup(g netip.Addr) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.groups[g] = true
	return nil
}

func (f fakeNDP) LeaveGroup(g netip.Addr) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	delete(f.groups, g)
	return nil
}

func (f *fakeConn) arpSent() []sentARP {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]sentARP(nil), f.sentARP...)
}

func (f *fakeConn) ndpSent() []sentNDP {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]sentNDP(nil), f.sentNDP...)
}

func (f *fakeConn) reset() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.sentARP, f.sentNDP = nil, nil
}

// fakeClock is a clock a test moves by hand.
type fakeClock struct {
	mu  sync.Mutex
	now time.Time
}

func newFakeClock() *fakeClock { return &fakeClock{now: time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)} }

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *fakeClock) Add(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
}

// fakeNode is a speaker on fake connections, on interfaces eth0 and eth1.
type fakeNode struct {
	t      *testing.T
	s      *Speaker
	clock  *fakeClock
	arp    map[string]*fakeConn
	ndp    map[string]*fakeConn
	frames map[string]*fakeConn
}

func newFakeNode(t *testing.T, opts Options) *fakeNode {
	t.Helper()
	n := &fakeNode{t: t, clock: newFakeClock(), arp: map[string]*fakeConn{}, ndp: map[string]*fakeConn{}, frames: map[string]*fakeConn{}}
	ifaces := map[string]*net.Interface{
		"eth0": {Index: 2, Name: "eth0", HardwareAddr: nodeMAC, MTU: 1500},
		"eth1": {Index: 3, Name: "eth1", HardwareAddr: node2MAC, MTU: 1500},
		"lo":   {Index: 1, Name: "lo", MTU: 65536},
	}
	var mu sync.Mutex
	opts.LookupInterface = func(name string) (*net.Interface, error) {
		if ifi := ifaces[name]; ifi != nil {
			return ifi, nil
		}
		return nil, fmt.Errorf("no interface %q", name)
	}
	opts.OpenARP = func(ifi *net.Interface) (ARPConn, error) {
		mu.Lock()
		defer mu.Unlock()
		c := newFakeConn(t)
		n.arp[ifi.Name] = c
		return c, nil
	}
	opts.OpenNDP = func(ifi *net.Interface) (NDPConn, error) {
		mu.Lock()
		defer mu.Unlock()
		c := newFakeConn(t)
		n.ndp[ifi.Name] = c
		return fakeNDP{c}, nil
	}
	opts.OpenFrames = func(ifi *net.Interface) (FrameConn, error) {
		mu.Lock()
		defer mu.Unlock()
		c := newFakeConn(t)
		n.frames[ifi.Name] = c
		return fakeFrames{c}, nil
	}
	if opts.Now == nil {
		opts.Now = n.clock.Now
	}
	if opts.Refresh == 0 {
		opts.Refresh = time.Hour
	}
	if opts.BurstInterval == 0 {
		opts.BurstInterval = time.Millisecond
	}
	n.s = New(opts)
	t.Cleanup(func() { n.s.Close() })
	return n
}

func (n *fakeNode) set(vips ...VIP) {
	n.t.Helper()
	if err := n.s.Set(vips); err != nil {
		n.t.Fatalf("Set: %v", err)
	}
}

// ask delivers an ARP request for vip from ip at mac (in a frame from mac) on eth0.
func (n *fakeNode) ask(vip, ip netip.Addr, mac net.HardwareAddr) {
	n.t.Helper()
	n.askOn("eth0", vip, ip, mac, mac)
}

func (n *fakeNode) askOn(ifname string, vip, ip netip.Addr, mac, frameSrc net.HardwareAddr) {
	n.t.Helper()
	p, err := arp.NewPacket(arp.OperationRequest, mac, ip, ethernet.Broadcast, vip)
	if err != nil {
		n.t.Fatal(err)
	}
	n.deliverARP(ifname, p, frameSrc)
}

func (n *fakeNode) deliverARP(ifname string, p *arp.Packet, frameSrc net.HardwareAddr) {
	n.t.Helper()
	c := n.arp[ifname]
	if c == nil {
		n.t.Fatalf("no ARP connection open on %s", ifname)
	}
	c.deliver(delivery{arp: p, eth: &ethernet.Frame{Source: frameSrc, Destination: ethernet.Broadcast, EtherType: ethernet.EtherTypeARP}})
}

// solicit delivers a Neighbor Solicitation for vip from ip with hop limit hops on eth0; a nil
// mac sends no source link-layer option.
func (n *fakeNode) solicit(vip, ip netip.Addr, mac net.HardwareAddr, hops int) {
	n.t.Helper()
	ns := &ndp.NeighborSolicitation{TargetAddress: vip}
	if mac != nil {
		ns.Options = []ndp.Option{&ndp.LinkLayerAddress{Direction: ndp.Source, Addr: mac}}
	}
	c := n.ndp["eth0"]
	if c == nil {
		n.t.Fatal("no NDP connection open on eth0")
	}
	c.deliver(delivery{ndp: ns, cm: &ipv6.ControlMessage{HopLimit: hops}, from: ip})
}

// replies returns the ARP replies for vip sent on eth0 since the last reset, excluding
// gratuitous ones.
func (n *fakeNode) replies(vip netip.Addr) []sentARP {
	var out []sentARP
	for _, s := range n.arp["eth0"].arpSent() {
		if s.p.Operation == arp.OperationReply && s.p.SenderIP == vip && s.p.TargetIP != vip {
			out = append(out, s)
		}
	}
	return out
}

// waitFor polls cond for up to 5 s.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within 5 s", what)
		}
		time.Sleep(time.Millisecond)
	}
}
