package desired

import (
	"slices"
	"time"

	v1 "k8s.io/api/core/v1"

	"github.com/metalvip/metalvip/loadbalancer/planner"
)

// Drain says which nodes are being drained. A drained node takes no new VIP; for Delay after
// the drain began it keeps announcing what it announced (BGP: with GRACEFUL_SHUTDOWN, so that
// routers move traffic away first; L2: behind the new owner, which answers at once, while it
// keeps answering too: make-before-break), then it announces nothing.
type Drain struct {
	// Label marks a node as being drained when present; "" for none.
	Label string
	// OnCordon: a cordoned node (spec.unschedulable) is being drained too.
	OnCordon bool
	// Delay between the drain's start and the withdrawal.
	Delay time.Duration
}

// Draining reports whether n is being drained.
func (d Drain) Draining(n *v1.Node) bool {
	if d.OnCordon && n.Spec.Unschedulable {
		return true
	}
	if d.Label == "" {
		return false
	}
	_, ok := n.Labels[d.Label]
	return ok
}

// Linger returns entry e with the nodes that announced the VIP before (was, in the order
// given then) and are in their drain's delay (lingering reports it) added back at the end:
// for BGP every such node, for L2 the former primary alone (the one that answers), unless
// the VIP is answered per client or with a virtual MAC (one MAC on two ports would flap the
// switch). With externalTrafficPolicy Local a node lingers only while it still runs an
// endpoint. e itself is not changed.
func Linger(e planner.Entry, v planner.VIP, was []string, lingering func(node string) bool, perClient, virtualMAC bool) planner.Entry {
	if len(was) == 0 {
		return e
	}
	keep := func(n string) bool {
		return lingering(n) && !slices.Contains(e.Nodes, n) && (!v.Local || slices.Contains(v.EndpointNodes, n))
	}
	var add []string
	switch v.Mode {
	case planner.BGP:
		for _, n := range was {
			if keep(n) {
				add = append(add, n)
			}
		}
	case planner.L2:
		// The former primary was first, or (lingering already) last.
		if !perClient && !virtualMAC {
			if keep(was[0]) {
				add = append(add, was[0])
			} else if last := was[len(was)-1]; keep(last) {
				add = append(add, last)
			}
		}
	}
	if len(add) == 0 {
		return e
	}
	e.Nodes = append(slices.Clone(e.Nodes), add...)
	return e
}
