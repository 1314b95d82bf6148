package integration

import (
	"context"
	"fmt"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/discovery/cached/memory"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/restmapper"
	cloudproviderapi "k8s.io/cloud-provider/api"
	corev1helpers "k8s.io/component-helpers/scheduling/corev1"
	"k8s.io/component-helpers/scheduling/corev1/nodeaffinity"
	"k8s.io/klog/v2"
	"sigs.k8s.io/yaml"

	"github.com/metalvip/metalvip/test/kubeapi"
	"github.com/metalvip/metalvip/test/testenv"
)

// manifestDocs returns the documents of manifests/install.yaml.
func manifestDocs(t *testing.T) []*unstructured.Unstructured {
	t.Helper()
	data, err := os.ReadFile("../../manifests/install.yaml")
	if err != nil {
		t.Fatal(err)
	}
	return parseDocs(t, "install.yaml", data)
}

// parseDocs splits a multi-document YAML stream into objects, skipping empty documents.
func parseDocs(t *testing.T, what string, data []byte) []*unstructured.Unstructured {
	t.Helper()
	var out []*unstructured.Unstructured
	for _, doc := range strings.Split("\n"+string(data), "\n---") {
		obj := &unstructured.Unstructured{}
		if err := yaml.Unmarshal([]byte(doc), &obj.Object); err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		if len(obj.Object) > 0 {
			out = append(out, obj)
		}
	}
	return out
}

// applyManifests server-side-applies install.yaml, as `kubectl apply --server-side` would.
func applyManifests(t *testing.T, srv *kubeapi.Server) {
	t.Helper()
	applyDocs(t, srv, manifestDocs(t))
}

// applyDocs server-side-applies objects: namespaces and CRDs first, then the rest, as
// `kubectl apply --server-side` of a file sorted that way would.
func applyDocs(t *testing.T, srv *kubeapi.Server, docs []*unstructured.Unstructured) {
	t.Helper()
	dyn, err := dynamic.NewForConfig(srv.Config)
	if err != nil {
		t.Fatal(err)
	}
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
	first := func(o *unstructured.Unstructured) bool {
		return o.GetKind() == "CustomResourceDefinition" || o.GetKind() == "Namespace"
	}
	for _, obj := range docs {
		if first(obj) {
			if err := apply(obj); err != nil {
				t.Fatalf("apply %s %s: %v", obj.GetKind(), obj.GetName(), err)
			}
		}
	}
	srv.InstallCRDs(t) // waits until they are served
	for _, obj := range docs {
		if !first(obj) {
			if err := apply(obj); err != nil {
				t.Errorf("apply %s %s/%s: %v", obj.GetKind(), obj.GetNamespace(), obj.GetName(), err)
			}
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
	port := testenv.FreePort(t)
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
		t.Errorf("the CCM was refused something:\n%s", grepLines(out, "forbidden", 5))
	}
}

func ptrInt64(v int64) *int64 { return &v }

// typed converts the one object of the kind and name in docs into out.
func typed(t *testing.T, docs []*unstructured.Unstructured, kind, name string, out any) {
	t.Helper()
	for _, d := range docs {
		if d.GetKind() == kind && d.GetName() == name {
			if err := runtime.DefaultUnstructuredConverter.FromUnstructured(d.Object, out); err != nil {
				t.Fatalf("%s %s: %v", kind, name, err)
			}
			return
		}
	}
	t.Fatalf("no %s %s", kind, name)
}

func node(name string, labels map[string]string, taints ...corev1.Taint) *corev1.Node {
	return &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels}, Spec: corev1.NodeSpec{Taints: taints}}
}

// placement is a node and whether a pod of the spec under test may run there.
type placement struct {
	name string
	node *corev1.Node
	want bool
}

// checkPlacements checks, a subtest each, whether spec's pods may run on each case's node.
func checkPlacements(t *testing.T, spec corev1.PodSpec, cases []placement) {
	t.Helper()
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if got := schedulable(t, spec, tc.node); got != tc.want {
				t.Errorf("schedulable = %v, want %v", got, tc.want)
			}
		})
	}
}

// schedulable: the pod's required affinity and node selector admit the node and it tolerates
// every NoSchedule and NoExecute taint the node carries.
func schedulable(t *testing.T, spec corev1.PodSpec, n *corev1.Node) bool {
	t.Helper()
	ok, err := nodeaffinity.GetRequiredNodeAffinity(&corev1.Pod{Spec: spec}).Match(n)
	if err != nil {
		t.Fatal(err)
	}
	_, untolerated := corev1helpers.FindMatchingUntoleratedTaint(klog.Background(), n.Spec.Taints, spec.Tolerations, func(tt *corev1.Taint) bool {
		return tt.Effect == corev1.TaintEffectNoSchedule || tt.Effect == corev1.TaintEffectNoExecute
	}, false)
	return ok && !untolerated
}

var (
	linux           = map[string]string{"kubernetes.io/os": "linux"}
	uninitialized   = corev1.Taint{Key: "node.cloudprovider.kubernetes.io/uninitialized", Value: "true", Effect: corev1.TaintEffectNoSchedule}
	notReady        = corev1.Taint{Key: "node.kubernetes.io/not-ready", Effect: corev1.TaintEffectNoSchedule}
	controlPlaneTnt = corev1.Taint{Key: "node-role.kubernetes.io/control-plane", Effect: corev1.TaintEffectNoSchedule}
)

func withLabels(a map[string]string, kv ...string) map[string]string {
	out := map[string]string{}
	for k, v := range a {
		out[k] = v
	}
	for i := 0; i+1 < len(kv); i += 2 {
		out[kv[i]] = kv[i+1]
	}
	return out
}

// TestTheCCMRunsOnAFreshControlPlane: right after `kubeadm init` (or a k3s/RKE2 server start)
// the only nodes are uninitialised, not ready (no CNI yet) control-plane nodes; the CCM must be
// able to run there, on the host's network, and nowhere but on control-plane nodes.
func TestTheCCMRunsOnAFreshControlPlane(t *testing.T) {
	var d appsv1.Deployment
	typed(t, manifestDocs(t), "Deployment", "metalvip-cloud-controller-manager", &d)
	spec := d.Spec.Template.Spec
	checkPlacements(t, spec, []placement{
		{"a kubeadm control-plane node, uninitialised and not ready, takes it", node("kubeadm-cp", withLabels(linux, "node-role.kubernetes.io/control-plane", ""), uninitialized, notReady, controlPlaneTnt), true},
		{"a k3s server node takes it", node("k3s-server", withLabels(linux, "node-role.kubernetes.io/control-plane", "true", "node-role.kubernetes.io/master", "true"), uninitialized), true},
		{"an RKE2 server node with the control-plane taint takes it", node("rke2-server", withLabels(linux, "node-role.kubernetes.io/control-plane", "true"), uninitialized, controlPlaneTnt), true},
		{"a worker does not", node("worker", linux, uninitialized), false},
		{"a control-plane node labelled false does not", node("odd", withLabels(linux, "node-role.kubernetes.io/control-plane", "false")), false},
		{"a Windows control-plane node does not", node("win", map[string]string{"kubernetes.io/os": "windows", "node-role.kubernetes.io/control-plane": ""}), false},
	})
	if !spec.HostNetwork {
		t.Error("the CCM is not on the host's network: it would wait for a CNI")
	}
	if len(spec.Containers[0].Ports) == 0 {
		t.Error("the CCM declares no port: two replicas could share a node and one would fail to bind")
	}
	var spread bool
	for _, c := range spec.TopologySpreadConstraints {
		spread = spread || (c.TopologyKey == "kubernetes.io/hostname" && c.MaxSkew == 1)
	}
	if !spread {
		t.Error("no topology spread over nodes")
	}
	if s := d.Spec.Strategy.RollingUpdate; s == nil || s.MaxSurge == nil || s.MaxSurge.IntValue() != 0 {
		t.Errorf("rolling update %+v: a surge pod cannot start beside the old one (host port)", d.Spec.Strategy)
	}
	if sc := spec.SecurityContext; sc == nil || sc.SeccompProfile == nil || sc.SeccompProfile.Type != corev1.SeccompProfileTypeRuntimeDefault || sc.RunAsNonRoot == nil || !*sc.RunAsNonRoot {
		t.Errorf("pod security context %+v", spec.SecurityContext)
	}

	var pdb policyv1.PodDisruptionBudget
	typed(t, manifestDocs(t), "PodDisruptionBudget", "metalvip-cloud-controller-manager", &pdb)
	// The disruption controller allows healthy - (replicas - maxUnavailable) evictions. Every
	// replica is on its own node (host port), so with all healthy a drain needs one eviction;
	// minAvailable would block the drain of a single replica's node.
	if pdb.Spec.MinAvailable != nil || pdb.Spec.MaxUnavailable == nil || pdb.Spec.MaxUnavailable.IntValue() < 1 {
		t.Errorf("PDB %+v: want maxUnavailable of at least 1", pdb.Spec)
	}
	if r := *d.Spec.Replicas; r != 1 {
		t.Errorf("%d replicas by default: on a cluster with one control-plane node all but one stay Pending and hold the PDB at 0", r)
	}
}

// TestTheAgentRunsOnEveryLinuxNode: every Linux node, whatever its taints, with probes on its
// metrics port, its address from the pod's IP (IPv4 or IPv6) and only the capabilities it uses.
func TestTheAgentRunsOnEveryLinuxNode(t *testing.T) {
	var ds appsv1.DaemonSet
	typed(t, manifestDocs(t), "DaemonSet", "metalvip-agent", &ds)
	spec := ds.Spec.Template.Spec
	checkPlacements(t, spec, []placement{
		{"a tainted, uninitialised worker takes it", node("w", linux, uninitialized, notReady, corev1.Taint{Key: "example.com/dedicated", Value: "db", Effect: corev1.TaintEffectNoExecute}), true},
		{"a control-plane node takes it", node("cp", withLabels(linux, "node-role.kubernetes.io/control-plane", ""), controlPlaneTnt), true},
		{"a Windows node does not", node("win", map[string]string{"kubernetes.io/os": "windows"}), false},
	})
	c := spec.Containers[0]
	if !spec.HostNetwork || spec.AutomountServiceAccountToken == nil || *spec.AutomountServiceAccountToken {
		t.Errorf("hostNetwork %v, automountServiceAccountToken %v", spec.HostNetwork, spec.AutomountServiceAccountToken)
	}
	ports := map[string]corev1.ContainerPort{}
	for _, p := range c.Ports {
		ports[p.Name] = p
	}
	if p := ports["metrics"]; p.ContainerPort != 7474 {
		t.Errorf("metrics port %+v, want 7474 named metrics", p)
	}
	if p := ports["heartbeat"]; p.ContainerPort != 7473 || p.Protocol != corev1.ProtocolUDP {
		t.Errorf("heartbeat port %+v", p)
	}
	for name, probe := range map[string]*corev1.Probe{"liveness": c.LivenessProbe, "readiness": c.ReadinessProbe} {
		if probe == nil || probe.HTTPGet == nil || probe.HTTPGet.Port.String() != "metrics" {
			t.Errorf("%s probe %+v: want an HTTP probe on the metrics port", name, probe)
		}
	}
	if c.LivenessProbe != nil && c.LivenessProbe.HTTPGet.Path != "/healthz" || c.ReadinessProbe != nil && c.ReadinessProbe.HTTPGet.Path != "/readyz" {
		t.Error("probes on the wrong paths")
	}
	var nodeIP string
	for _, e := range c.Env {
		if e.Name == "NODE_IP" && e.ValueFrom != nil && e.ValueFrom.FieldRef != nil {
			nodeIP = e.ValueFrom.FieldRef.FieldPath
		}
	}
	if nodeIP != "status.podIP" {
		t.Errorf("NODE_IP from %q, want status.podIP", nodeIP)
	}
	if !slices.Contains(c.Args, "--listen-address=$(NODE_IP)") {
		t.Errorf("args %v: want --listen-address=$(NODE_IP) (a bare address: $(NODE_IP):7472 breaks on IPv6)", c.Args)
	}
	if !slices.Contains(c.Args, "--metrics-address=$(NODE_IP)") || !slices.Contains(c.Args, "--metrics-auth=kubernetes") {
		t.Errorf("args %v: want --metrics-address=$(NODE_IP) (the node's address alone) and --metrics-auth=kubernetes", c.Args)
	}
	if c.LivenessProbe == nil || c.LivenessProbe.HTTPGet.Scheme != corev1.URISchemeHTTPS || c.ReadinessProbe == nil || c.ReadinessProbe.HTTPGet.Scheme != corev1.URISchemeHTTPS {
		t.Error("the probes do not ask over HTTPS, which the agent serves with --metrics-auth=kubernetes")
	}
	sc := c.SecurityContext
	if sc == nil || sc.Capabilities == nil || !slices.Equal(sc.Capabilities.Drop, []corev1.Capability{"ALL"}) ||
		!slices.Equal(sc.Capabilities.Add, []corev1.Capability{"NET_RAW", "NET_ADMIN"}) ||
		sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation || sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem {
		t.Errorf("agent security context %+v", sc)
	}
	if psc := spec.SecurityContext; psc == nil || psc.SeccompProfile == nil || psc.SeccompProfile.Type != corev1.SeccompProfileTypeRuntimeDefault {
		t.Errorf("agent pod security context %+v", psc)
	}
}
