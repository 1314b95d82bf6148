package pools

import (
	"fmt"
	"net/netip"
	"strings"
	"testing"
	"time"

	"pgregory.net/rapid"

	"github.com/metalvip/metalvip/api/v1alpha1"
	"github.com/metalvip/metalvip/loadbalancer/ipam"
)

func vmacPool(name string, age time.Duration, scheme v1alpha1.VirtualMACScheme, as ...string) *v1alpha1.IPPool {
	return pool(name, age, v1alpha1.IPPoolSpec{Addresses: addrs(as...), Announce: v1alpha1.Announce{
		Mode: v1alpha1.AnnounceL2, L2: &v1alpha1.L2Announce{VirtualMAC: &v1alpha1.VirtualMAC{Scheme: scheme}}}})
}

func TestAnAddressesVirtualMACIsMadeOfItsLastBytes(t *testing.T) {
	for _, tc := range []struct {
		scheme v1alpha1.VirtualMACScheme
		addr   string
		want   string
	}{
		{v1alpha1.VirtualMACLocal, "203.0.113.5", "02:00:cb:00:71:05"},
		{v1alpha1.VirtualMACLocal, "198.51.100.255", "02:00:c6:33:64:ff"},
		{v1alpha1.VirtualMACLocal, "2001:db8::5", "06:00:00:00:00:05"},
		{v1alpha1.VirtualMACLocal, "2001:db8:100::12:3456:789a", "06:12:34:56:78:9a"},
		{v1alpha1.VirtualMACVRRP, "203.0.113.7", "00:00:5e:00:01:07"},
		{v1alpha1.VirtualMACVRRP, "2001:db8:100::ff", "00:00:5e:00:02:ff"},
		{v1alpha1.VirtualMACLocal, "::ffff:203.0.113.5", "02:00:cb:00:71:05"},
	} {
		t.Run(fmt.Sprintf("%s under %s is %s", tc.addr, tc.scheme, tc.want), func(t *testing.T) {
			got := VirtualMAC(tc.scheme, netip.MustParseAddr(tc.addr))
			if got.String() != tc.want {
				t.Errorf("got %s", got)
			}
			if got[0]&1 != 0 {
				t.Errorf("%s is a multicast MAC", got)
			}
		})
	}
}

func TestAPoolGivesVirtualMACsOnlyWhenAskedAndValid(t *testing.T) {
	a := netip.MustParseAddr("203.0.113.5")
	if got := DecodePool(pool("plain", 0, v1alpha1.IPPoolSpec{Addresses: addrs("203.0.113.0/24")})).VirtualMAC(a); got != "" {
		t.Errorf("a pool without virtualMAC gives %q", got)
	}
	if got := DecodePool(vmacPool("vmac", 0, "", "203.0.113.0/24")).VirtualMAC(a); got != "02:00:cb:00:71:05" {
		t.Errorf("a pool with virtualMAC {} (stored before defaulting) gives %q, want the Local scheme's", got)
	}
	bad := DecodePool(vmacPool("bad", 0, v1alpha1.VirtualMACVRRP, "203.0.113.0/24"))
	if bad.Valid() || bad.VirtualMAC(a) != "" {
		t.Errorf("an invalid pool: valid %v, MAC %q", bad.Valid(), bad.VirtualMAC(a))
	}
	var nothing *Pool
	if nothing.VirtualMAC(a) != "" {
		t.Error("no pool gives a MAC")
	}
}

func TestAPoolWhoseAddressesCouldShareAMACIsRefused(t *testing.T) {
	for _, tc := range []struct {
		name   string
		scheme v1alpha1.VirtualMACScheme
		addrs  []string
		want   string // "" for valid
	}{
		{"IPv4 of any size with Local is fine", v1alpha1.VirtualMACLocal, []string{"10.0.0.0/8", "203.0.113.0/24"}, ""},
		{"one IPv6 /88 with Local is fine", v1alpha1.VirtualMACLocal, []string{"2001:db8:100::/88"}, ""},
		{"an IPv6 /87 with Local is refused", v1alpha1.VirtualMACLocal, []string{"2001:db8:100::/87"}, "spec.addresses[0]: 2001:db8:100::/87 does not lie in one /88"},
		{"IPv6 in two /88s with Local is refused", v1alpha1.VirtualMACLocal, []string{"2001:db8:100::/120", "2001:db8:200::/120"}, "spec.addresses[1]: 2001:db8:200::/120 is not in the /88 of the pool's other IPv6 addresses"},
		{"VRRP in one /24 and one /120 is fine", v1alpha1.VirtualMACVRRP, []string{"203.0.113.1-203.0.113.99", "203.0.113.128/25", "2001:db8:100::80/121"}, ""},
		{"a VRRP /24 is refused for .0", v1alpha1.VirtualMACVRRP, []string{"203.0.113.0/24"}, "spec.addresses[0]: 203.0.113.0/24 holds 203.0.113.0, whose last byte 0 is no VRRP ID"},
		{"a VRRP range across /24s is refused", v1alpha1.VirtualMACVRRP, []string{"203.0.112.200-203.0.113.5"}, "does not lie in one /24"},
		{"VRRP in two /24s is refused", v1alpha1.VirtualMACVRRP, []string{"203.0.113.1-203.0.113.9", "198.51.100.1-198.51.100.9"}, "is not in the /24 of the pool's other IPv4 addresses (203.0.113.0/24)"},
		{"a VRRP IPv6 range from ::100 is refused", v1alpha1.VirtualMACVRRP, []string{"2001:db8:100::100-2001:db8:100::1ff"}, "whose last byte 0 is no VRRP ID"},
		{"an unknown scheme is refused", "Hash", []string{"203.0.113.0/24"}, `spec.announce.l2.virtualMAC.scheme: "Hash"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := DecodePool(vmacPool("p", 0, tc.scheme, tc.addrs...))
			got := Problems(p.Problems)
			if tc.want == "" && got != "" || tc.want != "" && !strings.Contains(got, tc.want) {
				t.Errorf("problems %q; want %q", got, tc.want)
			}
		})
	}
	t.Run("with per-client spreading it is refused", func(t *testing.T) {
		ip := vmacPool("p", 0, v1alpha1.VirtualMACLocal, "203.0.113.0/24")
		ip.Spec.Announce.L2.Spreading = v1alpha1.SpreadPerClient
		if got := Problems(DecodePool(ip).Problems); !strings.Contains(got, "spec.announce.l2.virtualMAC: a virtual MAC is on one node at a time") {
			t.Errorf("problems %q", got)
		}
	})
}

func TestTheNewerOfTwoPoolsGivingOneMACIsNotUsed(t *testing.T) {
	for _, tc := range []struct {
		name     string
		older    *v1alpha1.IPPool
		newer    *v1alpha1.IPPool
		conflict string // a substring of the newer pool's problem, "" for none
	}{
		{"VRRP pools in two /24s with shared last bytes",
			vmacPool("old", time.Hour, v1alpha1.VirtualMACVRRP, "203.0.113.1-203.0.113.20"),
			vmacPool("new", 0, v1alpha1.VirtualMACVRRP, "198.51.100.10-198.51.100.30"),
			"198.51.100.10 would get the MAC 00:00:5e:00:01:0a of 203.0.113.10 in the older pool old"},
		{"VRRP pools in two /24s with distinct last bytes",
			vmacPool("old", time.Hour, v1alpha1.VirtualMACVRRP, "203.0.113.1-203.0.113.20"),
			vmacPool("new", 0, v1alpha1.VirtualMACVRRP, "198.51.100.21-198.51.100.30"), ""},
		{"VRRP pools overlapping in one /24 (the same addresses, not a shared MAC)",
			vmacPool("old", time.Hour, v1alpha1.VirtualMACVRRP, "203.0.113.1-203.0.113.20"),
			vmacPool("new", 0, v1alpha1.VirtualMACVRRP, "203.0.113.10-203.0.113.30"), ""},
		{"an IPv4 VRRP pool and an IPv6 one with the same last bytes",
			vmacPool("old", time.Hour, v1alpha1.VirtualMACVRRP, "203.0.113.1-203.0.113.20"),
			vmacPool("new", 0, v1alpha1.VirtualMACVRRP, "2001:db8:100::1-2001:db8:100::20"), ""},
		{"a VRRP pool and a Local one", vmacPool("old", time.Hour, v1alpha1.VirtualMACVRRP, "203.0.113.1-203.0.113.20"),
			vmacPool("new", 0, v1alpha1.VirtualMACLocal, "198.51.100.0/24"), ""},
		{"Local IPv4 pools never share", vmacPool("old", time.Hour, v1alpha1.VirtualMACLocal, "203.0.113.0/24"),
			vmacPool("new", 0, v1alpha1.VirtualMACLocal, "198.51.100.0/24"), ""},
		{"Local IPv6 pools in two /88s with shared last 40 bits",
			vmacPool("old", time.Hour, v1alpha1.VirtualMACLocal, "2001:db8:100::/120"),
			vmacPool("new", 0, v1alpha1.VirtualMACLocal, "2001:db8:200::80/121"),
			"2001:db8:200::80 would get the MAC 06:00:00:00:00:80 of 2001:db8:100::80 in the older pool old"},
		{"Local IPv6 pools in two /88s with distinct last 40 bits",
			vmacPool("old", time.Hour, v1alpha1.VirtualMACLocal, "2001:db8:100::/120"),
			vmacPool("new", 0, v1alpha1.VirtualMACLocal, "2001:db8:200::100/120"), ""},
		{"a pool without virtual MACs shares nothing", vmacPool("old", time.Hour, v1alpha1.VirtualMACVRRP, "203.0.113.1-203.0.113.20"),
			pool("new", 0, v1alpha1.IPPoolSpec{Addresses: addrs("198.51.100.0/24")}), ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			old, nw := DecodePool(tc.older), DecodePool(tc.newer)
			if !old.Valid() || !nw.Valid() {
				t.Fatalf("decoded: %v; %v", old.Problems, nw.Problems)
			}
			// In either order: age decides.
			for _, in := range [][]*Pool{{old, nw}, {nw, old}} {
				set := NewSet(in, nil)
				got := Problems(set.Pool("new").Problems)
				if tc.conflict == "" && got != "" || tc.conflict != "" && !strings.Contains(got, tc.conflict) {
					t.Errorf("newer pool's problems %q; want %q", got, tc.conflict)
				}
				if !set.Pool("old").Valid() {
					t.Errorf("the older pool lost: %v", set.Pool("old").Problems)
				}
			}
			if !nw.Valid() {
				t.Error("NewSet changed the decoded pool it was given")
			}
		})
	}
}

// TestNoTwoAddressesOfValidPoolsShareAMAC draws pools with virtual MACs whose blocks and
// positions often collide, and checks over every address they give out that no MAC is
// shared, and that every pool refused for a shared MAC had one.
func TestNoTwoAddressesOfValidPoolsShareAMAC(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		n := rapid.IntRange(1, 6).Draw(t, "pools")
		var ps []*Pool
		for i := range n {
			scheme := rapid.SampledFrom([]v1alpha1.VirtualMACScheme{v1alpha1.VirtualMACLocal, v1alpha1.VirtualMACVRRP}).Draw(t, "scheme")
			var as []string
			for range rapid.IntRange(1, 2).Draw(t, "ranges") {
				lo := rapid.IntRange(0, 40).Draw(t, "lo")
				hi := lo + rapid.IntRange(0, 20).Draw(t, "len")
				if rapid.Bool().Draw(t, "v6") {
					blk := rapid.SampledFrom([]string{"2001:db8:100::", "2001:db8:200::", "2001:db8:100::1:0:0:"}).Draw(t, "v6 block")
					as = append(as, fmt.Sprintf("%s%x-%s%x", blk, lo, blk, hi))
				} else {
					blk := rapid.SampledFrom([]string{"203.0.113.", "198.51.100."}).Draw(t, "v4 block")
					as = append(as, fmt.Sprintf("%s%d-%s%d", blk, lo, blk, hi))
				}
			}
			ps = append(ps, DecodePool(vmacPool(fmt.Sprintf("p%d", i), time.Duration(n-i)*time.Minute, scheme, as...)))
		}
		set := NewSet(ps, nil)
		type holder struct {
			addr netip.Addr
			pool string
		}
		byMAC := map[string]holder{}
		var refused []*Pool
		for _, p := range set.Pools() {
			if !p.Valid() {
				if strings.Contains(Problems(p.Problems), "in the older pool") {
					refused = append(refused, p)
				}
				continue
			}
			for _, a := range addresses(p.Allocation.Ranges) {
				mac := p.VirtualMAC(a)
				if h, ok := byMAC[mac]; ok && h.addr != a {
					t.Fatalf("%s (%s) and %s (%s) share %s", a, p.Name, h.addr, h.pool, mac)
				}
				byMAC[mac] = holder{a, p.Name}
			}
		}
		for _, p := range refused {
			alone := DecodePool(vmacPool(p.Name, 0, p.Announce.MACScheme, rangesOf(p)...))
			found := false
			for _, a := range addresses(alone.Allocation.Ranges) {
				if h, ok := byMAC[alone.VirtualMAC(a)]; ok && h.addr != a {
					found = true
				}
			}
			if !found {
				t.Fatalf("%s refused (%s) though none of its addresses shares a MAC with a used pool", p.Name, Problems(p.Problems))
			}
		}
	})
}

func addresses(rs []ipam.Range) []netip.Addr {
	var out []netip.Addr
	for _, r := range rs {
		for a := r.First; a.Compare(r.Last) <= 0; a = a.Next() {
			out = append(out, a)
		}
	}
	return out
}

func rangesOf(p *Pool) []string {
	var out []string
	for _, r := range p.Allocation.Ranges {
		out = append(out, r.First.String()+"-"+r.Last.String())
	}
	return out
}
