package integration

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	cloudproviderapi "k8s.io/cloud-provider/api"

	"github.com/metalvip/metalvip/test/kubeapi"
	"github.com/metalvip/metalvip/test/testenv"
)

// gate is a TCP forwarder to the API server that refuses connections until opened: the API
// server as a node that cannot reach it sees it.
type gate struct {
	addr, target string
	mu           sync.Mutex
	ln           net.Listener
	conns        []net.Conn
	wg           sync.WaitGroup
}

func newGate(t *testing.T, target string) *gate {
	t.Helper()
	g := &gate{addr: fmt.Sprintf("127.0.0.1:%d", testenv.FreePort(t)), target: target}
	t.Cleanup(g.close)
	return g
}

// open starts forwarding; connections before it were refused (nothing listened).
func (g *gate) open(t *testing.T) {
	t.Helper()
	ln, err := net.Listen("tcp", g.addr)
	if err != nil {
		t.Fatalf("gate: %v", err)
	}
	g.mu.Lock()
	g.ln = ln
	g.mu.Unlock()
	g.wg.Add(1)
	go func() {
		defer g.wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return // closed
			}
			up, err := net.Dial("tcp", g.target)
			if err != nil {
				c.Close()
				continue
			}
			g.mu.Lock()
			g.conns = append(g.conns, c, up)
			g.mu.Unlock()
			g.wg.Add(2)
			go func() { defer g.wg.Done(); _, _ = io.Copy(up, c); up.Close() }()
			go func() { defer g.wg.Done(); _, _ = io.Copy(c, up); c.Close() }()
		}
	}()
}

func (g *gate) close() {
	g.mu.Lock()
	if g.ln != nil {
		g.ln.Close()
	}
	for _, c := range g.conns {
		c.Close()
	}
	g.mu.Unlock()
	g.wg.Wait()
}

// TestTheCCMWaitsForAnUnreachableAPIServer: a CCM started while its node cannot reach the API
// server (as a pod: delegated authentication and authorization through the same kubeconfig)
// keeps running and waiting, then leads and initialises nodes once the API server is
// reachable. It used to exit at once ("unable to load configmap based
// request-header-client-ca-file"), and a pod that exits comes back only after CrashLoopBackOff.
func TestTheCCMWaitsForAnUnreachableAPIServer(t *testing.T) {
	srv := kubeapi.Get(t)
	u, err := url.Parse(srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	g := newGate(t, u.Host)
	cfg := rest.CopyConfig(srv.Config)
	cfg.Host = "https://" + g.addr
	kc := srv.Kubeconfig(t, cfg)
	ccm := startCCM(t, srv, "", "--kubeconfig", kc, "--authentication-kubeconfig", kc, "--authorization-kubeconfig", kc,
		"--leader-elect=true", "--leader-elect-resource-namespace=kube-system", "--leader-elect-resource-name=metalvip-unreachable-test",
		"--secure-port", fmt.Sprint(testenv.FreePort(t)), "--bind-address=127.0.0.1")

	// Longer than every start-up wait of the framework (WaitForAPIServer gives up after 10 s).
	const unreachable = 15 * time.Second
	select {
	case <-ccm.Done():
		t.Fatalf("the CCM exited while the API server was unreachable: %v\n%s", ccm.Err(), ccm.Tail(20))
	case <-time.After(unreachable):
	}
	if !strings.Contains(ccm.Output(), "connection refused") {
		t.Fatalf("the CCM never tried the API server:\n%s", ccm.Tail(20))
	}

	g.open(t)
	opened := time.Now()
	createNode(t, srv, &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: "unreachable-node", Annotations: map[string]string{cloudproviderapi.AnnotationAlphaProvidedIPAddr: "198.51.100.31"}},
		Spec:       corev1.NodeSpec{Taints: []corev1.Taint{uninitializedTaint()}},
	})
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	for {
		n, err := srv.Client.CoreV1().Nodes().Get(ctx, "unreachable-node", metav1.GetOptions{})
		if err == nil && n.Spec.ProviderID == "metalvip://unreachable-node" && !hasUninitializedTaint(n) {
			break
		}
		select {
		case <-ccm.Done():
			t.Fatalf("the CCM exited after the API server came back: %v\n%s", ccm.Err(), ccm.Tail(20))
		case <-ctx.Done():
			t.Fatalf("node not initialised within 60 s of the API server becoming reachable (%v)\n%s", errors.Join(err, ctx.Err()), ccm.Tail(20))
		case <-time.After(200 * time.Millisecond):
		}
	}
	t.Logf("unreachable for %s without exiting; node initialised %s after the API server became reachable",
		unreachable, time.Since(opened).Round(100*time.Millisecond))
}
