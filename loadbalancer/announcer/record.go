package announcer

import (
	"context"
	"slices"
	"time"

	v1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
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

// sameRecord reports whether the record held says what want says, owned by want's Service.
func sameRecord(have, want *v1alpha1.ServiceAnnouncement) bool {
	if have == nil || want == nil {
		return have == want
	}
	return have.ObservedGeneration == want.ObservedGeneration && desired.RecordOf(have, want.OwnerReferences[0].UID) &&
		slices.EqualFunc(have.Addresses, want.Addresses, func(a, b v1alpha1.AnnouncedAddress) bool {
			return a.Address == b.Address && a.Mode == b.Mode && slices.Equal(a.Nodes, b.Nodes) && slices.Equal(a.RefusedBy, b.RefusedBy)
		})
}

// heldRecord is the record of key as the informer holds it; nil when there is none or it
// cannot be read (then it is rewritten).
func (a *Announcer) heldRecord(key string) *v1alpha1.ServiceAnnouncement {
	if a.records == nil {
		return nil
	}
	obj, err := a.records.Get(key)
	if err != nil {
		return nil
	}
	switch r := obj.(type) {
	case *v1alpha1.ServiceAnnouncement:
		return r // compacted by the informer (compactRecord); only read
	case *unstructured.Unstructured:
		return decodeRecord(r)
	}
	return nil
}

// decodeRecord is a ServiceAnnouncement as the announcer reads it: typed, without managed
// fields; one that does not decode keeps only its name (so that it is rewritten).
func decodeRecord(u *unstructured.Unstructured) *v1alpha1.ServiceAnnouncement {
	var rec v1alpha1.ServiceAnnouncement
	if runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, &rec) != nil {
		return &v1alpha1.ServiceAnnouncement{ObjectMeta: metav1.ObjectMeta{Namespace: u.GetNamespace(), Name: u.GetName(), ResourceVersion: u.GetResourceVersion()}}
	}
	rec.ManagedFields = nil
	return &rec
}

// compactRecord is the records informer's transform: it keeps a ServiceAnnouncement typed and
// without managed fields. As unstructured objects with the managed fields of their
// server-side applies, 10,000 records held about 70 MiB of the CCM's heap (make bench,
// allocation of 10,000 Services).
func compactRecord(obj any) (any, error) {
	if u, ok := obj.(*unstructured.Unstructured); ok {
		return decodeRecord(u), nil
	}
	return obj, nil
}

// writeRecord makes key's ServiceAnnouncement say who announces addrs (svc nil: the Service is
// gone), creating, updating or deleting it when the one held differs.
func (a *Announcer) writeRecord(key string, svc *v1.Service, addrs []desired.Address) {
	have, want := a.heldRecord(key), recordFor(svc, addrs)
	if a.records == nil || !a.recordsSynced() || sameRecord(have, want) {
		return
	}
	res := a.cfg.Dynamic.Resource(v1alpha1.ServiceAnnouncementResource)
	if want == nil {
		ns, name := have.Namespace, have.Name
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
