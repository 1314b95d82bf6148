package bgp

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"time"

	"github.com/osrg/gobgp/v4/pkg/apiutil"
	"github.com/osrg/gobgp/v4/pkg/packet/bgp"
)

// SetRoutes makes the announced routes exactly routes: it announces new ones, re-announces
// those whose attributes changed and withdraws those no longer listed. Each route goes to
// every session of its address family (IPv4 VIPs on IPv4 sessions, IPv6 on IPv6) with this
// speaker's address on that session as the next hop. Invalid input changes nothing.
func (s *Speaker) SetRoutes(ctx context.Context, routes []Route) error {
	want, err := normalizeRoutes(routes)
	if err != nil {
		return fmt.Errorf("set bgp routes: %w", err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return ErrShutdown
	}

	var (
		gone     []netip.Prefix
		withdraw []*apiutil.Path
	)
	for _, p := range sortedPrefixes(s.routes) {
		if _, keep := want[p]; !keep {
			gone = append(gone, p)
			withdraw = append(withdraw, s.routes[p].path(true, s.bandwidthAS()))
		}
	}
	if len(withdraw) > 0 {
		// gobgp checks every path before it withdraws any: all or nothing.
		if err := s.server.DeletePath(apiutil.DeletePathRequest{Paths: withdraw}); err != nil {
			return fmt.Errorf("withdraw bgp routes %v: %w", gone, err)
		}
		for _, p := range gone {
			delete(s.routes, p)
		}
	}

	var errs []error
	for _, p := range sortedPrefixes(want) {
		r := want[p]
		if have, ok := s.routes[p]; ok && have.equal(r) {
			continue
		}
		if err := ctx.Err(); err != nil {
			return errors.Join(append(errs, fmt.Errorf("set bgp routes: %w", err))...)
		}
		// One path per call: gobgp reports a failed batch without saying which paths made it.
		// Announcing a prefix again replaces the previous attributes (implicit withdraw).
		if _, err := s.server.AddPath(apiutil.AddPathRequest{Paths: []*apiutil.Path{r.path(false, s.bandwidthAS())}}); err != nil {
			errs = append(errs, fmt.Errorf("announce bgp route %s: %w", p, err))
			continue
		}
		s.routes[p] = r
	}
	return errors.Join(errs...)
}

// bandwidthAS is the AS number in the link-bandwidth community: the local ASN, or AS_TRANS
// (23456, RFC 6793) when it needs four octets (the community has two).
func (s *Speaker) bandwidthAS() uint16 {
	if s.cfg.ASN > 65535 {
		return 23456
	}
	return uint16(s.cfg.ASN)
}

// path builds the gobgp path for r; asn goes in its link-bandwidth community. The next hop is unspecified (0.0.0.0 or ::): gobgp
// replaces it with the session's local address on the way out, which is next hop self.
func (r route) path(withdraw bool, asn uint16) *apiutil.Path {
	family := familyOf(r.prefix.Addr())
	nlri, _ := bgp.NewIPAddrPrefix(r.prefix) // cannot fail: the prefix is valid
	attrs := []bgp.PathAttributeInterface{bgp.NewPathAttributeOrigin(bgp.BGP_ORIGIN_ATTR_TYPE_IGP)}
	if family == bgp.RF_IPv4_UC {
		nh, _ := bgp.NewPathAttributeNextHop(netip.IPv4Unspecified())
		attrs = append(attrs, nh)
	} else {
		mp, _ := bgp.NewPathAttributeMpReachNLRI(family, []bgp.PathNLRI{{NLRI: nlri}}, netip.IPv6Unspecified())
		attrs = append(attrs, mp)
	}
	if len(r.values) > 0 {
		attrs = append(attrs, bgp.NewPathAttributeCommunities(slices.Clone(r.values)))
	}
	if len(r.largeValues) > 0 {
		large := make([]*bgp.LargeCommunity, len(r.largeValues))
		for i := range r.largeValues {
			v := r.largeValues[i]
			large[i] = &v
		}
		attrs = append(attrs, bgp.NewPathAttributeLargeCommunities(large))
	}
	switch {
	case r.gshut:
		// RFC 8326: LOCAL_PREF 0 inside the AS (gobgp sends it to iBGP peers only).
		attrs = append(attrs, bgp.NewPathAttributeLocalPref(0))
	case r.localPref != 0:
		attrs = append(attrs, bgp.NewPathAttributeLocalPref(r.localPref))
	}
	if r.weight > 0 {
		attrs = append(attrs, bgp.NewPathAttributeExtendedCommunities([]bgp.ExtendedCommunityInterface{
			bgp.NewLinkBandwidthExtended(asn, float32(r.weight)*BandwidthUnit),
		}))
	}
	return &apiutil.Path{
		Family:     family,
		Nlri:       nlri,
		Attrs:      attrs,
		Age:        time.Now().Unix(),
		Withdrawal: withdraw,
	}
}

func sortedPrefixes[V any](m map[netip.Prefix]V) []netip.Prefix {
	keys := make([]netip.Prefix, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.SortFunc(keys, func(a, b netip.Prefix) int { return a.Addr().Compare(b.Addr()) })
	return keys
}
