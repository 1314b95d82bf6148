package nodeagent

import (
	"fmt"
	"net"
	"net/netip"
	"slices"
	"time"

	"k8s.io/klog/v2"

	"github.com/metalvip/metalvip/nodeagent/l2"
	agentv1 "github.com/metalvip/metalvip/proto/metalvip/agent/v1"
)

// setL2Locked gives the speaker vips, with the node receiving every virtual MAC it answers
// with from before the speaker first sends from it until after it last has: a takeover's
// first frame from the MAC finds the node receiving, and a release has stopped answering (the
// heartbeats' ordered hand-over then lets the next owner start) before frames stop arriving.
// A virtual MAC the node cannot receive is answered with the interface's own MAC meanwhile:
// clients that heed gratuitous ARP still reach the VIP, and l2Problems says why. The caller
// holds mu.
func (a *Agent) setL2Locked(vips []l2.VIP) {
	var problems []string
	want := macsOf(vips)
	if len(want)+len(a.macs) > 0 {
		defer func(start time.Time, before int) {
			klog.V(2).InfoS("Set the speaker and the virtual MACs", "vips", len(vips), "macsBefore", before, "macs", countMACs(a.macs), "took", time.Since(start))
		}(time.Now(), countMACs(a.macs))
	}
	if err := a.opts.MACFilter.Set(unionMACs(a.macs, want)); err != nil {
		problems = append(problems, fmt.Sprintf("virtual MACs: %v; answering with the interfaces' own MACs until the node can receive them", err))
		vips, want = withoutMACs(vips), nil
	}
	if a.opts.L2 != nil {
		if err := a.opts.L2.Set(vips); err != nil {
			problems = append(problems, "L2: "+err.Error())
		}
	}
	if err := a.opts.MACFilter.Set(want); err != nil && len(problems) == 0 {
		problems = append(problems, fmt.Sprintf("virtual MACs: %v", err))
	}
	a.macs, a.l2Problems = want, problems
}

// macsOf returns the virtual MACs of vips by interface.
func macsOf(vips []l2.VIP) map[string][]net.HardwareAddr {
	out := map[string][]net.HardwareAddr{}
	for _, v := range vips {
		if v.MAC == nil {
			continue
		}
		for _, ifname := range v.Interfaces {
			out[ifname] = append(out[ifname], v.MAC)
		}
	}
	return out
}

func countMACs(m map[string][]net.HardwareAddr) int {
	n := 0
	for _, macs := range m {
		n += len(macs)
	}
	return n
}

func unionMACs(x, y map[string][]net.HardwareAddr) map[string][]net.HardwareAddr {
	out := map[string][]net.HardwareAddr{}
	for _, m := range []map[string][]net.HardwareAddr{x, y} {
		for ifname, macs := range m {
			out[ifname] = append(out[ifname], macs...)
		}
	}
	return out
}

func withoutMACs(vips []l2.VIP) []l2.VIP {
	out := slices.Clone(vips)
	for i := range out {
		out[i].MAC = nil
	}
	return out
}

// emitChanges emits events for what changed hands on this node. The caller holds mu.
func (a *Agent) emitChanges(views map[netip.Addr]*agentv1.AnnouncedVIP) {
	// Takeovers after a death are logged at Info in one line, whatever their number: a node
	// that stood by for a thousand VIPs of a dead one would otherwise write a thousand lines
	// at once, the work of a flap (the agent's own heartbeats wait meanwhile).
	var failedOver []netip.Addr
	var reason string
	var soonest, latest time.Duration
	for vip, v := range views {
		old := a.views[vip]
		l2 := v.GetMode() != agentv1.Mode_MODE_BGP
		if v.Active && (old == nil || !old.Active) {
			a.emit(&agentv1.Event{Kind: agentv1.Event_KIND_TOOK_OVER, Vip: vip.String(), Detail: v.Reason})
			if l2 {
				var after time.Duration
				if t, ok := a.deadAhead[vip]; ok {
					after = time.Since(t)
				}
				a.opts.Observer.TookOver(vip, after)
				if after > 0 {
					failedOver, reason = append(failedOver, vip), v.Reason
					if soonest == 0 || after < soonest {
						soonest = after
					}
					latest = max(latest, after)
				}
				klog.V(2).InfoS("Answering for an L2 VIP", "vip", vip, "reason", v.Reason, "sinceOwnerLastHeard", after.Round(time.Millisecond))
			}
		}
		if !v.Active && old != nil && old.Active {
			a.emit(&agentv1.Event{Kind: agentv1.Event_KIND_RELEASED, Vip: vip.String(), Detail: v.Reason})
			if l2 {
				a.opts.Observer.Released(vip)
				klog.V(2).InfoS("No longer answering for an L2 VIP", "vip", vip, "reason", v.Reason)
			}
		}
	}
	switch n := len(failedOver); {
	case n == 1:
		klog.InfoS("Answering for an L2 VIP", "vip", failedOver[0], "reason", reason, "sinceOwnerLastHeard", soonest.Round(time.Millisecond))
	case n > 1:
		slices.SortFunc(failedOver, netip.Addr.Compare)
		klog.InfoS("Answering for L2 VIPs whose higher-ranked candidates are down", "count", n, "vips", failedOver[:min(n, 10)],
			"sinceOwnerLastHeard", soonest.Round(time.Millisecond), "upTo", latest.Round(time.Millisecond))
	}
	for vip, old := range a.views {
		if _, still := views[vip]; !still {
			delete(a.deadAhead, vip)
		}
		if _, still := views[vip]; !still && old.Active {
			a.emit(&agentv1.Event{Kind: agentv1.Event_KIND_RELEASED, Vip: vip.String(), Detail: "no longer announced"})
			if old.GetMode() != agentv1.Mode_MODE_BGP {
				a.opts.Observer.Released(vip)
			}
		}
	}
}

// decideL2 decides this node's part in an L2 VIP (ownership.go), writes it into view, and
// returns what the speaker should answer for, if anything. The caller holds mu.
func (a *Agent) decideL2(checked checkedAnnouncement, view *agentv1.AnnouncedVIP) (l2.VIP, bool) {
	vip, an := checked.vip, checked.GetL2()
	cands := make([]string, 0, len(an.GetCandidates()))
	for _, c := range an.GetCandidates() {
		cands = append(cands, c.GetNode())
	}
	var live LivenessFacts
	if a.live != nil {
		live = a.facts
	}
	d := decideL2(a.opts.Node, cands, an.GetPerClient(), live)
	if live != nil {
		a.noteHeardLocked(live)
		d = a.cautiousLocked(vip, cands, an, live, d)
	}
	// Make-before-break: a node being drained that answered the VIP keeps answering while it
	// stays a candidate (the CCM takes it off after the drain's delay), behind the new owner,
	// which answers and announces at once. It sends no gratuitous ARP meanwhile, which would
	// draw the clients back (a share of one member answers every client and announces none).
	lingers := !d.Active && a.state.GetDraining() && !an.GetPerClient() && an.GetVirtualMac() == "" &&
		slices.Contains(cands, a.opts.Node) && a.views[vip].GetActive()
	if lingers {
		d = l2Decision{Active: true, Reason: "draining: answers while " + cands[0] + " takes over (make-before-break), without gratuitous ARP"}
	}
	view.Active, view.Reason, view.Sharing = d.Active, d.Reason, d.Sharing
	delete(a.deadAhead, vip)
	if !d.Active {
		return l2.VIP{}, false
	}
	if live != nil {
		if t, ok := a.deadAheadLocked(cands, a.facts); ok {
			a.deadAhead[vip] = t
		}
	}
	v := l2.VIP{Addr: vip, Interfaces: view.Interfaces, Again: a.again[vip]}
	if an.GetPerClient() {
		v.Share = &l2.Share{Self: a.opts.Node, Members: d.Sharing}
	}
	if lingers {
		v.Share = &l2.Share{Self: a.opts.Node, Members: []string{a.opts.Node}}
	}
	if checked.mac != nil {
		v.MAC = checked.mac
		view.Reason += "; virtual MAC " + v.MAC.String()
	}
	return v, true
}

// cautiousLocked makes two corrections to a decision d for vip, both against two nodes
// answering at once while nodes hold states that do not agree (a node restarted from a saved
// state that its peers no longer share, a new plan reaching the nodes one after the other):
//   - for HearPeerTimeout after the start, while this node has heard none of its peers, a
//     peer counts as alive and not seeing this node (heardFacts);
//   - a VIP with a virtual MAC that this node stood by for, and that a new plan makes it
//     answer while the node it stood by for is alive, is answered after one detection time:
//     that node, told at about the same time, stops first. A takeover because that node died
//     is not held.
//
// The caller holds mu.
func (a *Agent) cautiousLocked(vip netip.Addr, cands []string, an *agentv1.L2Announcement, live LivenessFacts, d l2Decision) l2Decision {
	now := time.Now()
	until := a.started.Add(a.opts.HearPeerTimeout)
	if !a.heardAny && now.Before(until) {
		a.redecideLocked(until)
		isUnheard := func(n string) bool { return n != a.opts.Node }
		c := decideL2(a.opts.Node, cands, an.GetPerClient(), heardFacts{live, isUnheard})
		if d.Active && !c.Active {
			c.Reason = fmt.Sprintf("just started and hears none of its peers: waiting up to %s for them or the CCM, as their states may no longer name this node (%s)",
				until.Sub(now).Round(time.Second), c.Reason)
		}
		d = c
	}

	if !d.Active {
		delete(a.handover, vip)
		delete(a.standbyFor, vip)
		me := max(slices.Index(cands, a.opts.Node), 0)
		for _, c := range cands[:me] {
			if live.Alive(c) {
				a.standbyFor[vip] = c
				break
			}
		}
		return d
	}
	prev := a.standbyFor[vip]
	if an.GetVirtualMac() != "" && prev != "" && live.Alive(prev) {
		until, held := a.handover[vip]
		if !held {
			until = now.Add(a.detectionTime())
			a.handover[vip] = until
		}
		if now.Before(until) {
			a.redecideLocked(until)
			return l2Decision{Reason: fmt.Sprintf("the plan moved it here from %s, which is alive: answering in %s, once %s has stopped", prev, until.Sub(now).Round(time.Millisecond), prev)}
		}
	}
	delete(a.handover, vip)
	delete(a.standbyFor, vip)
	return d
}

// noteHeardLocked notes whether any candidate of this node's L2 VIPs has shown that it sees
// this node. The caller holds mu.
func (a *Agent) noteHeardLocked(live LivenessFacts) {
	if a.heardAny {
		return
	}
	for _, an := range a.checked.announcements {
		for _, c := range an.GetL2().GetCandidates() {
			if c.GetNode() != a.opts.Node && live.Sees(c.GetNode()) {
				a.heardAny = true
				return
			}
		}
	}
}

// detectionTime is how long the heartbeats take to find a node dead.
func (a *Agent) detectionTime() time.Duration {
	iv, misses := a.liveCfg.Interval, a.liveCfg.Misses
	if iv <= 0 {
		iv = 50 * time.Millisecond // failover.Config's defaults
	}
	if misses <= 0 {
		misses = 3
	}
	return time.Duration(misses) * iv
}

// redecideLocked makes L2 be decided again at the latest at at. The caller holds mu.
func (a *Agent) redecideLocked(at time.Time) {
	if a.redecide != nil && !a.redecideAt.IsZero() && !at.Before(a.redecideAt) && a.redecideAt.After(time.Now()) {
		return // an earlier one is due
	}
	a.redecideAt = at
	d := max(time.Until(at), time.Millisecond)
	if a.redecide == nil {
		a.redecide = time.AfterFunc(d, a.redecideL2)
		return
	}
	a.redecide.Reset(d)
}
