package metallb

import (
	"cmp"
	"fmt"
	"slices"
	"strings"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/metalvip/metalvip/api/v1alpha1"
	"github.com/metalvip/metalvip/loadbalancer/pools"
)

// convertL2Advertisements maps the L2Advertisements of one pool onto its announce settings.
func convertL2Advertisements(an *v1alpha1.Announce, ads []*mlbL2Advertisement, add func(string, string, ...any)) {
	var nodeSels [][]metav1.LabelSelector
	ifaces := map[string]bool{}
	allIfaces := false
	combos := map[string]bool{}
	var preferred []mlbPreferredNodeSelector
	for _, a := range ads {
		nodeSels = append(nodeSels, a.Spec.NodeSelectors)
		if len(a.Spec.Interfaces) == 0 {
			allIfaces = true
		}
		for _, i := range a.Spec.Interfaces {
			ifaces[i] = true
		}
		combos[formatSelectors(a.Spec.NodeSelectors)+"|"+strings.Join(slices.Sorted(slices.Values(a.Spec.Interfaces)), ",")] = true
		if len(a.Spec.ServiceSelectors) > 0 {
			add("spec.announce", "CHECK: L2Advertisement %s announced only Services matching %s; metalvip announces every Service of the pool: give those Services a pool of their own", a.Meta.Name, formatSelectors(a.Spec.ServiceSelectors))
		}
		preferred = append(preferred, a.Spec.PreferredNodeSelectors...)
	}
	nodeSelector(an, nodeSels, add)
	if len(ads) > 0 {
		switch {
		case allIfaces && len(ifaces) > 0:
			add("spec.announce.l2", "CHECK: MetalLB answered on every interface for some nodes and on %s for others; metalvip answers only on each agent's --interfaces (by default the interface of the node's default route) unless interfaces are listed", strings.Join(sortedKeys(ifaces), ", "))
		case allIfaces:
			add("spec.announce", "%s", everyInterface)
		default:
			var valid []string
			for _, i := range sortedKeys(ifaces) {
				if i == "" || len(i) > 15 || strings.ContainsAny(i, "/: \t\n") {
					add("spec.announce.l2", "CHECK: interface %q left out: not an interface name (1 to 15 characters, no '/', ':' or spaces)", i)
					continue
				}
				valid = append(valid, i)
			}
			if len(valid) > 16 {
				add("spec.announce.l2.interfaces", "CHECK: %d interfaces; an IPPool takes 16, the first 16 by name are kept", len(valid))
				valid = valid[:16]
			}
			if len(valid) > 0 {
				an.L2 = &v1alpha1.L2Announce{Interfaces: valid}
			}
			if len(combos) > 1 {
				add("spec.announce.l2.interfaces", "CHECK: MetalLB paired interfaces with nodes per L2Advertisement; metalvip answers on every interface listed here on every node of the pool")
			}
		}
	}
	if len(preferred) > 0 {
		slices.SortStableFunc(preferred, func(a, b mlbPreferredNodeSelector) int { return cmp.Compare(b.Weight, a.Weight) })
		p := preferred[0].Preference
		an.PreferredNodeSelector = apiSelector(&p)
		msg := "MetalLB preferred these nodes as the announcing one; metalvip spreads the pool's addresses evenly first and prefers these nodes where the spread leaves a choice"
		if len(preferred) > 1 {
			msg = fmt.Sprintf("CHECK: of MetalLB's weighted preferences %s the heaviest is kept. ", formatPreferences(preferred)) + msg
		}
		add("spec.announce.preferredNodeSelector", "%s", msg)
	}
}

// convertBGPAdvertisements maps the BGPAdvertisements of one pool onto its announce settings.
// fams says which families the pool holds ([IPv4, IPv6]): an aggregation of a family it does
// not hold changes nothing.
func convertBGPAdvertisements(an *v1alpha1.Announce, ads []*mlbBGPAdvertisement, aliases map[string]string, fams [2]bool, add func(string, string, ...any)) {
	var nodeSels [][]metav1.LabelSelector
	communities := map[string]bool{}
	large := map[string]bool{}
	perAd := map[string]bool{}
	var localPrefs []uint32
	var aggs [2][]int32 // each advertisement's aggregation length, IPv4 and IPv6
	b := &v1alpha1.BGPAnnounce{}
	for _, a := range ads {
		nodeSels = append(nodeSels, a.Spec.NodeSelectors)
		var mine []string
		for _, c := range a.Spec.Communities {
			v, alias := c, false
			if looked, ok := aliases[c]; ok {
				v, alias = looked, true
			}
			switch {
			case strings.HasPrefix(v, "large:") && pools.ValidLargeCommunity(strings.TrimPrefix(v, "large:")) != nil:
				add("spec.announce.bgp.largeCommunities", "CHECK: large community %q (from %s) left out: %v", c, a.Meta.Name, pools.ValidLargeCommunity(strings.TrimPrefix(v, "large:")))
			case strings.HasPrefix(v, "large:"):
				if alias {
					add("spec.announce.bgp.largeCommunities", "%s is MetalLB's community alias %q", strings.TrimPrefix(v, "large:"), c)
				}
				large[strings.TrimPrefix(v, "large:")] = true
				mine = append(mine, v)
			case pools.ValidCommunity(v) != nil && !alias && !strings.Contains(v, ":"):
				add("spec.announce.bgp.communities", "CHECK: community %q (from %s) left out: no Community object defines that name", c, a.Meta.Name)
			case pools.ValidCommunity(v) != nil:
				add("spec.announce.bgp.communities", "CHECK: community %q (from %s) left out: %v", c, a.Meta.Name, pools.ValidCommunity(v))
			default:
				if alias {
					add("spec.announce.bgp.communities", "%s is MetalLB's community alias %q", v, c)
				}
				communities[v] = true
				mine = append(mine, v)
			}
		}
		perAd[strings.Join(slices.Sorted(slices.Values(mine)), ",")] = true
		if a.Spec.LocalPref != 0 {
			localPrefs = append(localPrefs, a.Spec.LocalPref)
		}
		aggs[0] = append(aggs[0], valueOr(a.Spec.AggregationLength, 32))
		aggs[1] = append(aggs[1], valueOr(a.Spec.AggregationLengthV6, 128))
		if len(a.Spec.Peers) > 0 {
			add("spec.announce.bgp", "CHECK: %s advertised only to the peers %s; metalvip advertises to every BGPPeer of the announcing nodes (limit the peers' nodeSelector instead)", a.Meta.Name, strings.Join(a.Spec.Peers, ", "))
		}
		if a.Spec.AsPathPrepend != 0 {
			add("spec.announce.bgp", "CHECK: %s prepended the AS %d times; metalvip does not prepend", a.Meta.Name, a.Spec.AsPathPrepend)
		}
		if len(a.Spec.ServiceSelectors) > 0 {
			add("spec.announce", "CHECK: BGPAdvertisement %s announced only Services matching %s; metalvip announces every Service of the pool: give those Services a pool of their own", a.Meta.Name, formatSelectors(a.Spec.ServiceSelectors))
		}
	}
	nodeSelector(an, nodeSels, add)
	b.Communities = sortedKeys(communities)
	if len(b.Communities) > 32 {
		add("spec.announce.bgp.communities", "CHECK: %d communities; an IPPool takes 32, the first 32 are kept", len(b.Communities))
		b.Communities = b.Communities[:32]
	}
	b.LargeCommunities = sortedKeys(large)
	if len(b.LargeCommunities) > 32 {
		add("spec.announce.bgp.largeCommunities", "CHECK: %d large communities; an IPPool takes 32, the first 32 are kept", len(b.LargeCommunities))
		b.LargeCommunities = b.LargeCommunities[:32]
	}
	if len(perAd) > 1 {
		add("spec.announce.bgp.communities", "CHECK: MetalLB attached each BGPAdvertisement's communities to its own announcement; metalvip attaches all of them to every route of the pool")
	}
	if len(localPrefs) > 0 {
		lp := int64(localPrefs[0])
		b.LocalPref = &lp
		if slices.ContainsFunc(localPrefs, func(v uint32) bool { return v != localPrefs[0] }) {
			add("spec.announce.bgp.localPref", "CHECK: the BGPAdvertisements give different local preferences %v; the first is kept", localPrefs)
		}
	}
	for i, f := range []struct {
		field string
		host  int32
		set   **int32
	}{{"spec.announce.bgp.aggregationLength", 32, &b.AggregationLength}, {"spec.announce.bgp.aggregationLengthV6", 128, &b.AggregationLengthV6}} {
		ls := slices.Compact(slices.Sorted(slices.Values(aggs[i])))
		switch {
		case !fams[i] || len(ls) == 0 || len(ls) == 1 && ls[0] == f.host:
		case len(ls) == 1:
			l := ls[0]
			*f.set = &l
		default:
			add(f.field, "CHECK: MetalLB announced this pool's addresses with the prefix lengths %v at once (one BGPAdvertisement each); metalvip announces one: the host routes (/%d) are kept, the aggregates left out", ls, f.host)
		}
	}
	if len(b.Communities) > 0 || b.LocalPref != nil || b.AggregationLength != nil || b.AggregationLengthV6 != nil {
		an.BGP = b
	}
}

// valueOr is *p, or def when p is nil (an explicit 0 stays 0).
func valueOr(p *int32, def int32) int32 {
	if p == nil {
		return def
	}
	return *p
}

// nodeSelector sets the nodes that announce: those any advertisement selects (one without
// selectors selects every node).
func nodeSelector(an *v1alpha1.Announce, perAd [][]metav1.LabelSelector, add func(string, string, ...any)) {
	var all []metav1.LabelSelector
	for _, sels := range perAd {
		if len(sels) == 0 {
			return // one advertisement announces from every node
		}
		all = append(all, sels...)
	}
	sel, exact := mergeSelectors(all)
	an.NodeSelector = apiSelector(sel)
	if !exact {
		add("spec.announce.nodeSelector", "CHECK: MetalLB announced from nodes matching any of %s; metalvip takes one selector, the first is kept. Give those nodes one common label and select it", formatSelectors(all))
	}
}

// everyInterface is the note on an L2 pool MetalLB answered on every interface; Convert says
// once, as a CHECK, which pools have it.
const everyInterface = "MetalLB answered on every interface; metalvip answers only on each agent's --interfaces, by default the interface of the node's default route: list l2.interfaces if clients reach the nodes through others"
