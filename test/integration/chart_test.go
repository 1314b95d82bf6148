package integration

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"sigs.k8s.io/yaml"

	"github.com/metalvip/metalvip/provider"
	"github.com/metalvip/metalvip/test/kubeapi"
)

const chartDir = "../../charts/metalvip"

// tool returns a large build tool's path, building it once into .cache/bin (hack/tool.sh).
func tool(t *testing.T, name string) string {
	t.Helper()
	if testing.Short() {
		t.Skipf("needs %s built; not run with -short", name)
	}
	start := time.Now()
	out, err := exec.Command("../../hack/tool.sh", name).Output()
	if err != nil {
		var stderr []byte
		if ee, ok := err.(*exec.ExitError); ok {
			stderr = ee.Stderr
		}
		t.Fatalf("hack/tool.sh %s: %v\n%s", name, err, stderr)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Logf("built %s in %s", name, d.Round(time.Second))
	}
	return strings.TrimSpace(string(out))
}

func helm(t *testing.T, args ...string) (string, error) {
	t.Helper()
	cmd := exec.Command(tool(t, "helm"), args...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	if err != nil {
		return stdout.String() + stderr.String(), err
	}
	return stdout.String(), nil
}

// renderChart is `helm template` of the chart in kube-system with the given --set values.
func renderChart(t *testing.T, set ...string) []*unstructured.Unstructured {
	t.Helper()
	args := []string{"template", "metalvip", chartDir, "--namespace", "kube-system", "--include-crds"}
	for _, s := range set {
		args = append(args, "--set", s)
	}
	out, err := helm(t, args...)
	if err != nil {
		t.Fatalf("helm %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return parseDocs(t, "helm template", []byte(out))
}

// renderKustomize builds manifests/ with kustomize's engine, as make generate does, but
// fresh: the comparison does not trust the committed install.yaml.
func renderKustomize(t *testing.T) []*unstructured.Unstructured {
	t.Helper()
	cmd := exec.Command("go", "run", "./render", "-dir", "../../manifests", "-o", "-")
	cmd.Dir = "../../hack/tools"
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("render: %v\n%s", err, stderr.String())
	}
	return parseDocs(t, "kustomize", out)
}

func objectKey(o *unstructured.Unstructured) string {
	return o.GetKind() + " " + o.GetNamespace() + "/" + o.GetName()
}

// comparable removes what only Helm needs and reads the cloud-config as the CCM does, as data
// rather than text (key order and comments do not matter to it).
func comparable(t *testing.T, o *unstructured.Unstructured) map[string]any {
	t.Helper()
	c := o.DeepCopy()
	// Helm only: keep the BGP password namespace on uninstall; restart the CCM on a new
	// cloud-config.
	if a := c.GetAnnotations(); a != nil {
		delete(a, "helm.sh/resource-policy")
		if len(a) == 0 {
			unstructured.RemoveNestedField(c.Object, "metadata", "annotations")
		} else {
			c.SetAnnotations(a)
		}
	}
	if a, found, _ := unstructured.NestedStringMap(c.Object, "spec", "template", "metadata", "annotations"); found {
		for k := range a {
			if strings.HasPrefix(k, "checksum/") {
				delete(a, k)
			}
		}
		if len(a) == 0 {
			unstructured.RemoveNestedField(c.Object, "spec", "template", "metadata", "annotations")
		} else {
			_ = unstructured.SetNestedStringMap(c.Object, a, "spec", "template", "metadata", "annotations")
		}
	}
	if c.GetKind() == "ConfigMap" && c.GetName() == "metalvip-cloud-config" {
		text, _, _ := unstructured.NestedString(c.Object, "data", "cloud-config.yaml")
		var parsed map[string]any
		if err := yaml.Unmarshal([]byte(text), &parsed); err != nil {
			t.Fatalf("cloud-config of %s: %v", objectKey(o), err)
		}
		c.Object["data"] = map[string]any{"cloud-config.yaml": parsed}
	}
	return c.Object
}

// TestTheChartRendersWhatKustomizeRenders: with its defaults the chart gives exactly the
// objects of manifests/ (what install.yaml holds), so the two ways to install cannot drift.
func TestTheChartRendersWhatKustomizeRenders(t *testing.T) {
	chart := map[string]*unstructured.Unstructured{}
	for _, o := range renderChart(t) {
		chart[objectKey(o)] = o
	}
	kust := renderKustomize(t)
	if len(kust) < 15 {
		t.Fatalf("kustomize rendered only %d objects", len(kust))
	}
	for _, k := range kust {
		key := objectKey(k)
		c, ok := chart[key]
		if !ok {
			t.Errorf("the chart has no %s", key)
			continue
		}
		delete(chart, key)
		want, got := comparable(t, k), comparable(t, c)
		if !reflect.DeepEqual(want, got) {
			wj, _ := json.MarshalIndent(want, "", " ")
			gj, _ := json.MarshalIndent(got, "", " ")
			t.Errorf("%s differs:\n%s", key, lineDiff(string(wj), string(gj)))
		}
	}
	for key := range chart {
		t.Errorf("the chart renders %s, which manifests/ does not", key)
	}
}

// lineDiff lists the lines only one side has (enough to see what drifted).
func lineDiff(want, got string) string {
	w, g := strings.Split(want, "\n"), strings.Split(got, "\n")
	var out []string
	for _, l := range w {
		if !slices.Contains(g, l) {
			out = append(out, "- kustomize: "+l)
		}
	}
	for _, l := range g {
		if !slices.Contains(w, l) {
			out = append(out, "+ chart:     "+l)
		}
	}
	return strings.Join(out, "\n")
}

func TestTheChartLintsClean(t *testing.T) {
	values := filepath.Join(t.TempDir(), "values.yaml")
	if err := os.WriteFile(values, []byte(everyOption), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct{ name, values string }{
		{"with its defaults", ""},
		{"with every option set", values},
	} {
		t.Run(tc.name, func(t *testing.T) {
			args := []string{"lint", "--strict", chartDir}
			if tc.values != "" {
				args = append(args, "--values", tc.values)
			}
			out, err := helm(t, args...)
			if err != nil || strings.Contains(out, "[WARNING]") || strings.Contains(out, "[ERROR]") {
				t.Fatalf("helm lint: %v\n%s", err, out)
			}
		})
	}
}

// everyOption sets every value the chart has, to something other than its default.
const everyOption = `
image: {registry: registry.example:5000/mirror, tag: v9.9.9, pullPolicy: Always, pullSecrets: [{name: mirror-pull}]}
tls: {mode: files, ccmSecretName: ccm-tls, agentSecretName: agents-tls}
cloudConfig:
  agent: {timeout: 3s}
  failover: {interval: 20ms, misses: 5, port: 7483, maxCandidates: 3, gratuitousRefresh: 60s}
  bgp: {passwordSecretNamespace: bgp-passwords}
  allocation: {pendingRetry: 5s, poolStatusInterval: 2s}
  topology:
    zoneLabel: example.com/zone
    subnets: [{cidr: 198.51.100.0/26, zone: rack-a, region: site-1}]
  instanceTypeLabel: example.com/hardware
  nodes: {initialize: false}
  services: {loadBalancerClass: example.com/lb, classless: false}
createPasswordSecretNamespace: false
ccm:
  image: {digest: "sha256:1111111111111111111111111111111111111111111111111111111111111111"}
  replicas: 3
  securePort: 10358
  priorityClassName: ""
  resources: {requests: {cpu: 200m, memory: 256Mi}}
  nodeSelector: {example.com/pool: infra}
  tolerations: [{operator: Exists}]
  podDisruptionBudget: {enabled: true, maxUnavailable: 2}
  extraArgs: [--v=2]
  strategy: {type: Recreate}
  serviceAccount: {name: ccm-identity, annotations: {example.com/owner: network-team}}
  podAnnotations: {example.com/note: ccm}
  podLabels: {example.com/team: network}
  podSecurityContext: {runAsUser: 65000, fsGroup: 65000}
  securityContext: {seccompProfile: {type: Localhost, localhostProfile: profiles/ccm.json}}
  serviceMonitor:
    enabled: true
    interval: 15s
    labels: {release: prometheus}
    prometheusServiceAccount: {name: prometheus-k8s, namespace: monitoring}
    tlsConfig: {ca: {configMap: {name: ccm-serving-ca, key: ca.crt}}, serverName: ccm.example}
agent:
  image: {digest: "sha256:2222222222222222222222222222222222222222222222222222222222222222"}
  port: 7480
  metricsPort: 7484
  metricsAuth: none
  restartGrace: 12s
  kubeProxyHealthz: http://127.0.0.1:10999/healthz
  dataPlaneGrace: 30s
  interfaces: [eth1, bond0]
  stateDir: /var/lib/metalvip
  priorityClassName: ""
  resources: {limits: {memory: 256Mi}}
  nodeSelector: {kubernetes.io/os: linux, example.com/edge: "true"}
  tolerations: []
  extraArgs: [--v=2, --gratuitous-refresh=60s]
  affinity: {nodeAffinity: {requiredDuringSchedulingIgnoredDuringExecution: {nodeSelectorTerms: [{matchExpressions: [{key: example.com/announce, operator: Exists}]}]}}}
  updateStrategy: {type: RollingUpdate, rollingUpdate: {maxUnavailable: 10%}}
  serviceAccount: {name: node-agents, annotations: {example.com/owner: network-team}}
  podAnnotations: {example.com/note: agent}
  podLabels: {example.com/team: network}
  podSecurityContext: {seccompProfile: {type: Localhost, localhostProfile: profiles/agent.json}}
  securityContext: {capabilities: {add: [NET_RAW]}}
  podMonitor: {enabled: true, interval: 15s, labels: {release: prometheus}, tlsConfig: {serverName: agents.example}}
`

// TestTheChartsValuesReachTheObjects: each value changes what it says, and the cloud-config it
// writes is one the CCM accepts, with the values in it.
func TestTheChartsValuesReachTheObjects(t *testing.T) {
	values := filepath.Join(t.TempDir(), "values.yaml")
	if err := os.WriteFile(values, []byte(everyOption), 0o644); err != nil {
		t.Fatal(err)
	}
	out, err := helm(t, "template", "metalvip", chartDir, "--namespace", "metalvip-system", "--values", values)
	if err != nil {
		t.Fatalf("helm template: %v\n%s", err, out)
	}
	docs := parseDocs(t, "helm template", []byte(out))

	var ccm appsv1.Deployment
	typed(t, docs, "Deployment", "metalvip-cloud-controller-manager", &ccm)
	c := ccm.Spec.Template.Spec.Containers[0]
	if *ccm.Spec.Replicas != 3 || c.Image != "registry.example:5000/mirror/metalvip-cloud-controller-manager@sha256:"+strings.Repeat("1", 64) ||
		c.ImagePullPolicy != "Always" || ccm.Spec.Template.Spec.ImagePullSecrets[0].Name != "mirror-pull" {
		t.Errorf("CCM: replicas %d image %s policy %s", *ccm.Spec.Replicas, c.Image, c.ImagePullPolicy)
	}
	for _, want := range []string{"--secure-port=10358", "--v=2", "--leader-elect-resource-namespace=metalvip-system"} {
		if !slices.Contains(c.Args, want) {
			t.Errorf("CCM args %v lack %s", c.Args, want)
		}
	}
	if ccm.Spec.Template.Spec.NodeSelector["example.com/pool"] != "infra" || ccm.Spec.Template.Spec.PriorityClassName != "" {
		t.Errorf("CCM pod spec: nodeSelector %v priority %q", ccm.Spec.Template.Spec.NodeSelector, ccm.Spec.Template.Spec.PriorityClassName)
	}
	if v := ccm.Spec.Template.Spec.Volumes[1].Secret; v == nil || v.SecretName != "ccm-tls" {
		t.Errorf("CCM TLS volume %+v", ccm.Spec.Template.Spec.Volumes)
	}
	checkPodKnobs(t, docs, "CCM", ccm.Spec.Template, "ccm-identity", "ccm")
	if s := ccm.Spec.Strategy; s.Type != appsv1.RecreateDeploymentStrategyType || s.RollingUpdate != nil {
		t.Errorf("CCM strategy %+v, want Recreate without the default's rollingUpdate", s)
	}
	if p := ccm.Spec.Template.Spec.SecurityContext; *p.RunAsUser != 65000 || *p.FSGroup != 65000 || !*p.RunAsNonRoot || p.SeccompProfile.Type != "RuntimeDefault" {
		t.Errorf("CCM pod securityContext %+v, want runAsUser and fsGroup 65000 beside the defaults", p)
	}
	if c := c.SecurityContext; c.SeccompProfile.Type != "Localhost" || *c.AllowPrivilegeEscalation || !*c.ReadOnlyRootFilesystem {
		t.Errorf("CCM container securityContext %+v, want a Localhost seccomp profile beside the defaults", c)
	}

	var agent appsv1.DaemonSet
	typed(t, docs, "DaemonSet", "metalvip-agent", &agent)
	a := agent.Spec.Template.Spec.Containers[0]
	for _, want := range []string{"--listen-address=[$(NODE_IP)]:7480", "--metrics-address=[$(NODE_IP)]:7484", "--metrics-auth=none", "--interfaces=eth1,bond0", "--state-dir=/var/lib/metalvip", "--gratuitous-refresh=60s"} {
		if !slices.Contains(a.Args, want) {
			t.Errorf("agent args %v lack %s", a.Args, want)
		}
	}
	if a.Image != "registry.example:5000/mirror/metalvip-agent@sha256:"+strings.Repeat("2", 64) || len(agent.Spec.Template.Spec.Tolerations) != 0 {
		t.Errorf("agent image %s tolerations %v", a.Image, agent.Spec.Template.Spec.Tolerations)
	}
	ports := map[string]int32{}
	for _, p := range a.Ports {
		ports[p.Name] = p.ContainerPort
	}
	if ports["grpc"] != 7480 || ports["heartbeat"] != 7483 || ports["metrics"] != 7484 {
		t.Errorf("agent ports %v", ports)
	}
	if a.LivenessProbe.HTTPGet.Scheme != corev1.URISchemeHTTP {
		t.Errorf("agent probes over %s with metricsAuth none (plain HTTP)", a.LivenessProbe.HTTPGet.Scheme)
	}
	for _, want := range []string{"--restart-grace=12s", "--pod-name=$(POD_NAME)", "--pod-namespace=$(POD_NAMESPACE)", "--kube-proxy-healthz=http://127.0.0.1:10999/healthz", "--data-plane-grace=30s"} {
		if !slices.Contains(a.Args, want) {
			t.Errorf("agent args %v lack %s", a.Args, want)
		}
	}
	// metricsAuth none, but the agent reads its own Pod on SIGTERM (restartGrace): the API
	// token is mounted, get on the namespace's Pods granted, token reviews not.
	token := false
	for _, v := range agent.Spec.Template.Spec.Volumes {
		token = token || v.Name == "kube-api-access"
	}
	if !token {
		t.Error("no API token mounted in the agent, which reads its own Pod (restartGrace)")
	}
	if findDoc(docs, "Role", "metalvip:agent:planned-restart") == nil || findDoc(docs, "RoleBinding", "metalvip:agent:planned-restart") == nil {
		t.Error("the agent is not granted get on its namespace's Pods (restartGrace)")
	}
	if findDoc(docs, "ClusterRoleBinding", "metalvip:agent:auth-delegator") != nil {
		t.Error("the agent is granted token reviews with metricsAuth none")
	}
	// Both off: no token, no grant, no flags.
	out, err = helm(t, "template", "metalvip", chartDir, "--namespace", "metalvip-system", "--values", values, "--set", "agent.restartGrace=0s", "--set", "agent.kubeProxyHealthz=")
	if err != nil {
		t.Fatalf("helm template: %v\n%s", err, out)
	}
	off := parseDocs(t, "helm template", []byte(out))
	var plain appsv1.DaemonSet
	typed(t, off, "DaemonSet", "metalvip-agent", &plain)
	for _, v := range plain.Spec.Template.Spec.Volumes {
		if v.Name == "kube-api-access" {
			t.Error("an API token mounted in the agent with metricsAuth none and restartGrace 0s")
		}
	}
	if findDoc(off, "Role", "metalvip:agent:planned-restart") != nil || slices.ContainsFunc(plain.Spec.Template.Spec.Containers[0].Args, func(a string) bool { return strings.HasPrefix(a, "--restart-grace") }) {
		t.Error("restartGrace 0s still renders the grace or its grant")
	}
	if slices.ContainsFunc(plain.Spec.Template.Spec.Containers[0].Args, func(a string) bool {
		return strings.HasPrefix(a, "--kube-proxy-healthz") || strings.HasPrefix(a, "--data-plane-grace")
	}) {
		t.Error(`kubeProxyHealthz "" still renders the kube-proxy check`)
	}
	sm := endpointOf(t, docs, "ServiceMonitor", "metalvip-cloud-controller-manager", "endpoints")
	if sm.TLSConfig["serverName"] != "ccm.example" || sm.TLSConfig["insecureSkipVerify"] != nil {
		t.Errorf("ServiceMonitor tlsConfig %v, want the values' (serverName ccm.example, no insecureSkipVerify)", sm.TLSConfig)
	}
	pm := endpointOf(t, docs, "PodMonitor", "metalvip-agent", "podMetricsEndpoints")
	if pm.Scheme != "" || pm.Authorization != nil {
		t.Errorf("PodMonitor with metricsAuth none: scheme %q authorization %v, want plain HTTP without a token", pm.Scheme, pm.Authorization)
	}
	if v := agent.Spec.Template.Spec.Volumes[1].Secret; v == nil || v.SecretName != "agents-tls" {
		t.Errorf("agent TLS volume %+v", agent.Spec.Template.Spec.Volumes)
	}
	checkPodKnobs(t, docs, "agent", agent.Spec.Template, "node-agents", "agent")
	if s := agent.Spec.UpdateStrategy; s.RollingUpdate == nil || s.RollingUpdate.MaxUnavailable.String() != "10%" {
		t.Errorf("agent updateStrategy %+v", s)
	}
	if aff := agent.Spec.Template.Spec.Affinity; aff == nil || aff.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution.NodeSelectorTerms[0].MatchExpressions[0].Key != "example.com/announce" {
		t.Errorf("agent affinity %+v", aff)
	}
	if p := agent.Spec.Template.Spec.SecurityContext; p.SeccompProfile.Type != "Localhost" || *p.SeccompProfile.LocalhostProfile != "profiles/agent.json" {
		t.Errorf("agent pod securityContext %+v", p)
	}
	if c := a.SecurityContext; !slices.Equal(c.Capabilities.Add, []corev1.Capability{"NET_RAW"}) || !slices.Equal(c.Capabilities.Drop, []corev1.Capability{"ALL"}) || *c.AllowPrivilegeEscalation || !*c.ReadOnlyRootFilesystem {
		t.Errorf("agent container securityContext %+v, want NET_RAW alone added beside the defaults", c)
	}

	// The cloud-config, read by the CCM's own reader.
	var cm struct {
		Data map[string]string `json:"data"`
	}
	typed(t, docs, "ConfigMap", "metalvip-cloud-config", &cm)
	path := filepath.Join(t.TempDir(), "cloud-config.yaml")
	if err := os.WriteFile(path, []byte(cm.Data["cloud-config.yaml"]), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg, err := provider.ReadConfig(path)
	if err != nil {
		t.Fatalf("the CCM refuses the chart's cloud-config: %v\n%s", err, cm.Data["cloud-config.yaml"])
	}
	if cfg.Agent.Port != 7480 || cfg.Failover.Interval.Duration != 20*time.Millisecond || cfg.Failover.Port != 7483 ||
		cfg.BGP.PasswordSecretNamespace != "bgp-passwords" || cfg.Agent.Timeout.Duration != 3*time.Second ||
		len(cfg.Topology.Subnets) != 1 || cfg.Agent.CAFile != "/etc/metalvip/tls/ca.crt" || cfg.Services.ServesClassless() {
		t.Errorf("cloud-config read as %+v", cfg)
	}

	// Namespaced objects in the release's namespace, the authentication reader in kube-system,
	// and no password namespace when told not to create it.
	for _, d := range docs {
		switch {
		case d.GetKind() == "Namespace":
			t.Errorf("a Namespace %s although createPasswordSecretNamespace is false", d.GetName())
		case d.GetName() == "metalvip:cloud-controller-manager:authentication-reader":
			if d.GetNamespace() != "kube-system" {
				t.Errorf("authentication reader in %q", d.GetNamespace())
			}
		case strings.HasSuffix(d.GetName(), ":bgp-passwords"):
			if d.GetNamespace() != "bgp-passwords" {
				t.Errorf("%s %s in %q", d.GetKind(), d.GetName(), d.GetNamespace())
			}
		case d.GetKind() == "Deployment" || d.GetKind() == "DaemonSet" || d.GetKind() == "ConfigMap":
			if d.GetNamespace() != "metalvip-system" {
				t.Errorf("%s %s in %q", d.GetKind(), d.GetName(), d.GetNamespace())
			}
		}
	}
}

// TestTheChartRendersMonitorsOnlyWhenAsked: a ServiceMonitor (with the Service it selects) and
// a PodMonitor when enabled, nothing of prometheus-operator otherwise.
func TestTheChartRendersMonitorsOnlyWhenAsked(t *testing.T) {
	kinds := func(docs []*unstructured.Unstructured) map[string]*unstructured.Unstructured {
		m := map[string]*unstructured.Unstructured{}
		for _, d := range docs {
			m[d.GetKind()+" "+d.GetName()] = d
		}
		return m
	}
	off := kinds(renderChart(t))
	for k := range off {
		if strings.Contains(k, "Monitor") || k == "Service metalvip-cloud-controller-manager-metrics" {
			t.Errorf("rendered by default: %s", k)
		}
	}
	on := kinds(renderChart(t, "ccm.serviceMonitor.enabled=true", "agent.podMonitor.enabled=true",
		"ccm.serviceMonitor.labels.release=prometheus",
		"ccm.serviceMonitor.prometheusServiceAccount.name=prometheus-k8s", "ccm.serviceMonitor.prometheusServiceAccount.namespace=monitoring"))
	sm, ok := on["ServiceMonitor metalvip-cloud-controller-manager"]
	if !ok {
		t.Fatal("no ServiceMonitor when enabled")
	}
	if sm.GetLabels()["release"] != "prometheus" || sm.GetAPIVersion() != "monitoring.coreos.com/v1" {
		t.Errorf("ServiceMonitor %v", sm.Object["metadata"])
	}
	eps, _, _ := unstructured.NestedSlice(sm.Object, "spec", "endpoints")
	if len(eps) != 1 || eps[0].(map[string]any)["port"] != "https" || eps[0].(map[string]any)["scheme"] != "https" {
		t.Errorf("ServiceMonitor endpoints %v", eps)
	}
	svc, ok := on["Service metalvip-cloud-controller-manager-metrics"]
	if !ok {
		t.Fatal("no Service for the ServiceMonitor to select")
	}
	smSel, _, _ := unstructured.NestedStringMap(sm.Object, "spec", "selector", "matchLabels")
	for k, v := range smSel {
		if svc.GetLabels()[k] != v {
			t.Errorf("the ServiceMonitor selects %v, the Service has %v", smSel, svc.GetLabels())
		}
	}
	pm, ok := on["PodMonitor metalvip-agent"]
	if !ok {
		t.Fatal("no PodMonitor when enabled")
	}
	pes, _, _ := unstructured.NestedSlice(pm.Object, "spec", "podMetricsEndpoints")
	if len(pes) != 1 || pes[0].(map[string]any)["port"] != "metrics" {
		t.Errorf("PodMonitor endpoints %v", pes)
	}
	if _, ok := on["ClusterRoleBinding metalvip:metrics-reader"]; !ok {
		t.Error("no binding granting Prometheus /metrics")
	}
}

// TestTheChartRefusesBadValuesByName: a mistake in values fails `helm template` (and so
// `helm install`) with the value at fault, before anything reaches the cluster.
func TestTheChartRefusesBadValuesByName(t *testing.T) {
	for _, tc := range []struct{ name, set, want string }{
		{"a misspelt key is refused", "ccm.replica=2", "additional properties 'replica' not allowed"},
		{"a misspelt cloud-config section is refused", "cloudConfig.topolgy.zoneLabel=x", "additional properties 'topolgy' not allowed"},
		{"a digest that is not sha256 is refused", "agent.image.digest=sha256:abc", "/agent/image/digest"},
		{"too few heartbeat misses are refused", "cloudConfig.failover.misses=1", "/cloudConfig/failover/misses"},
		{"a bare-number duration is refused", "cloudConfig.failover.interval=50", "/cloudConfig/failover/interval"},
		{"two interfaces in one item are refused", `agent.interfaces[0]=eth0\,eth1`, "/agent/interfaces/0"},
		{"a privileged port for the agent is refused", "agent.port=179", "/agent/port"},
		{"a pod label replacing the chart's own is refused", `agent.podLabels.app\.kubernetes\.io/name=x`, `agent.podLabels: "app.kubernetes.io/name" is the chart's own label`},
		{"a misspelt securityContext field is refused", "ccm.securityContext.readOnlyRootFileSystem=false", "additional properties 'readOnlyRootFileSystem' not allowed"},
		{"a toleration operator Kubernetes lacks is refused", "agent.tolerations[0].operator=Exist", "/agent/tolerations/0/operator"},
		{"a DaemonSet strategy of a Deployment is refused", "agent.updateStrategy.type=Recreate", "/agent/updateStrategy/type"},
		{"a ServiceAccount name in capitals is refused", "ccm.serviceAccount.name=CCM", "/ccm/serviceAccount/name"},
		{"a restart grace over 30 s is refused", "agent.restartGrace=31s", "/agent/restartGrace"},
		{"a restart grace below 1 s is refused", "agent.restartGrace=500ms", "/agent/restartGrace"},
		{"a kube-proxy health address without scheme is refused", "agent.kubeProxyHealthz=127.0.0.1:10256", "/agent/kubeProxyHealthz"},
		{"a data-plane grace below 2 s is refused", "agent.dataPlaneGrace=1s", "/agent/dataPlaneGrace"},
		{"a drain delay over 10 minutes is refused", "cloudConfig.drain.delay=11m", "cloudConfig.drain.delay: 11m is out of range; write at most 10m"},
		{"a Prometheus account without namespace is refused", "ccm.serviceMonitor.enabled=true,ccm.serviceMonitor.prometheusServiceAccount.name=p", "prometheusServiceAccount.namespace is required"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out, err := helm(t, "template", "metalvip", chartDir, "--namespace", "kube-system", "--set", tc.set)
			if err == nil || !strings.Contains(out, tc.want) {
				t.Fatalf("helm template --set %s: %v, want an error naming %q:\n%s", tc.set, err, tc.want, out)
			}
		})
	}
}

// TestTheChartIsAcceptedByTheAPIServer applies the chart, rendered with non-default values and
// the monitors on, server-side to the real API server (every object validated by it, CRDs
// first; prometheus-operator's generated from its Go API module).
func TestTheChartIsAcceptedByTheAPIServer(t *testing.T) {
	srv := kubeapi.Get(t)
	srv.InstallMonitoringCRDs(t)
	docs := renderChart(t, "ccm.replicas=2", "agent.interfaces={eth1}", "ccm.image.digest=sha256:"+strings.Repeat("a", 64),
		"cloudConfig.topology.zoneLabel=example.com/zone", "ccm.serviceMonitor.enabled=true", "agent.podMonitor.enabled=true",
		// The pod knobs, each to something other than its default.
		"ccm.strategy.type=Recreate", "agent.updateStrategy.rollingUpdate.maxUnavailable=10%",
		`ccm.podLabels.example\.com/team=network`, `agent.podAnnotations.example\.com/note=agent`,
		"ccm.podSecurityContext.fsGroup=65532", "agent.securityContext.capabilities.add={NET_RAW}",
		"agent.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms[0].matchExpressions[0].key=example.com/announce",
		"agent.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms[0].matchExpressions[0].operator=Exists",
		`ccm.serviceAccount.annotations.example\.com/owner=network-team`)
	applyDocs(t, srv, docs)
	// Restore what the other tests apply (same names), whatever happens here.
	t.Cleanup(func() { applyManifests(t, srv) })
	ctx := context.Background()
	d, err := srv.Client.AppsV1().Deployments("kube-system").Get(ctx, "metalvip-cloud-controller-manager", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if *d.Spec.Replicas != 2 || !strings.HasSuffix(d.Spec.Template.Spec.Containers[0].Image, "@sha256:"+strings.Repeat("a", 64)) {
		t.Errorf("the API server holds replicas %d image %s", *d.Spec.Replicas, d.Spec.Template.Spec.Containers[0].Image)
	}
	if d.Spec.Strategy.Type != appsv1.RecreateDeploymentStrategyType || d.Spec.Template.Labels["example.com/team"] != "network" ||
		d.Spec.Template.Spec.Containers[0].ReadinessProbe == nil || d.Spec.Template.Spec.Containers[0].StartupProbe == nil {
		t.Errorf("the API server holds strategy %+v, pod labels %v, probes %+v", d.Spec.Strategy, d.Spec.Template.Labels, d.Spec.Template.Spec.Containers[0])
	}
	ds, err := srv.Client.AppsV1().DaemonSets("kube-system").Get(ctx, "metalvip-agent", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(ds.Spec.Template.Spec.Containers[0].Args, "--interfaces=eth1") {
		t.Errorf("agent args %v", ds.Spec.Template.Spec.Containers[0].Args)
	}
	if _, err := srv.Client.CoreV1().Namespaces().Get(ctx, "metalvip-bgp-secrets", metav1.GetOptions{}); err != nil {
		t.Errorf("password namespace: %v", err)
	}
	dyn, err := dynamic.NewForConfig(srv.Config)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range []string{"servicemonitors", "podmonitors"} {
		gvr := schema.GroupVersionResource{Group: "monitoring.coreos.com", Version: "v1", Resource: r}
		list, err := dyn.Resource(gvr).Namespace("kube-system").List(ctx, metav1.ListOptions{})
		if err != nil || len(list.Items) != 1 {
			t.Errorf("%s held by the API server: %v", r, err)
			continue
		}
		// The monitors are removed again: the other tests apply manifests/ alone.
		_ = dyn.Resource(gvr).Namespace("kube-system").Delete(ctx, list.Items[0].GetName(), metav1.DeleteOptions{})
	}
	_ = srv.Client.CoreV1().Secrets("kube-system").Delete(ctx, "metalvip-metrics-reader-token", metav1.DeleteOptions{})
	_ = srv.Client.CoreV1().Services("kube-system").Delete(ctx, "metalvip-cloud-controller-manager-metrics", metav1.DeleteOptions{})
}
