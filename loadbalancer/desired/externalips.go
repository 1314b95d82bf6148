package desired

import (
	"fmt"
	"net/netip"
	"slices"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/labels"

	"github.com/metalvip/metalvip/internal/annotation"
	"github.com/metalvip/metalvip/loadbalancer/ipam"
	"github.com/metalvip/metalvip/loadbalancer/pools"
)

// ExternalIPRefusal is one spec.externalIPs entry metalvip does not announce, and why.
type ExternalIPRefusal struct {
	IP     string
	Reason string // for the Service's owner: names no Service of another namespace
	Holder string // the LoadBalancer Service holding the address, if that is why: for the log
}

// WantsExternalIPs reports whether a Service asks for its spec.externalIPs to be announced
// (annotation metalvip.io/announce-external-ips: "true") and is not another implementation's
// (a loadBalancerClass not metalvip's).
func (s Serves) WantsExternalIPs(svc *v1.Service) bool {
	if v, _ := annotation.AnnounceExternalIPs.Value(svc); v != "true" || len(svc.Spec.ExternalIPs) == 0 {
		return false
	}
	if c := svc.Spec.LoadBalancerClass; c != nil && svc.Spec.Type == v1.ServiceTypeLoadBalancer && *c != s.Class {
		return false
	}
	return true
}

// ExternalIPs decides which of a Service's spec.externalIPs are announced: those inside a
// valid pool that allows externalIPs (spec.externalIPs: Allow) and whose serviceAllocation
// admits the Service, and that no LoadBalancer Service holds (heldBy returns its key, or "";
// the reason names it only when it is in the Service's namespace).
// Anyone who may edit a Service may write any address there, so everything else is refused
// with the reason. A Service that does not ask (WantsExternalIPs) gets neither.
func (s Serves) ExternalIPs(svc *v1.Service, set *pools.Set, heldBy func(netip.Addr) string) ([]netip.Addr, []ExternalIPRefusal) {
	if !s.WantsExternalIPs(svc) {
		return nil, nil
	}
	var ok []netip.Addr
	var refused []ExternalIPRefusal
	no := func(ip, format string, args ...any) {
		refused = append(refused, ExternalIPRefusal{IP: ip, Reason: fmt.Sprintf(format, args...)})
	}
	// Only a LoadBalancer Service has its externalIPs announced: a ResourceQuota counts it
	// (services.loadbalancers), and it carries at most annotation.MaxVIPCount of them, as a
	// Service's own addresses. A ClusterIP Service took pool addresses no quota counted
	// (issue 30, fault 8).
	lb := svc.Spec.Type == v1.ServiceTypeLoadBalancer
	for _, raw := range svc.Spec.ExternalIPs {
		ip, err := netip.ParseAddr(raw)
		if err != nil {
			no(raw, "not an IP address")
			continue
		}
		ip = ip.Unmap()
		p := set.PoolOf(ip)
		switch {
		case slices.Contains(ok, ip):
			continue
		case !lb:
			no(raw, "the Service is of type %s: only a LoadBalancer Service has its externalIPs announced (a ResourceQuota counts it under services.loadbalancers)", svc.Spec.Type)
		case len(ok) >= annotation.MaxVIPCount:
			no(raw, "the Service has %d externalIPs announced already, the most a Service has", annotation.MaxVIPCount)
		case p == nil:
			no(raw, "in no IPPool; only addresses of a pool with spec.externalIPs: Allow are announced")
		case !p.Valid():
			no(raw, "IPPool %s is invalid: %s", p.Name, pools.Problems(p.Problems))
		case !p.Announce.ExternalIPs:
			no(raw, "IPPool %s does not lend its addresses as externalIPs; its owner may set spec.externalIPs: Allow", p.Name)
		case len(p.Allocation.Namespaces) > 0 && !slices.Contains(p.Allocation.Namespaces, svc.Namespace):
			no(raw, "IPPool %s serves only namespaces %v", p.Name, p.Allocation.Namespaces)
		case p.Allocation.NamespaceSelector != nil:
			// The announcer does not watch Namespaces: fail closed rather than guess.
			no(raw, "IPPool %s limits Services by namespaceSelector, which externalIPs are not checked against; give the pool serviceAllocation.namespaces instead", p.Name)
		case p.Allocation.ServiceSelector != nil && !p.Allocation.ServiceSelector.Matches(labels.Set(svc.Labels)):
			no(raw, "IPPool %s's serviceSelector does not select this Service", p.Name)
		case heldBy(ip) != "":
			no(raw, "it is the LoadBalancer address of %s; a LoadBalancer address is never announced as another Service's externalIP", ipam.NameFor(heldBy(ip), svc.Namespace))
			refused[len(refused)-1].Holder = heldBy(ip)
		default:
			ok = append(ok, ip)
		}
	}
	return ok, refused
}

// ServicePrefixes returns the aggregates a node advertises: the serviceCIDRs of every valid
// peer that selects it, once each, sorted.
func ServicePrefixes(node *v1.Node, set *pools.Set) []string {
	var out []netip.Prefix
	for _, p := range set.Peers() {
		if !p.Selects(node.Labels) {
			continue
		}
		for _, c := range p.ServiceCIDRs {
			if !slices.Contains(out, c) {
				out = append(out, c)
			}
		}
	}
	slices.SortFunc(out, func(a, b netip.Prefix) int {
		if c := a.Addr().Compare(b.Addr()); c != 0 {
			return c
		}
		return a.Bits() - b.Bits()
	})
	strs := make([]string, len(out))
	for i, p := range out {
		strs[i] = p.String()
	}
	return strs
}
