package main

import (
	"bufio"
	"errors"
	"os"
	"strings"
)

// defaultRouteInterface returns the interface of the IPv4 default route, else of the IPv6 one.
func defaultRouteInterface() (string, error) {
	if f, err := os.Open("/proc/net/route"); err == nil {
		defer f.Close()
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			fields := strings.Fields(sc.Text())
			// Iface Destination Gateway Flags RefCnt Use Metric Mask ...
			if len(fields) >= 8 && fields[1] == "00000000" && fields[7] == "00000000" {
				return fields[0], nil
			}
		}
	}
	if f, err := os.Open("/proc/net/ipv6_route"); err == nil {
		defer f.Close()
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			fields := strings.Fields(sc.Text())
			// dest destlen src srclen nexthop metric refcnt use flags iface
			if len(fields) >= 10 && fields[0] == strings.Repeat("0", 32) && fields[1] == "00" && fields[9] != "lo" {
				return fields[9], nil
			}
		}
	}
	return "", errors.New("no default route to find the interface from; give --interfaces")
}
