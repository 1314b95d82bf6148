// Package controlplane is the lab e2e of the control-plane VIP (kubeadm HA's
// --control-plane-endpoint): three real kube-apiservers, one per node namespace, on one etcd in
// the lab's control namespace; metalvip-agent in standalone mode on each node with the files
// `metalvipctl controlplane files` writes from the keys `metalvip-agent --print-heartbeat-key`
// printed; a client-go client in the client namespace listing Nodes through the VIP every
// 50 ms; an ARP listener counting who answers for the VIP.
package controlplane

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/mdlayher/arp"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/metalvip/metalvip/internal/agentapi"
	"github.com/metalvip/metalvip/internal/certs"
	"github.com/metalvip/metalvip/nodeagent/controlplane"
	agentv1 "github.com/metalvip/metalvip/proto/metalvip/agent/v1"
	"github.com/metalvip/metalvip/test/harness"
	"github.com/metalvip/metalvip/test/harness/pki"
	"github.com/metalvip/metalvip/test/kubeapi"
	"github.com/metalvip/metalvip/test/lab"
	"github.com/metalvip/metalvip/test/testenv"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
)

var agentBinary, ctlBinary string

func TestMain(m *testing.M) {
	bins, cleanup := testenv.BuildMain("metalvip-cp-e2e", "./cmd/metalvip-agent", "./cmd/metalvipctl")
	agentBinary, ctlBinary = bins[0], bins[1]
	code := m.Run()
	cleanup()
	os.Exit(code)
}

// vip is the control-plane endpoint.
var vip = netip.MustParseAddr("203.0.113.10")

const apiPort = 6443

// env is the lab with its API servers and agents.
type env struct {
	t     *testing.T
	lab   *lab.Lab
	dir   string
	pki   string // CA, API server and agent certificates
	token string
	etcd  string

	apiserverBin string
	apiservers   map[string]*testenv.Proc
	agents       map[string]*testenv.Proc
	grpc         map[string]agentv1.AgentServiceClient
	keys         map[string]string // heartbeat public keys, as printed
	macs         map[string]string // MAC -> node
	files        string            // metalvipctl's output
}

// newEnv builds the lab, the PKI and etcd; no API server and no agent runs yet.
func newEnv(t *testing.T) *env {
	apiserverBin, etcdBin, err := kubeapi.Binaries()
	if err != nil {
		testenv.Skip(t, "%v", err)
	}
	l := lab.New(t, lab.Options{Nodes: 3})
	e := &env{t: t, lab: l, dir: t.TempDir(), apiserverBin: apiserverBin,
		apiservers: map[string]*testenv.Proc{}, agents: map[string]*testenv.Proc{}, grpc: map[string]agentv1.AgentServiceClient{},
		keys: map[string]string{}, macs: map[string]string{}}
	e.pki = filepath.Join(e.dir, "pki")
	e.writePKI()
	for _, n := range l.Nodes {
		e.macs[n.MAC(t)] = n.Name
	}
	// etcd on the segment, in the control namespace: every API server reaches it, and a
	// node's link going down cuts that node's API server from it, as in a real cluster.
	data := filepath.Join(e.dir, "etcd")
	if st, err := os.Stat("/dev/shm"); err == nil && st.IsDir() {
		if data, err = os.MkdirTemp("/dev/shm", "metalvip-cp-etcd-"); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { os.RemoveAll(data) })
	}
	e.etcd = "http://" + netip.AddrPortFrom(l.Control.IPv4, 2379).String()
	peer := "http://" + netip.AddrPortFrom(l.Control.IPv4, 2380).String()
	l.Control.Start(t, "etcd", etcdBin, "--name", "default", "--data-dir", data,
		"--listen-client-urls", e.etcd, "--advertise-client-urls", e.etcd,
		"--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer, "--initial-cluster", "default="+peer,
		"--log-level", "warn")
	return e
}

func (e *env) path(name string) string { return filepath.Join(e.pki, name) }

// writePKI writes the cluster CA (ca.crt), the API servers' serving certificate (valid for the
// VIP and every node's address), the service-account keys, the token file, and the agents'
// gRPC PKI (agent-*), so that the test can read GetState.
func (e *env) writePKI() {
	t := e.t
	if err := os.MkdirAll(e.pki, 0o700); err != nil {
		t.Fatal(err)
	}
	addrs := []netip.Addr{vip, netip.AddrFrom4([4]byte{127, 0, 0, 1})}
	for _, n := range e.lab.Nodes {
		addrs = append(addrs, n.IPv4)
	}
	if err := pki.APIServer(e.pki, 24*time.Hour, addrs...); err != nil {
		t.Fatal(err)
	}
	if _, err := pki.ServiceAccount(e.pki); err != nil {
		t.Fatal(err)
	}
	var err error
	if e.token, err = pki.AdminToken(e.pki, "lab-admin"); err != nil {
		t.Fatal(err)
	}
	if _, err := pki.Agents(e.pki, "agent-", 24*time.Hour, lab.Names(e.lab.Nodes)...); err != nil {
		t.Fatal(err)
	}
}

func (e *env) node(name string) *lab.Host {
	for _, n := range e.lab.Nodes {
		if n.Name == name {
			return n
		}
	}
	e.t.Fatalf("no node %s", name)
	return nil
}

func (e *env) stateDir(node string) string { return filepath.Join(e.dir, "state-"+node) }

// writeFiles collects each node's heartbeat key as an operator would (metalvip-agent
// --print-heartbeat-key on the node) and writes every node's file with metalvipctl; then points
// the readiness check at the lab's CA (kubeadm's default path does not exist here); every
// timer keeps its default.
func (e *env) writeFiles(extra ...string) {
	t := e.t
	args := []string{"controlplane", "files", "--vip", vip.String(), "--bootstrap", "node1", "--interface", "eth0", "--out", filepath.Join(e.dir, "files")}
	for i, n := range e.lab.Nodes {
		if e.keys[n.Name] == "" {
			out, err := n.Run(context.Background(), agentBinary, "--print-heartbeat-key", "--state-dir", e.stateDir(n.Name))
			if err != nil {
				t.Fatal(err)
			}
			e.keys[n.Name] = strings.TrimSpace(string(out))
		}
		key := e.keys[n.Name]
		if slices.Contains(extra, "--mode=BGP") {
			key = "" // BGP mode exchanges no heartbeats
		}
		args = append(args, "--node", fmt.Sprintf("%s,%s,%s,%d", n.Name, n.IPv4, key, 30-10*i))
	}
	args = append(args, extra...)
	out, err := exec.Command(ctlBinary, args...).CombinedOutput()
	if err != nil {
		t.Fatalf("metalvipctl %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	e.files = filepath.Join(e.dir, "files")
	for _, n := range e.lab.Nodes {
		file := filepath.Join(e.files, n.Name, "controlplane.yaml")
		data, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		c, err := controlplane.Decode(data)
		if err != nil {
			t.Fatal(err)
		}
		c.APIServer.CAFile = e.path("ca.crt")
		if data, err = controlplane.Encode(c); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(file, data, 0o600); err != nil {
			t.Fatal(err)
		}
	}
}

// startAgent starts node's agent in standalone mode with the file metalvipctl wrote for it; it
// also serves gRPC (mutual TLS) so that the test can read its state.
func (e *env) startAgent(node string) {
	h := e.node(node)
	e.agents[node] = h.Start(e.t, "agent", agentBinary,
		"--control-plane-config", filepath.Join(e.files, node, "controlplane.yaml"),
		"--state-dir", e.stateDir(node), "--interfaces", "eth0",
		"--listen-address", netip.AddrPortFrom(h.IPv4, 7472).String(),
		"--tls-ca", e.path("agent-ca.crt"), "--tls-cert", e.path("agent-"+node+".crt"), "--tls-key", e.path("agent-"+node+".key"),
		"--v", "2")
	if e.grpc[node] == nil {
		cfg, err := certs.ClientConfig(certs.Files{CA: e.path("agent-ca.crt"), Cert: e.path("agent-viewer.crt"), Key: e.path("agent-viewer.key")}, node)
		if err != nil {
			e.t.Fatal(err)
		}
		conn, err := grpc.NewClient("passthrough:///"+netip.AddrPortFrom(h.IPv4, 7472).String(),
			append(agentapi.ClientOptions(), grpc.WithTransportCredentials(credentials.NewTLS(cfg)), grpc.WithContextDialer(e.lab.Control.DialTCP))...)
		if err != nil {
			e.t.Fatal(err)
		}
		e.t.Cleanup(func() { conn.Close() })
		e.grpc[node] = agentv1.NewAgentServiceClient(conn)
	}
}

func (e *env) stopAgent(node string) {
	if p := e.agents[node]; p != nil {
		p.Stop(10 * time.Second)
	}
}

// controlPlane returns node's agent's view of the control-plane VIP, or nil.
func (e *env) controlPlane(node string) *agentv1.ControlPlaneStatus {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	st, err := e.grpc[node].GetState(ctx, &agentv1.GetStateRequest{})
	if err != nil {
		return nil
	}
	return st.GetControlPlane()
}

// dump logs what every agent says of the VIP.
func (e *env) dump() {
	for _, n := range e.lab.Nodes {
		e.t.Logf("%s: %v", n.Name, e.controlPlane(n.Name))
	}
}

// startAPIServer starts node's kube-apiserver, listening on every address of its namespace
// (so on the VIP too: the lab's nodes take the VIPs' traffic).
func (e *env) startAPIServer(node string) {
	h := e.node(node)
	e.apiservers[node] = h.Start(e.t, "kube-apiserver", e.apiserverBin,
		"--etcd-servers", e.etcd,
		"--bind-address", "0.0.0.0", "--secure-port", strconv.Itoa(apiPort), "--advertise-address", h.IPv4.String(),
		"--tls-cert-file", e.path("apiserver.crt"), "--tls-private-key-file", e.path("apiserver.key"),
		"--service-account-issuer", "https://kubernetes.default.svc",
		"--service-account-key-file", e.path("sa.pub"), "--service-account-signing-key-file", e.path("sa.key"),
		"--token-auth-file", e.path("tokens.csv"), "--authorization-mode", "RBAC",
		"--service-cluster-ip-range", "10.96.0.0/16", "--endpoint-reconciler-type", "none",
		"--v", "1")
}

// waitAPIServers waits until every node's kube-apiserver answers /readyz at its own address.
func (e *env) waitAPIServers(timeout time.Duration) {
	e.t.Helper()
	deadline := time.Now().Add(timeout)
	for _, n := range e.lab.Nodes {
		for !e.ready(n) {
			if p := e.apiservers[n.Name]; p != nil {
				select {
				case <-p.Done():
					e.t.Fatalf("%s's kube-apiserver exited: %v\n%s", n.Name, p.Err(), p.Tail(30))
				default:
				}
			}
			if time.Now().After(deadline) {
				e.t.Fatalf("%s's kube-apiserver not ready within %s:\n%s", n.Name, timeout, e.apiservers[n.Name].Tail(30))
			}
			time.Sleep(200 * time.Millisecond)
		}
	}
}

// ready checks a node's API server from the control namespace.
func (e *env) ready(n *lab.Host) bool {
	c := e.httpClient(e.lab.Control)
	defer c.CloseIdleConnections()
	resp, err := c.Get("https://" + netip.AddrPortFrom(n.IPv4, apiPort).String() + "/readyz")
	if err != nil {
		return false
	}
	resp.Body.Close()
	return resp.StatusCode == http.StatusOK
}

func (e *env) httpClient(from *lab.Host) *http.Client {
	pool := x509.NewCertPool()
	ca, _ := os.ReadFile(e.path("ca.crt"))
	pool.AppendCertsFromPEM(ca)
	return &http.Client{Timeout: time.Second, Transport: &http.Transport{
		TLSClientConfig: &tls.Config{RootCAs: pool},
		DialContext:     from.DialContext,
	}}
}

// request is one List through the VIP.
type request struct {
	start, end time.Time
	err        error
}

// lister lists Nodes through the VIP with client-go every 50 ms, from the client namespace,
// each request on its own (a hanging one delays no other), at most maxInFlight at once and
// maxRequests in all.
type lister struct {
	loops
	mu   sync.Mutex
	reqs []request
}

// loops are a watcher's goroutines, which end once stop is closed.
type loops struct {
	stop  chan struct{}
	once  sync.Once // closes stop
	wg    sync.WaitGroup
	after func() // once they ended, if set
}

// Stop ends the goroutines and waits for them, once.
func (l *loops) Stop() {
	l.once.Do(func() {
		close(l.stop)
		l.wg.Wait()
		if l.after != nil {
			l.after()
		}
	})
}

const (
	listEvery   = 50 * time.Millisecond
	listTimeout = 2 * time.Second
	maxInFlight = 64
	maxRequests = 40000 // over half an hour at 50 ms
)

func (e *env) startLister() *lister {
	cfg := &rest.Config{
		Host: "https://" + netip.AddrPortFrom(vip, apiPort).String(), BearerToken: e.token,
		TLSClientConfig: rest.TLSClientConfig{CAFile: e.path("ca.crt")},
		Timeout:         listTimeout, QPS: 1000, Burst: 1000,
	}
	cfg.Dial = e.lab.Client.DialContext
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		e.t.Fatal(err)
	}
	l := &lister{loops: loops{stop: make(chan struct{})}}
	sem := make(chan struct{}, maxInFlight)
	l.wg.Add(1)
	go func() {
		defer l.wg.Done()
		for range harness.Ticks(l.stop, listEvery, maxRequests) {
			select {
			case sem <- struct{}{}:
			default:
				continue // maxInFlight hanging: skip a beat rather than pile up
			}
			l.wg.Add(1)
			go func() {
				defer l.wg.Done()
				defer func() { <-sem }()
				start := time.Now()
				ctx, cancel := context.WithTimeout(context.Background(), listTimeout)
				_, err := cs.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
				cancel()
				l.mu.Lock()
				l.reqs = append(l.reqs, request{start: start, end: time.Now(), err: err})
				l.mu.Unlock()
			}()
		}
	}()
	e.t.Cleanup(l.Stop)
	return l
}

// between returns the requests started in [from, to), by start.
func (l *lister) between(from, to time.Time) []request {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []request
	for _, r := range l.reqs {
		if !r.start.Before(from) && r.start.Before(to) {
			out = append(out, r)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].start.Before(out[j].start) })
	return out
}

// steady reports whether every request started in the last d (and at least d/listEvery/2 of
// them) succeeded, each finished.
func (l *lister) steady(d time.Duration) bool {
	now := time.Now()
	rs := l.between(now.Add(-d), now.Add(-listTimeout/4))
	if len(rs) < int(d/listEvery)/2 {
		return false
	}
	for _, r := range rs {
		if r.err != nil {
			return false
		}
	}
	return true
}

// outage is what the client saw of one fault at t0, observed until t1: the longest time
// without a successful answer around t0 (between two successive successful requests'
// answers), how many requests failed, and the first error. In steady state the gap is the
// listing interval.
func (l *lister) outage(t0, t1 time.Time) (time.Duration, int, error) {
	var ends []time.Time
	failed := 0
	var first error
	for _, r := range l.between(t0.Add(-time.Second), t1) {
		switch {
		case r.err == nil:
			ends = append(ends, r.end)
		case !r.start.Before(t0):
			failed++
			if first == nil {
				first = r.err
			}
		}
	}
	slices.SortFunc(ends, time.Time.Compare)
	var gap time.Duration
	for i := 1; i < len(ends); i++ {
		if ends[i].After(t0) {
			gap = max(gap, ends[i].Sub(ends[i-1]))
		}
	}
	if len(ends) == 0 || ends[len(ends)-1].Before(t0) {
		gap = t1.Sub(t0)
	}
	return gap, failed, first
}

// arpWatch asks for the VIP by ARP from the client every 20 ms and records who answers.
type arpWatch struct {
	loops
	mu      sync.Mutex
	replies []arpReply
}

type arpReply struct {
	node string
	at   time.Time
}

const arpEvery = 20 * time.Millisecond

func (e *env) watchARP() *arpWatch {
	c, err := e.lab.Client.DialARP()
	if err != nil {
		e.t.Fatal(err)
	}
	w := &arpWatch{loops: loops{stop: make(chan struct{}), after: func() { c.Close() }}}
	w.wg.Add(2)
	go func() {
		defer w.wg.Done()
		for range harness.Every(w.stop, arpEvery, maxRequests*3) {
			_ = c.Request(vip)
		}
	}()
	go func() {
		defer w.wg.Done()
		for !harness.Stopped(w.stop) {
			_ = c.SetReadDeadline(time.Now().Add(100 * time.Millisecond))
			p, _, err := c.Read()
			if err != nil || p.Operation != arp.OperationReply || p.SenderIP != vip || p.TargetIP == vip {
				continue // a timeout, another frame, or an announcement (not an answer)
			}
			node := e.macs[p.SenderHardwareAddr.String()]
			if node == "" {
				node = p.SenderHardwareAddr.String()
			}
			w.mu.Lock()
			w.replies = append(w.replies, arpReply{node: node, at: time.Now()})
			w.mu.Unlock()
		}
	}()
	e.t.Cleanup(w.Stop)
	return w
}

// answerers counts the answers in [from, to) by node.
func (w *arpWatch) answerers(from, to time.Time) map[string]int {
	w.mu.Lock()
	defer w.mu.Unlock()
	out := map[string]int{}
	for _, r := range w.replies {
		if !r.at.Before(from) && r.at.Before(to) {
			out[r.node]++
		}
	}
	return out
}

// newHolder returns the node that answered from moveBound after t0 until t1, with the answers
// by node, failing the test unless exactly one node other than victim did (after what, such as
// "the fault").
func (w *arpWatch) newHolder(t *testing.T, t0, t1 time.Time, victim, what string) (string, map[string]int) {
	t.Helper()
	after := w.answerers(t0.Add(moveBound), t1)
	var holder string
	for n := range after {
		holder = n
	}
	if len(after) != 1 || holder == victim {
		t.Errorf("from %s after %s, the VIP was answered by %v; want exactly one node, not %s", moveBound, what, after, victim)
	}
	return holder, after
}

// first returns when node first answered in [from, to), and last when it last did.
func (w *arpWatch) span(node string, from, to time.Time) (first, last time.Time) {
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, r := range w.replies {
		if r.node == node && !r.at.Before(from) && r.at.Before(to) {
			if first.IsZero() {
				first = r.at
			}
			last = r.at
		}
	}
	return first, last
}

// owner returns the node that alone answered in the last 300 ms, or "".
func (w *arpWatch) owner() string {
	now := time.Now()
	got := w.answerers(now.Add(-300*time.Millisecond), now)
	if len(got) != 1 {
		return ""
	}
	for n, c := range got {
		if c >= 5 {
			return n
		}
	}
	return ""
}

// percentiles returns p50, p99 and max of ds.
func percentiles(ds []time.Duration) (p50, p99, maxd time.Duration) {
	s := slices.Clone(ds)
	slices.Sort(s)
	at := func(p float64) time.Duration {
		i := int(p*float64(len(s))+0.5) - 1
		return s[min(max(i, 0), len(s)-1)]
	}
	return at(0.50), at(0.99), s[len(s)-1]
}
