package integration

import (
	"fmt"
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/metalvip/metalvip/test/kubeapi"
)

// TestIPPoolCRDVirtualMAC sends pools with announce.l2.virtualMAC straight to the API server:
// the CEL rules alone refuse it with per-client spreading and refuse the addresses that could
// give two of the pool's addresses one MAC; what they accept, the CCM's decoder takes whole.
func TestIPPoolCRDVirtualMAC(t *testing.T) {
	dyn := kubeapi.Get(t).InstallCRDs(t)
	pool := func(addrs, vm string) string {
		return fmt.Sprintf(`{addresses: [%s], announce: {l2: {virtualMAC: %s}}}`, addrs, vm)
	}
	cases := []crdCase{
		{"an IPv4 pool of any size with the default scheme is accepted", pool(`203.0.113.0/24, 198.51.100.0/25, "10.0.0.0-10.255.255.255"`, `{}`), ""},
		{"an IPv6 range within one /88 with scheme Local is accepted",
			pool(`203.0.113.0/24, "2001:db8:100::1:0-2001:db8:100::ff:ffff:ffff"`, `{scheme: Local}`), ""},
		{"an IPv6 /88 with scheme Local is accepted", pool(`"2001:db8:100::/88"`, `{}`), ""},
		{"an IPv6 CIDR wider than a /88 with scheme Local is refused", pool(`"2001:db8:100::/87"`, `{}`), "with scheme Local IPv6 CIDRs of /88 or longer"},
		{"an IPv6 range across two /88s with scheme Local is refused",
			pool(`"2001:db8:100::ff:ffff:fff0-2001:db8:100::100:0:10"`, `{}`), "an IPv6 range must lie in one block: a /88 with scheme Local"},
		{"IPv6 entries in two /88s with scheme Local are refused", pool(`"2001:db8:100::/120", "2001:db8:200::/120"`, `{}`), "give at most one IPv6 entry"},
		{"VRRP addresses of one /24 and one /120 are accepted",
			pool(`"203.0.113.1-203.0.113.100", 203.0.113.128/25, "2001:db8:100::1-2001:db8:100::ff"`, `{scheme: VRRP}`), ""},
		{"a VRRP /24 is refused for its address with last byte 0", pool(`203.0.113.0/24`, `{scheme: VRRP}`), "none ending in .0"},
		{"a VRRP range from a last byte of 0 is refused", pool(`"203.0.113.0-203.0.113.9"`, `{scheme: VRRP}`), "an IPv4 address's last byte is its VRRP ID, 1 to 255"},
		{"a VRRP /120 is refused for its address with last byte 0", pool(`"2001:db8:100::/120"`, `{scheme: VRRP}`), "must not start at one ending in 00"},
		{"a VRRP IPv6 range from ::100 is refused", pool(`"2001:db8:100::100-2001:db8:100::1ff"`, `{scheme: VRRP}`), "must not start at one ending in 00"},
		{"a VRRP IPv6 /121 from ::80 is accepted", pool(`"2001:db8:100::80/121"`, `{scheme: VRRP}`), ""},
		{"a VRRP CIDR wider than a /24 is refused", pool(`203.0.112.0/23`, `{scheme: VRRP}`), "with scheme VRRP give CIDRs of /24 (IPv4) or /120 (IPv6) or longer"},
		{"a VRRP range across two /24s is refused", pool(`"203.0.112.250-203.0.113.5"`, `{scheme: VRRP}`), "the pool's IPv4 addresses must lie in one /24"},
		{"a VRRP IPv6 range across two /120s is refused", pool(`"2001:db8:100::1-2001:db8:100::1:1"`, `{scheme: VRRP}`), "a /120 with scheme VRRP"},
		{"VRRP entries in two /24s are refused", pool(`"203.0.113.1-203.0.113.9", "198.51.100.10-198.51.100.20"`, `{scheme: VRRP}`), "the pool's IPv4 addresses must lie in one /24"},
		{"VRRP IPv6 entries in two /120s are refused", pool(`"2001:db8:100::1-2001:db8:100::9", "2001:db8:100::1:1-2001:db8:100::1:9"`, `{scheme: VRRP}`), "give at most one IPv6 entry"},
		{"an unknown scheme is refused", pool(`203.0.113.0/24`, `{scheme: Hash}`), `Unsupported value: "Hash"`},
		{"virtualMAC with per-client spreading is refused",
			`{addresses: [203.0.113.0/24], announce: {l2: {spreading: PerClient, virtualMAC: {}}}}`, "use one or the other"},
		{"virtualMAC with single spreading is accepted",
			`{addresses: [203.0.113.0/24], announce: {l2: {spreading: Single, virtualMAC: {scheme: Local}}}}`, ""},
		{"virtualMAC on a BGP pool is refused",
			`{addresses: [203.0.113.0/24], announce: {mode: BGP, l2: {virtualMAC: {}}}}`, "l2 options apply only to mode L2"},
		{"wide pools without virtualMAC are still accepted", `{addresses: ["2001:db8::/32", 0.0.0.0/0]}`, ""},
	}
	checkCRDCases(t, dyn, "IPPool", "vmac", cases, acceptedPoolParses)
	t.Run("an empty virtualMAC gets scheme Local", func(t *testing.T) {
		got, err := createSpec(t, dyn, "IPPool", "vmac-default", pool(`203.0.113.0/24`, `{}`))
		if err != nil {
			t.Fatal(err)
		}
		if s, _, _ := unstructured.NestedString(got.Object, "spec", "announce", "l2", "virtualMAC", "scheme"); s != "Local" {
			t.Errorf("scheme %q; want the default Local", s)
		}
	})
}
