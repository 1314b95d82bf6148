package services

import (
	"context"
	"encoding/json"
	"slices"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic/dynamicinformer"
	dynamicfake "k8s.io/client-go/dynamic/fake"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/client-go/tools/record"

	"github.com/metalvip/metalvip/api/v1alpha1"
	"github.com/metalvip/metalvip/internal/annotation"
	"github.com/metalvip/metalvip/loadbalancer/desired"
	"github.com/metalvip/metalvip/loadbalancer/objects"
)

// TestAnAPIServerThatDropsMetadataInStatusWritesStillGetsFinalizerAndRecord: the real API
// server takes a Service's metadata in a status patch (test/integration checks that the
// finalizer comes with the address); one that dropped it (a fake here, as no real one does)
// must still end with the finalizer and the record, and from then on get them before the
// status, so an address is never shown for long on a Service that could vanish without
// giving it back.
func TestAnAPIServerThatDropsMetadataInStatusWritesStillGetsFinalizerAndRecord(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	client := fake.NewClientset()
	// Status patches lose their metadata, as a status strategy that reset it would.
	client.PrependReactor("patch", "services", func(a k8stesting.Action) (bool, runtime.Object, error) {
		p := a.(k8stesting.PatchAction)
		if p.GetSubresource() != "status" {
			return false, nil, nil
		}
		var body map[string]any
		if err := json.Unmarshal(p.GetPatch(), &body); err != nil {
			return true, nil, err
		}
		delete(body, "metadata")
		b, _ := json.Marshal(body)
		return k8stesting.ObjectReaction(client.Tracker())(k8stesting.NewPatchSubresourceAction(
			p.GetResource(), p.GetNamespace(), p.GetName(), p.GetPatchType(), b, "status"))
	})
	dyn := fakeDynamic()
	objs := objects.NewObjects()
	allocs := New(Config{Client: client, Dynamic: dyn, Recorder: record.NewFakeRecorder(100), Objects: objs, Serves: desired.DefaultServes})
	services := NewServiceController(client, allocs, desired.DefaultServes)
	factory := informers.NewSharedInformerFactory(client, 0)
	dynF := dynamicinformer.NewDynamicSharedInformerFactory(dyn, 0)
	allocs.Register(factory, dynF)
	services.Register(factory)
	factory.Start(ctx.Done())
	dynF.Start(ctx.Done())
	objs.Note(&unstructured.Unstructured{Object: map[string]any{
		"apiVersion": v1alpha1.GroupVersion.String(), "kind": "IPPool",
		"metadata": map[string]any{"name": "p", "generation": int64(1)},
		"spec":     map[string]any{"addresses": []any{"10.1.0.0/24"}},
	}}, false, objects.KindPool)
	done := make(chan struct{}, 2)
	go func() { allocs.Run(ctx); done <- struct{}{} }()
	go func() { services.Run(ctx, 1); done <- struct{}{} }()
	defer func() { cancel(); <-done; <-done; factory.Shutdown(); dynF.Shutdown() }()

	create := func(name string) {
		t.Helper()
		s := &v1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: name}, Spec: v1.ServiceSpec{Type: v1.ServiceTypeLoadBalancer}}
		if _, err := client.CoreV1().Services("ns").Create(ctx, s, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	written := func(name string) *v1.Service {
		t.Helper()
		var s *v1.Service
		for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
			got, err := client.CoreV1().Services("ns").Get(ctx, name, metav1.GetOptions{})
			if err == nil && len(got.Status.LoadBalancer.Ingress) == 1 && slices.Contains(got.Finalizers, Finalizer) && got.Annotations[string(annotation.AllocatedIPs)] != "" {
				return got
			}
			s = got
		}
		t.Fatalf("%s not written with status, finalizer and record within 10 s: %+v", name, s)
		return nil
	}
	// patches lists the Service patches made for a Service: "" for the object, "status".
	patches := func(name string) []string {
		var out []string
		for _, a := range client.Actions() {
			if p, ok := a.(k8stesting.PatchAction); ok && p.GetName() == name {
				out = append(out, p.GetSubresource())
			}
		}
		return out
	}

	create("first")
	s := written("first")
	if s.Annotations[string(annotation.AllocatedIPs)] != s.Status.LoadBalancer.Ingress[0].IP {
		t.Errorf("first records %q and shows %s", s.Annotations[string(annotation.AllocatedIPs)], s.Status.LoadBalancer.Ingress[0].IP)
	}
	// A re-sync that raced the second patch may patch the object again (a real API server
	// refuses it by resourceVersion); the status is written once.
	if got := patches("first"); len(got) < 2 || !slices.Equal(got[:2], []string{"status", ""}) || slices.Contains(got[1:], "status") {
		t.Errorf("first was patched %q, want the status (whose metadata is lost), then the object", got)
	}
	create("second")
	written("second")
	if got := patches("second"); len(got) < 2 || !slices.Equal(got[:2], []string{"", "status"}) || slices.Contains(got[2:], "status") {
		t.Errorf("second was patched %q, want the object (finalizer and record) first, then the status", got)
	}
}

// fakeDynamic is a dynamic client that lists IPPools and BGPPeers (none), for the informers of
// a test that feeds pools by hand (objects.Objects.Note).
func fakeDynamic() *dynamicfake.FakeDynamicClient {
	return dynamicfake.NewSimpleDynamicClientWithCustomListKinds(runtime.NewScheme(), map[schema.GroupVersionResource]string{
		v1alpha1.IPPoolResource: "IPPoolList", v1alpha1.BGPPeerResource: "BGPPeerList",
	})
}
