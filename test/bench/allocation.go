package main

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/tools/cache"
	"sigs.k8s.io/yaml"

	"github.com/metalvip/metalvip/api/v1alpha1"
	"github.com/metalvip/metalvip/test/harness"
	"github.com/metalvip/metalvip/test/harness/figure"
	"github.com/metalvip/metalvip/test/harness/proc"
	"github.com/metalvip/metalvip/test/kubeapi"
	"github.com/metalvip/metalvip/test/testenv"
)

// createServices creates n Services in ns with 8 parallel clients and returns when each
// create returned.
// class, when not empty, is the Services' loadBalancerClass: a class no load balancer
// serves makes the same objects that no CCM touches.
func createServices(m *testenv.Main, srv *kubeapi.Server, ns string, n int, class string) (map[string]time.Time, time.Duration) {
	var mu sync.Mutex
	created := make(map[string]time.Time, n)
	start := time.Now()
	harness.Parallel(8, n, func(i int) {
		name := fmt.Sprintf("s-%05d", i)
		// No node ports: thousands of Services would exhaust the range (2,768 ports), and a
		// bare-metal load balancer does not need them.
		s := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
			Spec: corev1.ServiceSpec{Type: corev1.ServiceTypeLoadBalancer, Ports: []corev1.ServicePort{{Port: 80}},
				AllocateLoadBalancerNodePorts: ptr(false)}}
		if class != "" {
			s.Spec.LoadBalancerClass = &class
		}
		for attempt := 0; ; attempt++ {
			_, err := srv.Client.CoreV1().Services(ns).Create(context.Background(), s, metav1.CreateOptions{})
			if err == nil {
				break
			}
			if attempt > 5 {
				m.Fatalf("create %s: %v", name, err)
			}
			time.Sleep(100 * time.Millisecond)
		}
		mu.Lock()
		created[name] = time.Now()
		mu.Unlock()
	})
	return created, time.Since(start)
}

// allocation measures run i with n Services; each run has its own pool, whose range
// overlaps no earlier run's (overlapping pools are refused).
func allocation(m *testenv.Main, srv *kubeapi.Server, ccmBin string, n, i, agentPort int, status time.Duration) ([]string, string) {
	harness.Step("allocation of %d Services: the API server alone", n)
	base := fmt.Sprintf("bench-base-%d", n)
	mustNamespace(m, srv, base)
	// Of a class nobody serves: the CCMs started later leave them alone.
	// The same probe as the run with the CCM watches them: its watch is the measure's cost,
	// not metalvip's.
	basePr := newProbe(srv, base, n)
	pids := serverPids(srv)
	w0, r0 := apiRequests(m, srv)
	scpu0 := serverCPU(pids)
	self0 := proc.CPUSeconds(os.Getpid())
	serverProfile(srv, fmt.Sprintf("%d-alone", n))
	_, alone := createServices(m, srv, base, n, "bench.metalvip.io/nobody")
	time.Sleep(500 * time.Millisecond) // etcd's share of the last creates
	aloneCPU := serverCPU(pids) - scpu0
	aloneSelf := proc.CPUSeconds(os.Getpid()) - self0
	w0b, r0b := apiRequests(m, srv)
	aloneWrites, aloneReads := w0b.Minus(w0), r0b.Minus(r0)
	basePr.stop()
	harness.Step("  created in %s", alone.Round(time.Millisecond))
	// Gone again (no finalizer holds them): every run starts with the API server as empty.
	deleteServices(m, srv, base, n)

	ns := fmt.Sprintf("bench-alloc-%d", n)
	mustNamespace(m, srv, ns)
	dyn, err := dynamic.NewForConfig(srv.Config)
	if err != nil {
		m.Fatalf("%v", err)
	}
	createObject(m, dyn, v1alpha1.IPPoolResource, ns, fmt.Sprintf(`{addresses: ["10.%d.0.0/16"], serviceAllocation: {namespaces: [%s]}}`, 128+i, ns))
	kc := srv.Kubeconfig(m, nil)
	cfg := filepath.Join(m.TempDir(), "cloud-config.yaml")
	if err := os.WriteFile(cfg, fmt.Appendf(nil, "allocation:\n  poolStatusInterval: 1s\nagent:\n  insecure: true\n  port: %d\n", agentPort), 0o600); err != nil {
		m.Fatalf("%v", err)
	}
	args := []string{"--kubeconfig", kc, "--cloud-config", cfg, "--leader-elect=false", "--secure-port=0", "--controllers=service-lb-controller"}
	// The CCM's metrics (its queues' latency, its client's) on a loopback port, open without
	// credentials; the heap profile too when asked for.
	profPort := testenv.FreePort(m)
	args = append(args, fmt.Sprintf("--secure-port=%d", profPort), "--bind-address=127.0.0.1", "--profiling",
		"--authentication-skip-lookup", "--authorization-always-allow-paths=/healthz,/metrics,/debug/pprof/heap,/debug/pprof/profile")
	metricsURL := fmt.Sprintf("https://127.0.0.1:%d/metrics", profPort)
	metricNames := []string{"workqueue_queue_duration_seconds", "workqueue_work_duration_seconds", "rest_client_request_duration_seconds", "rest_client_rate_limiter_duration_seconds"}
	if *ccmArg != "" {
		args = append(args, strings.Fields(*ccmArg)...)
	}
	ccmProc := testenv.StartProc(m, fmt.Sprintf("ccm-%d", n), exec.Command(ccmBin, args...))
	time.Sleep(3 * time.Second) // informers synced, allocator rebuilt, the agent reached

	pr := newProbe(srv, ns, n)
	defer pr.stop()
	harness.Step("allocation of %d Services: with the CCM", n)
	cpu0 := proc.CPUSeconds(ccmProc.Cmd.Process.Pid)
	q0, err := readCCMMetrics(metricsURL, metricNames...)
	if err != nil {
		m.Fatalf("the CCM's metrics: %v", err)
	}
	w1, r1 := apiRequests(m, srv)
	scpu1 := serverCPU(pids)
	self1, ap0, at0 := proc.CPUSeconds(os.Getpid()), agentApplies.Load(), agentApplyTime.Load()
	if *cpuOut != "" {
		prof := fmt.Sprintf("%s-%d.pprof", *cpuOut, n)
		go func() {
			cmd := exec.Command("curl", "-sk", "-o", prof, fmt.Sprintf("https://127.0.0.1:%d/debug/pprof/profile?seconds=10", profPort))
			if out, err := cmd.CombinedOutput(); err != nil {
				harness.Step("  CPU profile: %v %s", err, out)
			} else {
				harness.Step("  CPU profile in %s", prof)
			}
		}()
	}
	serverProfile(srv, fmt.Sprintf("%d-ccm", n))
	start := time.Now()
	created, createdIn := createServices(m, srv, ns, n, "")
	agentLine := fmt.Sprintf(" During the creates the node's agent (in the bench's own process, on the same cores) took %d Applies of its whole state, %.1f s in them; the bench's process used %.1f s of CPU (alone %.1f s).",
		agentApplies.Load()-ap0, time.Duration(agentApplyTime.Load()-at0).Seconds(), proc.CPUSeconds(os.Getpid())-self1, aloneSelf)
	harness.Step(" %s", agentLine)
	select {
	case <-pr.done:
	case <-time.After(15 * time.Minute):
		m.Fatalf("only %d of %d Services allocated after 15 minutes", pr.allocated(), n)
	}
	select {
	case <-pr.allAnnounced:
	case <-time.After(60 * time.Second): // a CCM that writes no condition (an older one, -ccm)
	}
	// The reports written after the burst (IPAllocated Events, the pool status) land: the
	// writes counted are all of them, until the API server's count of writes stops moving.
	for last, still, deadline := apiWrites(m, srv).Total(), 0, time.Now().Add(5*time.Minute); still < 3 && time.Now().Before(deadline); {
		time.Sleep(time.Second)
		now := apiWrites(m, srv).Total()
		if now == last {
			still++
		} else {
			still = 0
		}
		last = now
	}
	w2, r2 := apiRequests(m, srv)
	ccmWrites, ccmReads := w2.Minus(w1).Minus(aloneWrites), r2.Minus(r1).Minus(aloneReads)
	withCPU := serverCPU(pids) - scpu1
	q1, err := readCCMMetrics(metricsURL, metricNames...)
	if err != nil {
		m.Fatalf("the CCM's metrics: %v", err)
	}
	q := q1.minus(q0)
	cpu := proc.CPUSeconds(ccmProc.Cmd.Process.Pid) - cpu0
	var last, lastAnn time.Time
	var lat []float64
	pr.mu.Lock()
	for name, at := range pr.seen {
		if at.After(last) {
			last = at
		}
		lat = append(lat, float64(at.Sub(created[name])))
	}
	for _, at := range pr.announced {
		if at.After(lastAnn) {
			lastAnn = at
		}
	}
	nAnnounced := len(pr.announced)
	pr.mu.Unlock()
	annCell := figure.Duration(lastAnn.Sub(start))
	if nAnnounced < n {
		annCell = fmt.Sprintf("%d of %d with a condition", nAnnounced, n)
	}
	all := last.Sub(start)
	mem, _ := proc.MemoryOf(ccmProc.Cmd.Process.Pid)
	rss, anon, file := mem.RSS, mem.Anon, mem.File
	if *heapOut != "" {
		heap := fmt.Sprintf("%s-%d.pprof", *heapOut, n)
		cmd := exec.Command("curl", "-sk", "-o", heap, fmt.Sprintf("https://127.0.0.1:%d/debug/pprof/heap", profPort))
		if out, err := cmd.CombinedOutput(); err != nil {
			harness.Step("  heap profile: %v %s", err, out)
		} else {
			harness.Step("  heap profile in %s", heap)
		}
	}
	harness.Step("  all allocated after %s (API server alone: %s), announced: %s, CCM writes %.2f per Service (%s)", all.Round(time.Millisecond), alone.Round(time.Millisecond),
		annCell, ccmWrites.Total()/float64(n), ccmWrites.Describe(float64(n), 0.05, 2))
	// The CCM removes its finalizers as the Services go: later runs and the lab start clean.
	harness.Step("  deleting them")
	deleteServices(m, srv, ns, n)
	ccmProc.Stop(10 * time.Second)
	// A-B-A: the same API server creates more slowly the more runs it has been through, so the run alone is made again after the CCM's, and the
	// CCM's is compared with the mean of the two.
	aloneCell, baseline, order := figure.Duration(alone), alone, ""
	if *aloneAfter {
		again := fmt.Sprintf("bench-again-%d", n)
		mustNamespace(m, srv, again)
		againPr := newProbe(srv, again, n)
		_, after := createServices(m, srv, again, n, "bench.metalvip.io/nobody")
		againPr.stop()
		harness.Step("  the API server alone again, after the CCM's run: created in %s (before it: %s)", after.Round(time.Millisecond), alone.Round(time.Millisecond))
		deleteServices(m, srv, again, n)
		baseline = (alone + after) / 2
		aloneCell = fmt.Sprintf("%s before, %s after (mean %s)", figure.Duration(alone), figure.Duration(after), figure.Duration(baseline))
		order = fmt.Sprintf(" The run alone after the CCM's took %.2fx the one before it; against the run before alone the ratio is %.2fx, against the run after %.2fx.",
			after.Seconds()/alone.Seconds(), all.Seconds()/alone.Seconds(), all.Seconds()/after.Seconds())
	}
	return []string{fmt.Sprint(n), aloneCell, figure.Duration(all), fmt.Sprintf("%.2fx", all.Seconds()/baseline.Seconds()),
			figure.Duration(time.Duration(figure.Percentile(lat, 50))), figure.Duration(time.Duration(figure.Percentile(lat, 99))), figure.Duration(time.Duration(slices.Max(lat))),
			annCell, fmt.Sprintf("%.2f", ccmWrites.Total()/float64(n)), fmt.Sprintf("%.1f s", cpu), fmt.Sprintf("%s (heap and stacks %s, binary pages %s)", figure.MiB(rss), figure.MiB(anon), figure.MiB(file))},
		gapOf(n, alone, createdIn, aloneCPU, withCPU, ccmWrites, ccmReads, q, status) + agentLine + order
}

// serverProfile writes, when -server-cpu asks for it, kube-apiserver's CPU profile of the next
// 10 s to the file named by -server-cpu and name, in the background.
func serverProfile(srv *kubeapi.Server, name string) {
	if *srvOut == "" {
		return
	}
	go func() {
		b, err := srv.Client.CoreV1().RESTClient().Get().AbsPath("/debug/pprof/profile").Param("seconds", "10").DoRaw(context.Background())
		if err == nil {
			err = os.WriteFile(fmt.Sprintf("%s-%s.pprof", *srvOut, name), b, 0o644)
		}
		if err != nil {
			harness.Step("  kube-apiserver's CPU profile: %v", err)
		}
	}()
}

// gapOf says what the time between the API server alone and metalvip is made of: how much
// longer the creates themselves took, the API server's extra CPU, the CCM's requests, and how
// long Services waited in the CCM's queues.
func gapOf(n int, alone, createdIn time.Duration, aloneCPU, withCPU float64, writes, reads figure.Counts, q ccmMetrics, status time.Duration) string {
	var b strings.Builder
	fmt.Fprintf(&b, "- %d Services: the creates took %s alone and %s with the CCM; kube-apiserver and etcd used %.1f s of CPU alone and %.1f s with the CCM (%s more per Service). CCM writes per Service: %s. CCM reads per Service: %s.",
		n, figure.Duration(alone), figure.Duration(createdIn), aloneCPU, withCPU, figure.Duration(time.Duration((withCPU-aloneCPU)/float64(n)*float64(time.Second))), writes.Describe(float64(n), 0.05, 2), orNone(reads.Describe(float64(n), 0.05, 2)))
	if status > 0 && aloneCPU > 0 {
		// The API server is the limit of a burst: its time is its CPU. The one write that
		// carries the address adds its price to each create's.
		perCreate := aloneCPU / float64(n)
		fmt.Fprintf(&b, " The floor: alone the API server spent %s of CPU a create; one status write a Service (%s, the price list below) would make it %.2fx, with no watch, Event, condition or CCM CPU at all.",
			figure.Duration(time.Duration(perCreate*float64(time.Second))), figure.Duration(status), 1+status.Seconds()/perCreate)
	}
	for _, name := range []string{"metalvip-services", "metalvip-service-events-paced", "metalvip-announcer-status", "metalvip-announcer-status-paced", "service"} {
		wait, work := q["workqueue_queue_duration_seconds{"+name+"}"], q["workqueue_work_duration_seconds{"+name+"}"]
		if wait.count == 0 {
			continue
		}
		fmt.Fprintf(&b, " Queue %s: %.0f items waited %s on average (p99 at most %s), their work took %s (p99 at most %s).",
			name, wait.count, figure.Duration(wait.mean()), durOrMore(wait.quantile(0.99)), figure.Duration(work.mean()), durOrMore(work.quantile(0.99)))
	}
	var client []string
	for _, verb := range []string{"POST", "PATCH", "PUT", "GET", "LIST"} {
		if h := q["rest_client_request_duration_seconds{"+verb+"}"]; h.count > 0 {
			client = append(client, fmt.Sprintf("%s %.0f, %s on average (p99 at most %s)", verb, h.count, figure.Duration(h.mean()), durOrMore(h.quantile(0.99))))
		}
	}
	if len(client) > 0 {
		fmt.Fprintf(&b, " The CCM's requests: %s.", strings.Join(client, "; "))
	}
	if h := q["rest_client_rate_limiter_duration_seconds{}"]; h.count > 0 {
		fmt.Fprintf(&b, " Its client's rate limiter held requests %s on average (p99 at most %s).", figure.Duration(h.mean()), durOrMore(h.quantile(0.99)))
	}
	return b.String()
}

func orNone(s string) string {
	if s == "" {
		return "none above 0.05"
	}
	return s
}

// durOrMore prints a histogram's bucket bound; -1 is past its last bucket.
func durOrMore(d time.Duration) string {
	if d < 0 {
		return "past the last bucket"
	}
	return figure.Duration(d)
}

// deleteServices deletes the n Services of ns and waits until they are gone.
func deleteServices(m *testenv.Main, srv *kubeapi.Server, ns string, n int) {
	harness.Parallel(8, n, func(i int) {
		_ = srv.Client.CoreV1().Services(ns).Delete(context.Background(), fmt.Sprintf("s-%05d", i), metav1.DeleteOptions{})
	})
	deadline := time.Now().Add(10 * time.Minute)
	for {
		l, err := srv.Client.CoreV1().Services(ns).List(context.Background(), metav1.ListOptions{Limit: 1})
		if err == nil && len(l.Items) == 0 {
			return
		}
		if time.Now().After(deadline) {
			m.Fatalf("Services of %s not gone after 10 minutes", ns)
		}
		time.Sleep(time.Second)
	}
}

func mustNamespace(m *testenv.Main, srv *kubeapi.Server, name string) {
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}
	if _, err := srv.Client.CoreV1().Namespaces().Create(context.Background(), ns, metav1.CreateOptions{}); err != nil {
		m.Fatalf("namespace %s: %v", name, err)
	}
}

func createObject(m *testenv.Main, dyn dynamic.Interface, gvr interface{ String() string }, name, spec string) {
	var s map[string]any
	if err := yaml.Unmarshal([]byte(spec), &s); err != nil {
		m.Fatalf("%v", err)
	}
	obj := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": v1alpha1.GroupVersion.String(), "kind": "IPPool", "metadata": map[string]any{"name": name}, "spec": s,
	}}
	if _, err := dyn.Resource(v1alpha1.IPPoolResource).Create(context.Background(), obj, metav1.CreateOptions{}); err != nil {
		m.Fatalf("pool %s: %v", name, err)
	}
}

// statusCost is the price of the status write that carries a Service's address, finalizer and
// record (0 when the price list was not measured).
func statusCost(costs []writeCost) time.Duration {
	for _, c := range costs {
		if c.kind == statusWriteKind {
			return c.cpu
		}
	}
	return 0
}

// probe records when each Service of a namespace gets its address and its Announced
// condition, by an informer (it re-lists and re-watches by itself, which a bare watch against
// a lagging watch cache does not). It runs in both runs, alone and with the CCM, so that its
// watch costs the API server the same in each.
type probe struct {
	mu                 sync.Mutex
	n                  int
	seen, announced    map[string]time.Time
	done, allAnnounced chan struct{}
	stopCh             chan struct{}
}

func newProbe(srv *kubeapi.Server, ns string, n int) *probe {
	p := &probe{n: n, seen: make(map[string]time.Time, n), announced: make(map[string]time.Time, n),
		done: make(chan struct{}), allAnnounced: make(chan struct{}), stopCh: make(chan struct{})}
	factory := informers.NewSharedInformerFactoryWithOptions(srv.Client, 0, informers.WithNamespace(ns))
	_, _ = factory.Core().V1().Services().Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc: p.record, UpdateFunc: func(_, o any) { p.record(o) },
	})
	factory.Start(p.stopCh)
	factory.WaitForCacheSync(p.stopCh)
	return p
}

func (p *probe) record(o any) {
	s, ok := o.(*corev1.Service)
	if !ok || len(s.Status.LoadBalancer.Ingress) == 0 {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if _, dup := p.seen[s.Name]; !dup {
		p.seen[s.Name] = time.Now()
		if len(p.seen) == p.n {
			close(p.done)
		}
	}
	for _, c := range s.Status.Conditions {
		if c.Type == "metalvip.io/Announced" {
			if _, dup := p.announced[s.Name]; !dup {
				p.announced[s.Name] = time.Now()
				if len(p.announced) == p.n {
					close(p.allAnnounced)
				}
			}
		}
	}
}

func (p *probe) allocated() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.seen)
}

func (p *probe) stop() {
	select {
	case <-p.stopCh:
	default:
		close(p.stopCh)
	}
}
