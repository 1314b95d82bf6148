package announcer

import (
	"context"
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"strings"

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

// egressRound decides whether the Services sharing ip get egress through it, marks the
// nodes whose states change, and remembers the Services' verdicts for their conditions.
func (a *Announcer) egressRound(ip netip.Addr, pool *pools.Pool, svcs []*v1.Service, r *round) {
	s := &a.loop
	old, had := s.egress[ip]
	var next egressVIP
	refused := desired.EgressRefusal(ip, pool, svcs, a.cfg.EgressClusterCIDRs)
	asked := false
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
		}
		if s.egressWhy[key] == nil {
			s.egressWhy[key] = map[netip.Addr]string{}
		}
		s.egressWhy[key][ip] = why
		r.conds[key] = true
	}
	if asked && refused == "" {
		next.sources = map[string][]string{}
		for _, svc := range svcs {
			sel := labels.SelectorFromSet(labels.Set{"kubernetes.io/service-name": svc.Name})
			es, _ := a.endpoints.EndpointSlices(svc.Namespace).List(sel)
			next.sources = desired.MergeSources(next.sources, desired.EgressSources(ip, es))
		}
	}
	if next.sources == nil {
		delete(s.egress, ip)
	} else {
		s.egress[ip] = next
	}
	if had == (next.sources != nil) && desired.SameSources(old.sources, next.sources) {
		return
	}
	for _, m := range []map[string][]string{old.sources, next.sources} {
		for n := range m {
			r.nodes[n] = true
		}
	}
	for _, n := range s.annNodes[ip] {
		r.nodes[n] = true // the candidates: one of them source-NATs
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
	if len(s.shown.addrs[key]) == 0 {
		delete(s.egressWhy, key) // no address: nothing to leave from
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
