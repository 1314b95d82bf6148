package integration

import (
	"testing"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	corev1ac "k8s.io/client-go/applyconfigurations/core/v1"
	metaac "k8s.io/client-go/applyconfigurations/meta/v1"

	"github.com/metalvip/metalvip/loadbalancer/report"
)

// TestReportApplyWritesAndSaysWhyNot: report.Apply, which reads nothing back of what it writes,
// writes the fields given as its manager, and an API server's refusal comes back as the API
// error it is (callers tell a terminating namespace by it).
func TestReportApplyWritesAndSaysWhyNot(t *testing.T) {
	e := newEnv(t)
	ns := e.namespace("report-apply")
	rc := e.srv.Client.CoreV1().RESTClient()
	cond := metav1.Condition{Type: "metalvip.io/Test", Status: metav1.ConditionTrue, Reason: "Written", Message: "by report.Apply", LastTransitionTime: metav1.Now()}
	status := corev1ac.Service("web", ns).WithStatus(corev1ac.ServiceStatus().WithConditions(
		metav1ac(cond)))

	e.service(ns, "web")
	if err := report.Apply(e.ctx, rc, status, "metalvip-test", report.ServiceStatusPath(ns, "web")...); err != nil {
		t.Fatalf("applying the status: %v", err)
	}
	svc, err := e.srv.Client.CoreV1().Services(ns).Get(e.ctx, "web", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if c := meta.FindStatusCondition(svc.Status.Conditions, cond.Type); c == nil || c.Message != cond.Message {
		t.Errorf("the Service's conditions %+v; want the one applied", svc.Status.Conditions)
	}
	owned := false
	for _, m := range svc.ManagedFields {
		owned = owned || (m.Manager == "metalvip-test" && m.Operation == metav1.ManagedFieldsOperationApply && m.Subresource == "status")
	}
	if !owned {
		t.Errorf("managed fields %+v; want an apply of the status by metalvip-test", svc.ManagedFields)
	}
	bad := corev1ac.Service("web", ns).WithStatus(corev1ac.ServiceStatus().WithLoadBalancer(
		corev1ac.LoadBalancerStatus().WithIngress(corev1ac.LoadBalancerIngress().WithIP("not an address"))))
	if err := report.Apply(e.ctx, rc, bad, "metalvip-test", report.ServiceStatusPath(ns, "web")...); !apierrors.IsInvalid(err) {
		t.Errorf("applying an invalid address: %v; want Invalid", err)
	}
}

// metav1ac is c as an apply configuration.
func metav1ac(c metav1.Condition) *metaac.ConditionApplyConfiguration {
	return metaac.Condition().WithType(c.Type).WithStatus(c.Status).WithReason(c.Reason).WithMessage(c.Message).WithLastTransitionTime(c.LastTransitionTime)
}
