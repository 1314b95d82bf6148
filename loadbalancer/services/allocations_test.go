package services

import (
	"context"
	"strings"
	"testing"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic/dynamicinformer"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes/fake"
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
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	client := fake.NewClientset()
	dyn := fakeDynamic()
	objs := objects.NewObjects()
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
		"spec":     map[string]any{"addresses": []any{"10.1.0.0/24"}},
	}}, false, objects.KindPool)
	done := make(chan struct{})
	go func() { allocs.Run(ctx); close(done) }()
	defer func() { cancel(); <-done; factory.Shutdown(); dynF.Shutdown() }()

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
