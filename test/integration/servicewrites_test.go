package integration

import (
	"context"
	"fmt"
	"net/netip"
	"slices"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/util/rand"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/tools/cache"

	"github.com/metalvip/metalvip/internal/annotation"
	"github.com/metalvip/metalvip/test/harness"
	"github.com/metalvip/metalvip/test/harness/pki"
	"github.com/metalvip/metalvip/test/kubeapi"
)

// serviceRevisions follows every revision of the Services of a namespace, from an informer
// started before they are created.
type serviceRevisions struct {
	mu   sync.Mutex
	revs map[string][]*corev1.Service // by name, ADDED first
}

func watchServices(t *testing.T, srv *kubeapi.Server, ns string) *serviceRevisions {
	t.Helper()
	r := &serviceRevisions{revs: map[string][]*corev1.Service{}}
	add := func(o any) {
		if s, ok := o.(*corev1.Service); ok {
			r.mu.Lock()
			r.revs[s.Name] = append(r.revs[s.Name], s)
			r.mu.Unlock()
		}
	}
	factory := informers.NewSharedInformerFactoryWithOptions(srv.Client, 0, informers.WithNamespace(ns))
	if _, err := factory.Core().V1().Services().Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc: add, UpdateFunc: func(_, o any) { add(o) },
	}); err != nil {
		t.Fatal(err)
	}
	stop := make(chan struct{})
	factory.Start(stop)
	factory.WaitForCacheSync(stop)
	t.Cleanup(func() { close(stop); factory.Shutdown() })
	return r
}

func (r *serviceRevisions) of(name string) []*corev1.Service {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.revs[name])
}

func announced(s *corev1.Service) bool {
	return meta.FindStatusCondition(s.Status.Conditions, "metalvip.io/Announced") != nil
}

// checkWrittenOnce says what is wrong with a Service's revisions, or "": created, then its
// finalizer, allocation record and address in one write, then its Announced condition in one
// more, and nothing else.
func checkWrittenOnce(revs []*corev1.Service, pool string, prefix netip.Prefix) string {
	if len(revs) != 3 {
		var what []string
		for _, s := range revs {
			what = append(what, fmt.Sprintf("rv %s: finalizers %v, annotations %v, ingress %v, conditions %d", s.ResourceVersion, s.Finalizers, s.Annotations, s.Status.LoadBalancer.Ingress, len(s.Status.Conditions)))
		}
		return fmt.Sprintf("%d revisions, want 3 (created, given its address, announced): %q", len(revs), what)
	}
	given, ann := revs[1], revs[2]
	if len(given.Status.LoadBalancer.Ingress) != 1 {
		return fmt.Sprintf("the first write shows %v, want one address", given.Status.LoadBalancer.Ingress)
	}
	ip, err := netip.ParseAddr(given.Status.LoadBalancer.Ingress[0].IP)
	if err != nil || !prefix.Contains(ip) {
		return fmt.Sprintf("the first write shows %v, not an address of %s", given.Status.LoadBalancer.Ingress, prefix)
	}
	if !slices.Contains(given.Finalizers, "service.kubernetes.io/load-balancer-cleanup") {
		return fmt.Sprintf("the write that shows the address has finalizers %v, without metalvip's", given.Finalizers)
	}
	if given.Annotations[string(annotation.AllocatedPool)] != pool || given.Annotations[string(annotation.AllocatedIPs)] != ip.String() {
		return fmt.Sprintf("the write that shows %s records %v", ip, given.Annotations)
	}
	if announced(given) {
		return "the address came with the Announced condition: the condition must follow the agents' answer"
	}
	if !announced(ann) || !slices.Equal(ann.Finalizers, given.Finalizers) || ann.Status.LoadBalancer.Ingress[0].IP != ip.String() {
		return fmt.Sprintf("the second write: conditions %v, finalizers %v, ingress %v", ann.Status.Conditions, ann.Finalizers, ann.Status.LoadBalancer.Ingress)
	}
	return ""
}

func ipAllocatedEvents(t *testing.T, srv *kubeapi.Server, ns, name string) []corev1.Event {
	t.Helper()
	l, err := srv.Client.CoreV1().Events(ns).List(context.Background(), metav1.ListOptions{
		FieldSelector: fields.Set{"involvedObject.name": name, "reason": "IPAllocated"}.String(),
	})
	if err != nil {
		t.Fatal(err)
	}
	return l.Items
}

// TestANewServiceIsWrittenOnceForItsAddressAndOnceForItsCondition: what a Service costs the
// API server, and that the cheaper writing loses nothing: the finalizer, the allocation record
// and the address come in one write (the finalizer never after the address), the IPAllocated
// Event once, the Announced condition in one more write once the agent holds the address.
// In a burst, the conditions wait behind the allocations but every one lands.
func TestANewServiceIsWrittenOnceForItsAddressAndOnceForItsCondition(t *testing.T) {
	srv := kubeapi.Get(t)
	node := "writes-" + rand.String(5)
	dir := pki.AgentsDir(t, node)
	agent := startAgent(t, dir, node, netip.MustParseAddr("127.0.0.51"))
	createNode(t, srv, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: node},
		Status: corev1.NodeStatus{Addresses: []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: "127.0.0.51"}}}})
	ns := srv.Namespace(t)
	pool := "writes-" + ns
	prefix := netip.MustParsePrefix("198.18.10.0/25")
	createPool(t, srv, pool, fmt.Sprintf(`{"addresses": [%q], "serviceAllocation": {"namespaces": [%q]}}`, prefix, ns))
	revs := watchServices(t, srv, ns)
	startCCM(t, srv, announcingConfig(dir, agent.port), "--controllers=service-lb-controller")

	t.Run("a Service alone gets its address in one write and its condition in one more", func(t *testing.T) {
		t.Cleanup(func() {
			if t.Failed() {
				s, err := srv.Client.CoreV1().Services(ns).Get(context.Background(), "alone", metav1.GetOptions{})
				t.Logf("alone now: %+v %v; its revisions seen: %d", s, err, len(revs.of("alone")))
			}
		})
		ip := lbService(t, srv, ns, "alone", pool)
		harness.Eventually(t, 30*time.Second, "the agent announces "+ip, func() bool { return agent.announces(t, ip) })
		harness.Eventually(t, 30*time.Second, "alone carries its Announced condition", func() bool {
			r := revs.of("alone")
			return len(r) > 0 && announced(r[len(r)-1])
		})
		time.Sleep(2 * time.Second) // a second write of anything would come now
		if msg := checkWrittenOnce(revs.of("alone"), pool, prefix); msg != "" {
			t.Error(msg)
		}
		harness.Eventually(t, 10*time.Second, "alone has its IPAllocated Event", func() bool { return len(ipAllocatedEvents(t, srv, ns, "alone")) > 0 })
		if evs := ipAllocatedEvents(t, srv, ns, "alone"); len(evs) != 1 || evs[0].Count > 1 {
			t.Errorf("IPAllocated Events on alone: %+v, want one, once", evs)
		}
	})

	t.Run("in a burst every Service gets the same writes, and every condition lands", func(t *testing.T) {
		const n = 40
		start := time.Now()
		harness.Parallel(8, n, func(i int) {
			_, err := srv.Client.CoreV1().Services(ns).Create(context.Background(), &corev1.Service{
				ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("burst-%02d", i), Annotations: map[string]string{"metalvip.io/pool": pool}},
				Spec:       corev1.ServiceSpec{Type: corev1.ServiceTypeLoadBalancer, Ports: []corev1.ServicePort{{Port: 80}}},
			}, metav1.CreateOptions{})
			if err != nil {
				t.Error(err)
			}
		})
		var lastIP, lastCond time.Time
		harness.Eventually(t, 60*time.Second, "every Service of the burst carries its Announced condition", func() bool {
			withIP, withCond := 0, 0
			for i := range n {
				r := revs.of(fmt.Sprintf("burst-%02d", i))
				if len(r) > 1 && len(r[len(r)-1].Status.LoadBalancer.Ingress) > 0 {
					withIP++
				}
				if len(r) > 0 && announced(r[len(r)-1]) {
					withCond++
				}
			}
			if withIP == n && lastIP.IsZero() {
				lastIP = time.Now()
			}
			if withCond == n {
				lastCond = time.Now()
			}
			return withCond == n
		})
		t.Logf("%d Services: all addressed %s after the first create, all announced %s after", n, lastIP.Sub(start).Round(time.Millisecond), lastCond.Sub(start).Round(time.Millisecond))
		time.Sleep(2 * time.Second) // a second write of anything would come now
		for i := range n {
			name := fmt.Sprintf("burst-%02d", i)
			if msg := checkWrittenOnce(revs.of(name), pool, prefix); msg != "" {
				t.Errorf("%s: %s", name, msg)
			}
			if evs := ipAllocatedEvents(t, srv, ns, name); len(evs) != 1 || evs[0].Count > 1 {
				t.Errorf("IPAllocated Events on %s: %+v, want one, once", name, evs)
			}
		}
	})
}
