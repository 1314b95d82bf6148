// Package l2 answers ARP (IPv4) and NDP (IPv6) for the VIPs this node owns, on the chosen
// interfaces, and for nothing else; it announces a VIP it takes over with a burst of
// gratuitous ARPs or unsolicited Neighbor Advertisements, and again periodically so that
// switches' forwarding tables never age the VIP out. It decides nothing about which node owns
// what (the agent tells it) and touches no routing or address configuration.
package l2

import (
	"bytes"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/mdlayher/arp"
	"github.com/mdlayher/ethernet"
	"github.com/mdlayher/ndp"
	"golang.org/x/net/icmp"
	"golang.org/x/net/ipv6"
	"k8s.io/klog/v2"

	"github.com/metalvip/metalvip/internal/rendezvous"
)

// VIP is an address this node answers for, and where.
type VIP struct {
	Addr       netip.Addr
	Interfaces []string
	// Share, when set, spreads the VIP's clients over several nodes: this node answers only
	// the clients it owns among Share.Members (rendezvous hashing of the client's address),
	// and sends no gratuitous announcements, which would draw every client to it.
	Share *Share
}

// Share is this node's part of a per-client VIP.
type Share struct {
	Self    string
	Members []string // the live candidates, this node among them
}

// answers reports whether the node answers client; a nil share answers everyone.
func (sh *Share) answers(client netip.Addr) bool {
	return sh == nil || rendezvous.Owner(client, sh.Members) == sh.Self
}

func (sh *Share) equal(o *Share) bool {
	if sh == nil || o == nil {
		return sh == o
	}
	return sh.Self == o.Self && slices.Equal(sh.Members, o.Members)
}

// maxClients bounds the clients remembered per per-client VIP.
const maxClients = 4096

// client is a host seen asking for a per-client VIP.
type client struct {
	mac   net.HardwareAddr
	iface string
}

// Options configure a Speaker.
type Options struct {
	// Refresh is how often owned VIPs are announced again; 0 means 30 s.
	Refresh time.Duration
	// Burst is how many announcements a takeover sends, BurstInterval apart; 0 means 3 and
	// 100 ms.
	Burst         int
	BurstInterval time.Duration
}

// Counters count the speaker's work.
type Counters struct {
	ARPRequests, ARPReplies, GratuitousARPs       uint64
	NeighborSolicitations, NeighborAdvertisements uint64
	UnsolicitedAdvertisements                     uint64
	// TargetedReplies are ARP replies and advertisements sent, unasked, to the clients of a
	// per-client VIP that this node took over.
	TargetedReplies uint64
}

// Speaker answers for owned VIPs. Its methods are safe for concurrent use.
type Speaker struct {
	opts Options

	mu     sync.Mutex
	ifaces map[string]*iface // by name
	owned  map[netip.Addr][]string
	shares map[netip.Addr]*Share // of the per-client VIPs in owned

	cmu        sync.Mutex
	clients    map[netip.Addr]map[netip.Addr]client // per-client VIP -> clients seen asking
	clientsVer uint64                               // grows with every change to clients

	arpRequests, arpReplies, gratuitous atomic.Uint64
	nsReceived, naSent, unsolicited     atomic.Uint64
	targeted                            atomic.Uint64

	refresh chan time.Duration // new refresh periods for refreshLoop

	stop chan struct{}
	wg   sync.WaitGroup
}

// iface holds the sockets of one interface; each is opened when a VIP of its family first
// needs it.
type iface struct {
	ifi *net.Interface
	arp *arp.Client
	ndp *ndpConn
	// owned VIPs on this interface, read by the receive loops; a nil share answers everyone.
	owned atomic.Pointer[map[netip.Addr]*Share]
	// groups are the solicited-node multicast groups joined.
	groups map[netip.Addr]bool
}

// New returns a speaker that owns nothing.
func New(opts Options) *Speaker {
	if opts.Refresh <= 0 {
		opts.Refresh = 30 * time.Second
	}
	if opts.Burst <= 0 {
		opts.Burst = 3
	}
	if opts.BurstInterval <= 0 {
		opts.BurstInterval = 100 * time.Millisecond
	}
	s := &Speaker{opts: opts, ifaces: map[string]*iface{}, owned: map[netip.Addr][]string{}, shares: map[netip.Addr]*Share{},
		clients: map[netip.Addr]map[netip.Addr]client{}, refresh: make(chan time.Duration, 1), stop: make(chan struct{})}
	s.wg.Add(1)
	go s.refreshLoop()
	return s
}

// Set makes vips the complete set of VIPs the node answers for. VIPs new to the set are
// announced at once (a burst); VIPs left out are no longer answered. For a per-client VIP, the
// clients this node owns now and did not before are told at once, each with a unicast reply.
func (s *Speaker) Set(vips []VIP) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	want := map[netip.Addr][]string{}
	shares := map[netip.Addr]*Share{}
	perIface := map[string]map[netip.Addr]*Share{}
	var errs []error
	for _, v := range vips {
		if len(v.Interfaces) == 0 {
			errs = append(errs, fmt.Errorf("VIP %s: no interface to answer on", v.Addr))
			continue
		}
		for _, name := range v.Interfaces {
			ifc, err := s.open(name, v.Addr.Is6())
			if err != nil {
				errs = append(errs, fmt.Errorf("VIP %s on %s: %w", v.Addr, name, err))
				continue
			}
			if perIface[name] == nil {
				perIface[name] = map[netip.Addr]*Share{}
			}
			perIface[name][v.Addr] = v.Share
			want[v.Addr] = append(want[v.Addr], name)
			if v.Share != nil {
				sh := &Share{Self: v.Share.Self, Members: slices.Sorted(slices.Values(v.Share.Members))}
				shares[v.Addr], perIface[name][v.Addr] = sh, sh
			}
			if v.Addr.Is6() {
				if err := ifc.join(v.Addr); err != nil {
					errs = append(errs, fmt.Errorf("VIP %s on %s: join solicited-node group: %w", v.Addr, name, err))
				}
			}
		}
	}
	for name, ifc := range s.ifaces {
		m := perIface[name]
		if m == nil {
			m = map[netip.Addr]*Share{}
		}
		ifc.owned.Store(&m)
		ifc.leaveUnused(m)
	}
	var added []netip.Addr
	for a, names := range want {
		old, had := s.owned[a]
		slices.Sort(names)
		if shares[a] != nil {
			if prev := s.shares[a]; !prev.equal(shares[a]) {
				s.tellTakenOver(a, prev, shares[a])
			}
			continue
		}
		if !had || !slices.Equal(old, names) || s.shares[a] != nil {
			added = append(added, a)
		}
	}
	s.owned, s.shares = want, shares
	s.forgetClients(shares)
	for _, a := range added {
		s.wg.Add(1)
		go s.burst(a, want[a])
	}
	return errors.Join(errs...)
}

// tellTakenOver sends each known client of a per-client VIP that this node owns under next
// and did not under prev a unicast reply, so that it moves at once. The caller holds mu.
func (s *Speaker) tellTakenOver(vip netip.Addr, prev, next *Share) {
	type job struct {
		ip netip.Addr
		c  client
	}
	var jobs []job
	s.cmu.Lock()
	for ip, c := range s.clients[vip] {
		if next.answers(ip) && (prev == nil || !prev.answers(ip)) {
			jobs = append(jobs, job{ip, c})
		}
	}
	s.cmu.Unlock()
	for _, j := range jobs {
		ifc := s.ifaces[j.c.iface]
		if ifc == nil {
			continue
		}
		var err error
		if vip.Is4() {
			if ifc.arp == nil {
				continue
			}
			var p *arp.Packet
			if p, err = arp.NewPacket(arp.OperationReply, ifc.ifi.HardwareAddr, vip, j.c.mac, j.ip); err == nil {
				err = ifc.arp.WriteTo(p, j.c.mac)
			}
		} else {
			if ifc.ndp == nil {
				continue
			}
			err = s.advertise(ifc, vip, j.ip, false)
		}
		if err != nil {
			klog.V(2).InfoS("Targeted reply failed", "vip", vip, "client", j.ip, "err", err)
			continue
		}
		s.targeted.Add(1)
	}
}

// forgetClients drops the clients of VIPs no longer answered per client. The caller holds mu.
func (s *Speaker) forgetClients(shares map[netip.Addr]*Share) {
	s.cmu.Lock()
	defer s.cmu.Unlock()
	for vip := range s.clients {
		if shares[vip] == nil {
			delete(s.clients, vip)
			s.clientsVer++
		}
	}
}

// learn remembers a client asking for a per-client VIP.
func (s *Speaker) learn(vip, ip netip.Addr, mac net.HardwareAddr, ifc *iface) {
	if !ip.IsValid() || ip.IsUnspecified() || len(mac) == 0 {
		return
	}
	s.cmu.Lock()
	defer s.cmu.Unlock()
	m := s.clients[vip]
	if m == nil {
		m = map[netip.Addr]client{}
		s.clients[vip] = m
	}
	if c, ok := m[ip]; ok && bytes.Equal(c.mac, mac) && c.iface == ifc.ifi.Name {
		return
	}
	s.clientsVer++
	if _, ok := m[ip]; !ok && len(m) >= maxClients {
		for old := range m { // full: forget one, any
			delete(m, old)
			break
		}
	}
	m[ip] = client{mac: slices.Clone(mac), iface: ifc.ifi.Name}
}

// Client is a host seen asking for a per-client VIP.
type Client struct {
	VIP, IP   netip.Addr
	MAC       net.HardwareAddr
	Interface string
}

// KnownClients returns the clients of every per-client VIP, and a version that changes
// whenever they do (to save them only then).
func (s *Speaker) KnownClients() ([]Client, uint64) {
	s.cmu.Lock()
	defer s.cmu.Unlock()
	var out []Client
	for vip, m := range s.clients {
		for ip, c := range m {
			out = append(out, Client{VIP: vip, IP: ip, MAC: slices.Clone(c.mac), Interface: c.iface})
		}
	}
	return out, s.clientsVer
}

// Remember adds clients known from before (an agent restart), so that a node that takes
// clients over can tell those it has not seen asking since. Call it before the first Set: a
// Set forgets the clients of VIPs it does not answer per client.
func (s *Speaker) Remember(cs []Client) {
	s.cmu.Lock()
	defer s.cmu.Unlock()
	for _, c := range cs {
		if !c.VIP.IsValid() || !c.IP.IsValid() || len(c.MAC) == 0 || c.Interface == "" {
			continue
		}
		m := s.clients[c.VIP]
		if m == nil {
			m = map[netip.Addr]client{}
			s.clients[c.VIP] = m
		}
		if len(m) < maxClients {
			m[c.IP] = client{mac: slices.Clone(c.MAC), iface: c.Interface}
		}
	}
}

// Clients returns how many clients of a per-client VIP the node knows, and how many of those
// it answers.
func (s *Speaker) Clients(vip netip.Addr) (known, answered int) {
	s.mu.Lock()
	sh := s.shares[vip]
	s.mu.Unlock()
	s.cmu.Lock()
	defer s.cmu.Unlock()
	for ip := range s.clients[vip] {
		known++
		if sh.answers(ip) {
			answered++
		}
	}
	return known, answered
}

// Owned returns the VIPs answered for now, with their interfaces.
func (s *Speaker) Owned() map[netip.Addr][]string {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make(map[netip.Addr][]string, len(s.owned))
	for a, n := range s.owned {
		out[a] = slices.Clone(n)
	}
	return out
}

// Counters returns the counters.
func (s *Speaker) Counters() Counters {
	return Counters{
		ARPRequests: s.arpRequests.Load(), ARPReplies: s.arpReplies.Load(), GratuitousARPs: s.gratuitous.Load(),
		NeighborSolicitations: s.nsReceived.Load(), NeighborAdvertisements: s.naSent.Load(),
		UnsolicitedAdvertisements: s.unsolicited.Load(), TargetedReplies: s.targeted.Load(),
	}
}

// Close stops answering and closes every socket.
func (s *Speaker) Close() error {
	s.mu.Lock()
	select {
	case <-s.stop:
		s.mu.Unlock()
		return nil
	default:
	}
	close(s.stop)
	for _, ifc := range s.ifaces {
		empty := map[netip.Addr]*Share{}
		ifc.owned.Store(&empty)
		if ifc.arp != nil {
			ifc.arp.Close()
		}
		if ifc.ndp != nil {
			ifc.ndp.Close()
		}
	}
	s.mu.Unlock()
	s.wg.Wait()
	return nil
}

// open returns the interface's state with the socket for the family open. The caller holds mu.
func (s *Speaker) open(name string, v6 bool) (*iface, error) {
	ifc := s.ifaces[name]
	if ifc == nil {
		ifi, err := net.InterfaceByName(name)
		if err != nil {
			return nil, err
		}
		if len(ifi.HardwareAddr) != 6 {
			return nil, fmt.Errorf("interface %s has no Ethernet address", name)
		}
		ifc = &iface{ifi: ifi, groups: map[netip.Addr]bool{}}
		empty := map[netip.Addr]*Share{}
		ifc.owned.Store(&empty)
		s.ifaces[name] = ifc
	}
	if !v6 && ifc.arp == nil {
		c, err := arp.Dial(ifc.ifi)
		if err != nil {
			return nil, fmt.Errorf("open ARP socket: %w", err)
		}
		ifc.arp = c
		s.wg.Add(1)
		go s.arpLoop(ifc)
	}
	if v6 && ifc.ndp == nil {
		c, err := listenNDP(ifc.ifi, ipv6.ICMPTypeNeighborSolicitation)
		if err != nil {
			return nil, fmt.Errorf("open NDP socket: %w", err)
		}
		ifc.ndp = c
		s.wg.Add(1)
		go s.ndpLoop(ifc)
	}
	return ifc, nil
}

func (ifc *iface) join(vip netip.Addr) error {
	g, err := ndp.SolicitedNodeMulticast(vip)
	if err != nil {
		return err
	}
	if ifc.groups[g] {
		return nil
	}
	if err := ifc.ndp.pc.JoinGroup(ifc.ifi, &net.IPAddr{IP: g.AsSlice()}); err != nil {
		return err
	}
	ifc.groups[g] = true
	return nil
}

// leaveUnused leaves the groups no owned VIP needs.
func (ifc *iface) leaveUnused(owned map[netip.Addr]*Share) {
	if ifc.ndp == nil {
		return
	}
	need := map[netip.Addr]bool{}
	for a := range owned {
		if a.Is6() {
			if g, err := ndp.SolicitedNodeMulticast(a); err == nil {
				need[g] = true
			}
		}
	}
	for g := range ifc.groups {
		if !need[g] {
			_ = ifc.ndp.pc.LeaveGroup(ifc.ifi, &net.IPAddr{IP: g.AsSlice()})
			delete(ifc.groups, g)
		}
	}
}

func (s *Speaker) arpLoop(ifc *iface) {
	defer s.wg.Done()
	for {
		p, _, err := ifc.arp.Read()
		if err != nil {
			select {
			case <-s.stop:
				return
			default:
			}
			if errors.Is(err, net.ErrClosed) {
				return
			}
			continue // a malformed frame: not ours to care about
		}
		if p.Operation != arp.OperationRequest {
			continue
		}
		s.arpRequests.Add(1)
		sh, ok := (*ifc.owned.Load())[p.TargetIP]
		if !ok {
			continue
		}
		if sh != nil {
			s.learn(p.TargetIP, p.SenderIP, p.SenderHardwareAddr, ifc)
			if !sh.answers(p.SenderIP) {
				continue
			}
		}
		if err := ifc.arp.Reply(p, ifc.ifi.HardwareAddr, p.TargetIP); err != nil {
			klog.V(2).InfoS("ARP reply failed", "vip", p.TargetIP, "interface", ifc.ifi.Name, "err", err)
			continue
		}
		s.arpReplies.Add(1)
	}
}

func (s *Speaker) ndpLoop(ifc *iface) {
	defer s.wg.Done()
	for {
		m, from, err := ifc.ndp.read()
		if err != nil {
			select {
			case <-s.stop:
				return
			default:
			}
			if errors.Is(err, net.ErrClosed) {
				return
			}
			continue
		}
		ns, ok := m.(*ndp.NeighborSolicitation)
		if !ok {
			continue
		}
		s.nsReceived.Add(1)
		sh, ok := (*ifc.owned.Load())[ns.TargetAddress]
		if !ok {
			continue
		}
		if sh != nil {
			var mac net.HardwareAddr
			for _, o := range ns.Options {
				if l, ok := o.(*ndp.LinkLayerAddress); ok && l.Direction == ndp.Source {
					mac = l.Addr
				}
			}
			s.learn(ns.TargetAddress, from, mac, ifc)
			if !sh.answers(from) {
				continue
			}
		}
		// A solicitation from the unspecified address is duplicate address detection: the
		// answer goes to all nodes and is not solicited (RFC 4861 7.2.4).
		dst, solicited := from, true
		if !from.IsValid() || from.IsUnspecified() {
			dst, solicited = netip.IPv6LinkLocalAllNodes(), false
		}
		if err := s.advertise(ifc, ns.TargetAddress, dst, solicited); err != nil {
			klog.V(2).InfoS("Neighbor advertisement failed", "vip", ns.TargetAddress, "interface", ifc.ifi.Name, "err", err)
			continue
		}
		s.naSent.Add(1)
	}
}

func (s *Speaker) advertise(ifc *iface, vip, dst netip.Addr, solicited bool) error {
	na := &ndp.NeighborAdvertisement{
		Solicited:     solicited,
		Override:      true,
		TargetAddress: vip,
		Options:       []ndp.Option{&ndp.LinkLayerAddress{Direction: ndp.Target, Addr: ifc.ifi.HardwareAddr}},
	}
	return ifc.ndp.write(na, dst)
}

// announce tells the segment once that this node has vip: a gratuitous ARP request and reply
// for IPv4 (some hosts heed only one of the two), an unsolicited advertisement for IPv6.
func (s *Speaker) announce(vip netip.Addr, names []string) {
	s.mu.Lock()
	ifcs := make([]*iface, 0, len(names))
	for _, n := range names {
		ifc := s.ifaces[n]
		if ifc == nil {
			continue
		}
		// Owned here, and answered for every client (per-client VIPs are never announced).
		if sh, own := (*ifc.owned.Load())[vip]; own && sh == nil {
			ifcs = append(ifcs, ifc)
		}
	}
	s.mu.Unlock()
	for _, ifc := range ifcs {
		if vip.Is4() {
			if ifc.arp == nil {
				continue
			}
			for _, op := range []arp.Operation{arp.OperationRequest, arp.OperationReply} {
				p, err := arp.NewPacket(op, ifc.ifi.HardwareAddr, vip, ethernet.Broadcast, vip)
				if err == nil {
					err = ifc.arp.WriteTo(p, ethernet.Broadcast)
				}
				if err != nil {
					klog.V(2).InfoS("Gratuitous ARP failed", "vip", vip, "interface", ifc.ifi.Name, "err", err)
					continue
				}
				s.gratuitous.Add(1)
			}
			continue
		}
		if ifc.ndp == nil {
			continue
		}
		if err := s.advertise(ifc, vip, netip.IPv6LinkLocalAllNodes(), false); err != nil {
			klog.V(2).InfoS("Unsolicited advertisement failed", "vip", vip, "interface", ifc.ifi.Name, "err", err)
			continue
		}
		s.unsolicited.Add(1)
	}
}

// burst announces a VIP just taken over a few times in a row, in case one is lost.
func (s *Speaker) burst(vip netip.Addr, names []string) {
	defer s.wg.Done()
	for i := range s.opts.Burst {
		if i > 0 {
			select {
			case <-s.stop:
				return
			case <-time.After(s.opts.BurstInterval):
			}
		}
		s.announce(vip, names)
	}
}

// SetRefresh changes how often owned VIPs are announced again; d <= 0 restores the default
// given at New.
func (s *Speaker) SetRefresh(d time.Duration) {
	if d <= 0 {
		d = s.opts.Refresh
	}
	select {
	case <-s.refresh:
	default:
	}
	s.refresh <- d
}

func (s *Speaker) refreshLoop() {
	defer s.wg.Done()
	period := s.opts.Refresh
	t := time.NewTicker(period)
	defer t.Stop()
	for {
		select {
		case <-s.stop:
			return
		case d := <-s.refresh:
			if d != period {
				period = d
				t.Reset(d)
			}
		case <-t.C:
			for vip, names := range s.Owned() {
				s.announce(vip, names)
			}
		}
	}
}

// ndpConn is a raw ICMPv6 socket for NDP. github.com/mdlayher/ndp's Conn names the interface
// in every destination address, which is turned into an index through a process-wide cache:
// with sockets in several network namespaces in one process (as in tests) the index can be
// another namespace's. This one names the interface by index in a control message only, and
// works from any goroutine once open. Messages are still marshalled and parsed by package ndp.
type ndpConn struct {
	pc  *ipv6.PacketConn
	raw *icmp.PacketConn
	cm  *ipv6.ControlMessage
}

// listenNDP opens the socket on ifi, receiving only the ICMPv6 types given.
func listenNDP(ifi *net.Interface, accept ...ipv6.ICMPType) (*ndpConn, error) {
	addrs, err := ifi.Addrs()
	if err != nil {
		return nil, err
	}
	var src netip.Addr
	for _, a := range addrs {
		if p, err := netip.ParsePrefix(a.String()); err == nil && p.Addr().Is6() && p.Addr().IsLinkLocalUnicast() {
			src = p.Addr()
			break
		}
	}
	if !src.IsValid() {
		return nil, fmt.Errorf("interface %s has no IPv6 link-local address", ifi.Name)
	}
	raw, err := icmp.ListenPacket("ip6:ipv6-icmp", src.WithZone(ifi.Name).String())
	if err != nil {
		return nil, err
	}
	pc := raw.IPv6PacketConn()
	var f ipv6.ICMPFilter
	f.SetAll(true)
	for _, typ := range accept {
		f.Accept(typ)
	}
	for _, set := range []func() error{
		func() error { return pc.SetHopLimit(ndp.HopLimit) },
		func() error { return pc.SetMulticastHopLimit(ndp.HopLimit) },
		func() error { return pc.SetChecksum(true, 2) },
		func() error { return pc.SetICMPFilter(&f) },
	} {
		if err := set(); err != nil {
			raw.Close()
			return nil, err
		}
	}
	return &ndpConn{pc: pc, raw: raw, cm: &ipv6.ControlMessage{HopLimit: ndp.HopLimit, Src: src.AsSlice(), IfIndex: ifi.Index}}, nil
}

func (c *ndpConn) read() (ndp.Message, netip.Addr, error) {
	b := make([]byte, 1500)
	n, _, from, err := c.pc.ReadFrom(b)
	if err != nil {
		return nil, netip.Addr{}, err
	}
	m, err := ndp.ParseMessage(b[:n])
	if err != nil {
		return nil, netip.Addr{}, err
	}
	var src netip.Addr
	if ia, ok := from.(*net.IPAddr); ok {
		src, _ = netip.AddrFromSlice(ia.IP)
	}
	return m, src, nil
}

func (c *ndpConn) write(m ndp.Message, dst netip.Addr) error {
	b, err := ndp.MarshalMessage(m)
	if err != nil {
		return err
	}
	_, err = c.pc.WriteTo(b, c.cm, &net.IPAddr{IP: dst.WithZone("").AsSlice()})
	return err
}

// Close closes the socket.
func (c *ndpConn) Close() error { return c.raw.Close() }
