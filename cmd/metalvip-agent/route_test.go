package main

import (
	"net"
	"testing"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

func TestDefaultRouteLinkIsTheOneTheKernelUses(t *testing.T) {
	cidr := func(s string) *net.IPNet {
		_, n, err := net.ParseCIDR(s)
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	route := func(dst string, link, metric int) netlink.Route {
		return netlink.Route{Dst: cidr(dst), LinkIndex: link, Priority: metric, Type: unix.RTN_UNICAST}
	}
	unreachable := route("::/0", 1, 0)
	unreachable.Type = unix.RTN_UNREACHABLE
	multipath := netlink.Route{Dst: cidr("0.0.0.0/0"), Type: unix.RTN_UNICAST,
		MultiPath: []*netlink.NexthopInfo{{LinkIndex: 7}, {LinkIndex: 8}}}
	for _, tc := range []struct {
		name   string
		v4, v6 []netlink.Route
		want   int // 0: none
	}{
		{"the IPv4 default route's interface", []netlink.Route{route("10.0.0.0/8", 2, 0), route("0.0.0.0/0", 3, 100)}, nil, 3},
		{"of two default routes the one of lowest metric, not the first listed", []netlink.Route{route("0.0.0.0/0", 3, 600), route("0.0.0.0/0", 4, 100)}, nil, 4},
		{"IPv4's before IPv6's", []netlink.Route{route("0.0.0.0/0", 3, 100)}, []netlink.Route{route("::/0", 5, 0)}, 3},
		{"IPv6's when IPv4 has none", []netlink.Route{route("10.0.0.0/8", 2, 0)}, []netlink.Route{route("2001:db8::/32", 2, 0), route("::/0", 5, 1024)}, 5},
		{"an unreachable default route is none (IPv6's on lo when there is no other)", nil, []netlink.Route{unreachable}, 0},
		{"an unreachable default route of lower metric does not hide a real one", nil, []netlink.Route{unreachable, route("::/0", 5, 1024)}, 5},
		{"a default route netlink gives without Dst counts", []netlink.Route{{LinkIndex: 6, Type: unix.RTN_UNICAST}}, nil, 6},
		{"a multipath default route gives its first next hop's interface", []netlink.Route{multipath}, nil, 7},
		{"only more specific routes: none", []netlink.Route{route("10.0.0.0/8", 2, 0)}, []netlink.Route{route("fe80::/64", 2, 256)}, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, ok := defaultRouteLink(tc.v4, tc.v6)
			if ok != (tc.want != 0) || got != tc.want {
				t.Errorf("defaultRouteLink = %d, %v; want %d", got, ok, tc.want)
			}
		})
	}
}
