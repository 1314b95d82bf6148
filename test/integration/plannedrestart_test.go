package integration

import (
	"context"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/metalvip/metalvip/internal/plannedrestart"
	"github.com/metalvip/metalvip/test/kubeapi"
)

// Issue 32: an agent stopped by a SIGTERM holds its VIPs for its restart grace only when its
// Pod is being deleted through the API (a rolling update); a Pod the kubelet stops on its own
// (a node shutting down) is not being deleted, and one that cannot be read says nothing.
func TestAPlannedRestartIsAPodBeingDeleted(t *testing.T) {
	srv := kubeapi.Get(t)
	ns := srv.Namespace(t)
	ctx := context.Background()
	pods := srv.Client.CoreV1().Pods(ns)
	// A finalizer keeps the Pod, deleted, with its deletionTimestamp (no kubelet here to end it).
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "metalvip-agent-x", Finalizers: []string{"metalvip.io/test"}},
		Spec:       corev1.PodSpec{NodeName: "node1", Containers: []corev1.Container{{Name: "agent", Image: "example.test/agent:v1"}}},
	}
	// No controller-manager here makes the namespace's default ServiceAccount.
	if _, err := srv.Client.CoreV1().ServiceAccounts(ns).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "default"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := pods.Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		p, err := pods.Get(ctx, pod.Name, metav1.GetOptions{})
		if err == nil {
			p.Finalizers = nil
			_, _ = pods.Update(ctx, p, metav1.UpdateOptions{})
		}
	})

	if ok, why := plannedrestart.Planned(ctx, srv.Client, ns, pod.Name); ok || !strings.Contains(why, "not being deleted") {
		t.Errorf("a running Pod: planned %v (%s); want not planned, not being deleted", ok, why)
	}
	if ok, why := plannedrestart.Planned(ctx, srv.Client, ns, "no-such-pod"); ok || !strings.Contains(why, "could not be read") {
		t.Errorf("a Pod that does not exist: planned %v (%s); want not planned, could not be read", ok, why)
	}
	if err := pods.Delete(ctx, pod.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	if ok, why := plannedrestart.Planned(ctx, srv.Client, ns, pod.Name); !ok || !strings.Contains(why, "being deleted") {
		t.Errorf("a Pod being deleted: planned %v (%s); want planned", ok, why)
	}
}
