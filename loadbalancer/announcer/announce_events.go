package announcer

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"

	v1 "k8s.io/api/core/v1"
	"k8s.io/klog/v2"

	"github.com/metalvip/metalvip/loadbalancer/desired"
	"github.com/metalvip/metalvip/loadbalancer/planner"
	"github.com/metalvip/metalvip/loadbalancer/report"
	agentv1 "github.com/metalvip/metalvip/proto/metalvip/agent/v1"
)

// refusalsChanged says whether what the agents said they refused may differ from what they
// said before. Every Apply answered reports its refusals, most often none after none: that is
// no change, and must not rebuild every node's state (after a node's death at 1,000 nodes the
// pushed agents' answers did so, 40% of the CCM's CPU, make bench-scale).
func (a *Announcer) refusalsChanged(ch map[string]refusal) bool {
	s := &a.loop
	for node, rf := range ch {
		if len(rf.items) > 0 || rf.whole != "" || len(s.refused[node]) > 0 || len(s.peerRefused[node]) > 0 || s.whole[node] != "" {
			return true
		}
	}
	return false
}

// refusedRound records what a node's agent refused.
func (a *Announcer) refusedRound(node string, rf refusal, r *round) {
	s := &a.loop
	prev := s.refused[node]
	next := map[netip.Addr]*agentv1.Refusal{}
	peers := map[string]*agentv1.Refusal{}
	for _, it := range rf.items {
		switch it.GetKind() {
		case agentv1.Refusal_KIND_ANNOUNCEMENT:
			if ip, err := netip.ParseAddr(it.GetKey()); err == nil {
				next[ip] = it
			}
		case agentv1.Refusal_KIND_BGP_PEER:
			peers[it.GetKey()] = it
		}
	}
	for ip := range prev {
		if _, still := next[ip]; !still {
			for _, k := range s.vipSvcs[ip] {
				r.conds[k] = true
			}
		}
	}
	for ip, it := range next {
		for _, k := range s.vipSvcs[ip] {
			r.conds[k] = true
			a.warnOnce("svc-refused/"+k+"/"+ip.String()+"/"+node, it.GetField()+it.GetReason(), func() {
				if svc := a.service(k); svc != nil {
					a.cfg.Recorder.Eventf(svc, v1.EventTypeWarning, report.ReasonAnnouncementRefused,
						"The agent on %s refused the announcement of %s: %s: %s", node, ip, it.GetField(), it.GetReason())
				}
			})
		}
	}
	s.refused[node] = next
	s.peerRefused[node] = peers
	if rf.whole != "" {
		s.whole[node] = rf.whole
		klog.ErrorS(nil, "Agent refused the whole state", "node", node, "reason", rf.whole)
	} else {
		delete(s.whole, node)
	}
}

// warnOnce runs emit unless the same warning (key, what) was the last given.
func (a *Announcer) warnOnce(key, what string, emit func()) {
	if a.loop.warned[key] == what {
		return
	}
	a.loop.warned[key] = what
	emit()
}

// moveEvents tells a VIP's Services when its primary moves, and when no node may announce it.
func (a *Announcer) moveEvents(ip netip.Addr, e planner.Entry, ok bool) {
	s := &a.loop
	svcs := s.vipSvcs[ip]
	if !ok {
		delete(s.primaries, ip)
		delete(s.noNode, ip)
		return
	}
	if len(e.Nodes) == 0 {
		if !s.noNode[ip] {
			s.noNode[ip] = true
			for _, k := range svcs {
				if svc := a.service(k); svc != nil {
					a.cfg.Recorder.Eventf(svc, v1.EventTypeWarning, report.ReasonNoEligibleNode,
						"No node may announce %s: none is eligible (the pool's node selector, nodes labelled %s, unreachable agents, or no ready local endpoint); see the pool's NodesEligible condition", ip, desired.LabelExcludeLB)
				}
			}
		}
		return
	}
	delete(s.noNode, ip)
	if e.Mode != planner.L2 {
		return
	}
	prev, next := s.primaries[ip], e.Primary()
	s.primaries[ip] = next
	if prev == "" || prev == next {
		return
	}
	why := "to keep the nodes balanced"
	if !slices.Contains(e.Nodes, prev) {
		why = prev + " may no longer announce it: excluded, its agent unreachable, or no local endpoint"
	}
	for _, k := range svcs {
		if svc := a.service(k); svc != nil {
			a.cfg.Recorder.Eventf(svc, v1.EventTypeNormal, report.ReasonMoved, "%s moved from %s to %s: %s", ip, prev, next, why)
		}
	}
}

// groupEvents says, once per change, when a Service's several addresses of one family share
// primary nodes (fewer eligible nodes than addresses), and when they no longer do.
func (a *Announcer) groupEvents(g string) {
	s := &a.loop
	ips := slices.Clone(s.groups[g])
	if len(ips) == 0 {
		delete(s.groupMsg, g)
		return
	}
	slices.SortFunc(ips, netip.Addr.Compare)
	byNode := map[string][]string{}
	var nodes []string
	for _, ip := range ips {
		e, _ := s.planner.Entry(ip)
		pr := e.Primary()
		if pr == "" {
			continue
		}
		if byNode[pr] == nil {
			nodes = append(nodes, pr)
		}
		byNode[pr] = append(byNode[pr], ip.String())
	}
	slices.Sort(nodes)
	var shared []string
	for _, n := range nodes {
		if len(byNode[n]) > 1 {
			shared = append(shared, strings.Join(byNode[n], " and ")+" on "+n)
		}
	}
	msg, reason, kind := "", "", v1.EventTypeNormal
	switch {
	case len(shared) > 0:
		reason, kind = report.ReasonVIPsShareNodes, v1.EventTypeWarning
		msg = fmt.Sprintf("%d addresses on %d nodes: fewer nodes are eligible than addresses, so some share a node (%s); they spread when more nodes become eligible", len(ips), len(nodes), strings.Join(shared, "; "))
	case s.groupMsg[g] != "":
		reason = report.ReasonVIPsSpread
		msg = fmt.Sprintf("%d addresses on %d distinct nodes", len(ips), len(nodes))
	}
	if msg == "" || s.groupMsg[g] == msg {
		return
	}
	if reason == report.ReasonVIPsSpread {
		delete(s.groupMsg, g)
	} else {
		s.groupMsg[g] = msg
	}
	if keys := s.vipSvcs[ips[0]]; len(keys) > 0 {
		if svc := a.service(keys[0]); svc != nil {
			a.cfg.Recorder.Eventf(svc, kind, reason, "%s", msg)
		}
	}
}

// tookOverEvent turns an agent's take-over into an Event on the Services of the VIP, when it
// is a failover: the planned first candidate beginning to answer a new VIP says nothing the
// Announced condition does not (and would cost a write per Service).
func (a *Announcer) tookOverEvent(t tookOver) {
	vip, err := netip.ParseAddr(t.ev.GetVip())
	if err != nil {
		return
	}
	if e, ok := a.loop.planner.Entry(vip); ok && (e.Mode != planner.L2 || e.Primary() == t.node || a.loop.vipPool[vip] != nil && a.loop.vipPool[vip].Announce.PerClient) {
		return
	}
	for _, k := range a.loop.vipSvcs[vip] {
		if svc := a.service(k); svc != nil {
			a.cfg.Recorder.Eventf(svc, v1.EventTypeNormal, report.ReasonTookOver, "Node %s answers for %s now: %s", t.node, vip, t.ev.GetDetail())
		}
	}
}
