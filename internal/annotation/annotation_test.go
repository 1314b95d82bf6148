package annotation

import (
	"net/netip"
	"slices"
	"strings"
	"testing"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

func service(ann map[string]string, lbIP string) *v1.Service {
	return &v1.Service{ObjectMeta: metav1.ObjectMeta{Annotations: ann}, Spec: v1.ServiceSpec{LoadBalancerIP: lbIP}}
}

func TestIPsFromService(t *testing.T) {
	for _, tc := range []struct {
		name string
		ann  string // "" means absent
		lbIP string
		want string
		err  string
	}{
		{name: "nothing requested", want: ""},
		{name: "one address", ann: "203.0.113.10", want: "203.0.113.10"},
		{name: "one per family, spaces allowed", ann: " 203.0.113.10 , 2001:db8::10 ", want: "203.0.113.10,2001:db8::10"},
		{name: "spec.loadBalancerIP alone", lbIP: "203.0.113.11", want: "203.0.113.11"},
		{name: "both agreeing", ann: "203.0.113.11", lbIP: "203.0.113.11", want: "203.0.113.11"},
		{name: "both disagreeing", ann: "203.0.113.10", lbIP: "203.0.113.11", err: "set one of the two"},
		{name: "two of a family", ann: "203.0.113.1,203.0.113.2", err: "two IPv4 addresses"},
		{name: "not an address", ann: "203.0.113.300", err: `"203.0.113.300" is not an IP address`},
		{name: "a CIDR", ann: "203.0.113.0/24", err: "is not an IP address"},
		{name: "empty", ann: " , ", err: "lists no address"},
		{name: "mapped", ann: "::ffff:203.0.113.1", err: "IPv4-mapped"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ann := map[string]string{}
			if tc.ann != "" {
				ann[string(IPs)] = tc.ann
			}
			got, err := IPsFromService(service(ann, tc.lbIP))
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("err = %v, want %q", err, tc.err)
				}
				return
			}
			if err != nil || FormatIPs(got) != tc.want {
				t.Fatalf("got %v, %v; want %q", got, err, tc.want)
			}
		})
	}
}

func TestPoolAndSharingKey(t *testing.T) {
	s := service(map[string]string{string(Pool): "edge-pool", string(SharingKey): "dns"}, "")
	if p, err := PoolFromService(s); err != nil || p != "edge-pool" {
		t.Errorf("pool = %q, %v", p, err)
	}
	if k, err := SharingKeyFromService(s); err != nil || k != "dns" {
		t.Errorf("sharing key = %q, %v", k, err)
	}
	bad := service(map[string]string{string(Pool): "Edge Pool", string(SharingKey): "a key"}, "")
	if _, err := PoolFromService(bad); err == nil || !strings.Contains(err.Error(), string(Pool)) {
		t.Errorf("bad pool name accepted: %v", err)
	}
	if _, err := SharingKeyFromService(bad); err == nil || !strings.Contains(err.Error(), string(SharingKey)) {
		t.Errorf("bad sharing key accepted: %v", err)
	}
}

func TestVIPCount(t *testing.T) {
	for v, want := range map[string]int{"": 1, "1": 1, " 3 ": 3, "16": 16} {
		ann := map[string]string{}
		if v != "" {
			ann[string(VIPCount)] = v
		}
		if n, err := VIPCountFromService(service(ann, "")); err != nil || n != want {
			t.Errorf("vip-count %q = %d, %v; want %d", v, n, err, want)
		}
	}
	for _, v := range []string{"0", "-1", "17", "three", "2.5"} {
		_, err := VIPCountFromService(service(map[string]string{string(VIPCount): v}, ""))
		if err == nil || !strings.Contains(err.Error(), "from 1 to 16") {
			t.Errorf("vip-count %q: %v; want an error naming the range", v, err)
		}
	}
}

func FuzzParseIPs(f *testing.F) {
	for _, s := range []string{"203.0.113.1", "203.0.113.1,2001:db8::1", "", ",", "::ffff:1.2.3.4", "fe80::1%eth0"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		ips, err := ParseIPs(s)
		if err != nil {
			return
		}
		if len(ips) == 0 || len(ips) > 2 {
			t.Fatalf("ParseIPs(%q) = %v", s, ips)
		}
		again, err := ParseIPs(FormatIPs(ips))
		if err != nil || !slices.Equal(again, ips) {
			t.Fatalf("round trip of %v: %v, %v", ips, again, err)
		}
		for _, a := range ips {
			if a.Zone() != "" || a.Is4In6() || !a.IsValid() || a != netip.MustParseAddr(a.String()) {
				t.Fatalf("ParseIPs(%q) gave %v", s, a)
			}
		}
	})
}
