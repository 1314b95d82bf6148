package integration

import (
	"context"
	"os/exec"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/metalvip/metalvip/api/v1alpha1"
	"github.com/metalvip/metalvip/test/harness"
	"github.com/metalvip/metalvip/test/testenv"
)

// TestRecordsAreWrittenOnceTheirCRDIsInstalled: an upgrade by Helm leaves out a chart's new
// CRDs, and install.yaml applies the CRDs and the CCM at once. Without the ServiceAnnouncement
// CRD the CCM allocates and announces all the same (the Announced condition is written); once
// the CRD is applied, the records are written, without a restart.
func TestRecordsAreWrittenOnceTheirCRDIsInstalled(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	crds := e.dyn.Resource(schema.GroupVersionResource{Group: "apiextensions.k8s.io", Version: "v1", Resource: "customresourcedefinitions"})
	const crd = "serviceannouncements.metalvip.io"
	root, err := testenv.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	install := func() {
		if err := e.srv.CreateCRDs(filepath.Join(root, "manifests", "crds"), v1alpha1.GroupVersion.Group); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(install) // for the tests after this one
	if err := crds.Delete(ctx, crd, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	harness.Eventually(t, 60*time.Second, "the ServiceAnnouncement CRD is gone", func() bool {
		_, err := crds.Get(ctx, crd, metav1.GetOptions{})
		return apierrors.IsNotFound(err)
	})

	e.pool("records-pool", `{addresses: ["203.0.113.200/30"], serviceAllocation: {namespaces: [records]}}`)
	ns := e.namespace("records")
	createNode(t, e.srv, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "records-node"},
		Status: corev1.NodeStatus{Addresses: []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: "127.0.0.32"}}}})
	ccm := startCCM(t, e.srv, fastConfig+"agent:\n  insecure: true\n  port: 1\n  timeout: 1s\n")
	e.service(ns, "web")
	e.waitIPs(ns, "web", 1, 60*time.Second)
	waitAnnounced(t, e.srv, ns, "web", "the Service's Announced condition is written without the CRD")

	// metalvipctl status says why it cannot tell who announces, and shows the rest.
	kc := e.srv.Kubeconfig(t, nil)
	status := func() string {
		out, err := exec.Command(ctlBinary, "status", "--kubeconfig", kc).CombinedOutput()
		if err != nil {
			t.Fatalf("metalvipctl status: %v\n%s", err, out)
		}
		return string(out)
	}
	if out := status(); !strings.Contains(out, ns+"/web") || !strings.Contains(out, "the ServiceAnnouncement CRD is not installed") {
		t.Errorf("metalvipctl status without the CRD:\n%s", out)
	}

	install()
	records := e.dyn.Resource(v1alpha1.ServiceAnnouncementResource).Namespace(ns)
	harness.Eventually(t, 90*time.Second, "the ServiceAnnouncement is written once its CRD is installed, without a restart", func() bool {
		_, err := records.Get(ctx, "web", metav1.GetOptions{})
		return err == nil
	})
	harness.Eventually(t, 30*time.Second, "metalvipctl status shows who announces once the record is there", func() bool {
		return !strings.Contains(status(), "CRD is not installed")
	})

	// The record is the announcer's alone: one edited or deleted by hand is made again, and
	// the one of a Service that is gone is deleted (no garbage collector runs here).
	orig, err := records.Get(ctx, "web", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	said, _, _ := unstructured.NestedSlice(orig.Object, "addresses")
	if len(said) != 1 {
		t.Fatalf("the record says %v; want the Service's one address", said)
	}
	saysWhatItSaid := func() bool {
		r, err := records.Get(ctx, "web", metav1.GetOptions{})
		if err != nil {
			return false
		}
		now, _, _ := unstructured.NestedSlice(r.Object, "addresses")
		return reflect.DeepEqual(now, said)
	}
	edited := orig.DeepCopy()
	if err := unstructured.SetNestedSlice(edited.Object, []any{map[string]any{"address": "203.0.113.203", "mode": "BGP", "nodes": []any{"elsewhere"}}}, "addresses"); err != nil {
		t.Fatal(err)
	}
	if _, err := records.Update(ctx, edited, metav1.UpdateOptions{}); err != nil {
		t.Fatalf("editing the record by hand: %v", err)
	}
	harness.Eventually(t, 60*time.Second, "a record edited by hand says again who announces", saysWhatItSaid)
	if err := records.Delete(ctx, "web", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	harness.Eventually(t, 60*time.Second, "a record deleted by hand is made again", saysWhatItSaid)
	if err := e.srv.Client.CoreV1().Services(ns).Delete(ctx, "web", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	harness.Eventually(t, 60*time.Second, "the record of a Service that is gone is deleted", func() bool {
		_, err := records.Get(ctx, "web", metav1.GetOptions{})
		return apierrors.IsNotFound(err)
	})
	select {
	case <-ccm.Done():
		t.Fatalf("the CCM exited: %v\n%s", ccm.Err(), ccm.Tail(20))
	default:
	}
}
