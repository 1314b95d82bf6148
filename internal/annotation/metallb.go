package annotation

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"slices"
	"strings"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/validation"
)

// MetalLB's Service annotations, honoured when metalvip's own are absent so that a chart
// written for MetalLB gets the pool, addresses and sharing it asks for. MetalLB reads the
// metallb.io spelling first, then the older metallb.universe.tf one; so does metalvip, after
// its own.
const (
	MetalLBAddressPool     Name = "metallb.io/address-pool"
	MetalLBLoadBalancerIPs Name = "metallb.io/loadBalancerIPs"
	MetalLBAllowSharedIP   Name = "metallb.io/allow-shared-ip"
	// MetalLBIPAllocatedFromPool is MetalLB's record of the pool it gave the address from.
	// metalvip keeps its own record (AllocatedPool) and never reads this one.
	MetalLBIPAllocatedFromPool Name = "metallb.io/ip-allocated-from-pool"

	MetalLBLegacyAddressPool         Name = "metallb.universe.tf/address-pool"
	MetalLBLegacyLoadBalancerIPs     Name = "metallb.universe.tf/loadBalancerIPs"
	MetalLBLegacyAllowSharedIP       Name = "metallb.universe.tf/allow-shared-ip"
	MetalLBLegacyIPAllocatedFromPool Name = "metallb.universe.tf/ip-allocated-from-pool"
)

// The prefixes of MetalLB's annotations: any other annotation under them is one metalvip does
// not know, and Warnings says so.
const (
	metalLBPrefix       = "metallb.io/"
	metalLBLegacyPrefix = "metallb.universe.tf/"
)

// spellings lists, for each annotation a user sets, every name it may be written under, the
// one that wins first. metalvip's own always wins.
var spellings = map[Name][]Name{
	Pool:       {Pool, MetalLBAddressPool, MetalLBLegacyAddressPool},
	IPs:        {IPs, MetalLBLoadBalancerIPs, MetalLBLegacyLoadBalancerIPs},
	SharingKey: {SharingKey, MetalLBAllowSharedIP, MetalLBLegacyAllowSharedIP},
}

// informational are MetalLB's records: they request nothing.
var informational = []Name{MetalLBIPAllocatedFromPool, MetalLBLegacyIPAllocatedFromPool}

// lookup returns the spelling of n that decides, and its value. ok is false when none is set.
func lookup(svc *v1.Service, n Name) (from Name, value string, ok bool) {
	for _, s := range spellings[n] {
		if v, ok := s.Value(svc); ok {
			return s, v, true
		}
	}
	return n, "", false
}

// isMetalLB reports whether n is one of MetalLB's spellings.
func isMetalLB(n Name) bool {
	return strings.HasPrefix(string(n), metalLBPrefix) || strings.HasPrefix(string(n), metalLBLegacyPrefix)
}

// blankMetalLB reports a MetalLB spelling set to nothing, which MetalLB reads as no request
// (charts often template these annotations with empty defaults).
func blankMetalLB(from Name, v string) bool {
	return isMetalLB(from) && strings.TrimSpace(v) == ""
}

// metalLBSharingKey turns MetalLB's allow-shared-ip value into a metalvip sharing key. MetalLB
// takes any string and compares values for equality; metalvip's keys are label values. A value
// that is one already is kept, so a MetalLB Service and a metalvip Service with the same key
// share; any other is replaced by a label value derived from it, so Services that MetalLB let
// share still share. An empty value is no key, as in MetalLB.
func metalLBSharingKey(v string) (key string, derived bool) {
	if v == "" {
		return "", false
	}
	if len(validation.IsValidLabelValue(v)) == 0 {
		return v, false
	}
	sum := sha256.Sum256([]byte(v))
	return "metallb-" + hex.EncodeToString(sum[:12]), true
}

// sameRequest reports whether two spellings of one annotation ask for the same thing, so that
// setting both is no conflict.
func sameRequest(n Name, a, b string) bool {
	switch n {
	case IPs:
		x, errX := ParseIPs(a)
		y, errY := ParseIPs(b)
		if errX != nil || errY != nil || len(x) != len(y) {
			return strings.TrimSpace(a) == strings.TrimSpace(b)
		}
		for _, ip := range x {
			if !containsAddr(y, ip) {
				return false
			}
		}
		return true
	case SharingKey:
		ka, _ := sharingKeyOf(n, a)
		kb, _ := sharingKeyOf(n, b)
		return ka == kb
	default:
		return strings.TrimSpace(a) == strings.TrimSpace(b)
	}
}

// sharingKeyOf is the key a spelling's value stands for.
func sharingKeyOf(from Name, v string) (string, bool) {
	if isMetalLB(from) {
		return metalLBSharingKey(v)
	}
	return v, false
}

// Warnings lists what metalvip does not honour among a Service's annotations, one sentence
// each with what to do, sorted: a MetalLB annotation overruled by another spelling that
// differs, a MetalLB sharing key that had to be rewritten, MetalLB's own records, and any other
// annotation under MetalLB's prefixes. Errors in the annotations that decide are not listed
// here: PoolFromService, IPsFromService and SharingKeyFromService return them.
func Warnings(svc *v1.Service) []string {
	var out []string
	for _, n := range []Name{Pool, IPs, SharingKey} {
		from, won, ok := lookup(svc, n)
		if !ok {
			continue
		}
		for _, s := range spellings[n] {
			v, set := s.Value(svc)
			if !set || s == from || sameRequest(n, won, v) {
				continue
			}
			out = append(out, fmt.Sprintf("annotation %s=%q is ignored: %s=%q is set and wins; remove one of the two", s, v, from, won))
		}
		if n == SharingKey && isMetalLB(from) {
			if key, derived := metalLBSharingKey(won); derived {
				out = append(out, fmt.Sprintf("annotation %s=%q is not a valid sharing key (1 to 63 letters, digits, '-', '_' or '.'); it is honoured as sharing key %q, which Services with the same value share; set %s to a valid key on all of them to choose its name", from, won, key, SharingKey))
			}
		}
	}
	known := map[Name]bool{}
	for _, ss := range spellings {
		for _, s := range ss {
			known[s] = true
		}
	}
	for k := range svc.Annotations {
		n := Name(k)
		switch {
		case known[n] || !isMetalLB(n):
		case slices.Contains(informational, n):
			out = append(out, fmt.Sprintf("annotation %s is MetalLB's record of where the address came from and has no effect on metalvip, which keeps its own in %s; remove it once MetalLB is gone", n, AllocatedPool))
		default:
			out = append(out, fmt.Sprintf("annotation %s is MetalLB's and not one metalvip knows; it has no effect (metalvip honours %s, %s and %s)", n, MetalLBAddressPool, MetalLBLoadBalancerIPs, MetalLBAllowSharedIP))
		}
	}
	slices.Sort(out)
	return out
}
