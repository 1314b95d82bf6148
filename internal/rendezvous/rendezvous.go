// Package rendezvous is the hash that ranks nodes for an address (highest random weight): the
// CCM's planner ranks a VIP's standby candidates with it, and agents in per-client mode pick
// the node that answers each client with it. Every node computes the same ranking alone.
package rendezvous

import (
	"hash/fnv"
	"net/netip"
)

// Score is the weight of node for address a; the highest wins.
func Score(a netip.Addr, node string) uint64 { return Mix(Addr(a), Node(node)) }

// Owner returns the member with the highest score for a, or "" when there is none.
func Owner(a netip.Addr, members []string) string {
	ah := Addr(a)
	best, bestScore := "", uint64(0)
	for _, m := range members {
		if s := Mix(ah, Node(m)); best == "" || s > bestScore || s == bestScore && m < best {
			best, bestScore = m, s
		}
	}
	return best
}

// Addr hashes an address (IPv4 as its IPv4-mapped form, so both spellings agree).
func Addr(a netip.Addr) uint64 {
	h := fnv.New64a()
	b := a.As16()
	h.Write(b[:])
	return h.Sum64()
}

// Node hashes a node name.
func Node(s string) uint64 {
	h := fnv.New64a()
	h.Write([]byte(s))
	return h.Sum64()
}

// Mix combines two hashes (the SplitMix64 finaliser), so that every pair gets an independent
// score cheaply.
func Mix(a, b uint64) uint64 {
	z := a ^ (b + 0x9e3779b97f4a7c15 + (a << 6) + (a >> 2))
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9
	z = (z ^ (z >> 27)) * 0x94d049bb133111eb
	return z ^ (z >> 31)
}
