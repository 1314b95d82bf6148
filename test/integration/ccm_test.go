// Package integration runs the real metalvip-cloud-controller-manager binary against a real
// kube-apiserver and etcd.
package integration

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	cloudproviderapi "k8s.io/cloud-provider/api"

	"github.com/metalvip/metalvip/test/kubeapi"
	"github.com/metalvip/metalvip/test/testenv"
)

var ccmBinary, ctlBinary string

func TestMain(m *testing.M) {
	bins, cleanup := testenv.BuildMain("metalvip-integration", "./cmd/metalvip-cloud-controller-manager", "./cmd/metalvipctl")
	ccmBinary, ctlBinary = bins[0], bins[1]
	kubeapi.Main(m, cleanup)
}

// startCCM runs the CCM against srv with the given cloud-config and returns the process.
func startCCM(t *testing.T, srv *kubeapi.Server, cloudConfig string, extra ...string) *testenv.Proc {
	t.Helper()
	cfgPath := filepath.Join(t.TempDir(), "cloud-config.yaml")
	if err := os.WriteFile(cfgPath, []byte(cloudConfig), 0o600); err != nil {
		t.Fatal(err)
	}
	args := append([]string{
		"--kubeconfig", srv.Kubeconfig(t, nil),
		"--cloud-config", cfgPath,
		"--leader-elect=false",
		"--secure-port=0",
		"--v=2",
	}, extra...)
	return testenv.StartProc(t, "ccm", exec.Command(ccmBinary, args...))
}

const topologyConfig = `
topology:
  subnets:
  - cidr: 198.51.100.0/26
    zone: rack-a
    region: site-1
  - cidr: 198.51.100.0/24
    zone: rack-other
    region: site-1
instanceTypeLabel: example.com/hardware
`

func uninitializedTaint() corev1.Taint {
	return corev1.Taint{Key: cloudproviderapi.TaintExternalCloudProvider, Value: "true", Effect: corev1.TaintEffectNoSchedule}
}

func createNode(t *testing.T, srv *kubeapi.Server, n *corev1.Node) *corev1.Node {
	t.Helper()
	ctx := context.Background()
	status := n.Status
	created, err := srv.Client.CoreV1().Nodes().Create(ctx, n, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("create node %s: %v", n.Name, err)
	}
	t.Cleanup(func() { _ = srv.Client.CoreV1().Nodes().Delete(context.Background(), n.Name, metav1.DeleteOptions{}) })
	if len(status.Addresses) > 0 {
		created.Status = status
		created, err = srv.Client.CoreV1().Nodes().UpdateStatus(ctx, created, metav1.UpdateOptions{})
		if err != nil {
			t.Fatalf("set status of node %s: %v", n.Name, err)
		}
	}
	return created
}

func TestCCMInitialisesNodes(t *testing.T) {
	srv := kubeapi.Get(t)
	ctx := context.Background()

	foreign := createNode(t, srv, &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: "foreign-node"},
		Spec: corev1.NodeSpec{
			ProviderID: "aws:///us-east-1a/i-0123456789",
			Taints:     []corev1.Taint{uninitializedTaint()},
		},
	})
	ccm := startCCM(t, srv, topologyConfig)

	start := time.Now()
	createNode(t, srv, &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{
			Name:        "node-a",
			Labels:      map[string]string{"example.com/hardware": "r640"},
			Annotations: map[string]string{cloudproviderapi.AnnotationAlphaProvidedIPAddr: "198.51.100.11"},
		},
		Spec: corev1.NodeSpec{Taints: []corev1.Taint{uninitializedTaint()}},
		Status: corev1.NodeStatus{Addresses: []corev1.NodeAddress{
			{Type: corev1.NodeHostName, Address: "node-a"},
			{Type: corev1.NodeInternalIP, Address: "198.51.100.11"},
			{Type: corev1.NodeInternalIP, Address: "10.1.2.3"}, // a second NIC: the provided IP must win
		}},
	})

	var node *corev1.Node
	deadline := start.Add(10 * time.Second)
	for {
		n, err := srv.Client.CoreV1().Nodes().Get(ctx, "node-a", metav1.GetOptions{})
		// The framework removes the taint and writes the addresses in two updates: wait for
		// the addresses too (only the provided InternalIP), else a slow machine sees the first.
		if err == nil && n.Spec.ProviderID != "" && !hasUninitializedTaint(n) && strings.Join(internalIPs(n), ",") == "198.51.100.11" {
			node = n
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("node-a not initialised within 10s: %+v, err %v", n, err)
		}
		select {
		case <-ccm.Done():
			t.Fatalf("CCM exited: %v", ccm.Err())
		case <-time.After(100 * time.Millisecond):
		}
	}
	t.Logf("node-a initialised %s after creation", time.Since(start).Round(time.Millisecond))

	if got, want := node.Spec.ProviderID, "metalvip://node-a"; got != want {
		t.Errorf("providerID = %q, want %q", got, want)
	}
	for label, want := range map[string]string{
		corev1.LabelTopologyZone:          "rack-a", // the /26 is more specific than the /24
		corev1.LabelTopologyRegion:        "site-1",
		corev1.LabelInstanceTypeStable:    "r640",
		"example.com/hardware":            "r640",
		corev1.LabelFailureDomainBetaZone: "rack-a",
	} {
		if got := node.Labels[label]; got != want {
			t.Errorf("label %s = %q, want %q", label, got, want)
		}
	}
	if !hasAddress(node, corev1.NodeHostName, "node-a") {
		t.Errorf("Hostname address lost: %v", node.Status.Addresses)
	}

	// The foreign node has had every chance to be touched by now: initialisation of node-a
	// came after it in the same queue. Give the periodic loops one more round.
	time.Sleep(2 * time.Second)
	after, err := srv.Client.CoreV1().Nodes().Get(ctx, foreign.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if after.ResourceVersion != foreign.ResourceVersion {
		t.Errorf("foreign node changed: resourceVersion %s -> %s; spec %+v labels %v", foreign.ResourceVersion, after.ResourceVersion, after.Spec, after.Labels)
	}
}

func TestCCMReportsInvalidProvidedNodeIP(t *testing.T) {
	srv := kubeapi.Get(t)
	ctx := context.Background()
	startCCM(t, srv, "")
	createNode(t, srv, &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{
			Name:        "node-bad-ip",
			Annotations: map[string]string{cloudproviderapi.AnnotationAlphaProvidedIPAddr: "198.51.100.300"},
		},
		Spec: corev1.NodeSpec{Taints: []corev1.Taint{uninitializedTaint()}},
	})

	deadline := time.Now().Add(15 * time.Second)
	for {
		evs, err := srv.Client.CoreV1().Events("").List(ctx, metav1.ListOptions{
			FieldSelector: fields.Set{"involvedObject.name": "node-bad-ip", "reason": "InvalidProvidedNodeIP"}.String(),
		})
		if err == nil && len(evs.Items) > 0 {
			if ev := evs.Items[0]; ev.Type != corev1.EventTypeWarning || !strings.Contains(ev.Message, "198.51.100.300") {
				t.Errorf("event = %s %q, want a Warning naming the address", ev.Type, ev.Message)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no InvalidProvidedNodeIP event on the node within 15s (err %v)", err)
		}
		time.Sleep(200 * time.Millisecond)
	}
	n, err := srv.Client.CoreV1().Nodes().Get(ctx, "node-bad-ip", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if n.Spec.ProviderID != "" || !hasUninitializedTaint(n) {
		t.Errorf("node with an invalid provided IP was initialised: providerID %q taints %v", n.Spec.ProviderID, n.Spec.Taints)
	}
}

func TestCCMRefusesABadCloudConfig(t *testing.T) {
	for _, tc := range []struct {
		name   string
		config string
		want   []string
	}{
		{"a misspelt field is named", "topology:\n  zoneLable: example.com/rack\n",
			[]string{"line 2", "zoneLable", `did you mean "zoneLabel"`}},
		{"an invalid value is named", "agent:\n  port: 70000\n",
			[]string{"line 2", "agent.port", "70000"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "cloud-config.yaml")
			if err := os.WriteFile(path, []byte(tc.config), 0o600); err != nil {
				t.Fatal(err)
			}
			// No --kubeconfig: the file must be refused before anything else is tried.
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			out, err := exec.CommandContext(ctx, ccmBinary, "--cloud-config", path).CombinedOutput()
			if err == nil {
				t.Fatalf("CCM accepted the file; output:\n%s", out)
			}
			if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() == 0 {
				t.Fatalf("CCM did not exit non-zero: %v", err)
			}
			for _, w := range tc.want {
				if !strings.Contains(string(out), w) {
					t.Errorf("output does not contain %q:\n%s", w, out)
				}
			}
		})
	}
}

func hasAddress(n *corev1.Node, typ corev1.NodeAddressType, addr string) bool {
	for _, a := range n.Status.Addresses {
		if a.Type == typ && a.Address == addr {
			return true
		}
	}
	return false
}

func hasUninitializedTaint(n *corev1.Node) bool {
	for _, t := range n.Spec.Taints {
		if t.Key == cloudproviderapi.TaintExternalCloudProvider {
			return true
		}
	}
	return false
}

func internalIPs(n *corev1.Node) []string {
	var out []string
	for _, a := range n.Status.Addresses {
		if a.Type == corev1.NodeInternalIP {
			out = append(out, a.Address)
		}
	}
	return out
}
