package announcer

import (
	"net/netip"
	"slices"
)

// shown indexes which addresses each Service shows (its status, and its externalIPs
// announced) and which Services show each address (several share one). It owns that and
// nothing else; only the loop calls it.
type shown struct {
	addrs    map[string][]netip.Addr // Service -> the addresses it shows
	services map[netip.Addr][]string // address -> the Services showing it, sorted
}

func newShown() shown {
	return shown{addrs: map[string][]netip.Addr{}, services: map[netip.Addr][]string{}}
}

// set records that the Service key shows now (none: nothing, or it is gone), and returns
// every address it showed or shows: their plan may change.
func (x *shown) set(key string, now []netip.Addr) (touched []netip.Addr) {
	for _, ip := range x.addrs[key] {
		touched = append(touched, ip)
		if !slices.Contains(now, ip) {
			x.services[ip] = slices.DeleteFunc(x.services[ip], func(k string) bool { return k == key })
			if len(x.services[ip]) == 0 {
				delete(x.services, ip)
			}
		}
	}
	for _, ip := range now {
		if !slices.Contains(touched, ip) {
			touched = append(touched, ip)
		}
		if !slices.Contains(x.services[ip], key) {
			x.services[ip] = append(x.services[ip], key)
			slices.Sort(x.services[ip])
		}
	}
	if len(now) == 0 {
		delete(x.addrs, key)
	} else {
		x.addrs[key] = slices.Clone(now)
	}
	return touched
}
