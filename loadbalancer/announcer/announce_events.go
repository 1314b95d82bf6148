package announcer

import (
	"net/netip"
	"slices"

	v1 "k8s.io/api/core/v1"
	"k8s.io/klog/v2"

	"github.com/metalvip/metalvip/loadbalancer/planner"
	"github.com/metalvip/metalvip/loadbalancer/report"
)

// refusedRound records what a node's agent refused, and rewrites the conditions of the
// Services of the addresses it refused before or refuses now; it warns once per refusal.
func (a *Announcer) refusedRound(node string, rf refusal, r *round) {
	s := &a.loop
	for _, ip := range a.refusals.record(node, rf) {
		it := a.refusals.vips[node][ip]
		for _, k := range s.shown.services[ip] {
			r.conds[k] = true
			if it == nil {
				continue
			}
			a.warnOnce("svc-refused/"+k+"/"+ip.String()+"/"+node, it.GetField()+it.GetReason(), func() {
				if svc := a.service(k); svc != nil {
					a.cfg.Recorder.Eventf(svc, v1.EventTypeWarning, report.ReasonAnnouncementRefused,
						"The agent on %s refused the announcement of %s: %s: %s", node, ip, it.GetField(), it.GetReason())
				}
			})
		}
	}
	if rf.whole != "" {
		klog.ErrorS(nil, "Agent refused the whole state", "node", node, "reason", rf.whole)
	}
}

// warnOnce runs emit unless the same warning (key, what) was the last given.
func (a *Announcer) warnOnce(key, what string, emit func()) { a.tell.once(key, what, emit) }

// servicesOf returns a lookup of the Services that show ip, made only when an Event is told.
func (a *Announcer) servicesOf(ip netip.Addr) func() []*v1.Service {
	return func() []*v1.Service {
		var out []*v1.Service
		for _, k := range a.loop.shown.services[ip] {
			if svc := a.service(k); svc != nil {
				out = append(out, svc)
			}
		}
		return out
	}
}

// moveEvents tells a VIP's Services when its primary moves, and when no node may announce it.
func (a *Announcer) moveEvents(ip netip.Addr, e planner.Entry, ok bool) {
	a.tell.placed(ip, e, ok, a.servicesOf(ip))
}

// groupEvents says, once per change, when a Service's several addresses of one family share
// primary nodes (fewer eligible nodes than addresses), and when they no longer do.
func (a *Announcer) groupEvents(g string) {
	s := &a.loop
	ips := slices.Clone(s.groups[g])
	slices.SortFunc(ips, netip.Addr.Compare)
	primaries := make([]string, len(ips))
	for i, ip := range ips {
		e, _ := s.planner.Entry(ip)
		primaries[i] = e.Primary()
	}
	var first func() []*v1.Service
	if len(ips) > 0 {
		first = a.servicesOf(ips[0])
	}
	a.tell.spread(g, ips, primaries, first)
}

// tookOverEvent turns an agent's take-over into an Event on the Services of the VIP, when it
// is a failover: the planned first candidate beginning to answer a new VIP says nothing the
// Announced condition does not (and would cost a write per Service).
func (a *Announcer) tookOverEvent(t tookOver) {
	vip, err := netip.ParseAddr(t.ev.GetVip())
	if err != nil {
		return
	}
	if e, ok := a.loop.planner.Entry(vip); ok && (e.Mode != planner.L2 || e.Primary() == t.node || a.loop.pools.of(vip) != nil && a.loop.pools.of(vip).Announce.PerClient) {
		return
	}
	for _, k := range a.loop.shown.services[vip] {
		if svc := a.service(k); svc != nil {
			a.cfg.Recorder.Eventf(svc, v1.EventTypeNormal, report.ReasonTookOver, "Node %s answers for %s now: %s", t.node, vip, t.ev.GetDetail())
		}
	}
}
