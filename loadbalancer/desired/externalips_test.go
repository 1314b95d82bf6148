package desired

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"testing"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/metalvip/metalvip/api/v1alpha1"
	"github.com/metalvip/metalvip/internal/annotation"
	"github.com/metalvip/metalvip/loadbalancer/pools"
)

func TestExternalIPsAreAnnouncedOnlyFromPoolsThatAllowThem(t *testing.T) {
	pool := func(name, cidr string, policy v1alpha1.ExternalIPsPolicy, ns ...string) *pools.Pool {
		sp := v1alpha1.IPPoolSpec{Addresses: []v1alpha1.AddressRange{v1alpha1.AddressRange(cidr)}, ExternalIPs: policy}
		if len(ns) > 0 {
			sp.ServiceAllocation = &v1alpha1.ServiceAllocation{Namespaces: ns}
		}
		return pools.DecodePool(&v1alpha1.IPPool{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: sp})
	}
	set := pools.NewSet([]*pools.Pool{
		pool("open", "203.0.113.0/28", v1alpha1.ExternalIPsAllow),
		pool("closed", "203.0.113.16/28", ""),
		pool("team", "203.0.113.32/28", v1alpha1.ExternalIPsAllow, "team"),
	}, nil)
	held := func(ip netip.Addr) string {
		if ip == netip.MustParseAddr("203.0.113.2") {
			return "ns/lb"
		}
		return ""
	}
	svc := func(ask bool, ips ...string) *v1.Service {
		s := &v1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "s"}, Spec: v1.ServiceSpec{Type: v1.ServiceTypeLoadBalancer, ExternalIPs: ips}}
		if ask {
			s.Annotations = map[string]string{string(annotation.AnnounceExternalIPs): "true"}
		}
		return s
	}
	clusterIP := func(s *v1.Service) *v1.Service { s.Spec.Type = v1.ServiceTypeClusterIP; return s }
	for _, tc := range []struct {
		name    string
		svc     *v1.Service
		ok      []string
		refused map[string]string // ip -> part of the reason
	}{
		{"an address of a pool that allows externalIPs is announced", svc(true, "203.0.113.1"), []string{"203.0.113.1"}, nil},
		{"a Service that does not ask gets nothing, and no refusal", svc(false, "203.0.113.1"), nil, nil},
		{"an address of a pool that does not allow them is refused", svc(true, "203.0.113.17"), nil, map[string]string{"203.0.113.17": "does not lend"}},
		{"an address in no pool is refused", svc(true, "198.51.100.77"), nil, map[string]string{"198.51.100.77": "in no IPPool"}},
		{"a pool limited to other namespaces refuses", svc(true, "203.0.113.33"), nil, map[string]string{"203.0.113.33": "namespaces"}},
		{"an address a LoadBalancer Service holds is refused", svc(true, "203.0.113.2"), nil, map[string]string{"203.0.113.2": "ns/lb"}},
		{"one refusal leaves the others announced", svc(true, "203.0.113.3", "203.0.113.17"), []string{"203.0.113.3"}, map[string]string{"203.0.113.17": "does not lend"}},
		{"a garbled address is refused alone", svc(true, "not-an-ip", "203.0.113.4"), []string{"203.0.113.4"}, map[string]string{"not-an-ip": "not an IP"}},
		// Issue 30, fault 8: no quota counted a ClusterIP Service's announced externalIPs.
		{"a ClusterIP Service's externalIPs are refused", clusterIP(svc(true, "203.0.113.5")), nil, map[string]string{"203.0.113.5": "only a LoadBalancer Service"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ok, refused := DefaultServes.ExternalIPs(tc.svc, set, held)
			var got []string
			for _, ip := range ok {
				got = append(got, ip.String())
			}
			if !slices.Equal(got, tc.ok) {
				t.Errorf("announced %v, want %v", got, tc.ok)
			}
			if len(refused) != len(tc.refused) {
				t.Fatalf("refused %+v, want %v", refused, tc.refused)
			}
			for _, r := range refused {
				if !strings.Contains(r.Reason, tc.refused[r.IP]) || tc.refused[r.IP] == "" {
					t.Errorf("%s refused for %q, want a reason with %q", r.IP, r.Reason, tc.refused[r.IP])
				}
			}
		})
	}
}

// TestFault8AnExternalIPRefusalNamesNoServiceOfAnotherNamespace (issue 30, fault 8): the
// refusal of an externalIP a LoadBalancer Service holds, written in the Service's Event and
// condition, names the holder only when it is in the Service's own namespace.
func TestFault8AnExternalIPRefusalNamesNoServiceOfAnotherNamespace(t *testing.T) {
	set := pools.NewSet([]*pools.Pool{pools.DecodePool(&v1alpha1.IPPool{ObjectMeta: metav1.ObjectMeta{Name: "open"},
		Spec: v1alpha1.IPPoolSpec{Addresses: []v1alpha1.AddressRange{"203.0.113.0/28"}, ExternalIPs: v1alpha1.ExternalIPsAllow}})}, nil)
	held := func(netip.Addr) string { return "bank/ledger" }
	for _, tc := range []struct {
		name, ns string
		want     string
	}{
		{"a Service of another namespace is not told the holder's name", "tenant", "it is the LoadBalancer address of a Service in another namespace"},
		{"a Service of the holder's namespace is told it", "bank", "it is the LoadBalancer address of bank/ledger"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := &v1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: tc.ns, Name: "s", Annotations: map[string]string{string(annotation.AnnounceExternalIPs): "true"}},
				Spec: v1.ServiceSpec{Type: v1.ServiceTypeLoadBalancer, ExternalIPs: []string{"203.0.113.2"}}}
			_, refused := DefaultServes.ExternalIPs(s, set, held)
			if len(refused) != 1 || !strings.Contains(refused[0].Reason, tc.want) {
				t.Fatalf("refused %+v, want a reason with %q", refused, tc.want)
			}
			if tc.ns != "bank" && strings.Contains(refused[0].Reason, "ledger") {
				t.Errorf("the reason %q names bank's Service", refused[0].Reason)
			}
		})
	}
}

// Issue 30, fault 8: a Service has at most 16 externalIPs announced, as it has at most 16
// addresses of its own (metalvip.io/vip-count).
func TestAServiceHasAtMost16ExternalIPsAnnounced(t *testing.T) {
	set := pools.NewSet([]*pools.Pool{pools.DecodePool(&v1alpha1.IPPool{ObjectMeta: metav1.ObjectMeta{Name: "big"},
		Spec: v1alpha1.IPPoolSpec{Addresses: []v1alpha1.AddressRange{"203.0.113.64/26"}, ExternalIPs: v1alpha1.ExternalIPsAllow}})}, nil)
	s := &v1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "s", Annotations: map[string]string{string(annotation.AnnounceExternalIPs): "true"}},
		Spec: v1.ServiceSpec{Type: v1.ServiceTypeLoadBalancer}}
	for i := range 20 {
		s.Spec.ExternalIPs = append(s.Spec.ExternalIPs, fmt.Sprintf("203.0.113.%d", 64+i))
	}
	ok, refused := DefaultServes.ExternalIPs(s, set, func(netip.Addr) string { return "" })
	if len(ok) != 16 || ok[15] != netip.MustParseAddr("203.0.113.79") {
		t.Errorf("announced %v; want the first 16", ok)
	}
	if len(refused) != 4 || !strings.Contains(refused[0].Reason, "16 externalIPs announced already") {
		t.Errorf("refused %+v; want the last 4, saying a Service has at most 16", refused)
	}
}
