package nodeagent

import "github.com/metalvip/metalvip/nodeagent/bgp"

// drainWeightScale multiplies the weight of a node that is not draining, for a VIP drained by
// weight, so that a drained node's weight of 1 is a small share beside it: FRR gives each
// path 100 times its share of the bandwidth, truncated, and no less than 1, so with 1 against
// 100 per node a drained node keeps 1 of about 100 shares per other node. 100 keeps the
// proportion of weights up to 1,000 endpoints within bgp.MaxWeight.
const drainWeightScale = 100

// drainByWeight sets the link bandwidth of a route whose VIP is drained by weight (the
// announcement's drain_by_weight): a draining node (r.GracefulShutdown, set from the state's
// draining) keeps its path and advertises the least weight, 1, without GRACEFUL_SHUTDOWN;
// any other node advertises its weight (1 without one) times drainWeightScale. A router with
// weighted ECMP over resilient next-hop groups then moves the drained node's idle flows to
// the others and keeps its established ones until the withdrawal.
func drainByWeight(r *bgp.Route) {
	if r.GracefulShutdown {
		r.GracefulShutdown = false
		r.Weight = 1
		return
	}
	r.Weight = min(max(r.Weight, 1)*drainWeightScale, bgp.MaxWeight)
}
