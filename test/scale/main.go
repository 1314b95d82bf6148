// Command scale is `make bench-scale`: the real CCM binary against a real API server with
// 1,000 Node objects and 20,000 LoadBalancer Services, and 1,000 simulated agents (the real
// agent logic and gRPC server with mutual TLS, each on a loopback address of its own, all in
// this process). It measures each stage (creating the objects, the CCM's first start, a node's
// agent dying and coming back, a CCM restart): time to every agent holding its state, CCM CPU
// and memory with profiles, API calls, bytes pushed; and writes docs/benchmarks-scale.md. It
// is not part of `make test`: it takes most of the machine for about half an hour. It needs no
// root (only loopback), only the kube-apiserver build and etcd (make deps).
package main

import (
	"context"
	"flag"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"runtime/pprof"
	"slices"
	"strconv"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/tools/cache"
	"k8s.io/klog/v2"

	"github.com/metalvip/metalvip/api/v1alpha1"
	"github.com/metalvip/metalvip/test/harness"
	"github.com/metalvip/metalvip/test/harness/figure"
	"github.com/metalvip/metalvip/test/harness/pki"
	"github.com/metalvip/metalvip/test/harness/proc"
	"github.com/metalvip/metalvip/test/kubeapi"
	"github.com/metalvip/metalvip/test/testenv"
)

var (
	out        = flag.String("out", "docs/benchmarks-scale.md", "the report to write; empty writes none")
	nodes      = flag.Int("nodes", 1000, "Node objects, each with a simulated agent")
	services   = flag.Int("services", 20000, "LoadBalancer Services, one VIP each")
	deaths     = flag.Int("deaths", 5, "node deaths, one after the other (each node comes back after)")
	candidates = flag.Int("candidates", 4, "failover.maxCandidates of the CCM (4 is its default)")
	agentPort  = flag.Int("agent-port", 17472, "the agents' port, on each of their loopback addresses")
	outputDir  = flag.String("profiles", "_output/scale", "where the CCM's profiles and logs are kept")
	ccmBin     = flag.String("ccm", "", "a CCM binary to measure instead of this tree's (for before and after)")
	ccmArgs    = flag.String("ccm-flags", "", "extra CCM flags, space-separated")
	ccmEnv     = flag.String("ccm-env", "", "extra environment of the CCM, space-separated NAME=value (e.g. GOMEMLIMIT=460MiB, what a 512-MiB container limit gives it)")
	timeout    = flag.Duration("timeout", 30*time.Minute, "the longest any stage may take")
	reread     = flag.Bool("rewrite-reading", false, "measure nothing: give the report (-out) this build's reading of the figures (its last section), for a reading written after the run")
	simProfile = flag.String("sim-cpuprofile", "", "write this process's CPU profile (the simulated agents) over the node deaths to this file")
)

const namespace = "scale"

// run is the whole measurement; its fields are what the report needs.
type run struct {
	m    *testenv.Main
	srv  *kubeapi.Server
	fl   *fleet
	tr   *tracker
	ccm  *ccm
	bin  string
	dir  string // output: profiles and logs
	cfg  string // the CCM's cloud-config
	kcfg string
	svcs *svcWatch
	rep  *report
}

func main() {
	flag.Parse()
	if *reread {
		if err := rewriteReading(*out); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		return
	}
	// Ctrl-C stops the CCM, the API server and the agents, and removes their state.
	m := harness.Program("metalvip-scale", "")
	defer m.Close()
	r := &run{m: m, rep: &report{loadStart: proc.LoadAverage(), nodes: *nodes, services: *services}}
	var err error
	if r.dir, err = filepath.Abs(*outputDir); err != nil {
		m.Fatalf("%v", err)
	}
	if err := os.MkdirAll(r.dir, 0o755); err != nil {
		m.Fatalf("%v", err)
	}
	// An earlier run's profiles would be summed with this one's.
	old, _ := filepath.Glob(filepath.Join(r.dir, "ccm-*.pprof"))
	for _, f := range old {
		_ = os.Remove(f)
	}
	quietKlog(m, filepath.Join(r.dir, "agents.log"))

	harness.Step("building the CCM")
	r.bin = *ccmBin
	if r.bin == "" {
		if r.bin, err = testenv.GoBuild(m.TempDir(), "./cmd/metalvip-cloud-controller-manager"); err != nil {
			m.Fatalf("%v", err)
		}
	}
	harness.Step("starting etcd and kube-apiserver")
	r.srv = kubeapi.Own(m)
	r.srv.InstallCRDs(m)

	r.tr = newTracker(*candidates)
	r.agents()
	r.objects()
	r.coldStart()
	if *simProfile != "" {
		f, err := os.Create(*simProfile)
		if err != nil {
			m.Fatalf("%v", err)
		}
		if err := pprof.StartCPUProfile(f); err != nil {
			m.Fatalf("%v", err)
		}
	}
	for i := range *deaths {
		r.death(i)
	}
	pprof.StopCPUProfile()
	if files, _ := filepath.Glob(filepath.Join(r.dir, "ccm-death*-cpu-*.pprof")); len(files) > 0 {
		r.rep.deathProfile = pprofTop(append([]string{"-top", "-nodecount=25"}, files...)...)
	}
	r.restart()
	r.rep.loadEnd = proc.LoadAverage()
	r.rep.simCPU = proc.CPUSeconds(os.Getpid())
	r.ccm.proc.Stop(30 * time.Second)
	r.fl.stopAll()
	if *out != "" {
		if err := os.WriteFile(*out, []byte(r.rep.markdown()), 0o644); err != nil {
			m.Fatalf("%v", err)
		}
		harness.Step("wrote %s", *out)
	}
}

// quietKlog sends the simulated agents' logs (this process's klog) to a file.
func quietKlog(m *testenv.Main, file string) {
	fs := flag.NewFlagSet("klog", flag.ContinueOnError)
	klog.InitFlags(fs)
	_ = fs.Set("logtostderr", "false")
	_ = fs.Set("alsologtostderr", "false")
	_ = fs.Set("stderrthreshold", "FATAL")
	f, err := os.Create(file)
	if err != nil {
		m.Fatalf("%v", err)
	}
	m.Cleanup(func() { klog.Flush(); f.Close() })
	klog.SetOutput(f)
}

// agents starts the simulated agents.
func (r *run) agents() {
	harness.Step("issuing certificates and starting %d simulated agents", *nodes)
	start := time.Now()
	var err error
	// Their state directories on tmpfs: 1,000 agents' fsyncs on one shared disk would queue
	// behind each other (and behind whatever else the machine does), which no real node's
	// own disk does.
	dir, err := os.MkdirTemp(tmpfs(), "metalvip-scale-agents-")
	if err != nil {
		r.m.Fatalf("%v", err)
	}
	r.m.Cleanup(func() { os.RemoveAll(dir) })
	if r.fl, err = newFleet(dir, *nodes, *agentPort, r.tr); err != nil {
		r.m.Fatalf("%v", err)
	}
	harness.Parallel(8, len(r.fl.agents), func(i int) {
		if err := r.fl.start(r.fl.agents[i]); err != nil {
			r.m.Fatalf("%v", err)
		}
	})
	r.m.Cleanup(r.fl.stopAll)
	mem, _ := proc.MemoryOf(os.Getpid())
	rss := mem.RSS
	r.rep.simStart = time.Since(start)
	r.rep.simRSS = rss
	harness.Step("  %d agents up in %s; this process holds %s", *nodes, r.rep.simStart.Round(time.Millisecond), figure.MiB(rss))
}

// objects creates the Nodes, the pool and the Services, with no CCM running.
func (r *run) objects() {
	ctx := context.Background()
	cs := r.srv.Client
	harness.Step("creating %d Nodes", *nodes)
	c0 := apiCallsOf(r.m, r.srv)
	start := time.Now()
	harness.Parallel(8, *nodes, func(i int) {
		n, err := cs.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: simName(i)}}, metav1.CreateOptions{})
		if err != nil {
			r.m.Fatalf("node %d: %v", i, err)
		}
		n.Status.Addresses = []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: simAddr(i).String()}, {Type: corev1.NodeHostName, Address: simName(i)}}
		n.Status.Conditions = []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue, LastHeartbeatTime: metav1.Now()}}
		if _, err := cs.CoreV1().Nodes().UpdateStatus(ctx, n, metav1.UpdateOptions{}); err != nil {
			r.m.Fatalf("node %d status: %v", i, err)
		}
	})
	r.rep.nodesIn = time.Since(start)
	harness.Step("  in %s", r.rep.nodesIn.Round(time.Millisecond))

	if _, err := cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: namespace}}, metav1.CreateOptions{}); err != nil {
		r.m.Fatalf("%v", err)
	}
	dyn, err := dynamic.NewForConfig(r.srv.Config)
	if err != nil {
		r.m.Fatalf("%v", err)
	}
	// API objects only: no packet ever carries these addresses.
	pool := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": v1alpha1.GroupVersion.String(), "kind": "IPPool", "metadata": map[string]any{"name": "scale"},
		"spec": map[string]any{"addresses": []any{"10.0.0.0/16"}, "serviceAllocation": map[string]any{"namespaces": []any{namespace}}},
	}}
	if _, err := dyn.Resource(v1alpha1.IPPoolResource).Create(ctx, pool, metav1.CreateOptions{}); err != nil {
		r.m.Fatalf("pool: %v", err)
	}

	harness.Step("creating %d Services (the API server alone)", *services)
	start = time.Now()
	var done sync.Map
	go func() {
		for t := time.NewTicker(30 * time.Second); ; <-t.C {
			n := 0
			done.Range(func(any, any) bool { n++; return true })
			if n >= *services {
				return
			}
			harness.Step("  %d created", n)
		}
	}()
	harness.Parallel(8, *services, func(i int) {
		s := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: fmt.Sprintf("s-%05d", i)},
			Spec: corev1.ServiceSpec{Type: corev1.ServiceTypeLoadBalancer, Ports: []corev1.ServicePort{{Port: 80}},
				AllocateLoadBalancerNodePorts: ptr(false)}}
		for attempt := 0; ; attempt++ {
			_, err := cs.CoreV1().Services(namespace).Create(ctx, s, metav1.CreateOptions{})
			if err == nil {
				break
			}
			if attempt > 5 {
				r.m.Fatalf("service %d: %v", i, err)
			}
			time.Sleep(200 * time.Millisecond)
		}
		done.Store(i, true)
	})
	r.rep.servicesIn = time.Since(start)
	r.rep.createCalls = apiCallsOf(r.m, r.srv).Minus(c0)
	harness.Step("  in %s", r.rep.servicesIn.Round(time.Millisecond))
	r.svcs = watchServices(r.m, r.srv, *services)
}

// startCCM starts the CCM with its debug endpoint open to this process (profiles, metrics).
func (r *run) startCCM(name string) {
	if r.cfg == "" {
		r.cfg = filepath.Join(r.m.TempDir(), "cloud-config.yaml")
		// agent.timeout 30s, not 5s: the simulated agents share the CCM's cores (and, here,
		// a machine others load), so an answer can take seconds that a node's own agent
		// would not; at 5 s the CCM counted slow agents unreachable by the thousand and
		// replanned around them (the first runs: see the reading). A dead agent's refused
		// connection is seen at once whatever the timeout.
		if err := os.WriteFile(r.cfg, fmt.Appendf(nil, `
agent:
  port: %d
  %s
  timeout: 30s
failover:
  maxCandidates: %d
allocation:
  poolStatusInterval: 1s
`, *agentPort, pki.CCMConfig(r.fl.dir), *candidates), 0o600); err != nil {
			r.m.Fatalf("%v", err)
		}
		r.kcfg = r.srv.Kubeconfig(r.m, nil)
	}
	port := testenv.FreePort(r.m)
	args := []string{"--kubeconfig", r.kcfg, "--cloud-config", r.cfg, "--leader-elect=false",
		"--controllers=service-lb-controller", "--bind-address=127.0.0.1", "--secure-port=" + strconv.Itoa(port),
		"--profiling", "--authorization-always-allow-paths=/healthz,/readyz,/livez,/metrics,/debug/pprof/*"}
	if *ccmArgs != "" {
		args = append(args, splitFields(*ccmArgs)...)
	}
	cmd := exec.Command(r.bin, args...)
	if *ccmEnv != "" {
		// The CCM's alone, not this process's (its simulated agents).
		cmd.Env = append(os.Environ(), splitFields(*ccmEnv)...)
	}
	r.ccm = &ccm{proc: testenv.StartProc(r.m, name, cmd), port: port, http: newDebugClient()}
	keep := filepath.Join(r.dir, name+".log")
	log := r.ccm.proc.Log
	r.m.Cleanup(func() { copyFile(log, keep) })
}

// stage measures what one stage cost the CCM, between begin and end.
type stage struct {
	name        string
	wall        time.Duration // to converged
	cpu         float64
	rss, hwm    int64
	calls       figure.Counts
	fleet       counts
	profile     string
	heap        string
	allocated   time.Duration
	announced   time.Duration
	lastLanding time.Duration
}

type mark struct {
	at    time.Time
	ccm   sample
	calls figure.Counts
	fleet counts
}

func (r *run) mark() mark {
	mk := mark{at: time.Now(), calls: apiCallsOf(r.m, r.srv), fleet: r.fl.counts()}
	if r.ccm != nil {
		mk.ccm = sampleOf(r.ccm.pid())
	}
	return mk
}

func (r *run) finish(name string, from mark, converged time.Time) stage {
	now := r.mark()
	st := stage{name: name, wall: converged.Sub(from.at), cpu: now.ccm.cpu - from.ccm.cpu, rss: now.ccm.rss, hwm: now.ccm.hwm,
		calls: now.calls.Minus(from.calls), fleet: now.fleet.minus(from.fleet)}
	if last := r.tr.lastLanding(); last.After(from.at) {
		st.lastLanding = last.Sub(from.at)
	}
	return st
}

// waitConverged waits until the fleet has converged and no state landed for quiet.
func (r *run) waitConverged(what string, from time.Time, quiet time.Duration) time.Time {
	deadline := time.Now().Add(*timeout)
	report := time.Now()
	for {
		c := r.tr.converged()
		if !c.IsZero() && !c.Before(from) && time.Since(r.tr.lastLanding()) >= quiet {
			return c
		}
		if time.Now().After(deadline) {
			notOK, stale := r.tr.status()
			r.m.Fatalf("%s: not converged within %s: %d VIPs not as planned, %d agents without a state of this term;\nCCM log:\n%s", what, *timeout, notOK, stale, r.ccm.proc.Tail(40))
		}
		if time.Since(report) > 30*time.Second {
			notOK, stale := r.tr.status()
			harness.Step("  %s: after %s, %d VIPs not as planned yet, %d agents without a state of this term", what, time.Since(from).Round(time.Second), notOK, stale)
			report = time.Now()
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// coldStart is the CCM's first start: it allocates every Service, plans, and pushes every
// agent its state.
func (r *run) coldStart() {
	harness.Step("cold start: the CCM allocates %d Services and pushes %d agents their state", *services, *nodes)
	from := r.mark()
	r.startCCM("ccm-cold")
	prof := r.ccm.profile(r.dir, "cold", 5*time.Second)
	allocated := r.svcs.waitAllocated(r.m, *timeout)
	harness.Step("  all allocated after %s", allocated.Sub(from.at).Round(time.Millisecond))
	r.tr.expect(r.svcs.vips())
	conv := r.waitConverged("cold start", from.at, 5*time.Second)
	announced := r.svcs.waitAnnounced(r.m, *timeout)
	st := r.finish("cold start", from, conv)
	st.allocated, st.announced = allocated.Sub(from.at), announced.Sub(from.at)
	st.profile = prof.stop()
	st.heap = r.ccm.heap(r.dir, "cold")
	harness.Step("  converged after %s (last push landed %s after the start, all Announced after %s); CCM CPU %.1f s, RSS %s (peak %s)",
		st.wall.Round(time.Millisecond), st.lastLanding.Round(time.Millisecond), st.announced.Round(time.Millisecond), st.cpu, figure.MiB(st.rss), figure.MiB(st.hwm))
	r.rep.stages = append(r.rep.stages, st)
	r.rep.balance = balance(r.tr.primaries(), *nodes)
	r.rep.peers = r.tr.peers()
}

// death stops one node's agent, measures until every affected agent holds a state without
// it, then starts it again and measures until it is back in the plan.
func (r *run) death(i int) {
	rng := rand.New(rand.NewPCG(uint64(i), 19))
	victim := r.fl.agents[rng.IntN(len(r.fl.agents))]
	holders := r.tr.holders(victim.name)
	harness.Step("node death %d: %s (a candidate with %d other agents)", i+1, victim.name, len(holders))
	from := r.mark()
	prof := r.ccm.profile(r.dir, fmt.Sprintf("death%d", i+1), time.Second)
	died := time.Now()
	r.fl.live.set(victim.name, true)
	r.tr.kill(victim.name, died)
	r.fl.stop(victim)
	conv := r.waitConverged("node death", died, 3*time.Second)
	st := r.finish(fmt.Sprintf("node death %d", i+1), from, conv)
	st.profile = prof.stop()
	// Per agent: the time its last state before convergence landed, for every agent that
	// was pushed a state (those that held the dead node among their candidates, and those
	// that became candidates); and whether each holder was pushed one that drops it.
	last := map[string]time.Time{}
	dropped := map[string]time.Time{} // a holder's first state without the dead node
	for _, l := range r.tr.since(died) {
		if l.at.After(conv) {
			continue
		}
		last[l.agent] = l.at
		if _, ok := dropped[l.agent]; l.dropped && !ok {
			dropped[l.agent] = l.at
		}
	}
	var lat, drop []float64
	for _, at := range last {
		lat = append(lat, float64(at.Sub(died)))
	}
	missed := 0
	var missedNames []string
	for _, h := range holders {
		at, ok := dropped[h]
		if !ok {
			missed++
			missedNames = append(missedNames, h)
			continue
		}
		drop = append(drop, float64(at.Sub(died)))
	}
	d := deathResult{victim: victim.name, holders: len(holders), pushed: len(last), missed: missed, converged: conv.Sub(died), lat: lat, drop: drop, st: st}
	harness.Step("  died at %s; %d agents updated, the last %s after the death (p50 %s, p99 %s); holders without the node p50 %s, p99 %s; holders not updated: %d",
		died.Format("15:04:05.000000"), len(last), d.converged.Round(time.Millisecond), figure.Duration(time.Duration(figure.Percentile(lat, 50))), figure.Duration(time.Duration(figure.Percentile(lat, 99))),
		figure.Duration(time.Duration(figure.Percentile(drop, 50))), figure.Duration(time.Duration(figure.Percentile(drop, 99))), missed)
	for _, h := range missedNames[:min(len(missedNames), 5)] {
		var ls []string
		for _, l := range r.tr.since(died) {
			if l.agent == h {
				ls = append(ls, fmt.Sprintf("%s held=%v dropped=%v", l.at.Sub(died).Round(time.Millisecond), l.held, l.dropped))
			}
		}
		harness.Step("    not updated: %s (conv +%s): landings %v; holds it now: %v", h, conv.Sub(died).Round(time.Millisecond), ls, r.tr.holdsNow(h, victim.name))
	}

	// Back: the agent restarts on its saved state, as a rebooted node's does.
	from = r.mark()
	back := time.Now()
	r.fl.live.set(victim.name, false)
	r.tr.revive(victim.name, back)
	if err := r.fl.start(victim); err != nil {
		r.m.Fatalf("%v", err)
	}
	conv = r.waitConverged("node back", back, 3*time.Second)
	d.back = r.finish(fmt.Sprintf("node back %d", i+1), from, conv)
	harness.Step("  back in the plan after %s", d.back.wall.Round(time.Millisecond))
	r.rep.deaths = append(r.rep.deaths, d)
}

// restart stops the CCM and starts it again: every Service is allocated, every agent holds
// its state; the new CCM learns what they hold and pushes every agent again under its term.
func (r *run) restart() {
	harness.Step("CCM restart")
	r.ccm.proc.Stop(30 * time.Second)
	r.tr.requireTerm(r.tr.maxTerm() + 1)
	from := r.mark()
	r.startCCM("ccm-restart")
	prof := r.ccm.profile(r.dir, "restart", 5*time.Second)
	conv := r.waitConverged("restart", from.at, 5*time.Second)
	st := r.finish("CCM restart", from, conv)
	st.profile = prof.stop()
	st.heap = r.ccm.heap(r.dir, "restart")
	harness.Step("  converged after %s; CCM CPU %.1f s, RSS %s (peak %s)", st.wall.Round(time.Millisecond), st.cpu, figure.MiB(st.rss), figure.MiB(st.hwm))
	r.rep.stages = append(r.rep.stages, st)
}

// svcWatch follows the Services: when each has an address and an Announced condition.
type svcWatch struct {
	mu        sync.Mutex
	n         int
	addrs     map[string]netip.Addr
	announced map[string]bool
	allAddr   time.Time
	allAnn    time.Time
}

func watchServices(m *testenv.Main, srv *kubeapi.Server, n int) *svcWatch {
	w := &svcWatch{n: n, addrs: map[string]netip.Addr{}, announced: map[string]bool{}}
	factory := informers.NewSharedInformerFactoryWithOptions(srv.Client, 0, informers.WithNamespace(namespace))
	record := func(o any) {
		s, ok := o.(*corev1.Service)
		if !ok || len(s.Status.LoadBalancer.Ingress) == 0 {
			return
		}
		ip, err := netip.ParseAddr(s.Status.LoadBalancer.Ingress[0].IP)
		if err != nil {
			return
		}
		w.mu.Lock()
		defer w.mu.Unlock()
		if _, dup := w.addrs[s.Name]; !dup {
			w.addrs[s.Name] = ip
			if len(w.addrs) == w.n {
				w.allAddr = time.Now()
			}
		}
		for _, c := range s.Status.Conditions {
			if c.Type == "metalvip.io/Announced" && !w.announced[s.Name] {
				w.announced[s.Name] = true
				if len(w.announced) == w.n {
					w.allAnn = time.Now()
				}
			}
		}
	}
	_, _ = factory.Core().V1().Services().Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc: record, UpdateFunc: func(_, o any) { record(o) },
	})
	stop := make(chan struct{})
	m.Cleanup(func() { close(stop) })
	factory.Start(stop)
	factory.WaitForCacheSync(stop)
	return w
}

func (w *svcWatch) wait(m *testenv.Main, what string, timeout time.Duration, at func() time.Time, count func() int) time.Time {
	deadline := time.Now().Add(timeout)
	for {
		w.mu.Lock()
		t, c := at(), count()
		w.mu.Unlock()
		if !t.IsZero() {
			return t
		}
		if time.Now().After(deadline) {
			m.Fatalf("only %d of %d Services %s after %s", c, w.n, what, timeout)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func (w *svcWatch) waitAllocated(m *testenv.Main, timeout time.Duration) time.Time {
	return w.wait(m, "allocated", timeout, func() time.Time { return w.allAddr }, func() int { return len(w.addrs) })
}

func (w *svcWatch) waitAnnounced(m *testenv.Main, timeout time.Duration) time.Time {
	return w.wait(m, "with an Announced condition", timeout, func() time.Time { return w.allAnn }, func() int { return len(w.announced) })
}

func (w *svcWatch) vips() []netip.Addr {
	w.mu.Lock()
	defer w.mu.Unlock()
	out := make([]netip.Addr, 0, len(w.addrs))
	for _, ip := range w.addrs {
		out = append(out, ip)
	}
	slices.SortFunc(out, netip.Addr.Compare)
	return slices.Compact(out)
}

func ptr[T any](v T) *T { return &v }

func tmpfs() string {
	if st, err := os.Stat("/dev/shm"); err == nil && st.IsDir() {
		return "/dev/shm"
	}
	return ""
}
