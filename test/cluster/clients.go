package cluster

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"sync"
	"time"

	"github.com/mdlayher/arp"
	"github.com/mdlayher/ethernet"

	"github.com/metalvip/metalvip/api/v1alpha1"
	"github.com/metalvip/metalvip/test/lab"
)

// Clients are many client addresses on the segment that ask for a VIP by ARP through the
// client host's interface. A reader records every ARP reply addressed to any of them, asked
// for or not, so a test sees the targeted replies of a node taking clients over.
type Clients struct {
	c     *Cluster
	arp   *arp.Client
	mac   net.HardwareAddr
	Addrs []netip.Addr

	mu      sync.Mutex
	replies []Reply
	stop    chan struct{} // closed when the test ends, before the socket
	done    chan struct{} // closed when the reader has returned
}

// Reply is one ARP reply for a VIP to one client address.
type Reply struct {
	At     time.Time
	VIP    netip.Addr
	Client netip.Addr
	Node   string // by the MAC that answered; "" when no node has it
}

// NewClients opens the client host's ARP socket for addrs; it closes when the test ends.
func (c *Cluster) NewClients(addrs []netip.Addr) *Clients {
	c.T.Helper()
	cs := &Clients{c: c, Addrs: slices.Clone(addrs), stop: make(chan struct{}), done: make(chan struct{})}
	if err := c.Lab.Client.Do(func() error {
		ifi, err := net.InterfaceByName("eth0")
		if err != nil {
			return err
		}
		cs.mac = ifi.HardwareAddr
		return nil
	}); err != nil {
		c.T.Fatalf("%v", err)
	}
	var err error
	if cs.arp, err = c.Lab.Client.DialARP(); err != nil {
		c.T.Fatalf("%v", err)
	}
	go cs.read()
	c.T.Cleanup(func() {
		close(cs.stop)
		cs.arp.Close()
		<-cs.done
	})
	return cs
}

func (cs *Clients) read() {
	defer close(cs.done)
	for {
		p, _, err := cs.arp.Read()
		if err != nil {
			if cs.closed(err) {
				return
			}
			continue
		}
		if p.Operation != arp.OperationReply || !slices.Contains(cs.Addrs, p.TargetIP) {
			continue
		}
		r := Reply{At: time.Now(), VIP: p.SenderIP, Client: p.TargetIP, Node: cs.c.MACs[p.SenderHardwareAddr.String()]}
		cs.mu.Lock()
		cs.replies = append(cs.replies, r)
		cs.mu.Unlock()
	}
}

func (cs *Clients) closed(err error) bool {
	select {
	case <-cs.stop:
		return true
	default:
	}
	return errors.Is(err, net.ErrClosed)
}

// Ask sends one ARP request for vip from each of addrs (every client when none are given).
func (cs *Clients) Ask(vip netip.Addr, addrs ...netip.Addr) {
	cs.c.T.Helper()
	if err := cs.Send(vip, addrs...); err != nil {
		cs.c.T.Fatalf("%v", err)
	}
}

// Send is Ask for a goroutine other than the test's: it returns the first error.
func (cs *Clients) Send(vip netip.Addr, addrs ...netip.Addr) error {
	if len(addrs) == 0 {
		addrs = cs.Addrs
	}
	for _, a := range addrs {
		p, err := arp.NewPacket(arp.OperationRequest, cs.mac, a, ethernet.Broadcast, vip)
		if err != nil {
			return err
		}
		if err := cs.arp.WriteTo(p, ethernet.Broadcast); err != nil {
			return fmt.Errorf("ARP request from %s: %w", a, err)
		}
	}
	return nil
}

// Replies returns the replies for vip received since t.
func (cs *Clients) Replies(vip netip.Addr, since time.Time) []Reply {
	cs.mu.Lock()
	defer cs.mu.Unlock()
	var out []Reply
	for _, r := range cs.replies {
		if r.VIP == vip && !r.At.Before(since) {
			out = append(out, r)
		}
	}
	return out
}

// Answerers asks for vip from every client and returns, per client, the nodes that answered
// within wait.
func (cs *Clients) Answerers(vip netip.Addr, wait time.Duration) map[netip.Addr][]string {
	cs.c.T.Helper()
	start := time.Now()
	cs.Ask(vip)
	time.Sleep(wait)
	out := map[netip.Addr][]string{}
	for _, r := range cs.Replies(vip, start) {
		if !slices.Contains(out[r.Client], r.Node) {
			out[r.Client] = append(out[r.Client], r.Node)
		}
	}
	return out
}

// Owners asks for vip from every client and returns each client's node, with ok false unless
// every client was answered by exactly one node within wait.
func (cs *Clients) Owners(vip netip.Addr, wait time.Duration) (map[netip.Addr]string, bool) {
	got := cs.Answerers(vip, wait)
	owners := map[netip.Addr]string{}
	ok := true
	for _, a := range cs.Addrs {
		if len(got[a]) != 1 || got[a][0] == "" {
			ok = false
			continue
		}
		owners[a] = got[a][0]
	}
	return owners, ok
}

// Told returns, for each of addrs, when a node other than except first replied to it for vip
// since t (asked or not).
func (cs *Clients) Told(vip netip.Addr, since time.Time, except string, addrs []netip.Addr) map[netip.Addr]time.Time {
	told := map[netip.Addr]time.Time{}
	for _, r := range cs.Replies(vip, since) {
		if r.Node == "" || r.Node == except || !slices.Contains(addrs, r.Client) {
			continue
		}
		if _, seen := told[r.Client]; !seen {
			told[r.Client] = r.At
		}
	}
	return told
}

// Shares counts clients per node.
func Shares(owners map[netip.Addr]string) map[string]int {
	out := map[string]int{}
	for _, n := range owners {
		out[n]++
	}
	return out
}

// ClientsOf returns the clients node answers, sorted.
func ClientsOf(owners map[netip.Addr]string, node string) []netip.Addr {
	var out []netip.Addr
	for a, n := range owners {
		if n == node {
			out = append(out, a)
		}
	}
	slices.SortFunc(out, netip.Addr.Compare)
	return out
}

// ClientAddrs returns every IPv4 address of the on-link client: its own, then the extra ones
// (Options.ClientAddrs).
func (c *Cluster) ClientAddrs() []netip.Addr {
	addrs := []netip.Addr{c.Lab.Client.IPv4}
	for i := range c.opts.ClientAddrs {
		addrs = append(addrs, lab.ClientAddr(i))
	}
	return addrs
}

// PerClientPool creates an IP pool named name-<namespace> of 203.0.113.128/28, only for the
// cluster's namespace and only by name, whose L2 VIPs are answered per client; it returns the
// pool's name.
func (c *Cluster) PerClientPool(name string) string {
	c.T.Helper()
	pool := name + "-" + c.NS
	c.Object(v1alpha1.IPPoolResource, pool, fmt.Sprintf(`{addresses: ["203.0.113.128/28"], autoAssign: false, serviceAllocation: {namespaces: [%s]}, announce: {l2: {spreading: PerClient}}}`, c.NS))
	return pool
}
