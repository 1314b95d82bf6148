package announcer

import (
	"context"
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"strings"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	corev1ac "k8s.io/client-go/applyconfigurations/core/v1"
	"k8s.io/klog/v2"

	"github.com/metalvip/metalvip/loadbalancer/desired"
	"github.com/metalvip/metalvip/loadbalancer/pools"
	"github.com/metalvip/metalvip/loadbalancer/report"
	agentv1 "github.com/metalvip/metalvip/proto/metalvip/agent/v1"
)

// ConditionEgress is the Service condition that says whether its pods leave from its
// address, and from which node.
const ConditionEgress = "metalvip.io/Egress"

// egressVIP is an address whose Services' pods leave from it: their addresses by node.
type egressVIP struct {
	sources map[string][]string
}

// egressAsk is an address whose Services ask for egress and may have it, before the claim
// round settles which pods each address gets: its pods, its Services and when the oldest of
// them was created (the older claim keeps a pod two addresses ask for).
type egressAsk struct {
	sources  map[string][]string
	services []string
	since    time.Time
}

// egressRound decides whether the Services sharing ip may have egress through it and notes its
// pods for the claim round; it remembers the verdicts of those refused for their conditions.
func (a *Announcer) egressRound(ip netip.Addr, pool *pools.Pool, svcs []*v1.Service, r *round) {
	s := &a.loop
	refused := desired.EgressRefusal(ip, pool, svcs, a.cfg.EgressClusterCIDRs)
	asked := false
	var ask egressAsk
	for _, svc := range svcs {
		ok, problem := desired.EgressAsk(svc)
		key := desired.Key(svc)
		why := refused
		switch {
		case problem != "":
			why = problem
		case !ok:
			if m := s.egressWhy[key]; m != nil {
				delete(m, ip)
				if len(m) == 0 {
					delete(s.egressWhy, key)
				}
			}
			r.conds[key] = true
			continue
		case refused == "":
			asked = true
			ask.services = append(ask.services, key)
			if t := svc.CreationTimestamp.Time; ask.since.IsZero() || t.Before(ask.since) {
				ask.since = t
			}
			continue // the claim round says
		}
		if s.egressWhy[key] == nil {
			s.egressWhy[key] = map[netip.Addr]string{}
		}
		s.egressWhy[key][ip] = why
		r.conds[key] = true
	}
	if asked && refused == "" {
		ask.sources = map[string][]string{}
		for _, svc := range svcs {
			sel := labels.SelectorFromSet(labels.Set{"kubernetes.io/service-name": svc.Name})
			es, _ := a.endpoints.EndpointSlices(svc.Namespace).List(sel)
			ask.sources = desired.MergeSources(ask.sources, desired.EgressSources(ip, es))
		}
	}
	old, had := s.egressAsks[ip]
	if ask.sources == nil {
		delete(s.egressAsks, ip)
	} else {
		s.egressAsks[ip] = ask
	}
	if had != (ask.sources != nil) || !desired.SameSources(old.sources, ask.sources) ||
		!slices.Equal(old.services, ask.services) || !old.since.Equal(ask.since) {
		r.egress = true
	}
}

// egressClaimRound settles which addresses' pods leave from them: a pod two addresses ask for
// leaves from the one whose oldest Service is older (then the lower address); the other is
// refused whole, naming the pod (a pod leaves from one address). It marks the nodes whose
// states change and the Services whose conditions do.
func (a *Announcer) egressClaimRound(r *round) {
	if !r.egress {
		return
	}
	s := &a.loop
	ips := slices.Collect(maps.Keys(s.egressAsks))
	slices.SortFunc(ips, func(x, y netip.Addr) int {
		if c := s.egressAsks[x].since.Compare(s.egressAsks[y].since); c != 0 {
			return c
		}
		return x.Compare(y)
	})
	claimed := map[string]netip.Addr{} // pod address -> the address it leaves from
	next := map[netip.Addr]egressVIP{}
	for _, ip := range ips {
		ask := s.egressAsks[ip]
		why := ""
		for _, n := range slices.Sorted(maps.Keys(ask.sources)) {
			for _, src := range ask.sources[n] {
				if other, ok := claimed[src]; ok && why == "" {
					why = fmt.Sprintf("pod address %s (on %s) already leaves from %s (Services %s, which asked first): a pod leaves from one address",
						src, n, other, strings.Join(s.egressAsks[other].services, ", "))
				}
			}
		}
		if why == "" {
			for _, srcs := range ask.sources {
				for _, src := range srcs {
					claimed[src] = ip
				}
			}
			next[ip] = egressVIP{sources: ask.sources}
		}
		for _, key := range ask.services {
			if s.egressWhy[key] == nil {
				s.egressWhy[key] = map[netip.Addr]string{}
			}
			if was, ok := s.egressWhy[key][ip]; !ok || was != why {
				r.conds[key] = true
			}
			s.egressWhy[key][ip] = why
		}
	}
	for _, ip := range slices.Collect(maps.Keys(s.egress)) {
		if _, ok := next[ip]; !ok {
			next[ip] = egressVIP{} // gone: its nodes are told below
		}
	}
	for ip, now := range next {
		old, had := s.egress[ip]
		if now.sources == nil {
			delete(s.egress, ip)
		} else {
			s.egress[ip] = now
		}
		if had == (now.sources != nil) && desired.SameSources(old.sources, now.sources) {
			continue
		}
		for _, m := range []map[string][]string{old.sources, now.sources} {
			for n := range m {
				r.nodes[n] = true
			}
		}
		for _, n := range s.annNodes[ip] {
			r.nodes[n] = true // the candidates: one of them source-NATs
		}
		for _, key := range s.shown.services[ip] {
			r.conds[key] = true
		}
		if had != (now.sources != nil) && s.anns[ip].GetBgp() != nil {
			r.entry[ip] = true // its announcers' heartbeat peers change (egressPeers)
		}
	}
}

// egressOf returns the egress items of a node's state: every egress address it has pods of
// or is a candidate of.
func (a *Announcer) egressOf(node string) []*agentv1.Egress {
	s := &a.loop
	var out []*agentv1.Egress
	for _, ip := range slices.SortedFunc(maps.Keys(s.egress), netip.Addr.Compare) {
		eg := s.egress[ip]
		an := s.anns[ip]
		cands := an.GetL2().GetCandidates()
		if an.GetBgp() != nil {
			for _, n := range a.egressNodes(ip) {
				c := &agentv1.Candidate{Node: n}
				if addr := s.addrOf(n); addr.IsValid() {
					c.Address = addr.String()
				}
				cands = append(cands, c)
			}
		}
		candidate := slices.ContainsFunc(cands, func(c *agentv1.Candidate) bool { return c.GetNode() == node })
		if len(cands) == 0 || (!candidate && len(eg.sources[node]) == 0) {
			continue
		}
		item := &agentv1.Egress{Vip: ip.String(), Candidates: cands, Sources: eg.sources[node], Services: an.GetServices()}
		if an.GetBgp() != nil {
			item.ReplyPorts = &agentv1.PortRange{First: uint32(desired.EgressReplyPorts[0]), Last: uint32(desired.EgressReplyPorts[1])}
		}
		if ip.Is6() {
			// The candidates' addresses are their IPv4 data-plane addresses: the pods' IPv6
			// connections are routed to their IPv6 InternalIPs.
			for _, c := range cands {
				gw := ""
				if a, ok := s.addrs6[c.GetNode()]; ok {
					gw = a.String()
				}
				item.Gateways = append(item.Gateways, gw)
			}
		}
		for _, p := range a.cfg.EgressClusterCIDRs {
			item.ClusterCidrs = append(item.ClusterCidrs, p.String())
		}
		if candidate {
			for _, n := range slices.Sorted(maps.Keys(eg.sources)) {
				if n != node {
					item.RemoteSources = append(item.RemoteSources, eg.sources[n]...)
				}
			}
			slices.Sort(item.RemoteSources)
		}
		out = append(out, item)
	}
	return out
}

// egressNodes are the nodes an egress address's egress node is chosen from, in order: an L2
// address's candidates, a BGP address's announcers ranked by desired.EgressOrder.
func (a *Announcer) egressNodes(ip netip.Addr) []string {
	s := &a.loop
	if s.anns[ip].GetBgp() != nil {
		return desired.EgressOrder(ip, s.annNodes[ip])
	}
	return s.annNodes[ip]
}

// egressCondition is a Service's Egress condition: for each of its addresses, from which
// node its pods leave, or why not; asks is false when the Service does not ask for egress
// (the condition goes).
func (a *Announcer) egressCondition(svc *v1.Service) (c metav1.Condition, refused string, asks bool) {
	s := &a.loop
	key := desired.Key(svc)
	whys := s.egressWhy[key]
	if len(whys) == 0 {
		return c, "", false
	}
	c = metav1.Condition{Type: ConditionEgress, ObservedGeneration: svc.Generation}
	var parts, no []string
	for _, ip := range slices.SortedFunc(maps.Keys(whys), netip.Addr.Compare) {
		if why := whys[ip]; why != "" {
			no = append(no, why)
			parts = append(parts, fmt.Sprintf("%s: refused: %s", ip, why))
			continue
		}
		eg := s.egress[ip]
		nodes := a.egressNodes(ip)
		if len(nodes) == 0 {
			parts = append(parts, fmt.Sprintf("%s: no eligible node", ip))
			continue
		}
		who := nodes[0]
		if len(nodes) > 1 {
			who += " (standby " + strings.Join(nodes[1:], ", ") + ")"
		}
		if ip.Is6() {
			var none []string
			for _, n := range nodes {
				if _, ok := s.addrs6[n]; !ok {
					none = append(none, n)
				}
			}
			if len(none) > 0 {
				who += fmt.Sprintf("; %s, without an IPv6 InternalIP, cannot be reached as egress node: while one of them is, pods on other nodes cannot connect out", strings.Join(none, ", "))
			}
		}
		pods := 0
		for _, srcs := range eg.sources {
			pods += len(srcs)
		}
		parts = append(parts, fmt.Sprintf("%s: %d pod addresses leave from egress node %s", ip, pods, who))
	}
	c.Status, c.Reason, c.Message = metav1.ConditionTrue, "EgressNode", strings.Join(parts, "; ")
	if len(no) == len(whys) {
		c.Status, c.Reason = metav1.ConditionFalse, "EgressRefused"
	}
	return c, strings.Join(no, "; "), true
}

// egressStatus warns once per refusal with an Event and sets the Service's Egress condition
// when it changed; a Service that stopped asking loses it.
func (a *Announcer) egressStatus(key string) {
	s := &a.loop
	svc := a.service(key)
	if svc == nil {
		delete(s.egressSaid, key)
		delete(s.egressWhy, key)
		a.tell.forget("egress/" + key)
		return
	}
	for ip := range s.egressWhy[key] {
		if !slices.Contains(s.shown.addrs[key], ip) {
			delete(s.egressWhy[key], ip) // an address it shows no more: nothing to leave from
		}
	}
	if len(s.egressWhy[key]) == 0 {
		delete(s.egressWhy, key)
	}
	c, refused, asks := a.egressCondition(svc)
	if refused != "" {
		a.warnOnce("egress/"+key, refused, func() {
			klog.V(2).InfoS("Egress refused", "service", key, "reason", refused)
			a.cfg.Recorder.Eventf(svc, v1.EventTypeWarning, report.ReasonEgressRefused, "egress through the Service's address refused: %s; its pods leave as before", refused)
		})
	} else {
		a.tell.forget("egress/" + key)
	}
	c.Type = ConditionEgress
	a.ownCondition(svc, s.egressSaid, c, asks, report.ManagerEgress)
}

// ownCondition applies a Service condition that a field manager of its own owns (c.Type),
// when it changed since said[the Service] (its text form); present false removes it.
func (a *Announcer) ownCondition(svc *v1.Service, said map[string]string, c metav1.Condition, present bool, manager string) {
	key := desired.Key(svc)
	text := string(c.Status) + "|" + c.Reason + "|" + c.Message + "|" + fmt.Sprint(c.ObservedGeneration)
	if said[key] == text {
		return
	}
	said[key] = text
	cur := meta.FindStatusCondition(svc.Status.Conditions, c.Type)
	if !present && cur == nil {
		return
	}
	st := corev1ac.ServiceStatus() // not present: the condition goes
	if present {
		var shown bool
		if st, shown = report.ServiceCondition(cur, c); shown {
			return
		}
	}
	ns, name := svc.Namespace, svc.Name
	ac := corev1ac.Service(name, ns).WithStatus(st)
	a.writer.Set(manager+"/"+key, func(ctx context.Context) error {
		_, err := a.cfg.Client.CoreV1().Services(ns).ApplyStatus(ctx, ac, metav1.ApplyOptions{FieldManager: manager, Force: true})
		return err
	})
}
