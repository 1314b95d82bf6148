package services

import (
	"context"
	"net/netip"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic/dynamicinformer"
	dynamicfake "k8s.io/client-go/dynamic/fake"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes/fake"
	clienttesting "k8s.io/client-go/testing"
	"k8s.io/client-go/tools/record"

	"github.com/metalvip/metalvip/api/v1alpha1"
	"github.com/metalvip/metalvip/internal/annotation"
	"github.com/metalvip/metalvip/loadbalancer/desired"
	"github.com/metalvip/metalvip/loadbalancer/objects"
	"github.com/metalvip/metalvip/loadbalancer/report"
)

// TestFault8AConflictEventNamesNoServiceOfAnotherNamespace (issue 30, fault 8): the Warning
// Event a Service gets when the address it asks for is held, or shared on other terms, names
// the holder only when it is in the Service's own namespace; a tenant never learns another
// namespace's Service names from it.
func TestFault8AConflictEventNamesNoServiceOfAnotherNamespace(t *testing.T) {
	ctx := context.Background()
	allocs, rec, _ := runAllocations(t, []any{"10.1.0.0/24"}, nil)

	svc := func(ns, name, ip, key string, local bool) *v1.Service {
		s := &v1.Service{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, UID: types.UID(ns + "/" + name),
				Annotations: map[string]string{string(annotation.IPs): ip}},
			Spec: v1.ServiceSpec{Type: v1.ServiceTypeLoadBalancer, IPFamilies: []v1.IPFamily{v1.IPv4Protocol},
				Ports: []v1.ServicePort{{Protocol: v1.ProtocolTCP, Port: 80}}},
		}
		if key != "" {
			s.Annotations[string(annotation.SharingKey)] = key
		}
		if local {
			s.Spec.ExternalTrafficPolicy = v1.ServiceExternalTrafficPolicyLocal
		}
		return s
	}
	// event is the Event the Service's failed assignment gave.
	event := func(s *v1.Service) string {
		t.Helper()
		if _, err := allocs.Assign(ctx, s); err == nil {
			t.Fatalf("%s/%s got its address; want a conflict", s.Namespace, s.Name)
		}
		select {
		case e := <-rec.Events:
			return e
		default:
			t.Fatalf("%s/%s got no Event", s.Namespace, s.Name)
			return ""
		}
	}
	for _, s := range []*v1.Service{svc("bank", "ledger", "10.1.0.5", "", false), svc("bank", "vault", "10.1.0.6", "web", false)} {
		if _, err := allocs.Assign(ctx, s); err != nil {
			t.Fatal(err)
		}
	}
	for _, tc := range []struct {
		name   string
		svc    *v1.Service
		reason string
		named  string // the holder the Event names, or "" for none
	}{
		{"a Service of another namespace asking for a held address is not told the holder's name",
			svc("tenant", "probe", "10.1.0.5", "", false), report.ReasonIPInUse, ""},
		{"a Service of another namespace with another sharing key is not told the holder's name",
			svc("tenant", "probe2", "10.1.0.6", "other", false), report.ReasonIPInUse, ""},
		{"a Service of another namespace sharing on other terms is not told the holder's name",
			svc("tenant", "probe3", "10.1.0.6", "web", true), report.ReasonSharingConflict, ""},
		{"a Service of the holder's namespace is told the holder's name",
			svc("bank", "audit", "10.1.0.5", "", false), report.ReasonIPInUse, "bank/ledger"},
		{"a Service of the holder's namespace sharing on other terms is told the holder's name",
			svc("bank", "audit2", "10.1.0.6", "web", true), report.ReasonSharingConflict, "bank/vault"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := event(tc.svc)
			if !strings.Contains(e, tc.reason) {
				t.Errorf("Event %q, want reason %s", e, tc.reason)
			}
			switch {
			case tc.named == "" && (strings.Contains(e, "bank/") || strings.Contains(e, "ledger") || strings.Contains(e, "vault")):
				t.Errorf("Event %q names a Service of namespace bank", e)
			case tc.named == "" && !strings.Contains(e, "a Service in another namespace"):
				t.Errorf("Event %q, want it to say the holder is a Service in another namespace", e)
			case tc.named != "" && !strings.Contains(e, tc.named):
				t.Errorf("Event %q, want it to name %s", e, tc.named)
			}
		})
	}
}

// runAllocations runs the allocation controller on fakes with one pool of addresses and the
// reserved addresses; it returns it, its recorder and its dynamic client.
func runAllocations(t *testing.T, addresses []any, reserved map[netip.Addr]string) (*Allocations, *record.FakeRecorder, *dynamicfake.FakeDynamicClient) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	client := fake.NewClientset()
	dyn := fakeDynamic()
	objs := objects.NewObjects()
	objs.Reserve(reserved)
	rec := record.NewFakeRecorder(100)
	allocs := New(Config{Client: client, Dynamic: dyn, Recorder: rec, Objects: objs, Serves: desired.DefaultServes})
	factory := informers.NewSharedInformerFactory(client, 0)
	dynF := dynamicinformer.NewDynamicSharedInformerFactory(dyn, 0)
	allocs.Register(factory, dynF)
	factory.Start(ctx.Done())
	dynF.Start(ctx.Done())
	objs.Note(&unstructured.Unstructured{Object: map[string]any{
		"apiVersion": v1alpha1.GroupVersion.String(), "kind": "IPPool",
		"metadata": map[string]any{"name": "p", "generation": int64(1)},
		"spec":     map[string]any{"addresses": addresses},
	}}, false, objects.KindPool)
	done := make(chan struct{})
	go func() { allocs.Run(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done; factory.Shutdown(); dynF.Shutdown() })
	return allocs, rec, dyn
}

// TestFault7TheControlPlaneVIPIsNeverGivenToAService (issue 30, fault 7): a pool covering the
// control-plane VIP let a tenant ask for it (metalvip.io/ips) or be given it. A reserved
// address is in no pool: asked for, it is refused; the pool gives its other addresses only.
func TestFault7TheControlPlaneVIPIsNeverGivenToAService(t *testing.T) {
	ctx := context.Background()
	allocs, rec, dyn := runAllocations(t, []any{"10.1.0.10/31"}, map[netip.Addr]string{netip.MustParseAddr("10.1.0.10"): "the control-plane VIP"})
	svc := func(name, ip string) *v1.Service {
		s := &v1.Service{
			ObjectMeta: metav1.ObjectMeta{Namespace: "tenant", Name: name, UID: types.UID(name), Annotations: map[string]string{}},
			Spec: v1.ServiceSpec{Type: v1.ServiceTypeLoadBalancer, IPFamilies: []v1.IPFamily{v1.IPv4Protocol},
				Ports: []v1.ServicePort{{Protocol: v1.ProtocolTCP, Port: 443}}},
		}
		if ip != "" {
			s.Annotations[string(annotation.IPs)] = ip
		}
		return s
	}
	if st, err := allocs.Assign(ctx, svc("asks", "10.1.0.10")); err == nil {
		t.Errorf("a Service asking for the control-plane VIP got %v", st.IPs)
	}
	select {
	case e := <-rec.Events:
		if !strings.Contains(e, report.ReasonAddressReserved) || !strings.Contains(e, "the control-plane VIP") {
			t.Errorf("Event %q; want it to say the address is reserved for the control-plane VIP", e)
		}
	default:
		t.Error("no Event for the Service asking for the control-plane VIP")
	}
	first, err := allocs.Assign(ctx, svc("first", ""))
	if err != nil || len(first.IPs) != 1 || first.IPs[0] != netip.MustParseAddr("10.1.0.11") {
		t.Fatalf("the first Service got %v, %v; want 10.1.0.11, the pool's one address not reserved", first, err)
	}
	if st, err := allocs.Assign(ctx, svc("second", "")); err == nil {
		t.Errorf("a second Service got %v from a pool whose other address is the control-plane VIP", st.IPs)
	}
	// The pool says so in its status (written with server-side apply).
	said := func() bool {
		for _, act := range dyn.Actions() {
			if p, ok := act.(clienttesting.PatchAction); ok && act.GetSubresource() == "status" && p.GetName() == "p" &&
				strings.Contains(string(p.GetPatch()), `"reason":"Reserved"`) && strings.Contains(string(p.GetPatch()), "10.1.0.10, the control-plane VIP") {
				return true
			}
		}
		return false
	}
	for i := 0; i < 100 && !said(); i++ {
		time.Sleep(20 * time.Millisecond)
	}
	if !said() {
		t.Error("the pool's status does not say it leaves the control-plane VIP out (PoolOverlaps, reason Reserved)")
	}
}

// TestFault8AServiceHasAtMost16AddressesWhateverItsFamilies (issue 30, fault 8): vip-count
// counted per family, so a dual-stack Service with vip-count 16 took 32 addresses for one
// services.loadbalancers quota unit. A Service has at most 16 in all.
func TestFault8AServiceHasAtMost16AddressesWhateverItsFamilies(t *testing.T) {
	ctx := context.Background()
	allocs, rec, _ := runAllocations(t, []any{"10.1.0.0/24", "2001:db8::/120"}, nil)
	dual := v1.IPFamilyPolicyRequireDualStack
	svc := func(name, count string) *v1.Service {
		return &v1.Service{
			ObjectMeta: metav1.ObjectMeta{Namespace: "tenant", Name: name, UID: types.UID(name), Annotations: map[string]string{string(annotation.VIPCount): count}},
			Spec: v1.ServiceSpec{Type: v1.ServiceTypeLoadBalancer, IPFamilies: []v1.IPFamily{v1.IPv4Protocol, v1.IPv6Protocol}, IPFamilyPolicy: &dual,
				Ports: []v1.ServicePort{{Protocol: v1.ProtocolTCP, Port: 443}}},
		}
	}
	if al, err := allocs.Assign(ctx, svc("many", "16")); err == nil {
		t.Errorf("a dual-stack Service with vip-count 16 got %d addresses", len(al.IPs))
	}
	select {
	case e := <-rec.Events:
		if !strings.Contains(e, report.ReasonInvalidAnnotation) || !strings.Contains(e, "gives 32 addresses") || !strings.Contains(e, "give 8 or fewer") {
			t.Errorf("Event %q; want an InvalidAnnotation saying 32 addresses and 8 or fewer", e)
		}
	default:
		t.Error("no Event")
	}
	if al, err := allocs.Assign(ctx, svc("eight", "8")); err != nil || len(al.IPs) != 16 {
		t.Errorf("a dual-stack Service with vip-count 8 got %v, %v; want 16 addresses", al.IPs, err)
	}
}
