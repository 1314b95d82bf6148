package nodeagent

import (
	"slices"
	"strings"
)

// The ownership rules: which part this node takes in an L2 VIP, from the VIP's ranked
// candidates and what the heartbeats say of the other candidates. Values in, a decision out:
// no sockets, no clocks, no locks.

// LivenessFacts are the two facts of the heartbeat exchange that an ordered hand-over needs.
type LivenessFacts interface {
	// Alive reports whether a node is alive; this node always is.
	Alive(node string) bool
	// Sees reports whether node's heartbeats say it counts this node alive.
	Sees(node string) bool
}

// l2Decision is this node's part in one L2 VIP.
type l2Decision struct {
	Active bool
	Reason string
	// Sharing, for a per-client VIP this node answers: the live candidates sharing its
	// clients, this node among them, sorted.
	Sharing []string
}

// decideL2 decides this node's part in an L2 VIP whose candidates are cands, best first. live
// nil means no heartbeats run (this node has no peer to exchange them with): the first
// candidate answers.
func decideL2(self string, cands []string, perClient bool, live LivenessFacts) l2Decision {
	if perClient {
		return decideShare(self, cands, live)
	}
	active, reason := owns(self, cands, live)
	return l2Decision{Active: active, Reason: reason}
}

// owns decides whether this node answers for an L2 VIP with the given ranked candidates:
//   - a live candidate ranked higher than this node answers, not this one;
//   - otherwise this node answers, once every live lower-ranked candidate shows (in its
//     heartbeats) that it sees this node: such a candidate stops answering as soon as it sees
//     a higher one, before its heartbeats show it, so two nodes never answer at once beyond
//     the time a heartbeat takes;
//   - without heartbeats, the first candidate answers.
func owns(self string, cands []string, live LivenessFacts) (bool, string) {
	me := slices.Index(cands, self)
	if len(cands) == 0 {
		return false, "not a candidate"
	}
	if live == nil {
		if me == 0 {
			return true, "first candidate"
		}
		if me < 0 {
			return false, "not a candidate"
		}
		return false, "standby for " + cands[0]
	}
	for _, c := range cands[:max(me, 0)] {
		if live.Alive(c) {
			return false, "standby: " + c + " is alive and ranks higher"
		}
	}
	if me < 0 {
		return false, "not a candidate"
	}
	for _, c := range cands[me+1:] {
		if live.Alive(c) && !live.Sees(c) {
			return false, "taking over: waiting for " + c + " to release"
		}
	}
	if me == 0 {
		return true, "first candidate"
	}
	return true, "first live candidate: higher-ranked candidates are down"
}

// decideShare decides this node's part in a per-client VIP: every live candidate answers its
// share of the clients (rendezvous hashing over the live candidates, this node included), once
// every other live candidate shows that it sees this node: until then that candidate counts
// this node out and answers this node's share itself (a node returning waits as an owner
// does; a node the CCM cut off, whose peers never show it alive, answers nothing).
func decideShare(self string, cands []string, live LivenessFacts) l2Decision {
	if !slices.Contains(cands, self) {
		return l2Decision{Reason: "not a candidate"}
	}
	for _, c := range cands {
		if live != nil && c != self && live.Alive(c) && !live.Sees(c) {
			return l2Decision{Reason: "joining: waiting for " + c + " to see this node before answering a share"}
		}
	}
	members := []string{self}
	var others []string
	for _, c := range cands {
		if c != self && (live == nil || live.Alive(c)) && !slices.Contains(members, c) {
			members = append(members, c)
			others = append(others, c)
		}
	}
	slices.Sort(members)
	d := l2Decision{Active: true, Sharing: members}
	if len(others) == 0 {
		d.Reason = "answers every client: no other candidate is alive"
	} else {
		d.Reason = "answers its share of clients with " + strings.Join(others, ", ")
	}
	return d
}

// heardFacts are the facts of the heartbeats with caution towards peers not heard (unheard):
// such a peer counts as alive and not seeing this node. A node that restarted from its saved
// state and hears none of its peers may have been dropped by them: the CCM moved its VIPs
// while it was away, so that their states no longer name it; they send it no heartbeats and
// take none, so that they look dead while they answer the VIPs they now hold. Counting them
// alive, this node answers no VIP they may hold until it hears one of them (their states name
// it again), or a while passes. A node that hears some peer is in their states: a peer it does
// not hear is then dead, and the usual rules apply.
type heardFacts struct {
	LivenessFacts
	unheard func(node string) bool
}

func (h heardFacts) Alive(node string) bool { return h.unheard(node) || h.LivenessFacts.Alive(node) }
func (h heardFacts) Sees(node string) bool  { return !h.unheard(node) && h.LivenessFacts.Sees(node) }
