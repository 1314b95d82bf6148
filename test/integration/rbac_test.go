package integration

import (
	"context"
	"strings"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/metalvip/metalvip/api/v1alpha1"
	"github.com/metalvip/metalvip/loadbalancer/desired"
	"github.com/metalvip/metalvip/test/harness"
	"github.com/metalvip/metalvip/test/kubeapi"
)

// ccmClient is a client with a token of the manifests' CCM ServiceAccount.
func ccmClient(t *testing.T, srv *kubeapi.Server) (*rest.Config, kubernetes.Interface) {
	t.Helper()
	tok, err := srv.Client.CoreV1().ServiceAccounts("kube-system").CreateToken(context.Background(), "metalvip-cloud-controller-manager",
		&authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: ptrInt64(3600)}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("token for the CCM's ServiceAccount: %v", err)
	}
	cfg := rest.CopyConfig(srv.Config)
	cfg.BearerToken = tok.Status.Token
	cfg.TLSClientConfig.CertData, cfg.TLSClientConfig.KeyData, cfg.TLSClientConfig.CertFile, cfg.TLSClientConfig.KeyFile = nil, nil, "", ""
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return cfg, client
}

// TestCCMReadsOnlyTheSecretsAndLeasesItNames: with the manifests' RBAC the CCM reads no Secret
// of kube-system (nor of any other namespace but the BGP password one), and no Lease but its
// own.
func TestCCMReadsOnlyTheSecretsAndLeasesItNames(t *testing.T) {
	srv := kubeapi.Get(t)
	applyManifests(t, srv)
	ctx := context.Background()
	for _, s := range []struct{ ns, name string }{{"kube-system", "some-secret"}, {"default", "some-secret"}, {"metalvip-bgp-secrets", "router-password"}} {
		_, _ = srv.Client.CoreV1().Secrets(s.ns).Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: s.ns, Name: s.name}, StringData: map[string]string{"password": "x"}}, metav1.CreateOptions{})
	}
	_, client := ccmClient(t, srv)
	getSecret := func(ns, name string) func() error {
		return func() error { _, err := client.CoreV1().Secrets(ns).Get(ctx, name, metav1.GetOptions{}); return err }
	}
	listSecrets := func(ns string) func() error {
		return func() error { _, err := client.CoreV1().Secrets(ns).List(ctx, metav1.ListOptions{}); return err }
	}
	getLease := func(name string) func() error {
		return func() error {
			_, err := client.CoordinationV1().Leases("kube-system").Get(ctx, name, metav1.GetOptions{})
			return err
		}
	}
	for _, tc := range []struct {
		what    string
		call    func() error
		allowed bool
	}{
		{"get a Secret of kube-system", getSecret("kube-system", "some-secret"), false},
		{"list the Secrets of kube-system", listSecrets("kube-system"), false},
		{"get a Secret of another namespace", getSecret("default", "some-secret"), false},
		{"list every Secret", listSecrets(""), false},
		{"get another Lease of kube-system", getLease("kube-controller-manager"), false},
		{"update another Lease of kube-system", func() error {
			_, err := client.CoordinationV1().Leases("kube-system").Update(ctx, leaseNamed("kube-scheduler"), metav1.UpdateOptions{})
			return err
		}, false},
		{"read a BGP password Secret", getSecret("metalvip-bgp-secrets", "router-password"), true},
		{"watch the BGP password Secrets", listSecrets("metalvip-bgp-secrets"), true},
		{"get its own Lease", getLease("metalvip-cloud-controller-manager"), true},
	} {
		t.Run(tc.what, func(t *testing.T) {
			err := tc.call()
			forbidden := apierrors.IsForbidden(err)
			if tc.allowed && forbidden {
				t.Errorf("refused: %v", err)
			}
			if !tc.allowed && !forbidden {
				t.Errorf("allowed (err %v); the CCM must not", err)
			}
		})
	}
}

func leaseNamed(name string) *coordinationv1.Lease {
	return &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "kube-system"}}
}

// TestAnnouncingCCMRunsWithTheManifestsRBAC runs the announcing CCM (term from its Lease,
// password Secrets by informer, conditions by server-side apply on Services, Nodes, pools and
// peers) with the manifests' ServiceAccount: nothing it does is refused.
func TestAnnouncingCCMRunsWithTheManifestsRBAC(t *testing.T) {
	srv := kubeapi.Get(t)
	applyManifests(t, srv)
	cfg, _ := ccmClient(t, srv)
	e := newEnv(t)
	e.pool("rbac-announce-pool", `{addresses: ["10.71.0.0/30"], serviceAllocation: {namespaces: [rbac-announce]}}`)
	ns := e.namespace("rbac-announce")
	createNode(t, srv, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "rbac-announce-node"},
		Status: corev1.NodeStatus{Addresses: []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: "127.0.0.31"}}}})
	ccm := startCCM(t, srv, fastConfig+"agent:\n  insecure: true\n  port: 1\n  timeout: 1s\n",
		"--kubeconfig", srv.Kubeconfig(t, cfg), "--leader-elect=true", "--leader-elect-resource-namespace=kube-system",
		"--controllers=service-lb-controller")
	e.service(ns, "web")
	e.waitIPs(ns, "web", 1, 60*time.Second)
	ctx := context.Background()
	waitAnnounced(t, srv, ns, "web", "the Service's Announced condition is written")
	// The record of who announces the Service: written with an owner reference to it, written
	// again when deleted by hand, deleted when the Service is no longer a LoadBalancer.
	svc, err := srv.Client.CoreV1().Services(ns).Get(ctx, "web", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	records := e.dyn.Resource(v1alpha1.ServiceAnnouncementResource).Namespace(ns)
	record := func() (*v1alpha1.ServiceAnnouncement, error) {
		u, err := records.Get(ctx, "web", metav1.GetOptions{})
		if err != nil {
			return nil, err
		}
		var rec v1alpha1.ServiceAnnouncement
		return &rec, runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, &rec)
	}
	written := func() bool {
		rec, err := record()
		return err == nil && len(rec.OwnerReferences) == 1 && rec.OwnerReferences[0].UID == svc.UID &&
			len(rec.Addresses) == 1 && rec.Addresses[0].Address == svc.Status.LoadBalancer.Ingress[0].IP && rec.ObservedGeneration == svc.Generation
	}
	harness.Eventually(t, 30*time.Second, "the Service's ServiceAnnouncement is written, owned by it", written)
	if err := records.Delete(ctx, "web", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	harness.Eventually(t, 30*time.Second, "a ServiceAnnouncement deleted by hand is written again", written)
	if _, err := records.Patch(ctx, "web", types.MergePatchType, []byte(`{"addresses":[{"address":"203.0.113.99","mode":"L2","nodes":["elsewhere"]}]}`), metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	harness.Eventually(t, 30*time.Second, "a ServiceAnnouncement edited by hand is written again", written)
	svc.Spec.Type = corev1.ServiceTypeClusterIP
	for i := range svc.Spec.Ports {
		svc.Spec.Ports[i].NodePort = 0
	}
	if _, err := srv.Client.CoreV1().Services(ns).Update(ctx, svc, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	harness.Eventually(t, 30*time.Second, "the ServiceAnnouncement of a Service turned ClusterIP is deleted", func() bool {
		_, err := record()
		return apierrors.IsNotFound(err)
	})
	harness.Eventually(t, 30*time.Second, "the Node's AgentReachable condition is written", func() bool {
		n, err := srv.Client.CoreV1().Nodes().Get(ctx, "rbac-announce-node", metav1.GetOptions{})
		if err != nil {
			return false
		}
		for _, c := range n.Status.Conditions {
			if string(c.Type) == "metalvip.io/AgentReachable" {
				return true
			}
		}
		return false
	})
	if out := ccm.Output(); strings.Contains(out, "forbidden") {
		t.Errorf("the announcing CCM was refused something:\n%s", grepLines(out, "forbidden", 5))
	}
}

// waitAnnounced waits until the Service ns/name carries the Announced condition.
func waitAnnounced(t *testing.T, srv *kubeapi.Server, ns, name, what string) {
	t.Helper()
	harness.Eventually(t, 60*time.Second, what, func() bool {
		s, err := srv.Client.CoreV1().Services(ns).Get(context.Background(), name, metav1.GetOptions{})
		if err != nil {
			return false
		}
		for _, c := range s.Status.Conditions {
			if c.Type == desired.ConditionAnnounced {
				return true
			}
		}
		return false
	})
}
