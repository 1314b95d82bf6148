package integration

import (
	"context"
	"fmt"
	"net"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/discovery/cached/memory"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/restmapper"
	cloudproviderapi "k8s.io/cloud-provider/api"
	"sigs.k8s.io/yaml"

	"github.com/metalvip/metalvip/test/kubeapi"
)

// manifestDocs returns the documents of manifests/install.yaml.
func manifestDocs(t *testing.T) []*unstructured.Unstructured {
	t.Helper()
	data, err := os.ReadFile("../../manifests/install.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var out []*unstructured.Unstructured
	for _, doc := range strings.Split(string(data), "\n---\n") {
		obj := &unstructured.Unstructured{}
		if err := yaml.Unmarshal([]byte(doc), &obj.Object); err != nil {
			t.Fatalf("install.yaml: %v", err)
		}
		if len(obj.Object) > 0 {
			out = append(out, obj)
		}
	}
	return out
}

// applyManifests server-side-applies install.yaml, CRDs first, as `kubectl apply
// --server-side` would.
func applyManifests(t *testing.T, srv *kubeapi.Server) {
	t.Helper()
	dyn, err := dynamic.NewForConfig(srv.Config)
	if err != nil {
		t.Fatal(err)
	}
	docs := manifestDocs(t)
	apply := func(obj *unstructured.Unstructured) error {
		mapper := restmapper.NewDeferredDiscoveryRESTMapper(memory.NewMemCacheClient(srv.Client.Discovery()))
		gvk := obj.GroupVersionKind()
		mapping, err := mapper.RESTMapping(gvk.GroupKind(), gvk.Version)
		if err != nil {
			return err
		}
		data, err := obj.MarshalJSON()
		if err != nil {
			return err
		}
		var ri dynamic.ResourceInterface = dyn.Resource(mapping.Resource)
		if ns := obj.GetNamespace(); ns != "" {
			ri = dyn.Resource(mapping.Resource).Namespace(ns)
		}
		force := true
		_, err = ri.Patch(context.Background(), obj.GetName(), types.ApplyPatchType, data, metav1.PatchOptions{FieldManager: "metalvip-test", Force: &force})
		return err
	}
	for _, obj := range docs {
		if obj.GetKind() != "CustomResourceDefinition" {
			continue
		}
		if err := apply(obj); err != nil {
			t.Fatalf("apply %s %s: %v", obj.GetKind(), obj.GetName(), err)
		}
	}
	srv.InstallCRDs(t) // waits until they are served
	for _, obj := range docs {
		if obj.GetKind() == "CustomResourceDefinition" {
			continue
		}
		if err := apply(obj); err != nil {
			t.Errorf("apply %s %s: %v", obj.GetKind(), obj.GetName(), err)
		}
	}
}

func TestManifestsAreAccepted(t *testing.T) {
	srv := kubeapi.Get(t)
	applyManifests(t, srv)
	kinds := map[string]bool{}
	for _, d := range manifestDocs(t) {
		kinds[d.GetKind()] = true
	}
	for _, k := range []string{"CustomResourceDefinition", "ServiceAccount", "ClusterRole", "Role", "Deployment", "DaemonSet", "PodDisruptionBudget", "ConfigMap"} {
		if !kinds[k] {
			t.Errorf("install.yaml has no %s", k)
		}
	}
}

func TestRBACHasNoWildcards(t *testing.T) {
	for _, d := range manifestDocs(t) {
		if d.GetKind() != "ClusterRole" && d.GetKind() != "Role" {
			continue
		}
		var role rbacv1.ClusterRole
		data, _ := d.MarshalJSON()
		if err := yaml.Unmarshal(data, &role); err != nil {
			t.Fatal(err)
		}
		for i, r := range role.Rules {
			for _, list := range [][]string{r.APIGroups, r.Resources, r.Verbs, r.ResourceNames, r.NonResourceURLs} {
				if slices.ContainsFunc(list, func(s string) bool { return strings.Contains(s, "*") }) {
					t.Errorf("%s %s rule %d has a wildcard: %+v", d.GetKind(), d.GetName(), i, r)
				}
			}
		}
	}
}

// TestCCMRunsWithTheManifestsRBAC runs the CCM with a token of exactly the manifests'
// ServiceAccount (not an admin): it must initialise a node and allocate an address.
func TestCCMRunsWithTheManifestsRBAC(t *testing.T) {
	srv := kubeapi.Get(t)
	applyManifests(t, srv)
	ctx := context.Background()
	tok, err := srv.Client.CoreV1().ServiceAccounts("kube-system").CreateToken(ctx, "metalvip-cloud-controller-manager",
		&authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: ptrInt64(3600)}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("token for the CCM's ServiceAccount: %v", err)
	}
	cfg := rest.CopyConfig(srv.Config)
	cfg.BearerToken = tok.Status.Token
	port := freePort(t)
	ccm := startCCM(t, srv, fastConfig, "--kubeconfig", srv.Kubeconfig(t, cfg), "--leader-elect=true",
		"--leader-elect-resource-namespace=kube-system", "--secure-port", fmt.Sprint(port), "--bind-address=127.0.0.1")

	// A node to initialise.
	createNode(t, srv, &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: "rbac-node", Annotations: map[string]string{cloudproviderapi.AnnotationAlphaProvidedIPAddr: "198.51.100.21"}},
		Spec:       corev1.NodeSpec{Taints: []corev1.Taint{uninitializedTaint()}},
	})
	// An address to allocate.
	e := newEnv(t)
	e.pool("rbac-pool", `{addresses: ["10.70.0.0/30"], serviceAllocation: {namespaces: [rbac]}}`)
	ns := e.namespace("rbac")
	e.service(ns, "web")
	e.waitIPs(ns, "web", 1, 60*time.Second)
	deadline := time.Now().Add(60 * time.Second)
	for {
		n, err := srv.Client.CoreV1().Nodes().Get(ctx, "rbac-node", metav1.GetOptions{})
		if err == nil && n.Spec.ProviderID == "metalvip://rbac-node" && !hasUninitializedTaint(n) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("node not initialised with the manifests' RBAC: %+v", n.Spec)
		}
		time.Sleep(200 * time.Millisecond)
	}
	// No permission was refused along the way.
	if out := ccm.Output(); strings.Contains(out, "forbidden") {
		var lines []string
		for _, l := range strings.Split(out, "\n") {
			if strings.Contains(l, "forbidden") {
				lines = append(lines, l)
			}
		}
		t.Errorf("the CCM was refused something:\n%s", strings.Join(lines[:min(5, len(lines))], "\n"))
	}
}

func ptrInt64(v int64) *int64 { return &v }

func freePort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}
