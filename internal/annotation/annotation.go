// Package annotation names every Service annotation metalvip reads or writes, its own and the
// MetalLB ones it honours (metallb.go), and parses them, in one place, so that no second
// spelling can exist. It decides which spelling wins and what a value means; it must not
// decide allocations or touch the API.
package annotation

import (
	"fmt"
	"net/netip"
	"strconv"
	"strings"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/validation"
)

// Name is a Service annotation of metalvip.
type Name string

// Annotations a user sets.
const (
	// Pool names the IPPool a Service takes its addresses from.
	Pool Name = "metalvip.io/pool"
	// IPs requests addresses, comma-separated, at most one per family.
	IPs Name = "metalvip.io/ips"
	// SharingKey lets Services with the same key share an address when their ports differ.
	SharingKey Name = "metalvip.io/sharing-key"
	// VIPCount asks for several addresses per family, announced from distinct nodes where
	// enough are eligible, so that DNS round-robin spreads clients over nodes.
	VIPCount Name = "metalvip.io/vip-count"
	// AnnounceExternalIPs: "true" asks metalvip to announce the Service's spec.externalIPs
	// that lie in an IPPool with spec.externalIPs: Allow (any Service type).
	AnnounceExternalIPs Name = "metalvip.io/announce-external-ips"
	// BGPCommunities adds communities to the routes of the Service's BGP addresses,
	// comma-separated "ASN:value": only those its pool lists in announce.bgp.serviceCommunities.
	BGPCommunities Name = "metalvip.io/bgp-communities"
	// Egress: "true" sends the Service's pods' traffic to the outside world from the Service's
	// address, if its pool says spec.egress: Allow (docs/egress.md).
	Egress Name = "metalvip.io/egress"
)

// MaxVIPCount bounds metalvip.io/vip-count.
const MaxVIPCount = 16

// Annotations the controller writes: the record of an allocation beside the Service's status.
const (
	// AllocatedPool names the pool the Service's addresses were given from.
	AllocatedPool Name = "metalvip.io/allocated-pool"
	// AllocatedIPs lists the addresses given, written before the status; when the two differ
	// after a restart, the Service was being moved.
	AllocatedIPs Name = "metalvip.io/allocated-ips"
)

// Value returns the annotation on svc.
func (n Name) Value(svc *v1.Service) (string, bool) {
	v, ok := svc.Annotations[string(n)]
	return v, ok
}

// PoolFromService returns the requested pool, or "": metalvip.io/pool, else MetalLB's
// address-pool (the converter names IPPools as MetalLB named its pools).
func PoolFromService(svc *v1.Service) (string, error) {
	from, v, ok := lookup(svc, Pool)
	if !ok || blankMetalLB(from, v) {
		return "", nil
	}
	v = strings.TrimSpace(v)
	if errs := validation.IsDNS1123Subdomain(v); len(errs) > 0 {
		return "", fmt.Errorf("annotation %s=%q is not an IPPool name: %s", from, v, strings.Join(errs, "; "))
	}
	return v, nil
}

// IPsFromService returns the requested addresses: the metalvip.io/ips annotation (else
// MetalLB's loadBalancerIPs), else spec.loadBalancerIP. Both set and different is an error.
func IPsFromService(svc *v1.Service) ([]netip.Addr, error) {
	var out []netip.Addr
	from, v, ok := lookup(svc, IPs)
	if blankMetalLB(from, v) {
		ok = false
	}
	if ok {
		var err error
		if out, err = ParseIPs(v); err != nil {
			return nil, fmt.Errorf("annotation %s: %w", from, err)
		}
	}
	if lb := strings.TrimSpace(svc.Spec.LoadBalancerIP); lb != "" {
		a, err := parseAddr(lb)
		if err != nil {
			return nil, fmt.Errorf("spec.loadBalancerIP: %w", err)
		}
		if ok && !containsAddr(out, a) {
			return nil, fmt.Errorf("spec.loadBalancerIP %s is not among annotation %s=%q; set one of the two", a, from, v)
		}
		if !ok {
			out = []netip.Addr{a}
		}
	}
	return out, nil
}

// ParseIPs parses a comma-separated list of addresses, at most one per family.
func ParseIPs(v string) ([]netip.Addr, error) {
	var out []netip.Addr
	for part := range strings.SplitSeq(v, ",") {
		part = strings.TrimSpace(part)
		if part == "" {
			continue
		}
		a, err := parseAddr(part)
		if err != nil {
			return nil, err
		}
		for _, o := range out {
			if o.Is4() == a.Is4() {
				return nil, fmt.Errorf("%q lists two %s addresses; give at most one per family", v, family(a))
			}
		}
		out = append(out, a)
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("%q lists no address; write e.g. \"203.0.113.10\" or \"203.0.113.10,2001:db8::10\"", v)
	}
	return out, nil
}

func parseAddr(s string) (netip.Addr, error) {
	a, err := netip.ParseAddr(s)
	if err != nil || a.Zone() != "" {
		return netip.Addr{}, fmt.Errorf("%q is not an IP address", s)
	}
	if a.Is4In6() {
		return netip.Addr{}, fmt.Errorf("%q is an IPv4-mapped IPv6 address; write the IPv4 address", s)
	}
	return a, nil
}

func containsAddr(as []netip.Addr, a netip.Addr) bool {
	for _, x := range as {
		if x == a {
			return true
		}
	}
	return false
}

func family(a netip.Addr) string {
	if a.Is4() {
		return "IPv4"
	}
	return "IPv6"
}

// VIPCountFromService returns how many addresses per family the Service asks for: 1 unless
// metalvip.io/vip-count says otherwise.
func VIPCountFromService(svc *v1.Service) (int, error) {
	v, ok := VIPCount.Value(svc)
	if !ok {
		return 1, nil
	}
	n, err := strconv.Atoi(strings.TrimSpace(v))
	if err != nil || n < 1 || n > MaxVIPCount {
		return 1, fmt.Errorf("annotation %s=%q: the number of addresses per family is a whole number from 1 to %d", VIPCount, v, MaxVIPCount)
	}
	return n, nil
}

// SharingKeyFromService returns the sharing key, or "": metalvip.io/sharing-key, else MetalLB's
// allow-shared-ip, which is never refused (see metalLBSharingKey).
func SharingKeyFromService(svc *v1.Service) (string, error) {
	from, v, ok := lookup(svc, SharingKey)
	if !ok {
		return "", nil
	}
	if isMetalLB(from) {
		key, _ := metalLBSharingKey(v)
		return key, nil
	}
	if errs := validation.IsValidLabelValue(v); len(errs) > 0 || v == "" {
		return "", fmt.Errorf("annotation %s=%q: a sharing key is 1 to 63 letters, digits, '-', '_' or '.', starting and ending with a letter or digit", SharingKey, v)
	}
	return v, nil
}

// FormatIPs writes addresses as AllocatedIPs holds them.
func FormatIPs(ips []netip.Addr) string {
	parts := make([]string, len(ips))
	for i, a := range ips {
		parts[i] = a.String()
	}
	return strings.Join(parts, ",")
}

// BGPCommunitiesFromService returns the communities the Service asks for with BGPCommunities,
// as written (trimmed, empty items dropped); the caller checks them against its pool.
func BGPCommunitiesFromService(svc *v1.Service) []string {
	v, ok := BGPCommunities.Value(svc)
	if !ok {
		return nil
	}
	var out []string
	for _, c := range strings.Split(v, ",") {
		if c = strings.TrimSpace(c); c != "" {
			out = append(out, c)
		}
	}
	return out
}

// EgressFromService reports whether the Service asks for egress through its address
// (metalvip.io/egress "true"); a value other than "true" or "false" is an error.
func EgressFromService(svc *v1.Service) (bool, error) {
	v, ok := Egress.Value(svc)
	if !ok {
		return false, nil
	}
	switch strings.TrimSpace(v) {
	case "true":
		return true, nil
	case "false", "":
		return false, nil
	}
	return false, fmt.Errorf("%s: %q is neither \"true\" nor \"false\"", Egress, truncate(v))
}

// truncate keeps a tenant-written value short enough to quote in an Event.
func truncate(v string) string {
	if len(v) > 64 {
		return v[:64] + "..."
	}
	return v
}
