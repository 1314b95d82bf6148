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
//	table ip metalvip-egress {
//	  chain postrouting { type nat hook postrouting priority srcnat - 10;
//	    ip daddr CLUSTER accept                      # one per cluster CIDR: never NATed here
//	    ip saddr POD counter snat to VIP             # on the egress node, every pod of the VIP
//	    ip saddr POD snat to ip saddr                # elsewhere: leaves as itself
//	  }
//	}
//	ip rule add prio 7470 from POD to CLUSTER lookup main   # each local pod, each cluster CIDR
//	ip rule add prio 7471 from POD lookup T                  # T: default via the egress node
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
}

// EgressSNAT is a VIP this node source-NATs the connections of Sources to.
type EgressSNAT struct {
	VIP     netip.Addr
	Sources []netip.Addr
}

// EgressRoute sends this node's Sources of a VIP to the egress node Via.
type EgressRoute struct {
	VIP     netip.Addr
	Via     netip.Addr
	Sources []netip.Addr
}

func (c EgressConfig) empty() bool { return len(c.SNAT)+len(c.Route) == 0 }

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
	for src, role := range roles {
		if old, ok := e.roles[src]; ok && old != role {
			moved[src.String()] = true
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
		n, err := e.nl.ConntrackDeleteFilters(netlink.ConntrackTable, unix.AF_INET, movedFlows{sources: moved, cluster: cluster})
		if err != nil {
			klog.ErrorS(err, "Egress: forgetting the connections of pods whose egress node changed", "pods", len(moved))
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
	if _, err := c.ListTableOfFamily(egressTable, nftables.TableFamilyIPv4); err == nil {
		return true, nil
	}
	rules, err := e.nl.RuleList(netlink.FAMILY_V4)
	if err != nil {
		return false, err
	}
	return slices.ContainsFunc(rules, ours), nil
}

func ours(r netlink.Rule) bool {
	return r.Priority == egressRulePrio || r.Priority == egressRulePrio+1
}

func egressTableOf(t int) bool { return t >= egressTableBase && t < egressTableBase+egressTables }

// ruleKey is one of the agent's ip rules.
type ruleKey struct {
	prio  int
	src   netip.Addr
	dst   netip.Prefix
	table int
}

// wantRouting is the policy routing of want, to be removed when no longer wanted.
type wantRouting struct {
	rules  map[ruleKey]bool
	tables map[int]bool
}

// addRouting adds the routes and rules of want (removeRouting takes out the others).
func (e *nlEgress) addRouting(want EgressConfig) (wantRouting, error) {
	var errs []error
	// A table per routed VIP, kept for as long as the VIP is routed.
	routed := map[netip.Addr]bool{}
	for _, r := range want.Route {
		routed[r.VIP] = true
	}
	for vip := range e.tables {
		if !routed[vip] {
			delete(e.tables, vip)
		}
	}
	used := map[int]bool{}
	for _, t := range e.tables {
		used[t] = true
	}
	wantRules := map[ruleKey]bool{}
	wantTables := map[int]bool{}
	for _, r := range want.Route {
		t, ok := e.tables[r.VIP]
		if !ok {
			for t = egressTableBase; used[t] && t < egressTableBase+egressTables; t++ {
			}
			if used[t] || !egressTableOf(t) {
				errs = append(errs, fmt.Errorf("egress %s: no routing table left", r.VIP))
				continue
			}
			e.tables[r.VIP], used[t] = t, true
		}
		route := &netlink.Route{Table: t, Dst: &net.IPNet{IP: net.IPv4zero.To4(), Mask: net.CIDRMask(0, 32)}, Gw: r.Via.AsSlice()}
		if err := e.nl.RouteReplace(route); err != nil {
			errs = append(errs, fmt.Errorf("egress %s: route via %s in table %d: %w", r.VIP, r.Via, t, err))
			continue
		}
		wantTables[t] = true
		for _, src := range r.Sources {
			for _, c := range want.Cluster {
				if c.Addr().Is4() {
					wantRules[ruleKey{egressRulePrio, src, c, unix.RT_TABLE_MAIN}] = true
				}
			}
			wantRules[ruleKey{egressRulePrio + 1, src, netip.Prefix{}, t}] = true
		}
	}
	w := wantRouting{rules: wantRules, tables: wantTables}
	have, err := e.nl.RuleList(netlink.FAMILY_V4)
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
		r.Priority, r.Table, r.Family = k.prio, k.table, unix.AF_INET
		r.Src = &net.IPNet{IP: k.src.AsSlice(), Mask: net.CIDRMask(32, 32)}
		if k.dst.IsValid() {
			r.Dst = &net.IPNet{IP: k.dst.Addr().AsSlice(), Mask: net.CIDRMask(k.dst.Bits(), 32)}
		}
		if err := e.nl.RuleAdd(r); err != nil && !errors.Is(err, unix.EEXIST) {
			errs = append(errs, fmt.Errorf("egress: ip rule from %s: %w", k.src, err))
		}
	}
	return w, errors.Join(errs...)
}

// ruleKeyOf is the key of a rule the kernel lists.
func ruleKeyOf(r netlink.Rule) ruleKey {
	k := ruleKey{prio: r.Priority, table: r.Table}
	if r.Src != nil {
		k.src, _ = netip.AddrFromSlice(r.Src.IP.To4())
	}
	if r.Dst != nil {
		a, _ := netip.AddrFromSlice(r.Dst.IP.To4())
		ones, _ := r.Dst.Mask.Size()
		k.dst = netip.PrefixFrom(a, ones)
	}
	return k
}

// removeRouting removes the agent's rules and routes that w does not hold.
func (e *nlEgress) removeRouting(w wantRouting) error {
	var errs []error
	have, err := e.nl.RuleList(netlink.FAMILY_V4)
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
	for _, r := range routes {
		if egressTableOf(r.Table) && !w.tables[r.Table] {
			if err := e.nl.RouteDel(&r); err != nil && !errors.Is(err, unix.ESRCH) {
				errs = append(errs, fmt.Errorf("egress: delete route in table %d: %w", r.Table, err))
			}
		}
	}
	return errors.Join(errs...)
}

func egressNATTable() *nftables.Table {
	return &nftables.Table{Family: nftables.TableFamilyIPv4, Name: egressTable}
}

// setNAT replaces the nftables table whole, in one transaction, folding the counters of the
// rules it replaces into base first.
func (e *nlEgress) setNAT(want EgressConfig) error {
	c, err := nftables.New(e.nftOpts...)
	if err != nil {
		return fmt.Errorf("nftables: %w", err)
	}
	for vip, n := range e.counted(c) {
		e.base[vip] += n
	}
	t := egressNATTable()
	c.AddTable(t)
	c.DelTable(t)
	if !want.empty() {
		c.AddTable(t)
		prio := nftables.ChainPriority(*nftables.ChainPriorityNATSource - 10)
		ch := c.AddChain(&nftables.Chain{Name: "postrouting", Table: t, Type: nftables.ChainTypeNAT,
			Hooknum: nftables.ChainHookPostrouting, Priority: &prio})
		for _, p := range want.Cluster {
			if !p.Addr().Is4() {
				continue
			}
			mask := net.CIDRMask(p.Bits(), 32)
			c.AddRule(&nftables.Rule{Table: t, Chain: ch, Exprs: []expr.Any{
				&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: 16, Len: 4},
				&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4, Mask: mask, Xor: []byte{0, 0, 0, 0}},
				&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: p.Addr().AsSlice()},
				&expr.Verdict{Kind: expr.VerdictAccept},
			}})
		}
		for _, s := range want.SNAT {
			for _, src := range s.Sources {
				c.AddRule(&nftables.Rule{Table: t, Chain: ch, UserData: []byte(s.VIP.String()), Exprs: []expr.Any{
					&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: 12, Len: 4},
					&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: src.AsSlice()},
					&expr.Counter{},
					&expr.Immediate{Register: 1, Data: s.VIP.AsSlice()},
					&expr.NAT{Type: expr.NATTypeSourceNAT, Family: unix.NFPROTO_IPV4, RegAddrMin: 1},
				}})
			}
		}
		for _, r := range want.Route {
			for _, src := range r.Sources {
				// snat to ip saddr: a mapping of its own, so that no later chain masquerades it.
				c.AddRule(&nftables.Rule{Table: t, Chain: ch, Exprs: []expr.Any{
					&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: 12, Len: 4},
					&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: src.AsSlice()},
					&expr.NAT{Type: expr.NATTypeSourceNAT, Family: unix.NFPROTO_IPV4, RegAddrMin: 1},
				}})
			}
		}
	}
	if err := c.Flush(); err != nil {
		return fmt.Errorf("nftables: replace table ip %s: %w", egressTable, err)
	}
	return nil
}

// counted returns the counters of the table's snat rules by VIP.
func (e *nlEgress) counted(c *nftables.Conn) map[netip.Addr]uint64 {
	out := map[netip.Addr]uint64{}
	rules, err := c.GetRules(egressNATTable(), &nftables.Chain{Name: "postrouting", Table: egressNATTable()})
	if err != nil {
		return out
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

func (e *nlEgress) Close() error {
	err := e.Set(EgressConfig{})
	e.forgets.Wait()
	e.nl.Close()
	return errors.Join(err, e.closeNS())
}
