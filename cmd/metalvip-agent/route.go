package main

import (
	"errors"
	"fmt"
	"net"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// defaultRouteInterface returns the interface of the IPv4 default route, else of the IPv6 one.
func defaultRouteInterface() (string, error) {
	var byFamily [2][]netlink.Route
	for i, family := range []int{netlink.FAMILY_V4, netlink.FAMILY_V6} {
		routes, err := netlink.RouteList(nil, family)
		if err != nil {
			return "", fmt.Errorf("cannot list the routes to find the default one (%w); give --interfaces", err)
		}
		byFamily[i] = routes
	}
	index, ok := defaultRouteLink(byFamily[0], byFamily[1])
	if !ok {
		return "", errors.New("no default route to find the interface from; give --interfaces")
	}
	ifi, err := net.InterfaceByIndex(index)
	if err != nil {
		return "", fmt.Errorf("the default route's interface (index %d): %w; give --interfaces", index, err)
	}
	return ifi.Name, nil
}

// defaultRouteLink returns the interface index of the default route the kernel uses, IPv4's
// if there is one, else IPv6's: among the main table's unicast default routes (not an
// unreachable or blackhole one), the one of lowest metric; for a multipath route, its first
// next hop's interface.
func defaultRouteLink(v4, v6 []netlink.Route) (int, bool) {
	for _, routes := range [][]netlink.Route{v4, v6} {
		best, found := 0, false
		var metric int
		for _, r := range routes {
			link := routeLink(r)
			if !isDefault(r.Dst) || r.Type != unix.RTN_UNICAST || link == 0 {
				continue
			}
			if !found || r.Priority < metric {
				best, metric, found = link, r.Priority, true
			}
		}
		if found {
			return best, true
		}
	}
	return 0, false
}

// isDefault reports whether dst is 0.0.0.0/0 or ::/0; netlink leaves it nil for a default
// route in some versions.
func isDefault(dst *net.IPNet) bool {
	if dst == nil {
		return true
	}
	ones, _ := dst.Mask.Size()
	return ones == 0
}

func routeLink(r netlink.Route) int {
	if r.LinkIndex > 0 {
		return r.LinkIndex
	}
	for _, nh := range r.MultiPath {
		if nh.LinkIndex > 0 {
			return nh.LinkIndex
		}
	}
	return 0
}
