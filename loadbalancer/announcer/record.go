package announcer

import (
	"context"
	"hash/maphash"
	"strconv"
	"time"

	v1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/klog/v2"

	"github.com/metalvip/metalvip/api/v1alpha1"
	"github.com/metalvip/metalvip/loadbalancer/desired"
	"github.com/metalvip/metalvip/loadbalancer/report"
)

// A Service's ServiceAnnouncement (same namespace and name) is the typed record of who
// announces its addresses, which `metalvipctl status` reads; the Announced condition says the
// same in words. The announcer alone writes it, from the plan, when it differs from what the
// informer holds: a record deleted by hand comes back, and one whose Service holds no address
// (or is gone) is deleted.

// awaitRecords waits until the ServiceAnnouncements are listed, saying once when their CRD
// seems missing, and then has every Service's record written (when they were listed from the
// start, the first plan does that).
func (a *Announcer) awaitRecords(ctx context.Context) {
	said := false
	for !a.recordsSynced() {
		if !said {
			klog.InfoS("ServiceAnnouncements are not listed yet (is their CRD installed? apply charts/metalvip/crds): Services are announced all the same, their records are written once it is")
			said = true
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(time.Second):
		}
	}
	if !said {
		return // listed from the start: the first plan writes every Service's record
	}
	klog.InfoS("ServiceAnnouncements listed: writing every Service's record")
	a.note(func(c *changes) { c.allRecords = true })
}

// recordFor is the record of svc's addresses; nil when it has none.
func recordFor(svc *v1.Service, addrs []desired.Address) *v1alpha1.ServiceAnnouncement {
	if svc == nil || len(addrs) == 0 {
		return nil
	}
	return &v1alpha1.ServiceAnnouncement{
		TypeMeta: metav1.TypeMeta{APIVersion: v1alpha1.GroupVersion.String(), Kind: "ServiceAnnouncement"},
		ObjectMeta: metav1.ObjectMeta{Namespace: svc.Namespace, Name: svc.Name,
			OwnerReferences: []metav1.OwnerReference{{APIVersion: "v1", Kind: "Service", Name: svc.Name, UID: svc.UID, Controller: new(true)}}},
		ObservedGeneration: svc.Generation,
		Addresses:          desired.Record(addrs),
	}
}

// heldRecord is what the records informer keeps of a ServiceAnnouncement (compactRecord): its
// name and a sum of what it says, all the announcer compares with the plan. Typed and without
// managed fields 10,000 records held about 6.5 MB of the CCM's heap, which its garbage
// collector doubles (make bench, allocation of 10,000 Services).
type heldRecord struct {
	namespace, name string
	// sum is recordSum of the record; 0 (no sum) when it does not decode, so that it is
	// rewritten.
	sum uint64
}

// GetObjectMeta names the record for the informer's keys.
func (r *heldRecord) GetObjectMeta() metav1.Object {
	return &metav1.ObjectMeta{Namespace: r.namespace, Name: r.name}
}

// GetObjectKind and DeepCopyObject make a heldRecord a runtime.Object, which the informer's
// cache may ask of what it stores.
func (r *heldRecord) GetObjectKind() schema.ObjectKind { return schema.EmptyObjectKind }

func (r *heldRecord) DeepCopyObject() runtime.Object { c := *r; return &c }

// recordSum stands for what a record says: the generation it observed, the Service that owns it
// (its controller) and every address with its mode, nodes and refusals, in order.
func recordSum(rec *v1alpha1.ServiceAnnouncement) uint64 {
	var h maphash.Hash
	h.SetSeed(recordSeed)
	field := func(s string) { _, _ = h.WriteString(s); _ = h.WriteByte(0) }
	field(strconv.FormatInt(rec.ObservedGeneration, 10))
	for _, o := range rec.OwnerReferences {
		if o.Kind == "Service" && o.Controller != nil && *o.Controller {
			field(string(o.UID))
		}
	}
	for _, a := range rec.Addresses {
		_ = h.WriteByte(1)
		field(a.Address)
		field(string(a.Mode))
		for _, n := range a.Nodes {
			field(n)
		}
		_ = h.WriteByte(2)
		for _, n := range a.RefusedBy {
			field(n)
		}
	}
	return h.Sum64() | 1
}

var recordSeed = maphash.MakeSeed()

// sameRecord reports whether the record held says what want says, owned by want's Service.
func sameRecord(have *heldRecord, want *v1alpha1.ServiceAnnouncement) bool {
	if have == nil || want == nil {
		return have == nil && want == nil
	}
	return have.sum == recordSum(want)
}

// held is the record of key as the informer holds it; nil when there is none.
func (a *Announcer) held(key string) *heldRecord {
	if a.records == nil {
		return nil
	}
	obj, ok, err := a.records.GetByKey(key)
	if err != nil || !ok {
		return nil
	}
	r, _ := obj.(*heldRecord)
	return r
}

// compactRecord is the records informer's transform: it keeps of a ServiceAnnouncement its name
// and sum (heldRecord). One that does not decode keeps its name alone, and is rewritten.
func compactRecord(obj any) (any, error) {
	switch o := obj.(type) {
	case *unstructured.Unstructured:
		var rec v1alpha1.ServiceAnnouncement
		if runtime.DefaultUnstructuredConverter.FromUnstructured(o.Object, &rec) != nil {
			return &heldRecord{namespace: o.GetNamespace(), name: o.GetName()}, nil
		}
		return &heldRecord{namespace: rec.Namespace, name: rec.Name, sum: recordSum(&rec)}, nil
	case *v1alpha1.ServiceAnnouncement:
		return &heldRecord{namespace: o.Namespace, name: o.Name, sum: recordSum(o)}, nil
	}
	return obj, nil
}

// writeRecord makes key's ServiceAnnouncement say who announces addrs (svc nil: the Service is
// gone), creating, updating or deleting it when the one held differs.
func (a *Announcer) writeRecord(key string, svc *v1.Service, addrs []desired.Address) {
	have, want := a.held(key), recordFor(svc, addrs)
	if a.records == nil || !a.recordsSynced() || sameRecord(have, want) {
		return
	}
	res := a.cfg.Dynamic.Resource(v1alpha1.ServiceAnnouncementResource)
	if want == nil {
		ns, name := have.namespace, have.name
		a.writer.SetPacedPart("svc/"+key, report.PartRecord, func(ctx context.Context) error {
			err := res.Namespace(ns).Delete(ctx, name, metav1.DeleteOptions{})
			if apierrors.IsNotFound(err) {
				return nil
			}
			return err
		})
		return
	}
	// The record is made when written: while Services are being given addresses thousands of
	// writes wait for the pacer, and what each holds sets the CCM's peak memory (make bench,
	// allocation of 10,000 Services: 2.6 kB a record as an unstructured object, 0.55 kB typed;
	// the Service, shared with the informer, and its addresses are about 0.15 kB).
	a.writer.SetPacedPart("svc/"+key, report.PartRecord, func(ctx context.Context) error {
		want := recordFor(svc, addrs)
		err := report.Apply(ctx, a.cfg.Client.CoreV1().RESTClient(), want, report.ManagerAnnouncer,
			"/apis", v1alpha1.GroupVersion.Group, v1alpha1.GroupVersion.Version, "namespaces", want.Namespace, v1alpha1.ServiceAnnouncementResource.Resource, want.Name)
		if apierrors.HasStatusCause(err, v1.NamespaceTerminatingCause) {
			return nil // the namespace is being deleted, with its Services: nothing to record
		}
		return err
	})
}
