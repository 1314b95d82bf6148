package announcer

import (
	"net/netip"
	"testing"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/tools/cache"

	"github.com/metalvip/metalvip/api/v1alpha1"
	"github.com/metalvip/metalvip/loadbalancer/desired"
)

// TestARecordIsWrittenWhenItDiffersFromThePlan: the ServiceAnnouncement held is rewritten
// when anything it says differs from the plan, including its owner (a record left by an
// earlier Service of the same name), and deleted when the Service holds no address.
func TestARecordIsWrittenWhenItDiffersFromThePlan(t *testing.T) {
	svc := &v1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "web", Name: "front", UID: "u2", Generation: 3}}
	addr := desired.Address{Addr: netip.MustParseAddr("203.0.113.7"), Mode: desired.ModeL2, Nodes: []string{"node1", "node2"}}
	want := recordFor(svc, []desired.Address{addr})
	changed := func(f func(r *v1alpha1.ServiceAnnouncement)) *v1alpha1.ServiceAnnouncement {
		r := want.DeepCopy()
		f(r)
		return r
	}
	for _, tc := range []struct {
		name        string
		have, want  *v1alpha1.ServiceAnnouncement
		writesAgain bool
	}{
		{"none held, none wanted", nil, nil, false},
		{"the same", want.DeepCopy(), want, false},
		{"none held", nil, want, true},
		{"another order of nodes", changed(func(r *v1alpha1.ServiceAnnouncement) { r.Addresses[0].Nodes = []string{"node2", "node1"} }), want, true},
		{"another mode", changed(func(r *v1alpha1.ServiceAnnouncement) { r.Addresses[0].Mode = v1alpha1.AnnouncedBGP }), want, true},
		{"a refusal gone", changed(func(r *v1alpha1.ServiceAnnouncement) { r.Addresses[0].RefusedBy = []string{"node3"} }), want, true},
		{"an older generation", changed(func(r *v1alpha1.ServiceAnnouncement) { r.ObservedGeneration = 2 }), want, true},
		{"an earlier Service's", changed(func(r *v1alpha1.ServiceAnnouncement) { r.OwnerReferences[0].UID = "u1" }), want, true},
		{"an address more", changed(func(r *v1alpha1.ServiceAnnouncement) {
			r.Addresses = append(r.Addresses, v1alpha1.AnnouncedAddress{Address: "2001:db8::7", Mode: v1alpha1.AnnouncedL2})
		}), want, true},
		{"held, the Service holds no address", want.DeepCopy(), recordFor(svc, nil), true},
		{"held, the Service is gone", want.DeepCopy(), recordFor(nil, []desired.Address{addr}), true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := !sameRecord(held(tc.have), tc.want); got != tc.writesAgain {
				t.Errorf("written again: %v, want %v", got, tc.writesAgain)
			}
		})
	}
	if o := want.OwnerReferences[0]; o.Kind != "Service" || o.APIVersion != "v1" || o.UID != svc.UID || o.Controller == nil || !*o.Controller {
		t.Errorf("owner %+v: want the Service, as its controller, so that it is deleted with it", o)
	}
}

// held is rec as the records informer keeps it.
func held(rec *v1alpha1.ServiceAnnouncement) *heldRecord {
	if rec == nil {
		return nil
	}
	got, _ := compactRecord(rec)
	return got.(*heldRecord)
}

// TestTheRecordsInformerKeepsThemCompact: the informer's transform keeps of a
// ServiceAnnouncement its name and sum, and it still reads as the same record, managed fields
// or not; one that does not decode keeps its name (and is rewritten); anything else passes.
func TestTheRecordsInformerKeepsThemCompact(t *testing.T) {
	svc := &v1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "web", Name: "front", UID: "u2", Generation: 3}}
	want := recordFor(svc, []desired.Address{{Addr: netip.MustParseAddr("203.0.113.7"), Mode: desired.ModeL2, Nodes: []string{"node1", "node2"}}})
	held := want.DeepCopy()
	held.ManagedFields = []metav1.ManagedFieldsEntry{{Manager: "metalvip-announcer", Operation: metav1.ManagedFieldsOperationApply, FieldsV1: metav1.NewFieldsV1(`{"f:addresses":{}}`)}}
	obj, err := runtime.DefaultUnstructuredConverter.ToUnstructured(held)
	if err != nil {
		t.Fatal(err)
	}
	got, err := compactRecord(&unstructured.Unstructured{Object: obj})
	rec, ok := got.(*heldRecord)
	if err != nil || !ok {
		t.Fatalf("compacted to %T, %v; want a heldRecord", got, err)
	}
	if rec.namespace != "web" || rec.name != "front" || !sameRecord(rec, want) {
		t.Errorf("compacted %+v; want web/front, the same record", rec)
	}
	if key, err := cache.MetaNamespaceKeyFunc(rec); err != nil || key != "web/front" {
		t.Errorf("its key %q, %v; want web/front", key, err)
	}
	other := want.DeepCopy()
	other.OwnerReferences[0].UID = "u1"
	if sameRecord(rec, other) {
		t.Errorf("it reads as another Service's record")
	}
	bad := &unstructured.Unstructured{Object: map[string]any{"apiVersion": "metalvip.io/v1alpha1", "kind": "ServiceAnnouncement",
		"metadata": map[string]any{"namespace": "web", "name": "front"}, "addresses": "not a list"}}
	if got, _ := compactRecord(bad); got.(*heldRecord).name != "front" || sameRecord(got.(*heldRecord), want) {
		t.Errorf("an undecodable record compacted to %+v; want its name alone, which differs from the plan", got)
	}
	tomb := cache.DeletedFinalStateUnknown{Key: "web/front"}
	if got, _ := compactRecord(tomb); got != tomb {
		t.Errorf("a tombstone became %v", got)
	}
}
