package main

import (
	"cmp"
	"fmt"
	"net/netip"
	"reflect"
	"slices"
	"strings"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"

	"github.com/metalvip/metalvip/api/v1alpha1"
	"github.com/metalvip/metalvip/loadbalancer/pools"
)

// The conversion from MetalLB's configuration to metalvip's is pure: MetalLB's objects in,
// IPPools and BGPPeers out, each with a note at every field where metalvip cannot do exactly
// what MetalLB did. A note that starts with "CHECK:" changes behaviour; the others explain.
// An IPPool keeps its MetalLB pool's name, so that the metallb.io/address-pool annotation of a
// Service names it.

// note is one remark on a printed object, at a field.
type note struct {
	Path string // e.g. "spec.announce.nodeSelector"; "" is the whole object
	Text string
}

// convertedObject is an IPPool or a BGPPeer to print.
type convertedObject struct {
	Kind  string // IPPool or BGPPeer
	Name  string
	From  string // the MetalLB objects it was made from, for its head comment
	Spec  any    // v1alpha1.IPPoolSpec or v1alpha1.BGPPeerSpec
	Notes []note
}

// conversion is the whole result.
type conversion struct {
	Namespace string
	Objects   []convertedObject
	// General notes concern no single printed object: MetalLB objects that gave nothing, or
	// that the converter could not fully read.
	General []string
}

// checks counts the notes that change behaviour.
func (c conversion) checks() int {
	n := 0
	for _, g := range c.General {
		if strings.HasPrefix(g, "CHECK:") {
			n++
		}
	}
	for _, o := range c.Objects {
		for _, nt := range o.Notes {
			if strings.HasPrefix(nt.Text, "CHECK:") {
				n++
			}
		}
	}
	return n
}

// convertedLabel marks every printed object, so that a rollback can delete them by label.
const convertedLabel = "metalvip.io/converted-from"

// convertMetalLB converts MetalLB's configuration. passwordNamespace is the namespace the CCM
// reads BGP passwords from.
func convertMetalLB(in metalLBConfig, passwordNamespace string) conversion {
	out := conversion{Namespace: in.Namespace}
	byName := func(a, b mlbMeta) int { return cmp.Compare(a.Name, b.Name) }
	slices.SortFunc(in.Pools, func(a, b mlbPool) int { return byName(a.Meta, b.Meta) })
	slices.SortFunc(in.L2, func(a, b mlbL2Advertisement) int { return byName(a.Meta, b.Meta) })
	slices.SortFunc(in.BGP, func(a, b mlbBGPAdvertisement) int { return byName(a.Meta, b.Meta) })
	slices.SortFunc(in.Peers, func(a, b mlbPeer) int { return byName(a.Meta, b.Meta) })
	slices.SortFunc(in.Communities, func(a, b mlbCommunity) int { return byName(a.Meta, b.Meta) })
	slices.SortFunc(in.BFDProfiles, func(a, b mlbBFDProfile) int { return byName(a.Meta, b.Meta) })

	for _, key := range sortedKeys(in.Unknown) {
		out.General = append(out.General, fmt.Sprintf("CHECK: %s in %s has fields this converter does not know (a newer MetalLB?), not converted: %s", strings.Replace(key, "/", " ", 1), in.Namespace, strings.Join(in.Unknown[key], ", ")))
	}

	aliases := map[string]string{}
	for _, c := range in.Communities {
		for _, a := range c.Spec.Communities {
			if prev, ok := aliases[a.Name]; ok && prev != a.Value {
				out.General = append(out.General, fmt.Sprintf("CHECK: community alias %q is defined twice (%s and %s); %s is used", a.Name, prev, a.Value, prev))
				continue
			}
			aliases[a.Name] = a.Value
		}
	}

	l2For, bgpFor := map[string][]*mlbL2Advertisement{}, map[string][]*mlbBGPAdvertisement{}
	for i := range in.L2 {
		ad := &in.L2[i]
		names, problems := selectPools(ad.Spec.mlbPoolSelection, in.Pools)
		for _, p := range problems {
			out.General = append(out.General, fmt.Sprintf("CHECK: L2Advertisement %s/%s %s", in.Namespace, ad.Meta.Name, p))
		}
		if len(names) == 0 {
			out.General = append(out.General, fmt.Sprintf("L2Advertisement %s/%s selects no pool; nothing comes of it", in.Namespace, ad.Meta.Name))
		}
		for _, n := range names {
			l2For[n] = append(l2For[n], ad)
		}
	}
	for i := range in.BGP {
		ad := &in.BGP[i]
		names, problems := selectPools(ad.Spec.mlbPoolSelection, in.Pools)
		for _, p := range problems {
			out.General = append(out.General, fmt.Sprintf("CHECK: BGPAdvertisement %s/%s %s", in.Namespace, ad.Meta.Name, p))
		}
		if len(names) == 0 {
			out.General = append(out.General, fmt.Sprintf("BGPAdvertisement %s/%s selects no pool; nothing comes of it", in.Namespace, ad.Meta.Name))
		}
		for _, n := range names {
			bgpFor[n] = append(bgpFor[n], ad)
		}
	}

	prios := poolPriorities(in.Pools)
	for _, p := range in.Pools {
		o, skipped := convertPool(p, in, l2For[p.Meta.Name], bgpFor[p.Meta.Name], aliases, prios)
		if skipped != "" {
			out.General = append(out.General, "CHECK: "+skipped)
			continue
		}
		if probs := pools.DecodePool(&v1alpha1.IPPool{ObjectMeta: metav1.ObjectMeta{Name: o.Name}, Spec: o.Spec.(v1alpha1.IPPoolSpec)}).Problems; len(probs) > 0 {
			o.Notes = append(o.Notes, note{"", "CHECK: metalvip will not use this pool as printed: " + pools.Problems(probs)})
		}
		out.Objects = append(out.Objects, o)
	}
	for _, p := range in.Peers {
		o, skipped := convertPeer(p, in, passwordNamespace)
		if skipped != "" {
			out.General = append(out.General, "CHECK: "+skipped)
			continue
		}
		if probs := pools.DecodePeer(&v1alpha1.BGPPeer{ObjectMeta: metav1.ObjectMeta{Name: o.Name}, Spec: o.Spec.(v1alpha1.BGPPeerSpec)}).Problems; len(probs) > 0 {
			o.Notes = append(o.Notes, note{"", "CHECK: metalvip will not use this peer as printed: " + pools.Problems(probs)})
		}
		out.Objects = append(out.Objects, o)
	}
	return out
}

// poolPriority is a pool's place in metalvip's order, and why.
type poolPriority struct {
	value    *int32
	assigned bool // MetalLB gave none; this one keeps MetalLB's order
	tied     bool // another pool has the same
}

// poolPriorities orders the pools as MetalLB does. MetalLB tries the pools with a
// serviceAllocation (pinned) before the others, those with a priority first; metalvip's
// priority is one order over every pool, with pools without one last, so pinned pools without
// a priority get one after the highest given.
func poolPriorities(ps []mlbPool) map[string]poolPriority {
	highest, unpinned := 0, false
	for _, p := range ps {
		if sa := p.Spec.ServiceAllocation; sa != nil {
			highest = max(highest, sa.Priority)
		} else {
			unpinned = true
		}
	}
	out := map[string]poolPriority{}
	count := map[int32]int{}
	for _, p := range ps {
		sa := p.Spec.ServiceAllocation
		if sa == nil {
			continue
		}
		v := int32(min(sa.Priority, 1<<31-1))
		pp := poolPriority{value: &v}
		if sa.Priority <= 0 {
			v = int32(min(highest+1, 1<<31-1))
			pp.assigned = unpinned
		}
		count[v]++
		out[p.Meta.Name] = pp
	}
	for name, pp := range out {
		pp.tied = count[*pp.value] > 1
		out[name] = pp
	}
	return out
}

// selectPools returns the names of the pools an advertisement applies to: those it names and
// those its selectors match, or every pool when it gives neither (as MetalLB does).
func selectPools(sel mlbPoolSelection, all []mlbPool) (names, problems []string) {
	if len(sel.IPAddressPools) == 0 && len(sel.IPAddressPoolSelectors) == 0 {
		for _, p := range all {
			names = append(names, p.Meta.Name)
		}
		return names, nil
	}
	exists := map[string]bool{}
	for _, p := range all {
		exists[p.Meta.Name] = true
	}
	chosen := map[string]bool{}
	for _, n := range sel.IPAddressPools {
		if !exists[n] {
			problems = append(problems, fmt.Sprintf("names IPAddressPool %q, which does not exist", n))
			continue
		}
		chosen[n] = true
	}
	for i := range sel.IPAddressPoolSelectors {
		s, err := metav1.LabelSelectorAsSelector(&sel.IPAddressPoolSelectors[i])
		if err != nil {
			problems = append(problems, fmt.Sprintf("has an ipAddressPoolSelector that does not parse (%v); it selects nothing", err))
			continue
		}
		for _, p := range all {
			if s.Matches(labels.Set(p.Meta.Labels)) {
				chosen[p.Meta.Name] = true
			}
		}
	}
	return sortedKeys(chosen), problems
}

// convertPool makes one IPPool. skipped, when not empty, says why there is none.
func convertPool(p mlbPool, in metalLBConfig, l2 []*mlbL2Advertisement, bgp []*mlbBGPAdvertisement, aliases map[string]string, prios map[string]poolPriority) (o convertedObject, skipped string) {
	ref := fmt.Sprintf("IPAddressPool %s/%s", in.Namespace, p.Meta.Name)
	o = convertedObject{Kind: "IPPool", Name: p.Meta.Name}
	var from []string
	for _, a := range l2 {
		from = append(from, "L2Advertisement "+a.Meta.Name)
	}
	for _, a := range bgp {
		from = append(from, "BGPAdvertisement "+a.Meta.Name)
	}
	o.From = ref
	if len(from) > 0 {
		o.From += ", announced by " + strings.Join(from, ", ")
	}
	add := func(path, format string, args ...any) {
		o.Notes = append(o.Notes, note{path, fmt.Sprintf(format, args...)})
	}
	var spec v1alpha1.IPPoolSpec

	for _, a := range p.Spec.Addresses {
		r, rewritten, err := normaliseRange(a)
		if err != nil {
			add("spec.addresses", "CHECK: %q left out: %v", a, err)
			continue
		}
		if rewritten {
			add("spec.addresses", "%q written as %s, the same addresses", a, r)
		}
		spec.Addresses = append(spec.Addresses, v1alpha1.AddressRange(r))
	}
	switch {
	case len(spec.Addresses) == 0:
		return o, fmt.Sprintf("%s not converted: it has no address metalvip can read", ref)
	case len(spec.Addresses) > 64:
		return o, fmt.Sprintf("%s not converted: it lists %d ranges and an IPPool takes at most 64; merge adjacent ranges or split the pool (Services naming it by metallb.io/address-pool then need the new names)", ref, len(spec.Addresses))
	}
	if a := p.Spec.AutoAssign; a != nil && !*a {
		spec.AutoAssign = a
	}
	spec.AvoidBuggyIPs = p.Spec.AvoidBuggyIPs
	if sa := p.Spec.ServiceAllocation; sa != nil {
		pp := prios[p.Meta.Name]
		spec.Priority = pp.value
		if pp.assigned {
			add("spec.priority", "MetalLB gives no priority here but tries this pool, which has a serviceAllocation, before every pool without one: priority %d keeps that order", *pp.value)
		}
		if pp.tied {
			add("spec.priority", "of pools with the same priority metalvip tries the first by name, MetalLB one at random")
		}
		spec.ServiceAllocation = convertServiceAllocation(sa, in.KubeNamespaces, add)
	}

	mode := v1alpha1.AnnounceL2
	switch {
	case len(bgp) > 0 && len(l2) > 0:
		mode = v1alpha1.AnnounceBGP
		add("spec.announce.mode", "CHECK: MetalLB announced this pool both by L2 (%s) and by BGP (%s); an IPPool has one mode, and BGP is kept: clients on the segment then reach its addresses through the router", names(l2), namesBGP(bgp))
	case len(bgp) > 0:
		mode = v1alpha1.AnnounceBGP
	case len(l2) == 0:
		add("spec.announce.mode", "CHECK: no L2Advertisement or BGPAdvertisement selects this pool, so MetalLB gave its addresses without announcing them; metalvip announces every pool (here by L2). To keep them silent, give spec.announce a nodeSelector that matches no node")
	}
	spec.Announce = v1alpha1.Announce{Mode: mode}
	if mode == v1alpha1.AnnounceBGP {
		convertBGPAdvertisements(&spec.Announce, bgp, aliases, add)
	} else {
		convertL2Advertisements(&spec.Announce, l2, add)
	}
	o.Spec = spec
	return o, ""
}

func names(ads []*mlbL2Advertisement) string {
	s := make([]string, len(ads))
	for i, a := range ads {
		s[i] = a.Meta.Name
	}
	return strings.Join(s, ", ")
}

func namesBGP(ads []*mlbBGPAdvertisement) string {
	s := make([]string, len(ads))
	for i, a := range ads {
		s[i] = a.Meta.Name
	}
	return strings.Join(s, ", ")
}

// normaliseRange writes one of MetalLB's address entries as an IPPool takes it. MetalLB
// allows spaces around a range's dash and a CIDR with host bits set (it keeps the network).
func normaliseRange(s string) (out string, rewritten bool, err error) {
	if first, last, ok := strings.Cut(s, "-"); ok {
		a, errA := netip.ParseAddr(strings.TrimSpace(first))
		b, errB := netip.ParseAddr(strings.TrimSpace(last))
		if errA != nil || errB != nil {
			return "", false, fmt.Errorf("not a range of two addresses")
		}
		a, b = a.Unmap(), b.Unmap()
		if a.BitLen() != b.BitLen() || a.Compare(b) > 0 {
			return "", false, fmt.Errorf("the range is reversed or mixes families")
		}
		out = a.String() + "-" + b.String()
		return out, out != s, nil
	}
	p, err := netip.ParsePrefix(strings.TrimSpace(s))
	if err != nil || p.Addr().Zone() != "" {
		return "", false, fmt.Errorf("not a CIDR")
	}
	if p.Addr().Is4In6() && p.Bits() >= 96 {
		p = netip.PrefixFrom(p.Addr().Unmap(), p.Bits()-96)
	}
	out = p.Masked().String()
	return out, out != s, nil
}

// convertServiceAllocation maps MetalLB's limits. MetalLB admits a Service whose namespace is
// listed OR matches one of the namespace selectors, AND that matches one of the service
// selectors; metalvip takes one list and one selector of each, all of which must hold.
func convertServiceAllocation(sa *mlbServiceAllocation, known []kubeNamespace, add func(string, string, ...any)) *v1alpha1.ServiceAllocation {
	out := &v1alpha1.ServiceAllocation{}
	listed := slices.Compact(slices.Sorted(slices.Values(sa.Namespaces)))
	sels := sa.NamespaceSelectors
	resolve := func() []string {
		if known == nil {
			return nil
		}
		set := map[string]bool{}
		for _, n := range listed {
			set[n] = true
		}
		for i := range sels {
			s, err := metav1.LabelSelectorAsSelector(&sels[i])
			if err != nil {
				continue
			}
			for _, ns := range known {
				if s.Matches(labels.Set(ns.Labels)) {
					set[ns.Name] = true
				}
			}
		}
		return sortedKeys(set)
	}
	switch {
	case len(sels) == 0:
		out.Namespaces = listed
	case len(listed) == 0:
		sel, exact := mergeSelectors(sels)
		if exact {
			out.NamespaceSelector = apiSelector(sel)
			break
		}
		if ns := resolve(); len(ns) > 0 {
			out.Namespaces = ns
			add("spec.serviceAllocation.namespaces", "CHECK: the namespaces matching MetalLB's namespaceSelectors %s when converted; a namespace labelled later is not added", formatSelectors(sels))
			break
		}
		out.NamespaceSelector = apiSelector(sel)
		add("spec.serviceAllocation.namespaceSelector", "CHECK: MetalLB admitted namespaces matching any of %s; metalvip takes one selector, the first is kept. Give those namespaces one common label and select it", formatSelectors(sels))
	default:
		if ns := resolve(); len(ns) > 0 {
			out.Namespaces = ns
			add("spec.serviceAllocation.namespaces", "CHECK: MetalLB admitted the namespaces listed or matching %s; this list holds both as they were when converted, a namespace labelled later is not added", formatSelectors(sels))
			break
		}
		out.Namespaces = listed
		add("spec.serviceAllocation.namespaces", "CHECK: MetalLB also admitted namespaces matching %s; metalvip requires both the list and a selector to hold, so only the list is kept: add the namespaces the selectors match", formatSelectors(sels))
	}
	if len(sa.ServiceSelectors) > 0 {
		sel, exact := mergeSelectors(sa.ServiceSelectors)
		out.ServiceSelector = apiSelector(sel)
		if !exact {
			add("spec.serviceAllocation.serviceSelector", "CHECK: MetalLB admitted Services matching any of %s; metalvip takes one selector, the first is kept. Give those Services one common label and select it", formatSelectors(sa.ServiceSelectors))
		}
	}
	if len(out.Namespaces) == 0 && out.NamespaceSelector == nil && out.ServiceSelector == nil {
		return nil
	}
	return out
}

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
			add("spec.announce.l2", "CHECK: MetalLB answered on every interface for some nodes and on %s for others; metalvip answers on the interface holding the node's address on the segment unless interfaces are listed", strings.Join(sortedKeys(ifaces), ", "))
		case allIfaces:
			add("spec.announce", "MetalLB answered on every interface; metalvip answers on the interface that holds the node's address on the segment: list l2.interfaces if clients reach the nodes through others")
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
func convertBGPAdvertisements(an *v1alpha1.Announce, ads []*mlbBGPAdvertisement, aliases map[string]string, add func(string, string, ...any)) {
	var nodeSels [][]metav1.LabelSelector
	communities := map[string]bool{}
	perAd := map[string]bool{}
	var localPrefs []uint32
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
			case strings.HasPrefix(v, "large:"):
				add("spec.announce.bgp.communities", "CHECK: large community %s (from %s) left out: metalvip attaches standard communities only", v, a.Meta.Name)
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
		if l := a.Spec.AggregationLength; l != nil && *l != 32 {
			add("spec.announce.bgp", "CHECK: %s aggregated IPv4 routes to /%d; metalvip announces each address as a /32", a.Meta.Name, *l)
		}
		if l := a.Spec.AggregationLengthV6; l != nil && *l != 128 {
			add("spec.announce.bgp", "CHECK: %s aggregated IPv6 routes to /%d; metalvip announces each address as a /128", a.Meta.Name, *l)
		}
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
	if len(b.Communities) > 0 || b.LocalPref != nil {
		an.BGP = b
	}
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

// mergeSelectors turns MetalLB's list of selectors (any may match) into one. It is exact when
// the list holds one selector, or selectors that each ask for one value of the same label
// (written as one "In"); otherwise it returns the first and exact is false.
func mergeSelectors(sels []metav1.LabelSelector) (sel *metav1.LabelSelector, exact bool) {
	var uniq []metav1.LabelSelector
	for _, s := range sels {
		if len(s.MatchLabels) == 0 && len(s.MatchExpressions) == 0 {
			return nil, true // matches everything
		}
		if !slices.ContainsFunc(uniq, func(u metav1.LabelSelector) bool { return reflect.DeepEqual(u, s) }) {
			uniq = append(uniq, s)
		}
	}
	switch len(uniq) {
	case 0:
		return nil, true
	case 1:
		return &uniq[0], true
	}
	key := ""
	values := map[string]bool{}
	for _, s := range uniq {
		k, vs, ok := oneLabel(s)
		if !ok || (key != "" && k != key) {
			return &uniq[0], false
		}
		key = k
		for _, v := range vs {
			values[v] = true
		}
	}
	return &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{{
		Key: key, Operator: metav1.LabelSelectorOpIn, Values: sortedKeys(values),
	}}}, true
}

// apiSelector writes a selector as metalvip's API holds it; nil stays nil (every node or
// object).
func apiSelector(s *metav1.LabelSelector) *v1alpha1.LabelSelector {
	if s == nil {
		return nil
	}
	out := &v1alpha1.LabelSelector{}
	if s.MatchLabels != nil {
		out.MatchLabels = make(map[string]v1alpha1.LabelValue, len(s.MatchLabels))
		for k, v := range s.MatchLabels {
			out.MatchLabels[k] = v1alpha1.LabelValue(v)
		}
	}
	for _, r := range s.MatchExpressions {
		req := v1alpha1.LabelSelectorRequirement{Key: r.Key, Operator: r.Operator}
		for _, v := range r.Values {
			req.Values = append(req.Values, v1alpha1.LabelValue(v))
		}
		out.MatchExpressions = append(out.MatchExpressions, req)
	}
	return out
}

// oneLabel returns the label and values of a selector that asks only for a label to have one
// of some values.
func oneLabel(s metav1.LabelSelector) (key string, values []string, ok bool) {
	switch {
	case len(s.MatchLabels) == 1 && len(s.MatchExpressions) == 0:
		for k, v := range s.MatchLabels {
			return k, []string{v}, true
		}
	case len(s.MatchLabels) == 0 && len(s.MatchExpressions) == 1 && s.MatchExpressions[0].Operator == metav1.LabelSelectorOpIn:
		return s.MatchExpressions[0].Key, s.MatchExpressions[0].Values, true
	}
	return "", nil, false
}

func formatSelectors(sels []metav1.LabelSelector) string {
	s := make([]string, len(sels))
	for i := range sels {
		s[i] = "{" + metav1.FormatLabelSelector(&sels[i]) + "}"
	}
	return strings.Join(s, ", ")
}

func formatPreferences(ps []mlbPreferredNodeSelector) string {
	s := make([]string, len(ps))
	for i := range ps {
		s[i] = fmt.Sprintf("%d:{%s}", ps[i].Weight, metav1.FormatLabelSelector(&ps[i].Preference))
	}
	return strings.Join(s, ", ")
}

// convertPeer makes one BGPPeer. skipped, when not empty, says why there is none.
func convertPeer(p mlbPeer, in metalLBConfig, passwordNamespace string) (o convertedObject, skipped string) {
	ref := fmt.Sprintf("BGPPeer %s/%s", in.Namespace, p.Meta.Name)
	o = convertedObject{Kind: "BGPPeer", Name: p.Meta.Name, From: ref}
	add := func(path, format string, args ...any) {
		o.Notes = append(o.Notes, note{path, fmt.Sprintf(format, args...)})
	}
	sp := p.Spec
	switch {
	case sp.Interface != "":
		return o, fmt.Sprintf("%s not converted: it peers unnumbered over interface %s, and a metalvip BGPPeer needs the router's address", ref, sp.Interface)
	case sp.PeerAddress == "":
		return o, fmt.Sprintf("%s not converted: it has no peerAddress", ref)
	case sp.MyASN == 0:
		return o, fmt.Sprintf("%s not converted: myASN is 0", ref)
	}
	spec := v1alpha1.BGPPeerSpec{Address: sp.PeerAddress, MyASN: int64(sp.MyASN), GracefulRestart: sp.EnableGracefulRestart}
	if sp.LocalASN != 0 {
		spec.MyASN = int64(sp.LocalASN)
		add("spec.myASN", "MetalLB's localASN %d, the AS the router sees (metalvip's ASN is per peer already; MetalLB's myASN was %d)", sp.LocalASN, sp.MyASN)
	}
	switch {
	case sp.PeerASN != 0:
		spec.PeerASN = int64(sp.PeerASN)
	case sp.DynamicASN == "internal":
		spec.PeerASN = int64(sp.MyASN)
		add("spec.peerASN", "MetalLB's dynamicASN internal: the router is in the nodes' own AS")
	case sp.DynamicASN != "":
		return o, fmt.Sprintf("%s not converted: dynamicASN %s accepts a router of any other AS, and a metalvip BGPPeer needs the router's AS number: convert it by hand with peerASN", ref, sp.DynamicASN)
	default:
		return o, fmt.Sprintf("%s not converted: it gives neither peerASN nor dynamicASN", ref)
	}
	if sp.PeerPort != 0 && sp.PeerPort != 179 {
		port := int32(sp.PeerPort)
		spec.Port = &port
	}
	hold := int32(90)
	if d := sp.HoldTime; d != nil {
		h, whole := seconds(d.Duration)
		if !whole {
			add("spec.holdTimeSeconds", "MetalLB's holdTime %s, in whole seconds", d.Duration)
		}
		if h != 0 && h < 3 || h > 65535 {
			add("spec.holdTimeSeconds", "CHECK: MetalLB's holdTime %s left out: give 0 or 3 to 65535 seconds; the default is 90", d.Duration)
		} else {
			spec.HoldTimeSeconds = &h
			hold = h
		}
	}
	if d := sp.KeepaliveTime; d != nil {
		k, whole := seconds(d.Duration)
		switch {
		case k < 0 || k > 21845 || k*3 > hold:
			add("spec.keepaliveSeconds", "CHECK: MetalLB's keepaliveTime %s left out: metalvip wants at most a third of the hold time (%ds), and takes a third by default", d.Duration, hold)
		default:
			if !whole {
				add("spec.keepaliveSeconds", "MetalLB's keepaliveTime %s, in whole seconds", d.Duration)
			}
			spec.KeepaliveSeconds = &k
		}
	}
	if sp.EBGPMultiHop {
		hops := int32(255)
		spec.EBGPMultihop = &hops
		add("spec.ebgpMultihop", "MetalLB's ebgpMultiHop allows a router any number of hops away")
	}
	if len(sp.NodeSelectors) > 0 {
		sel, exact := mergeSelectors(sp.NodeSelectors)
		spec.NodeSelector = apiSelector(sel)
		if !exact {
			add("spec.nodeSelector", "CHECK: MetalLB peered from nodes matching any of %s; metalvip takes one selector, the first is kept. Give those nodes one common label and select it", formatSelectors(sp.NodeSelectors))
		}
	}
	switch {
	case sp.PasswordSecret.Name != "":
		ns := cmp.Or(sp.PasswordSecret.Namespace, in.Namespace)
		spec.PasswordSecretRef = &v1alpha1.SecretKeyRef{Namespace: passwordNamespace, Name: sp.PasswordSecret.Name, Key: "password"}
		add("spec.passwordSecretRef", "CHECK: the CCM reads passwords only in %s: copy MetalLB's Secret there before applying, or the session stays down:\n"+
			"kubectl -n %s create secret generic %s --from-literal=password=\"$(kubectl -n %s get secret %s -o jsonpath='{.data.password}' | base64 -d)\"",
			passwordNamespace, passwordNamespace, sp.PasswordSecret.Name, ns, sp.PasswordSecret.Name)
		if sp.Password != "" {
			add("spec.passwordSecretRef", "CHECK: MetalLB's BGPPeer also gives a password in plain text; the Secret is used")
		}
	case sp.Password != "":
		name := p.Meta.Name + "-password"
		spec.PasswordSecretRef = &v1alpha1.SecretKeyRef{Namespace: passwordNamespace, Name: name, Key: "password"}
		add("spec.passwordSecretRef", "CHECK: MetalLB's BGPPeer holds the password in plain text (not printed here); put it in a Secret before applying, or the session stays down:\n"+
			"kubectl -n %s create secret generic %s --from-literal=password=\"$(kubectl -n %s get bgppeers.metallb.io %s -o jsonpath='{.spec.password}')\"",
			passwordNamespace, name, in.Namespace, p.Meta.Name)
	}
	if sp.BFDProfile != "" {
		convertBFD(&spec, sp.BFDProfile, in.BFDProfiles, add)
	}
	if sp.SourceAddress != "" {
		add("spec", "CHECK: MetalLB opened the session from %s; metalvip opens it from the node's address towards the router", sp.SourceAddress)
	}
	if sp.RouterID != "" {
		add("spec", "CHECK: MetalLB sent router ID %s; metalvip sends the node's own", sp.RouterID)
	}
	if sp.ConnectTime != nil {
		add("spec", "CHECK: MetalLB's connectTime %s is not kept: metalvip retries with gobgp's defaults", sp.ConnectTime.Duration)
	}
	if sp.VRF != "" {
		add("spec", "CHECK: MetalLB peered in VRF %s; metalvip peers in the nodes' default VRF", sp.VRF)
	}
	if sp.DualStackAddressFamily {
		add("spec", "CHECK: MetalLB carried both address families over this session; metalvip's carries only the family of the router's address: add a BGPPeer at the router's other address for the other family")
	}
	o.Spec = spec
	return o, ""
}

// convertBFD merges a BFD profile into the peer's bfd settings.
func convertBFD(spec *v1alpha1.BGPPeerSpec, name string, profiles []mlbBFDProfile, add func(string, string, ...any)) {
	i := slices.IndexFunc(profiles, func(p mlbBFDProfile) bool { return p.Meta.Name == name })
	if i < 0 {
		add("spec", "CHECK: BFD profile %q does not exist, so MetalLB ran no BFD for this session and neither does metalvip", name)
		return
	}
	if spec.EBGPMultihop != nil {
		add("spec", "CHECK: BFD profile %s left out: metalvip's BFD is single-hop and this router is multihop", name)
		return
	}
	bp := profiles[i].Spec
	bfd := &v1alpha1.BFDSettings{Enabled: true}
	ms := func(v *uint32) *int32 {
		if v == nil {
			return nil
		}
		x := int32(min(*v, 1<<31-1))
		return &x
	}
	bfd.MinRxMilliseconds, bfd.MinTxMilliseconds, bfd.Multiplier = ms(bp.ReceiveInterval), ms(bp.TransmitInterval), ms(bp.DetectMultiplier)
	add("spec.bfd", "from BFD profile %s", name)
	if bp.EchoMode != nil && *bp.EchoMode || bp.EchoInterval != nil {
		add("spec.bfd", "CHECK: the profile's echo mode is not kept: metalvip sends no BFD echo packets")
	}
	if bp.PassiveMode != nil && *bp.PassiveMode {
		add("spec.bfd", "CHECK: the profile is passive; metalvip's BFD sessions are active")
	}
	if bp.MinimumTTL != nil {
		add("spec.bfd", "the profile's minimumTtl applies to multihop sessions only; metalvip's BFD is single-hop")
	}
	spec.BFD = bfd
}

// seconds returns d in whole seconds, and whether it was whole.
func seconds(d time.Duration) (int32, bool) {
	s := d / time.Second
	return int32(min(s, 1<<31-1)), d%time.Second == 0
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}
