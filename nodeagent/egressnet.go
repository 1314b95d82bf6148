package nodeagent

import (
	"errors"
	"fmt"
	"maps"
	"net"
	"net/netip"
	"reflect"
	"slices"
	"sync"

	"github.com/google/nftables"
	"github.com/google/nftables/binaryutil"
	"github.com/google/nftables/expr"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
	"k8s.io/klog/v2"
)

// Egress on the wire (docs/egress.md). The egress node of a VIP source-NATs its pods'
// connections to the VIP; every other node routes its own pods' connections to that node, as
// themselves. Both in an nftables table of the agent's own and in policy routing rules the
// agent alone writes; the CNI's rules are never touched:
//
//	table ip metalvip-egress {                       # and table ip6 metalvip-egress
//	  chain postrouting { type nat hook postrouting priority srcnat - 10;
//	    ip daddr CLUSTER accept                      # one per cluster CIDR: never NATed here
//	    ip saddr POD counter snat to VIP             # on the egress node, every pod of the VIP
//	    ip saddr POD snat to ip saddr                # elsewhere: leaves as itself
//	  }
//	}
//	ip rule add prio 7470 from POD to CLUSTER lookup main   # each local pod, each cluster CIDR
//	ip rule add prio 7471 from POD lookup T                  # T: default via the egress node
//
// A BGP VIP's egress node maps TCP and UDP to the reply ports (`snat to VIP:FIRST-LAST`), and
// each of its other announcers sends the replies the router hashes to it on to the egress node:
//
//	ip rule add prio 7472 to VIP ipproto tcp dport FIRST-LAST lookup T   # and udp
//
// (ip -6 rules and routes for IPv6 VIPs and pods alike.)
//
// NAT takes the first mapping a connection's first packet gets, so the chain, ahead of the
// CNI's masquerade (srcnat), decides alone for these pods: the VIP on the egress node, the
// pod's own address elsewhere (so that it arrives at the egress node as itself). The counter
// of a snat rule counts connections, as only their first packet passes a nat chain.

// EgressNet is the seam to the kernel's egress configuration.
type EgressNet interface {
	// Set makes want the node's complete egress configuration.
	Set(want EgressConfig) error
	// Flows returns, by VIP, the connections this node source-NATed to it since the agent
	// started.
	Flows() map[netip.Addr]uint64
	// Check writes the last configuration again when the kernel lost some of it (a firewall
	// flushed the ruleset, rules were deleted by hand), or when the last Set failed.
	Check() error
	Close() error
}

// EgressConfig is what a node does for egress.
type EgressConfig struct {
	// Cluster are the destinations pods reach as themselves.
	Cluster []netip.Prefix
	// SNAT: this node is the egress node of these VIPs.
	SNAT []EgressSNAT
	// Route: another node is the egress node; this node's pods are routed to it.
	Route []EgressRoute
	// Steer: another node is the egress node of these BGP VIPs this node announces; the
	// replies to its connections that reach this node go on to it.
	Steer []EgressSteer
}

// EgressSNAT is a VIP this node source-NATs the connections of Sources to; with Ports (a BGP
// VIP), their TCP and UDP connections get a source port in it.
type EgressSNAT struct {
	VIP     netip.Addr
	Sources []netip.Addr
	Ports   PortRange
}

// EgressSteer sends the packets to VIP with a TCP or UDP destination port in Ports to the
// egress node Via.
type EgressSteer struct {
	VIP   netip.Addr
	Via   netip.Addr
	Ports PortRange
}

// PortRange is the ports First to Last, both included; zero for none.
type PortRange struct{ First, Last uint16 }

func (p PortRange) empty() bool { return p.First == 0 }

// EgressRoute sends this node's Sources of a VIP to the egress node Via (of the VIP's family;
// invalid: the egress node has no address of it, and the Sources' connections out are refused).
type EgressRoute struct {
	VIP     netip.Addr
	Via     netip.Addr
	Sources []netip.Addr
}

func (c EgressConfig) empty() bool { return len(c.SNAT)+len(c.Route)+len(c.Steer) == 0 }

// has reports whether c does anything for VIPs of a family (IPv4 when is4): its nftables
// table of that family exists then.
func (c EgressConfig) has(is4 bool) bool {
	ours := func(a netip.Addr) bool { return a.Is4() == is4 }
	return slices.ContainsFunc(c.SNAT, func(s EgressSNAT) bool { return ours(s.VIP) }) ||
		slices.ContainsFunc(c.Route, func(r EgressRoute) bool { return ours(r.VIP) }) ||
		slices.ContainsFunc(c.Steer, func(r EgressSteer) bool { return ours(r.VIP) })
}

const (
	egressTable = "metalvip-egress"
	// egressRulePrio and egressRulePrio+1 are the priorities of the agent's ip rules: the
	// first sends cluster destinations to the main table, the second the rest to the VIP's.
	egressRulePrio = 7470
	// egressTableBase is the first of the routing tables (one per routed VIP).
	egressTableBase = 7473000
	egressTables    = 1000
)

// nlEgress is the EgressNet of a network namespace.
type nlEgress struct {
	mu      sync.Mutex
	nl      *netlink.Handle
	nftOpts []nftables.ConnOption
	closeNS func() error
	touched bool // Set has written something (or found something to remove)
	known   bool // applied is what the kernel holds (the last Set succeeded)
	applied EgressConfig
	tables  map[netip.Addr]int    // routed VIP -> its routing table
	base    map[netip.Addr]uint64 // flows counted by the rules replaced so far
	roles   map[netip.Addr]string // local pod -> what the rules do with it ("snat VIP", "via VIP X")
	forgets sync.WaitGroup        // conntrack deletions under way
}

var _ EgressNet = (*nlEgress)(nil)

// NewEgressNet returns the egress configuration of the agent's network namespace. It touches
// nothing until a Set has something to do.
func NewEgressNet() (EgressNet, error) {
	h, err := netlink.NewHandle()
	if err != nil {
		return nil, fmt.Errorf("netlink: %w", err)
	}
	return &nlEgress{nl: h, closeNS: func() error { return nil }, tables: map[netip.Addr]int{}, base: map[netip.Addr]uint64{}, roles: map[netip.Addr]string{}}, nil
}

// newEgressNetIn returns the egress configuration of the network namespace ns (for tests
// that run in the lab's namespaces).
func newEgressNetIn(ns netns.NsHandle) (*nlEgress, error) {
	h, opts, closeNS, err := handlesIn(ns)
	if err != nil {
		return nil, err
	}
	return &nlEgress{nl: h, nftOpts: opts, closeNS: closeNS, tables: map[netip.Addr]int{}, base: map[netip.Addr]uint64{}, roles: map[netip.Addr]string{}}, nil
}

func (e *nlEgress) Set(want EgressConfig) error {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.setLocked(want)
}

func (e *nlEgress) setLocked(want EgressConfig) error {
	// The agent sets the whole configuration at every decision (every liveness change): the
	// kernel is touched only when it differs from the last one applied.
	if e.known && reflect.DeepEqual(e.applied, want) {
		return nil
	}
	if want.empty() && !e.touched {
		// Nothing wanted and nothing written by this agent: clear what an earlier run left,
		// if anything, without needing NET_ADMIN when there is nothing.
		left, err := e.leftOver()
		if err != nil || !left {
			e.known, e.applied = err == nil, want
			return nil //nolint:nilerr // an agent without NET_ADMIN wrote nothing either
		}
	}
	e.touched = true
	// New routes and rules first, then the NAT table, then what is no longer wanted: a pod
	// that stops being routed (its node became the egress node) is source-NATed to the VIP
	// before its rules go, and one that starts being routed is routed before it stops being
	// NATed to the VIP. It never leaves as itself.
	rules, err := e.addRouting(want)
	err = errors.Join(err, e.setNAT(want), e.removeRouting(rules))
	e.forgetMoved(want)
	e.known, e.applied = err == nil, want
	return err
}

// forgetMoved deletes, in the background, the conntrack entries of the pods whose part
// changed (this node became the egress node of their VIP, stopped being it, or the egress node
// moved): netfilter keeps the NAT an entry got, so a connection under way (a SYN being sent
// again) would otherwise go on as before, and, routed no more, leave from the pod's own
// address. Such connections break; new ones take the new path. A pod whose VIP stops egress
// altogether keeps its connections (they leave from the VIP, which its node still answers).
func (e *nlEgress) forgetMoved(want EgressConfig) {
	roles := map[netip.Addr]string{}
	for _, s := range want.SNAT {
		for _, src := range s.Sources {
			roles[src] = "snat " + s.VIP.String()
		}
	}
	for _, r := range want.Route {
		for _, src := range r.Sources {
			roles[src] = "via " + r.VIP.String() + " " + r.Via.String()
		}
	}
	moved := map[string]bool{}
	families := map[netlink.InetFamily]bool{}
	for src, role := range roles {
		if old, ok := e.roles[src]; ok && old != role {
			moved[src.String()] = true
			families[familyOf(src)] = true
		}
	}
	e.roles = roles
	if len(moved) == 0 {
		return
	}
	cluster := slices.Clone(want.Cluster)
	e.forgets.Add(1)
	go func() {
		defer e.forgets.Done()
		var n uint
		for _, f := range []netlink.InetFamily{unix.AF_INET, unix.AF_INET6} {
			if !families[f] {
				continue
			}
			m, err := e.nl.ConntrackDeleteFilters(netlink.ConntrackTable, f, movedFlows{sources: moved, cluster: cluster})
			if err != nil {
				klog.ErrorS(err, "Egress: forgetting the connections of pods whose egress node changed", "pods", len(moved))
			}
			n += m
		}
		klog.V(2).InfoS("Egress: forgot the connections of pods whose egress node changed", "pods", len(moved), "connections", n)
	}()
}

// movedFlows matches the conntrack entries from sources to destinations outside cluster.
type movedFlows struct {
	sources map[string]bool
	cluster []netip.Prefix
}

func (m movedFlows) MatchConntrackFlow(f *netlink.ConntrackFlow) bool {
	if !m.sources[f.Forward.SrcIP.String()] {
		return false
	}
	dst, ok := netip.AddrFromSlice(f.Forward.DstIP)
	return ok && !slices.ContainsFunc(m.cluster, func(p netip.Prefix) bool { return p.Contains(dst.Unmap()) })
}

// leftOver reports whether the namespace holds egress rules (of an earlier run).
func (e *nlEgress) leftOver() (bool, error) {
	c, err := nftables.New(e.nftOpts...)
	if err != nil {
		return false, err
	}
	for _, f := range []nftables.TableFamily{nftables.TableFamilyIPv4, nftables.TableFamilyIPv6} {
		if _, err := c.ListTableOfFamily(egressTable, f); err == nil {
			return true, nil
		}
	}
	rules, err := e.ruleList()
	if err != nil {
		return false, err
	}
	return slices.ContainsFunc(rules, ours), nil
}

// ruleList lists the namespace's ip rules of both families.
func (e *nlEgress) ruleList() ([]netlink.Rule, error) {
	v4, err := e.nl.RuleList(netlink.FAMILY_V4)
	if err != nil {
		return nil, err
	}
	v6, err := e.nl.RuleList(netlink.FAMILY_V6)
	return append(v4, v6...), err
}

// familyOf is a's address family.
func familyOf(a netip.Addr) netlink.InetFamily {
	if a.Is4() {
		return unix.AF_INET
	}
	return unix.AF_INET6
}

// hostBits is the length of a host prefix of a's family.
func hostBits(a netip.Addr) int { return a.BitLen() }

// ipOf decodes an address the kernel lists (IPv4 as 4 bytes, whatever its slice).
func ipOf(ip net.IP) netip.Addr {
	if v4 := ip.To4(); v4 != nil {
		return netip.AddrFrom4([4]byte(v4))
	}
	a, _ := netip.AddrFromSlice(ip)
	return a
}

func ours(r netlink.Rule) bool {
	return r.Priority >= egressRulePrio && r.Priority <= egressRulePrio+2
}

func egressTableOf(t int) bool { return t >= egressTableBase && t < egressTableBase+egressTables }

// ruleKey is one of the agent's ip rules.
type ruleKey struct {
	prio  int
	src   netip.Addr
	dst   netip.Prefix
	table int
	proto uint8     // with dport: a steering rule's
	dport PortRange // (none: zero)
}

// wantRouting is the policy routing of want, to be removed when no longer wanted.
type wantRouting struct {
	rules  map[ruleKey]bool
	tables map[int]bool
}

// addRouting adds the routes and rules of want (removeRouting takes out the others).
func (e *nlEgress) addRouting(want EgressConfig) (wantRouting, error) {
	var errs []error
	// A table per routed or steered VIP (default via its egress node), kept for as long as the
	// VIP is routed or steered.
	via := map[netip.Addr]netip.Addr{}
	for _, r := range want.Route {
		via[r.VIP] = r.Via
	}
	for _, r := range want.Steer {
		if _, ok := via[r.VIP]; !ok {
			via[r.VIP] = r.Via
		}
	}
	for vip := range e.tables {
		if _, ok := via[vip]; !ok {
			delete(e.tables, vip)
		}
	}
	used := map[int]bool{}
	for _, t := range e.tables {
		used[t] = true
	}
	wantRules := map[ruleKey]bool{}
	wantTables := map[int]bool{}
	tableOf := map[netip.Addr]int{}
	for _, vip := range slices.SortedFunc(maps.Keys(via), netip.Addr.Compare) {
		t, ok := e.tables[vip]
		if !ok {
			for t = egressTableBase; used[t] && t < egressTableBase+egressTables; t++ {
			}
			if used[t] || !egressTableOf(t) {
				errs = append(errs, fmt.Errorf("egress %s: no routing table left", vip))
				continue
			}
			e.tables[vip], used[t] = t, true
		}
		unspec := netip.IPv4Unspecified()
		if vip.Is6() {
			unspec = netip.IPv6Unspecified()
		}
		route := &netlink.Route{Table: t, Family: int(familyOf(vip)), Dst: &net.IPNet{IP: unspec.AsSlice(), Mask: net.CIDRMask(0, hostBits(unspec))}}
		if gw := via[vip]; gw.IsValid() {
			route.Gw = gw.AsSlice()
		} else {
			route.Type = unix.RTN_UNREACHABLE // refused, not sent from the pod's own address
		}
		if err := e.nl.RouteReplace(route); err != nil {
			errs = append(errs, fmt.Errorf("egress %s: route via %s in table %d: %w", vip, via[vip], t, err))
			continue
		}
		wantTables[t], tableOf[vip] = true, t
	}
	for _, r := range want.Route {
		t, ok := tableOf[r.VIP]
		if !ok {
			continue
		}
		for _, src := range r.Sources {
			for _, c := range want.Cluster {
				if c.Addr().Is4() == src.Is4() {
					wantRules[ruleKey{prio: egressRulePrio, src: src, dst: c, table: unix.RT_TABLE_MAIN}] = true
				}
			}
			wantRules[ruleKey{prio: egressRulePrio + 1, src: src, table: t}] = true
		}
	}
	for _, r := range want.Steer {
		t, ok := tableOf[r.VIP]
		if !ok {
			continue
		}
		for _, proto := range []uint8{unix.IPPROTO_TCP, unix.IPPROTO_UDP} {
			wantRules[ruleKey{prio: egressRulePrio + 2, dst: netip.PrefixFrom(r.VIP, r.VIP.BitLen()), table: t, proto: proto, dport: r.Ports}] = true
		}
	}
	w := wantRouting{rules: wantRules, tables: wantTables}
	have, err := e.ruleList()
	if err != nil {
		return w, errors.Join(append(errs, fmt.Errorf("egress: list rules: %w", err))...)
	}
	present := map[ruleKey]bool{}
	for _, r := range have {
		if ours(r) {
			present[ruleKeyOf(r)] = true
		}
	}
	for _, k := range slices.SortedFunc(maps.Keys(wantRules), func(a, b ruleKey) int { return a.prio - b.prio }) {
		if present[k] {
			continue
		}
		r := netlink.NewRule()
		r.Priority, r.Table = k.prio, k.table
		fam := k.src
		if !fam.IsValid() {
			fam = k.dst.Addr()
		}
		r.Family = int(familyOf(fam))
		if k.src.IsValid() {
			r.Src = &net.IPNet{IP: k.src.AsSlice(), Mask: net.CIDRMask(hostBits(k.src), hostBits(k.src))}
		}
		if k.dst.IsValid() {
			r.Dst = &net.IPNet{IP: k.dst.Addr().AsSlice(), Mask: net.CIDRMask(k.dst.Bits(), hostBits(fam))}
		}
		if k.proto != 0 {
			r.IPProto = int(k.proto)
			r.Dport = netlink.NewRulePortRange(k.dport.First, k.dport.Last)
		}
		if err := e.nl.RuleAdd(r); err != nil && !errors.Is(err, unix.EEXIST) {
			errs = append(errs, fmt.Errorf("egress: ip rule %+v: %w", k, err))
		}
	}
	return w, errors.Join(errs...)
}

// ruleKeyOf is the key of a rule the kernel lists.
func ruleKeyOf(r netlink.Rule) ruleKey {
	k := ruleKey{prio: r.Priority, table: r.Table, proto: uint8(r.IPProto)}
	if r.Src != nil {
		k.src = ipOf(r.Src.IP)
	}
	if r.Dst != nil {
		ones, _ := r.Dst.Mask.Size()
		k.dst = netip.PrefixFrom(ipOf(r.Dst.IP), ones)
	}
	if r.Dport != nil {
		k.dport = PortRange{First: r.Dport.Start, Last: r.Dport.End}
	}
	return k
}

// removeRouting removes the agent's rules and routes that w does not hold.
func (e *nlEgress) removeRouting(w wantRouting) error {
	var errs []error
	have, err := e.ruleList()
	if err != nil {
		return fmt.Errorf("egress: list rules: %w", err)
	}
	for _, r := range have {
		if ours(r) && !w.rules[ruleKeyOf(r)] {
			if err := e.nl.RuleDel(&r); err != nil && !errors.Is(err, unix.ENOENT) {
				errs = append(errs, fmt.Errorf("egress: delete ip rule %s: %w", r.String(), err))
			}
		}
	}
	routes, err := e.nl.RouteListFiltered(netlink.FAMILY_V4, &netlink.Route{Table: unix.RT_TABLE_UNSPEC}, netlink.RT_FILTER_TABLE)
	if err != nil {
		return errors.Join(append(errs, fmt.Errorf("egress: list routes: %w", err))...)
	}
	v6, err := e.nl.RouteListFiltered(netlink.FAMILY_V6, &netlink.Route{Table: unix.RT_TABLE_UNSPEC}, netlink.RT_FILTER_TABLE)
	if err != nil {
		return errors.Join(append(errs, fmt.Errorf("egress: list routes: %w", err))...)
	}
	routes = append(routes, v6...)
	for _, r := range routes {
		if egressTableOf(r.Table) && !w.tables[r.Table] {
			if err := e.nl.RouteDel(&r); err != nil && !errors.Is(err, unix.ESRCH) {
				errs = append(errs, fmt.Errorf("egress: delete route in table %d: %w", r.Table, err))
			}
		}
	}
	return errors.Join(errs...)
}

func egressNATTable(f nftables.TableFamily) *nftables.Table {
	return &nftables.Table{Family: f, Name: egressTable}
}

// natFamily is how the NAT rules of an address family read a packet.
type natFamily struct {
	table      nftables.TableFamily
	proto      uint32 // the NAT expression's family
	is4        bool
	saddr, dad uint32 // offsets of the source and destination in the network header
	len        uint32
}

var natFamilies = []natFamily{
	{table: nftables.TableFamilyIPv4, proto: unix.NFPROTO_IPV4, is4: true, saddr: 12, dad: 16, len: 4},
	{table: nftables.TableFamilyIPv6, proto: unix.NFPROTO_IPV6, saddr: 8, dad: 24, len: 16},
}

// setNAT replaces the nftables tables (ip and ip6) whole, in one transaction, folding the
// counters of the rules it replaces into base first.
func (e *nlEgress) setNAT(want EgressConfig) error {
	c, err := nftables.New(e.nftOpts...)
	if err != nil {
		return fmt.Errorf("nftables: %w", err)
	}
	for vip, n := range e.counted(c) {
		e.base[vip] += n
	}
	for _, f := range natFamilies {
		e.addNAT(c, f, want)
	}
	if err := c.Flush(); err != nil {
		return fmt.Errorf("nftables: replace table %s: %w", egressTable, err)
	}
	return nil
}

// addNAT queues the replacement of one family's table: removed, and written again when want
// has anything of that family.
func (e *nlEgress) addNAT(c *nftables.Conn, f natFamily, want EgressConfig) {
	ours := func(a netip.Addr) bool { return a.Is4() == f.is4 }
	t := egressNATTable(f.table)
	c.AddTable(t)
	c.DelTable(t)
	if !want.has(f.is4) {
		return
	}
	c.AddTable(t)
	e.addSteer(c, t, f, want.Steer)
	prio := nftables.ChainPriority(*nftables.ChainPriorityNATSource - 10)
	ch := c.AddChain(&nftables.Chain{Name: "postrouting", Table: t, Type: nftables.ChainTypeNAT,
		Hooknum: nftables.ChainHookPostrouting, Priority: &prio})
	saddr := &expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: f.saddr, Len: f.len}
	for _, p := range want.Cluster {
		if !ours(p.Addr()) {
			continue
		}
		mask := net.CIDRMask(p.Bits(), int(f.len)*8)
		c.AddRule(&nftables.Rule{Table: t, Chain: ch, Exprs: []expr.Any{
			&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: f.dad, Len: f.len},
			&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: f.len, Mask: mask, Xor: make([]byte, f.len)},
			&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: p.Addr().AsSlice()},
			&expr.Verdict{Kind: expr.VerdictAccept},
		}})
	}
	for _, s := range want.SNAT {
		if !ours(s.VIP) {
			continue
		}
		for _, src := range s.Sources {
			if !s.Ports.empty() {
				// A BGP VIP: TCP and UDP get a source port in the reply range, which the
				// other announcers send on to this node.
				for _, proto := range []byte{unix.IPPROTO_TCP, unix.IPPROTO_UDP} {
					c.AddRule(&nftables.Rule{Table: t, Chain: ch, UserData: []byte(s.VIP.String()), Exprs: []expr.Any{
						saddr,
						&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: src.AsSlice()},
						&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: 2},
						&expr.Cmp{Op: expr.CmpOpEq, Register: 2, Data: []byte{proto}},
						&expr.Counter{},
						&expr.Immediate{Register: 1, Data: s.VIP.AsSlice()},
						&expr.Immediate{Register: 2, Data: binaryutil.BigEndian.PutUint16(s.Ports.First)},
						&expr.Immediate{Register: 3, Data: binaryutil.BigEndian.PutUint16(s.Ports.Last)},
						&expr.NAT{Type: expr.NATTypeSourceNAT, Family: f.proto, RegAddrMin: 1, RegProtoMin: 2, RegProtoMax: 3},
					}})
				}
			}
			c.AddRule(&nftables.Rule{Table: t, Chain: ch, UserData: []byte(s.VIP.String()), Exprs: []expr.Any{
				saddr,
				&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: src.AsSlice()},
				&expr.Counter{},
				&expr.Immediate{Register: 1, Data: s.VIP.AsSlice()},
				&expr.NAT{Type: expr.NATTypeSourceNAT, Family: f.proto, RegAddrMin: 1},
			}})
		}
	}
	for _, r := range want.Route {
		if !ours(r.VIP) {
			continue
		}
		for _, src := range r.Sources {
			// snat to ip saddr: a mapping of its own, so that no later chain masquerades it.
			c.AddRule(&nftables.Rule{Table: t, Chain: ch, Exprs: []expr.Any{
				saddr,
				&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: src.AsSlice()},
				&expr.NAT{Type: expr.NATTypeSourceNAT, Family: f.proto, RegAddrMin: 1},
			}})
		}
	}
}

// addSteer queues the prerouting chain of the VIPs this node steers replies of: the packets to
// the VIP's reply ports are not tracked here. This node sees a connection's replies only (its
// SYN left from the egress node), which conntrack would call invalid, and Kubernetes nodes drop
// invalid packets they forward (kube-proxy's KUBE-FORWARD); the egress node tracks them.
func (e *nlEgress) addSteer(c *nftables.Conn, t *nftables.Table, f natFamily, steer []EgressSteer) {
	var ch *nftables.Chain
	for _, r := range steer {
		if r.VIP.Is4() != f.is4 {
			continue
		}
		if ch == nil {
			ch = c.AddChain(&nftables.Chain{Name: "prerouting", Table: t, Type: nftables.ChainTypeFilter,
				Hooknum: nftables.ChainHookPrerouting, Priority: nftables.ChainPriorityRaw})
		}
		for _, proto := range []byte{unix.IPPROTO_TCP, unix.IPPROTO_UDP} {
			c.AddRule(&nftables.Rule{Table: t, Chain: ch, UserData: []byte("steer " + r.VIP.String()), Exprs: []expr.Any{
				&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: 1},
				&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{proto}},
				&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: f.dad, Len: f.len},
				&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: r.VIP.AsSlice()},
				&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseTransportHeader, Offset: 2, Len: 2},
				&expr.Range{Op: expr.CmpOpEq, Register: 1, FromData: binaryutil.BigEndian.PutUint16(r.Ports.First), ToData: binaryutil.BigEndian.PutUint16(r.Ports.Last)},
				&expr.Counter{},
				&expr.Notrack{},
			}})
		}
	}
}

// counted returns the counters of the tables' snat rules by VIP.
func (e *nlEgress) counted(c *nftables.Conn) map[netip.Addr]uint64 {
	out := map[netip.Addr]uint64{}
	for _, f := range natFamilies {
		t := egressNATTable(f.table)
		rules, err := c.GetRules(t, &nftables.Chain{Name: "postrouting", Table: t})
		if err != nil {
			continue
		}
		for _, r := range rules {
			vip, err := netip.ParseAddr(string(r.UserData))
			if err != nil {
				continue
			}
			for _, x := range r.Exprs {
				if ctr, ok := x.(*expr.Counter); ok {
					out[vip] += ctr.Packets
				}
			}
		}
	}
	return out
}

func (e *nlEgress) Flows() map[netip.Addr]uint64 {
	e.mu.Lock()
	defer e.mu.Unlock()
	out := maps.Clone(e.base)
	if !e.touched {
		return out
	}
	c, err := nftables.New(e.nftOpts...)
	if err != nil {
		return out
	}
	for vip, n := range e.counted(c) {
		out[vip] += n
	}
	return out
}

func (e *nlEgress) Check() error {
	e.mu.Lock()
	defer e.mu.Unlock()
	if !e.touched || (e.known && e.intact()) {
		return nil
	}
	klog.InfoS("Egress: the kernel lost some of the rules, or the last write failed: writing them again")
	e.known = false
	return e.setLocked(e.applied)
}

// intact reports whether the kernel holds the nftables tables and as many ip rules of the
// agent's as the applied configuration makes.
func (e *nlEgress) intact() bool {
	c, err := nftables.New(e.nftOpts...)
	if err != nil {
		return false
	}
	rules := 0
	for _, f := range natFamilies {
		if _, err := c.ListTableOfFamily(egressTable, f.table); (err == nil) != e.applied.has(f.is4) {
			return false
		}
	}
	for _, r := range e.applied.Route {
		for _, src := range r.Sources {
			rules++
			for _, p := range e.applied.Cluster {
				if p.Addr().Is4() == src.Is4() {
					rules++
				}
			}
		}
	}
	rules += 2 * len(e.applied.Steer)
	have, err := e.ruleList()
	if err != nil {
		return false
	}
	return len(slices.DeleteFunc(have, func(r netlink.Rule) bool { return !ours(r) })) == rules
}

func (e *nlEgress) Close() error {
	err := e.Set(EgressConfig{})
	e.forgets.Wait()
	e.nl.Close()
	return errors.Join(err, e.closeNS())
}
