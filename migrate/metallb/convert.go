// Package metallb converts MetalLB's configuration (IPAddressPools, L2Advertisements,
// BGPAdvertisements, BGPPeers, Communities and BFDProfiles in MetalLB's namespace) into
// metalvip's IPPools and BGPPeers, with a note at every field where metalvip cannot do exactly
// what MetalLB did. A note that starts with "CHECK:" changes behaviour; the others explain.
// An IPPool keeps its MetalLB pool's name, so that the metallb.io/address-pool annotation of a
// Service names it.
//
// Convert is pure: MetalLB's objects in, the objects to print out. ReadFiles and ReadCluster
// fill a Config; ReadCluster only lists, and nothing in this package changes a cluster.
// Render prints a Conversion for kubectl apply. metalvipctl migrate metallb is the command.
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

// Note is one remark on a printed object, at a field.
type Note struct {
	Path string // e.g. "spec.announce.nodeSelector"; "" is the whole object
	Text string
}

// Object is an IPPool or a BGPPeer to print.
type Object struct {
	Kind  string // IPPool or BGPPeer
	Name  string
	From  string // the MetalLB objects it was made from, for its head comment
	Spec  any    // v1alpha1.IPPoolSpec or v1alpha1.BGPPeerSpec
	Notes []Note
}

// Conversion is the whole result: the objects to print, and what concerns none of them.
type Conversion struct {
	Namespace string
	Objects   []Object
	// General notes concern no single printed object: MetalLB objects that gave nothing, or
	// that the converter could not fully read.
	General []string
}

// Checks counts the notes that change behaviour.
func (c Conversion) Checks() int {
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

// Convert converts MetalLB's configuration; in is left as it was. passwordNamespace is the
// namespace the CCM reads BGP passwords from. Convert never fails: what it cannot convert is
// a CHECK note, on an object or in General.
func Convert(in Config, passwordNamespace string) Conversion {
	out := Conversion{Namespace: in.Namespace}
	byName := func(a, b mlbMeta) int { return cmp.Compare(a.Name, b.Name) }
	in.pools = slices.SortedFunc(slices.Values(in.pools), func(a, b mlbPool) int { return byName(a.Meta, b.Meta) })
	in.l2 = slices.SortedFunc(slices.Values(in.l2), func(a, b mlbL2Advertisement) int { return byName(a.Meta, b.Meta) })
	in.bgp = slices.SortedFunc(slices.Values(in.bgp), func(a, b mlbBGPAdvertisement) int { return byName(a.Meta, b.Meta) })
	in.peers = slices.SortedFunc(slices.Values(in.peers), func(a, b mlbPeer) int { return byName(a.Meta, b.Meta) })
	in.communities = slices.SortedFunc(slices.Values(in.communities), func(a, b mlbCommunity) int { return byName(a.Meta, b.Meta) })
	in.bfdProfiles = slices.SortedFunc(slices.Values(in.bfdProfiles), func(a, b mlbBFDProfile) int { return byName(a.Meta, b.Meta) })

	if in.lbClass != "" {
		out.General = append(out.General, fmt.Sprintf("CHECK: MetalLB served only Services of loadBalancerClass %q (its --lb-class): give metalvip's CCM the same class (cloud-config services.loadBalancerClass: %s), or those Services get no address from metalvip", in.lbClass, in.lbClass))
	}
	for _, key := range sortedKeys(in.unknown) {
		out.General = append(out.General, fmt.Sprintf("CHECK: %s in %s has fields this converter does not know (a newer MetalLB?), not converted: %s", strings.Replace(key, "/", " ", 1), in.Namespace, strings.Join(in.unknown[key], ", ")))
	}

	aliases := map[string]string{}
	for _, c := range in.communities {
		for _, a := range c.Spec.Communities {
			if prev, ok := aliases[a.Name]; ok && prev != a.Value {
				out.General = append(out.General, fmt.Sprintf("CHECK: community alias %q is defined twice (%s and %s); %s is used", a.Name, prev, a.Value, prev))
				continue
			}
			aliases[a.Name] = a.Value
		}
	}

	l2For, bgpFor := map[string][]*mlbL2Advertisement{}, map[string][]*mlbBGPAdvertisement{}
	for i := range in.l2 {
		ad := &in.l2[i]
		names, problems := selectPools(ad.Spec.mlbPoolSelection, in.pools)
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
	for i := range in.bgp {
		ad := &in.bgp[i]
		names, problems := selectPools(ad.Spec.mlbPoolSelection, in.pools)
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

	prios := poolPriorities(in.pools)
	for _, p := range in.pools {
		o, skipped := convertPool(p, in, l2For[p.Meta.Name], bgpFor[p.Meta.Name], aliases, prios)
		if skipped != "" {
			out.General = append(out.General, "CHECK: "+skipped)
			continue
		}
		if probs := pools.DecodePool(&v1alpha1.IPPool{ObjectMeta: metav1.ObjectMeta{Name: o.Name}, Spec: o.Spec.(v1alpha1.IPPoolSpec)}).Problems; len(probs) > 0 {
			o.Notes = append(o.Notes, Note{"", "CHECK: metalvip will not use this pool as printed: " + pools.Problems(probs)})
		}
		out.Objects = append(out.Objects, o)
	}
	var everywhere []string
	for _, o := range out.Objects {
		if slices.ContainsFunc(o.Notes, func(n Note) bool { return n.Text == everyInterface }) {
			everywhere = append(everywhere, o.Name)
		}
	}
	if len(everywhere) > 0 {
		out.General = append(out.General, fmt.Sprintf("CHECK: MetalLB answered ARP and NDP for %s on every interface of a node; metalvip answers only on each agent's --interfaces, by default the interface of the node's default route. If clients reach the nodes through another interface, list it in the pool's spec.announce.l2.interfaces or in the agents' --interfaces", strings.Join(everywhere, ", ")))
	}
	for _, p := range in.peers {
		o, skipped := convertPeer(p, in, passwordNamespace)
		if skipped != "" {
			out.General = append(out.General, "CHECK: "+skipped)
			continue
		}
		if probs := pools.DecodePeer(&v1alpha1.BGPPeer{ObjectMeta: metav1.ObjectMeta{Name: o.Name}, Spec: o.Spec.(v1alpha1.BGPPeerSpec)}).Problems; len(probs) > 0 {
			o.Notes = append(o.Notes, Note{"", "CHECK: metalvip will not use this peer as printed: " + pools.Problems(probs)})
		}
		out.Objects = append(out.Objects, o)
	}
	return out
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}
