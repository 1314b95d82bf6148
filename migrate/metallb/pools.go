package metallb

import (
	"fmt"
	"net/netip"
	"strings"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"

	"github.com/metalvip/metalvip/api/v1alpha1"
)

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
func convertPool(p mlbPool, in Config, l2 []*mlbL2Advertisement, bgp []*mlbBGPAdvertisement, aliases map[string]string, prios map[string]poolPriority) (o Object, skipped string) {
	ref := fmt.Sprintf("IPAddressPool %s/%s", in.Namespace, p.Meta.Name)
	o = Object{Kind: "IPPool", Name: p.Meta.Name}
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
		o.Notes = append(o.Notes, Note{path, fmt.Sprintf(format, args...)})
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
		spec.ServiceAllocation = convertServiceAllocation(sa, in.namespaces, add)
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
		convertBGPAdvertisements(&spec.Announce, bgp, aliases, familiesOf(spec.Addresses), add)
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

// families says which address families a pool's ranges hold: [IPv4, IPv6].
func familiesOf(ranges []v1alpha1.AddressRange) (fams [2]bool) {
	for _, r := range ranges {
		if strings.Contains(string(r), ":") {
			fams[1] = true
		} else {
			fams[0] = true
		}
	}
	return fams
}
