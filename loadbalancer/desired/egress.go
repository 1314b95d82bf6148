package desired

import (
	"cmp"
	"fmt"
	"hash/fnv"
	"maps"
	"net/netip"
	"slices"
	"strings"

	v1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"

	"github.com/metalvip/metalvip/internal/annotation"
	"github.com/metalvip/metalvip/loadbalancer/planner"
	"github.com/metalvip/metalvip/loadbalancer/pools"
)

// Egress: a Service that asks (metalvip.io/egress: "true") sends its pods' traffic to the
// outside world from its address, when the pool owner consents (spec.egress: Allow), the
// address is one node's at a time (L2, not per client) or BGP (one announcer is the egress
// node; the others send the replies on to it), and every Service sharing it asks too (an
// address is one identity: one Service cannot lend it to another's pods).

// EgressAsk is whether a Service asks for egress, and the problem with its annotation.
func EgressAsk(svc *v1.Service) (bool, string) {
	ok, err := annotation.EgressFromService(svc)
	if err != nil {
		return false, err.Error()
	}
	return ok, ""
}

// EgressRefusal says why the Services sharing ip (sharers, each asking or not) do not get
// egress through it, or "" when they do. cluster are the cluster ranges the cloud-config
// names.
func EgressRefusal(ip netip.Addr, pool *pools.Pool, sharers []*v1.Service, cluster []netip.Prefix) string {
	var asking, silent []string
	for _, svc := range sharers {
		if ok, _ := EgressAsk(svc); ok {
			asking = append(asking, Key(svc))
		} else {
			silent = append(silent, Key(svc))
		}
	}
	switch {
	case len(asking) == 0:
		return ""
	case pool == nil || !pool.Valid():
		return fmt.Sprintf("%s has no valid pool", ip)
	case !pool.Announce.Egress:
		return fmt.Sprintf("IPPool %s does not allow egress (spec.egress: Deny); its owner may set Allow", pool.Name)
	case pool.Announce.Mode == planner.L2 && pool.Announce.PerClient:
		return fmt.Sprintf("%s is answered per client by several nodes: egress needs an address one node answers", ip)
	case !slices.ContainsFunc(cluster, func(p netip.Prefix) bool { return p.Addr().Is4() == ip.Is4() }):
		return fmt.Sprintf("the CCM's cloud-config names no egress.clusterCIDRs of %s's family (the pod and ClusterIP ranges pods reach as themselves); the cluster's administrator must set them", ip)
	case len(silent) > 0:
		return fmt.Sprintf("%s is shared with %s, which does not ask for egress: an address leaves for all of its Services or none", ip, strings.Join(silent, ", "))
	}
	for _, svc := range sharers {
		if len(svc.Spec.Selector) == 0 {
			return fmt.Sprintf("Service %s has no selector: metalvip sends only the pods of a selector from the address", Key(svc))
		}
		if pool.Announce.Mode != planner.BGP {
			continue
		}
		for _, p := range svc.Spec.Ports {
			if p.Port >= EgressReplyPorts[0] && p.Port <= EgressReplyPorts[1] {
				return fmt.Sprintf("Service %s listens on port %d of the BGP address %s, inside the ports its egress connections take (%d-%d, which every announcer sends on to the egress node)",
					Key(svc), p.Port, ip, EgressReplyPorts[0], EgressReplyPorts[1])
			}
		}
	}
	return ""
}

// EgressReplyPorts are the source ports the egress node of a BGP address maps its pods' TCP and
// UDP connections to; the address's other announcers send the packets to it with a destination
// port in the range on to the egress node (a reply reaches any node of the ECMP set). No Service
// of the address may listen in it. (65535 is left out: an ip rule's port range ends at 65534.)
var EgressReplyPorts = [2]int32{49152, 65534}

// EgressOrder ranks the announcers of a BGP address for its egress node: by a hash of the
// address and the node's name (rendezvous), so that a node joining or leaving the ECMP set
// moves the egress node only when it is, or becomes, the first.
func EgressOrder(ip netip.Addr, nodes []string) []string {
	out := slices.Clone(nodes)
	rank := func(n string) uint64 {
		h := fnv.New64a()
		_, _ = h.Write([]byte(ip.String() + "/" + n))
		return h.Sum64()
	}
	slices.SortFunc(out, func(a, b string) int {
		if c := cmp.Compare(rank(a), rank(b)); c != 0 {
			return c
		}
		return strings.Compare(a, b)
	})
	return out
}

// EgressSources returns the addresses of the endpoints in slices_ of vip's family by node, each
// sorted: ready or not (a starting pod connects out too), each endpoint once.
func EgressSources(vip netip.Addr, slices_ []*discoveryv1.EndpointSlice) map[string][]string {
	out := map[string][]string{}
	family := discoveryv1.AddressTypeIPv4
	if vip.Is6() {
		family = discoveryv1.AddressTypeIPv6
	}
	for _, es := range slices_ {
		if es.AddressType != family {
			continue
		}
		for _, ep := range es.Endpoints {
			if ep.NodeName == nil || *ep.NodeName == "" {
				continue
			}
			for _, a := range ep.Addresses {
				if ip, err := netip.ParseAddr(a); err == nil && ip.Is4() == vip.Is4() && !ip.Is4In6() && ip.Zone() == "" {
					out[*ep.NodeName] = append(out[*ep.NodeName], ip.String())
				}
			}
		}
	}
	for n := range out {
		slices.Sort(out[n])
		out[n] = slices.Compact(out[n])
	}
	return out
}

// MergeSources adds b's sources to a's.
func MergeSources(a, b map[string][]string) map[string][]string {
	if a == nil {
		a = map[string][]string{}
	}
	for n, srcs := range b {
		a[n] = append(a[n], srcs...)
		slices.Sort(a[n])
		a[n] = slices.Compact(a[n])
	}
	return a
}

// SameSources reports whether a and b are the same sources.
func SameSources(a, b map[string][]string) bool { return maps.EqualFunc(a, b, slices.Equal) }
