package integration

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"

	"github.com/metalvip/metalvip/loadbalancer/services"
	"github.com/metalvip/metalvip/test/harness"
)

func classedService(t *testing.T, e *env, ns, name string, class *string) {
	t.Helper()
	_, err := e.srv.Client.CoreV1().Services(ns).Create(e.ctx, &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: corev1.ServiceSpec{Type: corev1.ServiceTypeLoadBalancer, LoadBalancerClass: class,
			Ports: []corev1.ServicePort{{Port: 80}}, AllocateLoadBalancerNodePorts: new(bool)},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
}

// serviceOf is the Service ns/name as it is now, or fails t.
func serviceOf(t *testing.T, e *env, ns, name string) *corev1.Service {
	t.Helper()
	s, err := e.srv.Client.CoreV1().Services(ns).Get(e.ctx, name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// eventsOf returns the Events a load balancer gave a Service: metalvip's, or the framework's
// service controller's (the API server's own, such as its ClusterIP repairs, are not ours).
func eventsOf(t *testing.T, e *env, ns, name string) []corev1.Event {
	t.Helper()
	l, err := e.srv.Client.CoreV1().Events(ns).List(e.ctx, metav1.ListOptions{FieldSelector: fields.Set{"involvedObject.name": name}.String()})
	if err != nil {
		t.Fatal(err)
	}
	var out []corev1.Event
	for _, ev := range l.Items {
		switch ev.Source.Component + ev.ReportingController {
		case "metalvip-cloud-controller-manager", "service-controller", "service-lb-controller":
			out = append(out, ev)
		default:
			if strings.Contains(ev.Source.Component+ev.ReportingController, "metalvip") || strings.Contains(ev.Source.Component+ev.ReportingController, "service") {
				out = append(out, ev)
			}
		}
	}
	return out
}

// TestTwoImplementationsSideBySide: a Service of metalvip's class is served by metalvip's own
// controller; one of another class is never touched, not even with an Event; a class-less
// one is served or left alone as the cloud-config says.
func TestTwoImplementationsSideBySide(t *testing.T) {
	for _, classless := range []bool{true, false} {
		t.Run(fmt.Sprintf("classless=%v", classless), func(t *testing.T) {
			e := newEnv(t)
			ns := e.srv.Namespace(t)
			e.pool("classes-"+ns, fmt.Sprintf(`{addresses: ["198.18.9.0/28"], serviceAllocation: {namespaces: [%s]}}`, ns))
			cfg := fmt.Sprintf("services:\n  loadBalancerClass: metalvip.io/vip\n  classless: %v\nallocation:\n  pendingRetry: 1s\n", classless)
			args := []string{}
			if !classless {
				args = append(args, "--controllers=*,-service-lb-controller")
			}
			startCCM(t, e.srv, cfg, args...)
			ours, other := "metalvip.io/vip", "example.com/other-lb"
			classedService(t, e, ns, "ours", &ours)
			classedService(t, e, ns, "other", &other)
			classedService(t, e, ns, "classless", nil)

			harness.Eventually(t, 30*time.Second, "the Service of metalvip's class gets an address", func() bool {
				return len(serviceOf(t, e, ns, "ours").Status.LoadBalancer.Ingress) == 1
			})
			s := serviceOf(t, e, ns, "ours")
			if !slices.Contains(s.Finalizers, services.ClassFinalizer) {
				t.Errorf("the classed Service has finalizers %v, want %s", s.Finalizers, services.ClassFinalizer)
			}
			if classless {
				harness.Eventually(t, 30*time.Second, "the class-less Service gets an address", func() bool {
					return len(serviceOf(t, e, ns, "classless").Status.LoadBalancer.Ingress) == 1
				})
			} else {
				time.Sleep(3 * time.Second) // long enough for a served Service to get its address
				if s := serviceOf(t, e, ns, "classless"); len(s.Status.LoadBalancer.Ingress) > 0 || len(s.Finalizers) > 0 || len(eventsOf(t, e, ns, "classless")) > 0 {
					t.Errorf("with classless: false the class-less Service was touched: %v %v, events %v", s.Status.LoadBalancer, s.Finalizers, eventsOf(t, e, ns, "classless"))
				}
			}
			o := serviceOf(t, e, ns, "other")
			if len(o.Status.LoadBalancer.Ingress) > 0 || len(o.Finalizers) > 0 || len(o.Annotations) > 0 || len(o.Status.Conditions) > 0 {
				t.Errorf("the other class's Service was touched: %+v", o)
			}
			if evs := eventsOf(t, e, ns, "other"); len(evs) > 0 {
				t.Errorf("the other class's Service has Events: %v", evs)
			}

			// Deleting the classed Service gives its address back, and the finalizer goes.
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			if err := e.srv.Client.CoreV1().Services(ns).Delete(ctx, "ours", metav1.DeleteOptions{}); err != nil {
				t.Fatal(err)
			}
			harness.Eventually(t, 30*time.Second, "the classed Service is gone", func() bool {
				_, err := e.srv.Client.CoreV1().Services(ns).Get(ctx, "ours", metav1.GetOptions{})
				return err != nil
			})
		})
	}
}
