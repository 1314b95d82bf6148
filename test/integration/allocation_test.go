package integration

import (
	"context"
	"fmt"
	"net/netip"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	"k8s.io/client-go/util/retry"
	"sigs.k8s.io/yaml"

	"github.com/metalvip/metalvip/api/v1alpha1"
	"github.com/metalvip/metalvip/internal/annotation"
	"github.com/metalvip/metalvip/loadbalancer/desired"
	"github.com/metalvip/metalvip/test/harness"
	"github.com/metalvip/metalvip/test/kubeapi"
	"github.com/metalvip/metalvip/test/testenv"
)

// fastConfig makes pending Services retry quickly so that tests need not wait.
const fastConfig = `
allocation:
  pendingRetry: 1s
  poolStatusInterval: 200ms
`

type env struct {
	t   *testing.T
	srv *kubeapi.Server
	dyn dynamic.Interface
	ctx context.Context
}

func newEnv(t *testing.T) *env {
	t.Helper()
	srv := kubeapi.Get(t)
	dyn := srv.InstallCRDs(t)
	return &env{t: t, srv: srv, dyn: dyn, ctx: context.Background()}
}

// setPoolAddresses sets an IPPool's spec.addresses, again on a conflict (the CCM writes the
// pool's status meanwhile).
func (e *env) setPoolAddresses(name string, addrs []string) {
	e.t.Helper()
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		u, err := e.dyn.Resource(v1alpha1.IPPoolResource).Get(e.ctx, name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		_ = unstructured.SetNestedStringSlice(u.Object, addrs, "spec", "addresses")
		_, err = e.dyn.Resource(v1alpha1.IPPoolResource).Update(e.ctx, u, metav1.UpdateOptions{})
		return err
	})
	if err != nil {
		e.t.Fatalf("set %s's addresses: %v", name, err)
	}
}

// pool creates an IPPool from YAML for spec; it is deleted when the test ends.
func (e *env) pool(name, spec string) {
	e.t.Helper()
	var s map[string]any
	if err := yaml.Unmarshal([]byte(spec), &s); err != nil {
		e.t.Fatal(err)
	}
	obj := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": v1alpha1.GroupVersion.String(), "kind": "IPPool",
		"metadata": map[string]any{"name": name}, "spec": s,
	}}
	if _, err := e.dyn.Resource(v1alpha1.IPPoolResource).Create(e.ctx, obj, metav1.CreateOptions{}); err != nil {
		e.t.Fatalf("create pool %s: %v", name, err)
	}
	e.t.Cleanup(func() {
		_ = e.dyn.Resource(v1alpha1.IPPoolResource).Delete(context.Background(), name, metav1.DeleteOptions{})
	})
}

func (e *env) getPool(name string) *v1alpha1.IPPool {
	e.t.Helper()
	u, err := e.dyn.Resource(v1alpha1.IPPoolResource).Get(e.ctx, name, metav1.GetOptions{})
	if err != nil {
		e.t.Fatal(err)
	}
	p := &v1alpha1.IPPool{}
	if err := fromUnstructured(u, p); err != nil {
		e.t.Fatal(err)
	}
	return p
}

// namespace creates a namespace whose Services are deleted when the test ends; when no CCM
// runs any more to remove their finalizers, the cleanup removes them, so that later tests
// sharing the API server do not see them.
func (e *env) namespace(name string) string {
	e.t.Helper()
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}
	if _, err := e.srv.Client.CoreV1().Namespaces().Create(e.ctx, ns, metav1.CreateOptions{}); err != nil {
		e.t.Fatalf("create namespace %s: %v", name, err)
	}
	e.t.Cleanup(func() {
		ctx := context.Background()
		cs := e.srv.Client.CoreV1().Services(name)
		if l, err := cs.List(ctx, metav1.ListOptions{}); err == nil {
			for _, s := range l.Items {
				_ = cs.Delete(ctx, s.Name, metav1.DeleteOptions{})
			}
		}
		deadline := time.Now().Add(5 * time.Second)
		for {
			l, err := cs.List(ctx, metav1.ListOptions{})
			if err == nil && len(l.Items) == 0 {
				return
			}
			if time.Now().After(deadline) && err == nil {
				for _, s := range l.Items {
					_, _ = cs.Patch(ctx, s.Name, types.MergePatchType, []byte(`{"metadata":{"finalizers":null}}`), metav1.PatchOptions{})
				}
				return
			}
			time.Sleep(200 * time.Millisecond)
		}
	})
	return name
}

type svcOpt func(*corev1.Service)

func annotate(k annotation.Name, v string) svcOpt {
	return func(s *corev1.Service) {
		if s.Annotations == nil {
			s.Annotations = map[string]string{}
		}
		s.Annotations[string(k)] = v
	}
}

func ports(ps ...corev1.ServicePort) svcOpt { return func(s *corev1.Service) { s.Spec.Ports = ps } }

func (e *env) service(ns, name string, opts ...svcOpt) *corev1.Service {
	e.t.Helper()
	s := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: corev1.ServiceSpec{
			Type:     corev1.ServiceTypeLoadBalancer,
			Selector: map[string]string{"app": name},
			Ports:    []corev1.ServicePort{{Name: "http", Port: 80, Protocol: corev1.ProtocolTCP, TargetPort: intstr.FromInt32(8080)}},
		},
	}
	for _, o := range opts {
		o(s)
	}
	out, err := e.srv.Client.CoreV1().Services(ns).Create(e.ctx, s, metav1.CreateOptions{})
	if err != nil {
		e.t.Fatalf("create service %s/%s: %v", ns, name, err)
	}
	return out
}

// waitIPs waits until the Service's status holds n addresses and returns them.
func (e *env) waitIPs(ns, name string, n int, timeout time.Duration) []netip.Addr {
	e.t.Helper()
	var last *corev1.Service
	deadline := time.Now().Add(timeout)
	for time.Now().Before(deadline) {
		s, err := e.srv.Client.CoreV1().Services(ns).Get(e.ctx, name, metav1.GetOptions{})
		if err == nil {
			last = s
			if ips := ingressIPs(s); len(ips) == n {
				return ips
			}
		}
		time.Sleep(100 * time.Millisecond)
	}
	e.t.Fatalf("%s/%s has no %d addresses after %s; status %+v; events:\n%s", ns, name, n, timeout, last.Status.LoadBalancer, e.events(ns, name))
	return nil
}

func ingressIPs(s *corev1.Service) []netip.Addr {
	var out []netip.Addr
	for _, ing := range s.Status.LoadBalancer.Ingress {
		if a, err := netip.ParseAddr(ing.IP); err == nil {
			out = append(out, a)
		}
	}
	return out
}

// events lists the Events of an object, one a line: "Type Reason: Message".
func (e *env) events(ns, name string) string {
	l, err := e.srv.Client.CoreV1().Events(ns).List(e.ctx, metav1.ListOptions{
		FieldSelector: fields.Set{"involvedObject.name": name}.String(),
	})
	if err != nil {
		return err.Error()
	}
	var b strings.Builder
	for _, ev := range l.Items {
		fmt.Fprintf(&b, "%s %s: %s (x%d)\n", ev.Type, ev.Reason, ev.Message, max(ev.Count, 1))
	}
	return b.String()
}

// waitEvent waits for an Event of reason on the object whose message has every substring.
func (e *env) waitEvent(ns, name, reason string, timeout time.Duration, substrings ...string) {
	e.t.Helper()
	deadline := time.Now().Add(timeout)
	for time.Now().Before(deadline) {
		l, err := e.srv.Client.CoreV1().Events(ns).List(e.ctx, metav1.ListOptions{
			FieldSelector: fields.Set{"involvedObject.name": name, "reason": reason}.String(),
		})
		if err == nil {
			for _, ev := range l.Items {
				ok := true
				for _, sub := range substrings {
					ok = ok && strings.Contains(ev.Message, sub)
				}
				if ok {
					return
				}
			}
		}
		time.Sleep(100 * time.Millisecond)
	}
	e.t.Fatalf("no %s Event with %q on %s/%s within %s; events:\n%s", reason, substrings, ns, name, timeout, e.events(ns, name))
}

func TestAllocationAgainstTheRealAPIServer(t *testing.T) {
	e := newEnv(t)
	// Pool a serves only namespace alloc-a and comes first (priority 0); pool b serves
	// everyone, after a.
	e.pool("alloc-a", `{addresses: ["10.10.0.0/24", "10.10.1.0-10.10.1.99"], priority: 0, serviceAllocation: {namespaces: [alloc-a]}}`)
	e.pool("alloc-b", `{addresses: ["10.20.0.0/23"], priority: 1}`)
	ccm := startCCM(t, e.srv, fastConfig)
	nsA, nsB := e.namespace("alloc-a"), e.namespace("alloc-b")

	// 300 Services, created by 8 clients at once.
	const n = 300
	start := time.Now()
	errs := make(chan error, n)
	harness.Parallel(8, n, func(i int) {
		ns := nsA
		if i%2 == 1 {
			ns = nsB
		}
		s := &corev1.Service{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: fmt.Sprintf("svc-%03d", i)},
			Spec: corev1.ServiceSpec{Type: corev1.ServiceTypeLoadBalancer,
				Ports: []corev1.ServicePort{{Port: 80, Protocol: corev1.ProtocolTCP}}},
		}
		if _, err := e.srv.Client.CoreV1().Services(ns).Create(e.ctx, s, metav1.CreateOptions{}); err != nil {
			errs <- err
		}
	})
	close(errs)
	for err := range errs {
		t.Fatalf("create: %v", err)
	}
	prefixA := []netip.Prefix{netip.MustParsePrefix("10.10.0.0/24"), netip.MustParsePrefix("10.10.1.0/25")}
	prefixB := []netip.Prefix{netip.MustParsePrefix("10.20.0.0/23")}
	byIP := e.waitAll(n, 120*time.Second, nsA, nsB)
	t.Logf("%d Services allocated %s after the first create", n, time.Since(start).Round(time.Millisecond))
	for ip, s := range byIP {
		want := prefixB
		if s.Namespace == nsA {
			want = prefixA
		}
		if !inAny(ip, want) {
			t.Errorf("%s/%s got %s, outside its pool %v", s.Namespace, s.Name, ip, want)
		}
	}
	// The allocation records (pool and addresses beside the status) follow, off the hot path.
	deadline := time.Now().Add(60 * time.Second)
	for {
		wrong := ""
		for _, ns := range []string{nsA, nsB} {
			l, err := e.srv.Client.CoreV1().Services(ns).List(e.ctx, metav1.ListOptions{})
			if err != nil {
				t.Fatal(err)
			}
			for _, s := range l.Items {
				pool := s.Annotations[string(annotation.AllocatedPool)]
				ips := s.Annotations[string(annotation.AllocatedIPs)]
				if (ns == nsA) != (pool == "alloc-a") || pool == "" || ips != ingressIPs(&s)[0].String() {
					wrong = fmt.Sprintf("%s/%s records pool %q ips %q", ns, s.Name, pool, ips)
				}
			}
		}
		if wrong == "" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("allocation records incomplete after 60s: %s", wrong)
		}
		time.Sleep(250 * time.Millisecond)
	}
	t.Logf("allocation records complete %s after the first create", time.Since(start).Round(time.Millisecond))

	// Pool status counts the allocations.
	deadline = time.Now().Add(15 * time.Second)
	for {
		pa, pb := e.getPool("alloc-a"), e.getPool("alloc-b")
		if pa.Status.AllocatedIPv4 == n/2 && pb.Status.AllocatedIPv4 == n/2 && pa.Status.AvailableIPv4 == 356-n/2 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("pool status: a %+v, b %+v; want %d allocated in each, %d free in a", pa.Status, pb.Status, n/2, 356-n/2)
		}
		time.Sleep(200 * time.Millisecond)
	}

	// Restart the CCM: nothing moves.
	t.Logf("pool status checked at %s", time.Since(start).Round(time.Millisecond))
	ccm.Stop(10 * time.Second)
	ccm2 := startCCM(t, e.srv, fastConfig)
	// Wait until the new CCM has taken up every Service, then compare.
	e.waitSynced(ccm2, 60*time.Second, nsA, nsB)
	e.service(nsB, "after-restart")
	e.waitIPs(nsB, "after-restart", 1, 30*time.Second)
	after := e.waitAll(n+1, 60*time.Second, nsA, nsB)
	t.Logf("restart checked at %s", time.Since(start).Round(time.Millisecond))
	moved := 0
	for ip, s := range byIP {
		if a, ok := after[ip]; !ok || a.Name != s.Name || a.Namespace != s.Namespace {
			moved++
		}
	}
	if moved != 0 {
		t.Errorf("%d of %d addresses changed over a CCM restart", moved, n)
	}

	// A deleted Service's address is given out again (lowest free first).
	victim := "svc-001"
	victimIP := ingressIPs(serviceOf(t, e, nsB, victim))[0]
	if err := e.srv.Client.CoreV1().Services(nsB).Delete(e.ctx, victim, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	e.waitGone(nsB, victim)
	t.Logf("deletion done at %s", time.Since(start).Round(time.Millisecond))
	e.service(nsB, "reuser")
	if got := e.waitIPs(nsB, "reuser", 1, 30*time.Second); got[0] != victimIP {
		t.Errorf("reuser got %s; the freed %s is the lowest free address", got[0], victimIP)
	}
}

func (e *env) waitAll(n int, timeout time.Duration, namespaces ...string) map[netip.Addr]*corev1.Service {
	e.t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		byIP := map[netip.Addr]*corev1.Service{}
		total, dup := 0, ""
		for _, ns := range namespaces {
			l, err := e.srv.Client.CoreV1().Services(ns).List(e.ctx, metav1.ListOptions{})
			if err != nil {
				e.t.Fatal(err)
			}
			for i := range l.Items {
				s := &l.Items[i]
				for _, ip := range ingressIPs(s) {
					if o, ok := byIP[ip]; ok {
						dup = fmt.Sprintf("%s held by %s/%s and %s/%s", ip, o.Namespace, o.Name, s.Namespace, s.Name)
					}
					byIP[ip] = s
					total++
				}
			}
		}
		if dup != "" {
			e.t.Fatalf("duplicate address: %s", dup)
		}
		if total >= n {
			return byIP
		}
		if time.Now().After(deadline) {
			e.t.Fatalf("%d of %d Services have addresses after %s", total, n, timeout)
		}
		time.Sleep(250 * time.Millisecond)
	}
}

// waitSynced waits until the CCM's log shows it has taken up every Service of the namespaces.
func (e *env) waitSynced(ccm *testenv.Proc, timeout time.Duration, namespaces ...string) {
	e.t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		log := ccm.Output()
		behind := 0
		for _, ns := range namespaces {
			svcs, err := e.srv.Client.CoreV1().Services(ns).List(e.ctx, metav1.ListOptions{})
			if err != nil {
				e.t.Fatal(err)
			}
			for _, s := range svcs.Items {
				if !strings.Contains(log, `"Service served" service="`+ns+"/"+s.Name+`"`) {
					behind++
				}
			}
		}
		if behind == 0 {
			return
		}
		if time.Now().After(deadline) {
			e.t.Fatalf("the CCM has not taken up %d Services within %s", behind, timeout)
		}
		time.Sleep(250 * time.Millisecond)
	}
}

func (e *env) waitGone(ns, name string) {
	e.t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		if _, err := e.srv.Client.CoreV1().Services(ns).Get(e.ctx, name, metav1.GetOptions{}); apierrors.IsNotFound(err) {
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
	e.t.Fatalf("%s/%s not deleted within 30s (finalizer not removed?)", ns, name)
}

func inAny(a netip.Addr, ps []netip.Prefix) bool {
	for _, p := range ps {
		if p.Contains(a) {
			return true
		}
	}
	return false
}

func TestRequestsConflictsAndExhaustion(t *testing.T) {
	e := newEnv(t)
	e.pool("req-pool", `{addresses: ["10.30.0.0/29"], serviceAllocation: {namespaces: [req]}}`)
	e.pool("tiny-pool", `{addresses: ["10.31.0.1-10.31.0.2"], serviceAllocation: {namespaces: [tiny]}}`)
	startCCM(t, e.srv, fastConfig)
	ns := e.namespace("req")
	tiny := e.namespace("tiny")

	// A requested address is honoured, by annotation and by spec.loadBalancerIP.
	e.service(ns, "wants-5", annotate(annotation.IPs, "10.30.0.5"))
	if got := e.waitIPs(ns, "wants-5", 1, 30*time.Second); got[0] != netip.MustParseAddr("10.30.0.5") {
		t.Errorf("requested 10.30.0.5, got %s", got[0])
	}
	e.service(ns, "wants-6", func(s *corev1.Service) { s.Spec.LoadBalancerIP = "10.30.0.6" })
	if got := e.waitIPs(ns, "wants-6", 1, 30*time.Second); got[0] != netip.MustParseAddr("10.30.0.6") {
		t.Errorf("spec.loadBalancerIP 10.30.0.6, got %s", got[0])
	}
	e.waitEvent(ns, "wants-5", "IPAllocated", 10*time.Second, "10.30.0.5", "req-pool")
	time.Sleep(time.Second) // the framework syncs again after the allocation annotations are written
	assertEventCount(t, e, ns, "wants-5", "IPAllocated", 1)

	// Asking for a taken address leaves the Service pending with a Warning naming the holder.
	e.service(ns, "wants-5-too", annotate(annotation.IPs, "10.30.0.5"))
	e.waitEvent(ns, "wants-5-too", "IPInUse", 30*time.Second, "10.30.0.5", ns+"/wants-5")
	time.Sleep(2 * time.Second) // two retries
	if s := serviceOf(t, e, ns, "wants-5-too"); len(s.Status.LoadBalancer.Ingress) != 0 {
		t.Errorf("a Service asking for a taken address got %v", s.Status.LoadBalancer.Ingress)
	}
	assertEventCount(t, e, ns, "wants-5-too", "IPInUse", 1)

	// Sharing: same key, other port, same address; a colliding port is refused by name.
	e.service(ns, "dns-tcp", annotate(annotation.SharingKey, "dns"), annotate(annotation.IPs, "10.30.0.7"),
		ports(corev1.ServicePort{Name: "dns", Port: 53, Protocol: corev1.ProtocolTCP}))
	e.service(ns, "dns-udp", annotate(annotation.SharingKey, "dns"), annotate(annotation.IPs, "10.30.0.7"),
		ports(corev1.ServicePort{Name: "dns", Port: 53, Protocol: corev1.ProtocolUDP}))
	if a, b := e.waitIPs(ns, "dns-tcp", 1, 30*time.Second), e.waitIPs(ns, "dns-udp", 1, 30*time.Second); a[0] != b[0] {
		t.Errorf("sharing Services got %s and %s", a[0], b[0])
	}
	e.service(ns, "dns-tcp-2", annotate(annotation.SharingKey, "dns"), annotate(annotation.IPs, "10.30.0.7"),
		ports(corev1.ServicePort{Name: "dns", Port: 53, Protocol: corev1.ProtocolTCP}))
	e.waitEvent(ns, "dns-tcp-2", "SharingConflict", 30*time.Second, "TCP/53", ns+"/dns-tcp")

	// An address outside every pool says so.
	e.service(ns, "outside", annotate(annotation.IPs, "10.99.0.1"))
	e.waitEvent(ns, "outside", "NoPool", 30*time.Second, "10.99.0.1 is not in any IP pool")
	// A malformed annotation says what is wrong.
	e.service(ns, "malformed", annotate(annotation.IPs, "10.30.0.300"))
	e.waitEvent(ns, "malformed", "InvalidAnnotation", 30*time.Second, "metalvip.io/ips", "10.30.0.300")

	// An exhausted pool leaves the third Service pending until an address is freed.
	e.service(tiny, "one")
	e.service(tiny, "two")
	e.waitIPs(tiny, "one", 1, 30*time.Second)
	e.waitIPs(tiny, "two", 1, 30*time.Second)
	e.service(tiny, "three")
	e.waitEvent(tiny, "three", "PoolExhausted", 30*time.Second, "tiny-pool")
	// Why it waits is also its Allocated condition (Events expire), which metalvipctl reads.
	allocated := func(name string) *metav1.Condition {
		svc, err := e.srv.Client.CoreV1().Services(tiny).Get(e.ctx, name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return meta.FindStatusCondition(svc.Status.Conditions, desired.ConditionAllocated)
	}
	harness.Eventually(t, 30*time.Second, "the waiting Service's Allocated condition says why", func() bool {
		c := allocated("three")
		return c != nil && c.Status == metav1.ConditionFalse && c.Reason == "PoolExhausted" && strings.Contains(c.Message, "tiny-pool")
	})
	// kubectl's flags: a kubeconfig whose current context leads nowhere, the right one named
	// by --context, one namespace by -n.
	kc := elsewhereKubeconfig(t, e.srv.Kubeconfig(t, nil), "metalvip-test")
	out, err := exec.Command(ctlBinary, "status", "--kubeconfig", kc, "--context", "metalvip-test", "-n", tiny, "-o", "yaml").Output()
	var st struct {
		Services []struct{ Namespace, Name, Pending string }
	}
	if err != nil || yaml.Unmarshal(out, &st) != nil {
		t.Fatalf("metalvipctl status -o yaml: %v\n%s", err, out)
	}
	for _, svc := range st.Services {
		if svc.Namespace != tiny {
			t.Errorf("metalvipctl status -n %s shows %s/%s", tiny, svc.Namespace, svc.Name)
		}
	}
	said := "(not listed)"
	for _, svc := range st.Services {
		if svc.Namespace == tiny && svc.Name == "three" {
			said = svc.Pending
		}
	}
	if !strings.HasPrefix(said, "PoolExhausted: ") {
		t.Errorf("metalvipctl status says %s/three is pending for %q; want PoolExhausted: ...", tiny, said)
	}
	if err := e.srv.Client.CoreV1().Services(tiny).Delete(e.ctx, "one", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	got := e.waitIPs(tiny, "three", 1, 30*time.Second)
	t.Logf("pending Service got %s after an address was freed", got[0])
	harness.Eventually(t, 30*time.Second, "the Allocated condition removed once the Service has its address", func() bool { return allocated("three") == nil })
	if c := allocated("two"); c != nil {
		t.Errorf("a Service that never waited has an Allocated condition: %+v", c)
	}

	// The pool is full again; growing it lets a fourth in, without a restart.
	e.service(tiny, "four")
	e.waitEvent(tiny, "four", "PoolExhausted", 30*time.Second, "tiny-pool")
	e.setPoolAddresses("tiny-pool", []string{"10.31.0.1-10.31.0.3"})
	if got := e.waitIPs(tiny, "four", 1, 30*time.Second); got[0] != netip.MustParseAddr("10.31.0.3") {
		t.Errorf("after the pool grew the pending Service got %s, want 10.31.0.3", got[0])
	}
}

func assertEventCount(t *testing.T, e *env, ns, name, reason string, want int32) {
	t.Helper()
	l, err := e.srv.Client.CoreV1().Events(ns).List(e.ctx, metav1.ListOptions{
		FieldSelector: fields.Set{"involvedObject.name": name, "reason": reason}.String(),
	})
	if err != nil {
		t.Fatal(err)
	}
	var n int32
	for _, ev := range l.Items {
		n += max(ev.Count, 1)
	}
	if n != want {
		t.Errorf("%d %s Events on %s/%s, want %d (no Event on a retry that changes nothing)", n, reason, ns, name, want)
	}
}

func TestPoolChangesNeverTakeAnAddress(t *testing.T) {
	e := newEnv(t)
	e.pool("shrink-pool", `{addresses: ["10.40.0.0/30"], serviceAllocation: {namespaces: [shrink]}}`)
	startCCM(t, e.srv, fastConfig)
	ns := e.namespace("shrink")
	e.service(ns, "first")
	held := e.waitIPs(ns, "first", 1, 30*time.Second)[0]

	// Shrink the pool under the address: the Service keeps it, is told, and so is the pool.
	e.setPoolAddresses("shrink-pool", []string{"10.40.0.2/31"})
	e.waitEvent(ns, "first", "PoolShrunk", 30*time.Second, held.String(), "shrink-pool")
	deadline := time.Now().Add(15 * time.Second)
	for {
		p := e.getPool("shrink-pool")
		c := findCondition(p, v1alpha1.PoolAddressesInUseRemoved)
		if c != nil && c.Status == metav1.ConditionTrue && strings.Contains(c.Message, held.String()) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("pool conditions %+v; want AddressesInUseRemoved naming %s", p.Status.Conditions, held)
		}
		time.Sleep(200 * time.Millisecond)
	}
	// A Service update re-runs the allocation: still the same address.
	s := serviceOf(t, e, ns, "first")
	s.Labels = map[string]string{"touched": "yes"}
	if s.Annotations == nil { // the allocation record may not be written yet
		s.Annotations = map[string]string{}
	}
	s.Annotations[string(annotation.SharingKey)] = "x"
	if _, err := e.srv.Client.CoreV1().Services(ns).Update(e.ctx, s, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	e.service(ns, "second") // gets a new address from what remains
	second := e.waitIPs(ns, "second", 1, 30*time.Second)[0]
	if second == held || !netip.MustParsePrefix("10.40.0.2/31").Contains(second) {
		t.Errorf("second Service got %s; the pool is now 10.40.0.2/31 and %s is held", second, held)
	}
	if got := ingressIPs(serviceOf(t, e, ns, "first")); len(got) != 1 || got[0] != held {
		t.Errorf("first Service now has %v; it must keep %s", got, held)
	}
}

func TestDualStackServices(t *testing.T) {
	e := newEnv(t)
	e.pool("dual-pool", `{addresses: ["10.60.0.0/30", "fd00:60::/126"], serviceAllocation: {namespaces: [dual]}}`)
	e.pool("v4-pool", `{addresses: ["10.61.0.0/30"], serviceAllocation: {namespaces: [dual]}, autoAssign: false}`)
	startCCM(t, e.srv, fastConfig)
	ns := e.namespace("dual")
	policy := func(p corev1.IPFamilyPolicy, fams ...corev1.IPFamily) svcOpt {
		return func(s *corev1.Service) { s.Spec.IPFamilyPolicy = &p; s.Spec.IPFamilies = fams }
	}
	e.service(ns, "require", policy(corev1.IPFamilyPolicyRequireDualStack, corev1.IPv6Protocol, corev1.IPv4Protocol))
	got := e.waitIPs(ns, "require", 2, 30*time.Second)
	if !got[0].Is6() || !got[1].Is4() {
		t.Errorf("RequireDualStack [IPv6, IPv4] got %v; want IPv6 first", got)
	}
	e.service(ns, "single-v6", policy(corev1.IPFamilyPolicySingleStack, corev1.IPv6Protocol))
	if got := e.waitIPs(ns, "single-v6", 1, 30*time.Second); !got[0].Is6() {
		t.Errorf("SingleStack IPv6 got %v", got)
	}
	e.service(ns, "prefer-in-v4-pool", annotate(annotation.Pool, "v4-pool"), policy(corev1.IPFamilyPolicyPreferDualStack, corev1.IPv4Protocol, corev1.IPv6Protocol))
	if got := e.waitIPs(ns, "prefer-in-v4-pool", 1, 30*time.Second); !got[0].Is4() {
		t.Errorf("PreferDualStack from an IPv4-only pool got %v", got)
	}
	e.service(ns, "require-in-v4-pool", annotate(annotation.Pool, "v4-pool"), policy(corev1.IPFamilyPolicyRequireDualStack, corev1.IPv4Protocol, corev1.IPv6Protocol))
	e.waitEvent(ns, "require-in-v4-pool", "PoolExhausted", 30*time.Second, "v4-pool", "no IPv6 addresses")
}

func findCondition(p *v1alpha1.IPPool, typ string) *metav1.Condition {
	for i := range p.Status.Conditions {
		if p.Status.Conditions[i].Type == typ {
			return &p.Status.Conditions[i]
		}
	}
	return nil
}

func fromUnstructured(u *unstructured.Unstructured, into any) error {
	return runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, into)
}

// elsewhereKubeconfig writes a copy of the kubeconfig at path whose current context points at
// no API server, and whose working context is named name.
func elsewhereKubeconfig(t *testing.T, path, name string) string {
	t.Helper()
	cfg, err := clientcmd.LoadFromFile(path)
	if err != nil {
		t.Fatal(err)
	}
	for n, c := range cfg.Contexts {
		delete(cfg.Contexts, n)
		cfg.Contexts[name] = c
	}
	cfg.Clusters["nowhere"] = &clientcmdapi.Cluster{Server: "https://127.0.0.1:1"}
	cfg.Contexts["elsewhere"] = &clientcmdapi.Context{Cluster: "nowhere", AuthInfo: "nobody"}
	cfg.CurrentContext = "elsewhere"
	out := filepath.Join(t.TempDir(), "kubeconfig")
	if err := clientcmd.WriteToFile(*cfg, out); err != nil {
		t.Fatal(err)
	}
	return out
}
