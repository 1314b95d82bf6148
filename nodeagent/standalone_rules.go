package nodeagent

import (
	"fmt"

	"github.com/metalvip/metalvip/nodeagent/controlplane"
)

// The control-plane VIP's rules: whether this node may hold it, and whether it does. Values
// in, a decision out: no sockets, no clocks, no locks (standalone.go gathers the facts).

// cpFacts are what the decision needs.
type cpFacts struct {
	self   string
	ranked []string // every control-plane node, best first
	mode   controlplane.Mode

	// ready: the local kube-apiserver passed its check (with hysteresis); detail says how.
	ready  bool
	detail string
	// standby: the file keeps this node from holding the VIP.
	standby bool
	// healthWaived, quorumWaived: the first node's bootstrap lets it hold the VIP before its
	// API server was ever ready, and without a majority before it ever saw one.
	healthWaived, quorumWaived bool

	// seen is how many other control-plane nodes see this one and are seen by it (L2).
	seen int
	// cands are the heartbeats among the nodes that may hold the VIP now; nil when this node
	// is not among them or has no peer.
	cands LivenessFacts
}

// cpDecision is this node's part in the control-plane VIP.
type cpDecision struct {
	// Eligible: this node may hold the VIP now, so it joins the candidates' heartbeats.
	Eligible bool
	// Active: this node answers (L2) or advertises (BGP) the VIP now.
	Active bool
	Reason string
}

// decideControlPlane applies the rules, in order:
//   - a standby node never holds the VIP;
//   - a node whose kube-apiserver is not ready never holds it (unless bootstrap waives it);
//   - BGP: every other node advertises it (anycast, no election);
//   - L2: a node that does not see a majority of the control-plane nodes (itself included)
//     never holds it (unless bootstrap waives it): of two sides of a partition, at most one
//     has a majority, so at most one side answers;
//   - L2: among the nodes that may hold it, the ranking decides with the ordered hand-over
//     of the Service VIPs (owns): a node answers only once every live lower-ranked one shows
//     it stopped.
func decideControlPlane(f cpFacts) cpDecision {
	if f.standby {
		return cpDecision{Reason: "standby (the local file says so): the VIP goes to the next ready node"}
	}
	why := "kube-apiserver ready"
	if !f.ready {
		if !f.healthWaived {
			return cpDecision{Reason: "kube-apiserver not ready: " + f.detail}
		}
		why = "bootstrap: before the first kube-apiserver is ready"
	}
	if f.mode == controlplane.ModeBGP {
		return cpDecision{Eligible: true, Active: true, Reason: why + "; advertised (anycast: every ready node)"}
	}
	total := len(f.ranked)
	need := total/2 + 1
	if f.seen+1 < need {
		if !f.quorumWaived {
			return cpDecision{Reason: fmt.Sprintf("sees %d of %d control-plane nodes (itself included); holds the VIP only with %d", f.seen+1, total, need)}
		}
		why += fmt.Sprintf("; bootstrap: holds the VIP without a majority (%d of %d) until it has seen one", f.seen+1, total)
	}
	active, reason := owns(f.self, f.ranked, f.cands)
	return cpDecision{Eligible: true, Active: active, Reason: why + "; " + reason}
}
