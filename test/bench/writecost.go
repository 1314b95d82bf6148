package main

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"fmt"
	"math"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	corev1ac "k8s.io/client-go/applyconfigurations/core/v1"
	metav1ac "k8s.io/client-go/applyconfigurations/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/metalvip/metalvip/test/harness"
	"github.com/metalvip/metalvip/test/harness/proc"
	"github.com/metalvip/metalvip/test/kubeapi"
	"github.com/metalvip/metalvip/test/testenv"
)

// serverPids are the processes of the API server under test: kube-apiserver and etcd, found
// by their folder (srv.Dir) on the command line.
func serverPids(srv *kubeapi.Server) []int {
	var pids []int
	dirs, _ := filepath.Glob("/proc/[0-9]*/cmdline")
	for _, f := range dirs {
		b, err := os.ReadFile(f)
		if err != nil || !bytes.Contains(b, []byte(srv.Dir)) {
			continue
		}
		if pid, err := strconv.Atoi(filepath.Base(filepath.Dir(f))); err == nil && pid != os.Getpid() {
			pids = append(pids, pid)
		}
	}
	return pids
}

// serverCPU is the CPU (user+system) kube-apiserver and etcd have used so far.
func serverCPU(pids []int) float64 {
	t := 0.0
	for _, p := range pids {
		t += proc.CPUSeconds(p)
	}
	return t
}

// statusWriteKind is the write metalvip makes to allocate: the one that carries the address.
const statusWriteKind = "merge patch of status: record, finalizer and address at once"

// writeCost is the API server's (kube-apiserver and etcd) CPU for one write of a kind.
type writeCost struct {
	kind string
	cpu  time.Duration
	wall time.Duration // for all n, with 8 clients
}

// writeCosts measures the CPU each kind of write the CCM makes costs the API server: n
// Services of a class nobody serves, then each kind of write once per Service, 8 clients at a
// time, nothing else running. It is the price list that explains the allocation figures: the
// API server is CPU-bound on 2 cores, so what the CCM writes during a create burst slows the
// creates.
func writeCosts(m *testenv.Main, srv *kubeapi.Server, n int) []writeCost {
	ns := "bench-write-costs"
	mustNamespace(m, srv, ns)
	pids := serverPids(srv)
	if len(pids) < 2 {
		m.Fatalf("kube-apiserver and etcd not found by their folder %s (found %v)", srv.Dir, pids)
	}
	ctx := context.Background()
	// The CCM's client speaks protobuf (the framework's default), the creating clients JSON.
	pcfg := rest.CopyConfig(srv.Config)
	pcfg.ContentType = "application/vnd.kubernetes.protobuf"
	pcfg.AcceptContentTypes = pcfg.ContentType
	pcfg.QPS, pcfg.Burst = -1, 0
	pclient, err := kubernetes.NewForConfig(pcfg)
	if err != nil {
		m.Fatalf("%v", err)
	}
	svcs := pclient.CoreV1().Services(ns)
	jsvcs := srv.Client.CoreV1().Services(ns)
	name := func(i int) string { return fmt.Sprintf("s-%05d", i) }
	var out []writeCost
	measure := func(kind string, write func(i int) error) {
		// Settle: what the previous kind left (watch fan-out, compaction) is not counted.
		time.Sleep(time.Second)
		cpu0, start := serverCPU(pids), time.Now()
		harness.Parallel(8, n, func(i int) {
			if err := write(i); err != nil {
				m.Fatalf("write cost, %s of %s: %v", kind, name(i), err)
			}
		})
		wall := time.Since(start)
		time.Sleep(500 * time.Millisecond) // etcd's share of the last writes
		c := writeCost{kind: kind, cpu: time.Duration((serverCPU(pids) - cpu0) / float64(n) * float64(time.Second)), wall: wall}
		harness.Step("  %s: %s of API server CPU each (%d in %s)", kind, c.cpu.Round(10*time.Microsecond), n, wall.Round(time.Millisecond))
		out = append(out, c)
	}
	class := "bench.metalvip.io/nobody"
	measure("create a Service", func(i int) error {
		s := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name(i)},
			Spec: corev1.ServiceSpec{Type: corev1.ServiceTypeLoadBalancer, Ports: []corev1.ServicePort{{Port: 80}},
				AllocateLoadBalancerNodePorts: ptr(false), LoadBalancerClass: &class}}
		_, err := jsvcs.Create(ctx, s, metav1.CreateOptions{})
		return err
	})
	ip := func(i int) string { return fmt.Sprintf("10.250.%d.%d", i/250, i%250+1) }
	measure("merge patch: record and finalizer", func(i int) error {
		b := fmt.Sprintf(`{"metadata":{"annotations":{"metalvip.io/allocated-pool":"p","metalvip.io/allocated-ips":"%s"},"finalizers":["bench.metalvip.io/cleanup"]}}`, ip(i))
		_, err := svcs.Patch(ctx, name(i), types.MergePatchType, []byte(b), metav1.PatchOptions{})
		return err
	})
	measure("merge patch of status: the address", func(i int) error {
		b := fmt.Sprintf(`{"status":{"loadBalancer":{"ingress":[{"ip":"%s","ipMode":"VIP"}]}}}`, ip(i))
		_, err := svcs.Patch(ctx, name(i), types.MergePatchType, []byte(b), metav1.PatchOptions{}, "status")
		return err
	})
	measure(statusWriteKind, func(i int) error {
		b := fmt.Sprintf(`{"metadata":{"annotations":{"metalvip.io/allocated-ips":"%s,"}},"status":{"loadBalancer":{"ingress":[{"ip":"%s","ipMode":"VIP"},{"ip":"10.251.0.1","ipMode":"VIP"}]}}}`, ip(i), ip(i))
		_, err := svcs.Patch(ctx, name(i), types.MergePatchType, []byte(b), metav1.PatchOptions{}, "status")
		return err
	})
	// An update sends the whole object, as the CCM's cache holds it: listed first, not counted.
	listed, err := svcs.List(ctx, metav1.ListOptions{})
	if err != nil {
		m.Fatalf("%v", err)
	}
	byName := map[string]*corev1.Service{}
	for i := range listed.Items {
		byName[listed.Items[i].Name] = &listed.Items[i]
	}
	measure("update of status: record, finalizer and address at once", func(i int) error {
		s := byName[name(i)]
		s.Annotations["metalvip.io/allocated-ips"] = ip(i) + ",,"
		s.Status.LoadBalancer.Ingress = s.Status.LoadBalancer.Ingress[:1]
		_, err := svcs.UpdateStatus(ctx, s, metav1.UpdateOptions{})
		return err
	})
	cond := func(msg string) *corev1ac.ServiceApplyConfiguration {
		return corev1ac.Service("", ns).WithStatus(corev1ac.ServiceStatus().WithConditions(metav1ac.Condition().
			WithType("metalvip.io/Announced").WithStatus(metav1.ConditionTrue).WithReason("Announced").WithMessage(msg).
			WithObservedGeneration(1).WithLastTransitionTime(metav1.Now())))
	}
	measure("server-side apply of status: the Announced condition", func(i int) error {
		ac := cond("10.250.0.1 (L2) from bench-node")
		ac.WithName(name(i))
		_, err := svcs.ApplyStatus(ctx, ac, metav1.ApplyOptions{FieldManager: "bench-announcer", Force: true})
		return err
	})
	measure("strategic merge patch of status: the Announced condition", func(i int) error {
		b := fmt.Sprintf(`{"status":{"conditions":[{"type":"metalvip.io/Announced","status":"True","reason":"Announced","message":"10.250.0.1 (L2) from bench-node, again","observedGeneration":1,"lastTransitionTime":%q}]}}`, metav1.Now().UTC().Format(time.RFC3339))
		_, err := svcs.Patch(ctx, name(i), types.StrategicMergePatchType, []byte(b), metav1.PatchOptions{FieldManager: "bench-announcer"}, "status")
		return err
	})
	measure("create an Event", func(i int) error {
		e := &corev1.Event{ObjectMeta: metav1.ObjectMeta{Namespace: ns, GenerateName: name(i) + "."},
			InvolvedObject: corev1.ObjectReference{Kind: "Service", Namespace: ns, Name: name(i), APIVersion: "v1"},
			Reason:         "IPAllocated", Message: "Allocated " + ip(i) + " from IP pool p", Type: corev1.EventTypeNormal,
			Source: corev1.EventSource{Component: "metalvip"}, FirstTimestamp: metav1.Now(), LastTimestamp: metav1.Now(), Count: 1}
		_, err := pclient.CoreV1().Events(ns).Create(ctx, e, metav1.CreateOptions{})
		return err
	})
	// Gone again (finalizer first), so the allocation runs start with the API server as empty.
	harness.Parallel(8, n, func(i int) {
		_, _ = svcs.Patch(ctx, name(i), types.MergePatchType, []byte(`{"metadata":{"finalizers":null}}`), metav1.PatchOptions{})
	})
	deleteServices(m, srv, ns, n)
	_ = srv.Client.CoreV1().Events(ns).DeleteCollection(ctx, metav1.DeleteOptions{}, metav1.ListOptions{})
	return out
}

// ccmQueues reads a CCM's workqueue and client metrics from its loopback metrics port: per
// queue, how long items waited before a worker took them and how long the work took; per
// verb, the client's request latency and its rate limiter's wait.
type ccmMetrics map[string]histogram

type histogram struct {
	count, sum float64
	buckets    [][2]float64 // upper bound, cumulative count
}

func (h histogram) mean() time.Duration {
	if h.count == 0 {
		return 0
	}
	return time.Duration(h.sum / h.count * float64(time.Second))
}

// quantile is the upper bound of the bucket that holds quantile q (an upper estimate).
func (h histogram) quantile(q float64) time.Duration {
	for _, b := range h.buckets {
		if b[1] >= q*h.count {
			if math.IsInf(b[0], 1) {
				return -1
			}
			return time.Duration(b[0] * float64(time.Second))
		}
	}
	return 0
}

func (h histogram) minus(o histogram) histogram {
	out := histogram{count: h.count - o.count, sum: h.sum - o.sum}
	for i, b := range h.buckets {
		c := b[1]
		if i < len(o.buckets) {
			c -= o.buckets[i][1]
		}
		out.buckets = append(out.buckets, [2]float64{b[0], c})
	}
	return out
}

func (c ccmMetrics) minus(o ccmMetrics) ccmMetrics {
	out := ccmMetrics{}
	for k, h := range c {
		out[k] = h.minus(o[k])
	}
	return out
}

// readCCMMetrics reads the histograms named in want (by metric name) from url, keyed
// "metric{label}" by the label that tells the series apart (name for queues, verb for the
// client).
func readCCMMetrics(url string, want ...string) (ccmMetrics, error) {
	cl := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}} //nolint:gosec // the CCM's self-signed loopback port
	resp, err := cl.Get(url)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	out := ccmMetrics{}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		l := sc.Text()
		for _, w := range want {
			if !strings.HasPrefix(l, w+"_") {
				continue
			}
			rest := l[len(w)+1:]
			suffix, _, _ := strings.Cut(rest, "{")
			suffix, _, _ = strings.Cut(suffix, " ")
			labels := ""
			if i, j := strings.Index(l, "{"), strings.LastIndex(l, "}"); i >= 0 && j > i {
				labels = l[i+1 : j]
			}
			get := func(k string) string {
				for kv := range strings.SplitSeq(labels, ",") {
					if name, v, ok := strings.Cut(kv, "="); ok && name == k {
						return strings.Trim(v, `"`)
					}
				}
				return ""
			}
			key := w + "{" + get("name") + get("verb") + "}"
			v, _ := strconv.ParseFloat(l[strings.LastIndex(l, " ")+1:], 64)
			h := out[key]
			switch suffix {
			case "count":
				h.count += v
			case "sum":
				h.sum += v
			case "bucket":
				le, _ := strconv.ParseFloat(get("le"), 64)
				if get("le") == "+Inf" {
					le = math.Inf(1)
				}
				// Series of other labels (the host, the code) add up bucket by bucket.
				found := false
				for i := range h.buckets {
					if h.buckets[i][0] == le {
						h.buckets[i][1] += v
						found = true
					}
				}
				if !found {
					h.buckets = append(h.buckets, [2]float64{le, v})
				}
			}
			out[key] = h
		}
	}
	return out, sc.Err()
}
