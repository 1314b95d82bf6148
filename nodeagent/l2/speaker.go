// Package l2 answers ARP (IPv4) and NDP (IPv6) for the VIPs this node owns, on the chosen
// interfaces, and for nothing else; it announces a VIP it takes over with a burst of
// gratuitous ARPs or unsolicited Neighbor Advertisements, and again periodically so that
// switches' forwarding tables never age the VIP out. For a per-client VIP it answers only its
// share of clients, remembers the clients it hears (clients.go) and tells those it takes over.
// A VIP with a virtual MAC is answered and announced with that MAC, in frames from it, so that
// a switch learns the MAC where the VIP is now. It decides nothing about which node owns what
// (the agent tells it) and touches no routing, address or link configuration (receiving frames
// for a virtual MAC is the agent's part).
//
// One file per concern: speaker.go holds the VIP set, takeovers, the refresh and the
// sockets' lifetimes; arp.go and ndp.go what is received and sent for each protocol;
// clients.go the client table. The packet connections are opened through Options, so the
// decisions test without root on fake connections; the real sockets are tested in network
// namespaces.
package l2

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"sync"
	"sync/atomic"
	"time"

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
	// MAC, when set, is the VIP's virtual MAC: answers and announcements name it and come
	// from it. Nil: the interface's own MAC. Not with Share (one MAC on several nodes).
	MAC net.HardwareAddr
	// Again: a VIP answered before is announced again (a burst) when Again differs from the
	// last Set's. The agent raises it when another candidate may have answered meanwhile (it
	// took this node for dead): clients it drew away come back now, not at the next refresh.
	Again uint64
}

// answer is how a VIP owned on an interface is answered.
type answer struct {
	share *Share           // nil: every client
	mac   net.HardwareAddr // the MAC answers name and come from
}

// announced reports whether the VIP is announced unasked (per-client VIPs never are).
func (a answer) announced() bool { return a.share == nil }

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

// Options configure a Speaker.
type Options struct {
	// Refresh is how often owned VIPs are announced again; 0 means 30 s.
	Refresh time.Duration
	// Burst is how many announcements a takeover sends, BurstInterval apart; 0 means 3 and
	// 100 ms.
	Burst         int
	BurstInterval time.Duration
	// Clients bound the table of per-client VIPs' clients.
	Clients ClientLimits

	// OpenARP opens an interface's ARP connection; nil means mdlayher/arp's Dial.
	OpenARP func(*net.Interface) (ARPConn, error)
	// OpenNDP opens an interface's NDP connection, receiving Neighbor Solicitations with
	// their hop limit; nil means a raw ICMPv6 socket.
	OpenNDP func(*net.Interface) (NDPConn, error)
	// OpenFrames opens an interface's connection for Neighbor Advertisements from a virtual
	// MAC (a raw socket sends from the interface's own); nil means a packet socket.
	OpenFrames func(*net.Interface) (FrameConn, error)
	// LookupInterface finds an interface by name; nil means net.InterfaceByName.
	LookupInterface func(string) (*net.Interface, error)
	// Now is the client table's clock; nil means time.Now.
	Now func() time.Time
}

// Counters count the speaker's work.
type Counters struct {
	ARPRequests, ARPReplies, GratuitousARPs       uint64
	NeighborSolicitations, NeighborAdvertisements uint64
	UnsolicitedAdvertisements                     uint64
	// TargetedReplies are ARP replies and advertisements sent, unasked, to the clients of a
	// per-client VIP that this node took over.
	TargetedReplies uint64
	// Clients counts what the client table did with the requests it heard.
	Clients ClientStats
}

// Speaker answers for owned VIPs. Its methods are safe for concurrent use.
type Speaker struct {
	opts    Options
	clients *clientTable

	mu     sync.Mutex // guards ifaces, owned, shares, macs and again
	ifaces map[string]*iface
	owned  map[netip.Addr][]string
	shares map[netip.Addr]*Share // of the per-client VIPs in owned
	macs   map[netip.Addr]string // of the VIPs in owned with a virtual MAC
	again  map[netip.Addr]uint64 // VIP.Again as last Set
	// bursts are the takeover announcements still to send, in the order the VIPs were
	// taken over; burstLoop sends them.
	bursts    []pendingBurst
	burstKick chan struct{}
	// answering is held (shared) by a receive loop from reading what an interface owns to
	// sending its answer, and by Set while it changes that: once Set returns, no answer for a
	// dropped VIP is on its way.
	answering sync.RWMutex

	arpRequests, arpReplies, gratuitous atomic.Uint64
	nsReceived, naSent, unsolicited     atomic.Uint64
	targeted                            atomic.Uint64

	refresh chan time.Duration // new refresh periods for refreshLoop

	stop chan struct{}
	wg   sync.WaitGroup
}

// iface holds the connections of one interface; each is opened when a VIP of its family
// first needs it, and lives until Close.
type iface struct {
	ifi    *net.Interface
	arp    ARPConn
	ndp    NDPConn
	frames FrameConn // for IPv6 VIPs with a virtual MAC
	// owned VIPs on this interface, read by the receive loops.
	owned atomic.Pointer[map[netip.Addr]answer]
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
	if opts.OpenARP == nil {
		opts.OpenARP = dialARP
	}
	if opts.OpenNDP == nil {
		opts.OpenNDP = listenNDPSolicitations
	}
	if opts.OpenFrames == nil {
		opts.OpenFrames = openFrames
	}
	if opts.LookupInterface == nil {
		opts.LookupInterface = net.InterfaceByName
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	s := &Speaker{
		opts:      opts,
		clients:   newClientTable(opts.Clients, opts.Now),
		ifaces:    map[string]*iface{},
		owned:     map[netip.Addr][]string{},
		shares:    map[netip.Addr]*Share{},
		macs:      map[netip.Addr]string{},
		refresh:   make(chan time.Duration, 1),
		burstKick: make(chan struct{}, 1),
		stop:      make(chan struct{}),
	}
	s.wg.Add(2)
	go s.refreshLoop()
	go s.burstLoop()
	return s
}

// Set makes vips the complete set of VIPs the node answers for. VIPs new to the set, or
// with another MAC, are announced at once (a burst); VIPs left out are no longer answered when
// Set returns, and nothing is sent for them after. For a per-client VIP, the clients this node
// owns now and did not before are told at once, each with a unicast reply. A VIP that cannot
// be answered somewhere is reported in the error and disturbs no other.
func (s *Speaker) Set(vips []VIP) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	want := map[netip.Addr][]string{}
	shares := map[netip.Addr]*Share{}
	macs := map[netip.Addr]string{}
	again := map[netip.Addr]uint64{}
	perIface := map[string]map[netip.Addr]answer{}
	var errs []error
	for _, v := range vips {
		if len(v.Interfaces) == 0 {
			errs = append(errs, fmt.Errorf("VIP %s: no interface to answer on", v.Addr))
			continue
		}
		if err := checkMAC(v); err != nil {
			errs = append(errs, fmt.Errorf("VIP %s: %w", v.Addr, err))
			continue
		}
		if v.Again != 0 {
			again[v.Addr] = v.Again
		}
		var sh *Share
		if v.Share != nil {
			sh = &Share{Self: v.Share.Self, Members: slices.Sorted(slices.Values(v.Share.Members))}
		}
		for _, name := range v.Interfaces {
			ifc, err := s.open(name, v.Addr.Is6(), v.MAC != nil)
			if err != nil {
				errs = append(errs, fmt.Errorf("VIP %s on %s: %w", v.Addr, name, err))
				continue
			}
			if perIface[name] == nil {
				perIface[name] = map[netip.Addr]answer{}
			}
			ans := answer{share: sh, mac: ifc.ifi.HardwareAddr}
			if v.MAC != nil {
				ans.mac = slices.Clone(v.MAC)
				macs[v.Addr] = v.MAC.String()
			}
			perIface[name][v.Addr] = ans
			want[v.Addr] = append(want[v.Addr], name)
			if sh != nil {
				shares[v.Addr] = sh
			}
			if v.Addr.Is6() {
				if err := ifc.join(v.Addr); err != nil {
					errs = append(errs, fmt.Errorf("VIP %s on %s: join solicited-node group: %w", v.Addr, name, err))
				}
			}
		}
	}
	s.answering.Lock()
	for name, ifc := range s.ifaces {
		m := perIface[name]
		if m == nil {
			m = map[netip.Addr]answer{}
		}
		ifc.owned.Store(&m)
	}
	s.answering.Unlock()
	for name, ifc := range s.ifaces {
		ifc.leaveUnused(perIface[name])
	}
	// In the order given: a takeover of many VIPs is announced in that order.
	var added []netip.Addr
	seen := make(map[netip.Addr]bool, len(want))
	for _, v := range vips {
		a := v.Addr
		names, ok := want[a]
		if !ok || seen[a] {
			continue
		}
		seen[a] = true
		old, had := s.owned[a]
		slices.Sort(names)
		if shares[a] != nil {
			if prev := s.shares[a]; !prev.equal(shares[a]) {
				s.tellTakenOver(a, prev, shares[a])
			}
			continue
		}
		if !had || !slices.Equal(old, names) || s.shares[a] != nil || s.macs[a] != macs[a] || s.again[a] != again[a] {
			added = append(added, a)
		}
	}
	s.owned, s.shares, s.macs, s.again = want, shares, macs, again
	s.clients.keepOnly(func(vip netip.Addr) bool { return shares[vip] != nil })
	s.scheduleBursts(added)
	return errors.Join(errs...)
}

// tellTakenOver sends each known client of a per-client VIP that this node owns under next
// and did not under prev a unicast reply, so that it moves at once; clients that asked more
// than once go first. The caller holds mu.
func (s *Speaker) tellTakenOver(vip netip.Addr, prev, next *Share) {
	for _, c := range s.clients.clientsOf(vip, func(ip netip.Addr) bool {
		return next.answers(ip) && (prev == nil || !prev.answers(ip))
	}) {
		ifc := s.ifaces[c.Interface]
		if ifc == nil {
			continue
		}
		if s.tell(ifc, vip, c) {
			s.targeted.Add(1)
		}
	}
}

// tell sends one client an unasked answer for vip; false when it could not.
func (s *Speaker) tell(ifc *iface, vip netip.Addr, c Client) bool {
	if vip.Is4() {
		return s.tellARP(ifc, vip, c)
	}
	return s.tellNDP(ifc, vip, c)
}

// KnownClients returns the clients worth keeping across a restart (those that asked more than
// once, most recently seen first), and a version that changes whenever they do, so that they
// are saved only then. A flood of one-shot senders changes neither.
func (s *Speaker) KnownClients() ([]Client, uint64) { return s.clients.kept() }

// Remember adds clients kept from before a restart, so that a node that takes clients over
// can tell those it has not seen asking since. Call it before the first Set: a Set forgets
// the clients of VIPs it does not answer per client.
func (s *Speaker) Remember(cs []Client) { s.clients.remember(cs) }

// Clients returns how many clients of a per-client VIP the node knows, and how many of those
// it answers.
func (s *Speaker) Clients(vip netip.Addr) (known, answered int) {
	s.mu.Lock()
	sh := s.shares[vip]
	s.mu.Unlock()
	return s.clients.count(vip, sh.answers)
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
		Clients: s.clients.statsNow(),
	}
}

// Close stops answering and closes every connection.
func (s *Speaker) Close() error {
	s.mu.Lock()
	select {
	case <-s.stop:
		s.mu.Unlock()
		return nil
	default:
	}
	close(s.stop)
	var errs []error
	for _, ifc := range s.ifaces {
		empty := map[netip.Addr]answer{}
		ifc.owned.Store(&empty)
		if ifc.arp != nil {
			errs = append(errs, ifc.arp.Close())
		}
		if ifc.ndp != nil {
			errs = append(errs, ifc.ndp.Close())
		}
		if ifc.frames != nil {
			errs = append(errs, ifc.frames.Close())
		}
	}
	s.mu.Unlock()
	s.wg.Wait()
	return errors.Join(errs...)
}

// stopped reports whether Close has begun.
func (s *Speaker) stopped() bool {
	select {
	case <-s.stop:
		return true
	default:
		return false
	}
}

// open returns the interface's state with the connection for the family open, and its
// receive loop started; with vmac, for IPv6, also the connection that sends from a virtual
// MAC. The caller holds mu.
func (s *Speaker) open(name string, v6, vmac bool) (*iface, error) {
	if s.stopped() {
		return nil, errors.New("the speaker is closed")
	}
	ifc := s.ifaces[name]
	if ifc == nil {
		ifi, err := s.opts.LookupInterface(name)
		if err != nil {
			return nil, err
		}
		if len(ifi.HardwareAddr) != 6 {
			return nil, fmt.Errorf("interface %s has no Ethernet address", name)
		}
		ifc = &iface{ifi: ifi, groups: map[netip.Addr]bool{}}
		empty := map[netip.Addr]answer{}
		ifc.owned.Store(&empty)
		s.ifaces[name] = ifc
	}
	if !v6 && ifc.arp == nil {
		c, err := s.opts.OpenARP(ifc.ifi)
		if err != nil {
			return nil, fmt.Errorf("open ARP socket: %w", err)
		}
		ifc.arp = c
		s.wg.Add(1)
		go s.arpLoop(ifc)
	}
	if v6 && ifc.ndp == nil {
		c, err := s.opts.OpenNDP(ifc.ifi)
		if err != nil {
			return nil, fmt.Errorf("open NDP socket: %w", err)
		}
		ifc.ndp = c
		s.wg.Add(1)
		go s.ndpLoop(ifc)
	}
	if v6 && vmac && ifc.frames == nil {
		c, err := s.opts.OpenFrames(ifc.ifi)
		if err != nil {
			return nil, fmt.Errorf("open a packet socket for a virtual MAC: %w", err)
		}
		ifc.frames = c
	}
	return ifc, nil
}

// checkMAC refuses a virtual MAC that is not a unicast EUI-48, or with a share.
func checkMAC(v VIP) error {
	switch {
	case v.MAC == nil:
		return nil
	case len(v.MAC) != 6 || v.MAC[0]&1 != 0 || slices.Equal(v.MAC, make(net.HardwareAddr, 6)):
		return fmt.Errorf("virtual MAC %s is not a unicast Ethernet address", v.MAC)
	case v.Share != nil:
		return errors.New("a virtual MAC cannot be shared per client: one MAC is on one node at a time")
	}
	return nil
}

// readFailed decides what a receive loop does after a read error: end (true) when the
// connection is closed, go on otherwise (a malformed frame is not ours to care about).
func (s *Speaker) readFailed(err error) bool {
	return s.stopped() || errors.Is(err, net.ErrClosed)
}
