package integration

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"sort"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/yaml"

	"github.com/metalvip/metalvip/provider/config"
)

// settingCase says how one cloud-config setting is set through the chart's values and what the
// CCM then reads, or that the chart refuses it.
type settingCase struct {
	values    string // a values file
	namespace string // the release's namespace; kube-system when empty
	want      string // the setting as the CCM reads it (leafString)
	constant  bool   // the chart always writes want: there is no other value to set
	refused   string // instead of want: the chart refuses values, with this in its error
}

// settingCases has a case for every setting of the CCM's config struct: a setting added there
// without one fails TestEveryDocumentedSettingReachesTheCCM.
var settingCases = map[string]settingCase{
	"apiVersion":                    {want: config.APIVersion, constant: true},
	"kind":                          {want: config.Kind, constant: true},
	"agent.port":                    {values: "agent: {port: 7480}", want: "7480"},
	"agent.caFile":                  {values: "tls: {mode: files}", want: "/etc/metalvip/tls/ca.crt"},
	"agent.certFile":                {values: "tls: {mode: files}", want: "/etc/metalvip/tls/tls.crt"},
	"agent.keyFile":                 {values: "tls: {mode: files}", want: "/etc/metalvip/tls/tls.key"},
	"agent.insecure":                {values: "cloudConfig: {agent: {insecure: true}}", refused: "additional properties 'insecure' not allowed"},
	"agent.timeout":                 {values: "cloudConfig: {agent: {timeout: 3s}}", want: "3s"},
	"agent.enroll.enabled":          {values: "tls: {mode: enroll}", want: "true", constant: true},
	"agent.enroll.namespace":        {namespace: "metalvip-system", want: "metalvip-system"},
	"agent.enroll.serviceAccount":   {values: "agent: {serviceAccount: {name: node-agents}}", want: "node-agents"},
	"agent.enroll.validity":         {values: "cloudConfig: {agent: {enroll: {validity: 48h}}}", want: "48h0m0s"},
	"failover.interval":             {values: "cloudConfig: {failover: {interval: 20ms}}", want: "20ms"},
	"failover.misses":               {values: "cloudConfig: {failover: {misses: 5}}", want: "5"},
	"failover.port":                 {values: "cloudConfig: {failover: {port: 7483}}", want: "7483"},
	"failover.keySecret":            {values: "cloudConfig: {failover: {keySecret: kube-system/x}}", refused: "additional properties 'keySecret' not allowed"},
	"failover.maxCandidates":        {values: "cloudConfig: {failover: {maxCandidates: 3}}", want: "3"},
	"failover.gratuitousRefresh":    {values: "cloudConfig: {failover: {gratuitousRefresh: 1m}}", want: "1m0s"},
	"allocation.pendingRetry":       {values: "cloudConfig: {allocation: {pendingRetry: 5s}}", want: "5s"},
	"allocation.poolStatusInterval": {values: "cloudConfig: {allocation: {poolStatusInterval: 2s}}", want: "2s"},
	"topology.zoneLabel":            {values: "cloudConfig: {topology: {zoneLabel: example.com/zone}}", want: "example.com/zone"},
	"topology.regionLabel":          {values: "cloudConfig: {topology: {regionLabel: example.com/region}}", want: "example.com/region"},
	"topology.subnets.cidr":         {values: "cloudConfig: {topology: {subnets: [{cidr: \"2001:db8:1::/48\", zone: rack-a}]}}", want: "2001:db8:1::/48"},
	"topology.subnets.zone":         {values: "cloudConfig: {topology: {subnets: [{cidr: 198.51.100.0/26, zone: rack-a}]}}", want: "rack-a"},
	"topology.subnets.region":       {values: "cloudConfig: {topology: {subnets: [{cidr: 198.51.100.0/26, region: site-1}]}}", want: "site-1"},
	"instanceTypeLabel":             {values: "cloudConfig: {instanceTypeLabel: example.com/hardware}", want: "example.com/hardware"},
	"bgp.passwordSecretNamespace":   {values: "cloudConfig: {bgp: {passwordSecretNamespace: bgp-passwords}}", want: "bgp-passwords"},
	"egress.clusterCIDRs":           {values: "cloudConfig: {egress: {clusterCIDRs: [10.244.0.0/16, 10.96.0.0/12]}}", want: "[10.244.0.0/16 10.96.0.0/12]"},
	"drain.label":                   {values: "cloudConfig: {drain: {label: example.com/draining}}", want: "example.com/draining"},
	"drain.onCordon":                {values: "cloudConfig: {drain: {onCordon: false}}", want: "false"},
	"drain.delay":                   {values: "cloudConfig: {drain: {delay: 30s}}", want: "30s"},
	"nodes.initialize":              {values: "cloudConfig: {nodes: {initialize: false}}", want: "false"},
	"services.loadBalancerClass":    {values: "cloudConfig: {services: {loadBalancerClass: example.com/lb}}", want: "example.com/lb"},
	"services.classless":            {values: "cloudConfig: {services: {classless: false}}", want: "false"},
}

// TestEveryDocumentedSettingReachesTheCCM: docs/cloud-config.md documents exactly the settings
// of the CCM's config struct, and each one, set through the chart's values to something other
// than what the chart writes by default, is in the cloud-config the chart renders as the CCM's
// own reader reads it (or the chart refuses it, saying so: the settings it must own).
func TestEveryDocumentedSettingReachesTheCCM(t *testing.T) {
	leaves := configLeaves(reflect.TypeFor[config.Config](), "")
	documented := documentedSettings(t)
	for _, l := range leaves {
		if !slices.Contains(documented, l) {
			t.Errorf("cloud-config %s is not in docs/cloud-config.md's table of fields", l)
		}
		if _, ok := settingCases[l]; !ok {
			t.Errorf("cloud-config %s has no case here: say how the chart's values set it (or that the chart refuses it)", l)
		}
	}
	for _, d := range documented {
		if !slices.ContainsFunc(leaves, func(l string) bool { return l == d || strings.HasPrefix(l, d+".") }) {
			t.Errorf("docs/cloud-config.md documents %s, which the CCM does not read", d)
		}
	}
	for p := range settingCases {
		if !slices.Contains(leaves, p) {
			t.Errorf("a case for %s, which the CCM does not read", p)
		}
	}
	if t.Failed() {
		return
	}

	defaults := renderCloudConfig(t, "kube-system", "")
	paths := slices.Sorted(func(yield func(string) bool) {
		for p := range settingCases {
			if !yield(p) {
				return
			}
		}
	})
	for _, p := range paths {
		tc := settingCases[p]
		t.Run(p, func(t *testing.T) {
			ns := cmpOr(tc.namespace, "kube-system")
			if tc.refused != "" {
				out, err := helmTemplateValues(t, ns, tc.values)
				if err == nil || !strings.Contains(out, tc.refused) {
					t.Fatalf("values %q: %v, want the chart to refuse them with %q:\n%s", tc.values, err, tc.refused, out)
				}
				return
			}
			cfg := renderCloudConfig(t, ns, tc.values)
			if got := leafString(cfg, p); got != tc.want {
				t.Errorf("values %q (namespace %s): the CCM reads %s = %q, want %q", tc.values, ns, p, got, tc.want)
			}
			if def := leafString(defaults, p); def == tc.want && !tc.constant {
				t.Errorf("%q is what the chart writes by default: choose another value, or this case shows nothing", tc.want)
			}
		})
	}
}

// cmpOr is cmp.Or for strings (kept local: one use).
func cmpOr(a, b string) string {
	if a != "" {
		return a
	}
	return b
}

// documentedSettings lists the field names of docs/cloud-config.md's table, dotted, "[]" dropped.
func documentedSettings(t *testing.T) []string {
	t.Helper()
	b, err := os.ReadFile("../../docs/cloud-config.md")
	if err != nil {
		t.Fatal(err)
	}
	_, table, ok := strings.Cut(string(b), "\n## Fields\n")
	if !ok {
		t.Fatal("docs/cloud-config.md has no \"## Fields\" section")
	}
	table, _, _ = strings.Cut(table, "\n## ")
	name := regexp.MustCompile("`([^`]+)`")
	var out []string
	for line := range strings.SplitSeq(table, "\n") {
		if !strings.HasPrefix(line, "| `") {
			continue
		}
		first := strings.Split(line, "|")[1]
		for _, m := range name.FindAllStringSubmatch(first, -1) {
			out = append(out, strings.ReplaceAll(m[1], "[]", ""))
		}
	}
	if len(out) < 20 {
		t.Fatalf("read only %d fields from docs/cloud-config.md's table: %v", len(out), out)
	}
	return out
}

// configLeaves lists the yaml leaves of t, dotted; a Duration is a leaf, a list's item fields
// are under the list's name.
func configLeaves(t reflect.Type, prefix string) []string {
	for t.Kind() == reflect.Pointer || t.Kind() == reflect.Slice {
		t = t.Elem()
	}
	if t.Kind() != reflect.Struct || t == reflect.TypeFor[config.Duration]() {
		return []string{strings.TrimSuffix(prefix, ".")}
	}
	var out []string
	for f := range t.Fields() {
		name, _, _ := strings.Cut(f.Tag.Get("yaml"), ",")
		if !f.IsExported() || name == "" || name == "-" {
			continue
		}
		out = append(out, configLeaves(f.Type, prefix+name+".")...)
	}
	return out
}

// leafString is the value at a dotted path of cfg as text: a list's first item, a pointer's
// target ("" when nil), a duration as Go prints it.
func leafString(cfg *config.Config, path string) string {
	v := reflect.ValueOf(cfg).Elem()
	for part := range strings.SplitSeq(path, ".") {
		for v.Kind() == reflect.Pointer || v.Kind() == reflect.Slice {
			if v.Kind() == reflect.Pointer {
				if v.IsNil() {
					return ""
				}
				v = v.Elem()
			} else {
				if v.Len() == 0 {
					return ""
				}
				v = v.Index(0)
			}
		}
		var next reflect.Value
		for i := range v.NumField() {
			if name, _, _ := strings.Cut(v.Type().Field(i).Tag.Get("yaml"), ","); name == part {
				next = v.Field(i)
			}
		}
		if !next.IsValid() {
			return fmt.Sprintf("<no field %s>", part)
		}
		v = next
	}
	if v.Kind() == reflect.Pointer {
		if v.IsNil() {
			return ""
		}
		v = v.Elem()
	}
	if d, ok := v.Interface().(config.Duration); ok {
		return d.String()
	}
	return fmt.Sprint(v.Interface())
}

// helmTemplateValues renders the chart's cloud-config with a values file.
func helmTemplateValues(t *testing.T, namespace, values string) (string, error) {
	t.Helper()
	f := filepath.Join(t.TempDir(), "values.yaml")
	if err := os.WriteFile(f, []byte(values), 0o644); err != nil {
		t.Fatal(err)
	}
	return helm(t, "template", "metalvip", chartDir, "--namespace", namespace, "--values", f,
		"--show-only", "templates/ccm-cloud-config.yaml")
}

// renderCloudConfig is the chart's cloud-config as the CCM reads it.
func renderCloudConfig(t *testing.T, namespace, values string) *config.Config {
	t.Helper()
	out, err := helmTemplateValues(t, namespace, values)
	if err != nil {
		t.Fatalf("helm template with values %q: %v\n%s", values, err, out)
	}
	var cm struct {
		Data map[string]string `json:"data"`
	}
	if err := yaml.Unmarshal([]byte(out), &cm); err != nil {
		t.Fatalf("the chart's ConfigMap: %v\n%s", err, out)
	}
	cfg, err := config.Parse([]byte(cm.Data["cloud-config.yaml"]))
	if err != nil {
		t.Fatalf("the CCM refuses the chart's cloud-config for values %q: %v\n%s", values, err, cm.Data["cloud-config.yaml"])
	}
	return cfg
}

// TestTheChartRefusesWhatTheCCMRefuses: a cloudConfig the CCM would refuse at start fails
// `helm install` instead (values.schema.json, or the chart's checks of ranges), and what the
// CCM accepts, the chart accepts: each case goes through both, the CCM reading it as the chart
// would write it (with the agents' port and enrollment).
func TestTheChartRefusesWhatTheCCMRefuses(t *testing.T) {
	for _, tc := range []struct {
		name, cloudConfig string
		// A known disagreement, with its reason: the CCM alone refuses it (a schema cannot
		// tell), or the chart alone does (on purpose).
		ccmOnly, chartOnly string
	}{
		{name: "a heartbeat interval of 10ms", cloudConfig: "failover: {interval: 10ms}"},
		{name: "a heartbeat interval of 10s", cloudConfig: "failover: {interval: 10s}"},
		{name: "a heartbeat interval of 9ms", cloudConfig: "failover: {interval: 9ms}"},
		{name: "a heartbeat interval of 10.5s", cloudConfig: "failover: {interval: 10.5s}"},
		{name: "a heartbeat interval without a unit", cloudConfig: "failover: {interval: \"50\"}"},
		{name: "2 misses", cloudConfig: "failover: {misses: 2}"},
		{name: "1 miss", cloudConfig: "failover: {misses: 1}"},
		{name: "101 misses", cloudConfig: "failover: {misses: 101}"},
		{name: "16 candidates", cloudConfig: "failover: {maxCandidates: 16}"},
		{name: "1 candidate", cloudConfig: "failover: {maxCandidates: 1}"},
		{name: "17 candidates", cloudConfig: "failover: {maxCandidates: 17}"},
		{name: "a gratuitous refresh of 1s", cloudConfig: "failover: {gratuitousRefresh: 1s}"},
		{name: "a gratuitous refresh of 999ms", cloudConfig: "failover: {gratuitousRefresh: 999ms}"},
		{name: "a heartbeat port of 80", cloudConfig: "failover: {port: 80}", chartOnly: "the agents drop every capability but NET_RAW and NET_ADMIN: no port below 1024"},
		{name: "a heartbeat port of 65536", cloudConfig: "failover: {port: 65536}"},
		{name: "a key Secret", cloudConfig: "failover: {keySecret: kube-system/k}", chartOnly: "no longer used: the CCM reads it with a warning"},
		{name: "a misspelt failover field", cloudConfig: "failover: {intervall: 1s}"},
		{name: "an agent timeout of 1m30s", cloudConfig: "agent: {timeout: 1m30s}"},
		{name: "a negative agent timeout", cloudConfig: "agent: {timeout: -1s}"},
		{name: "plaintext to the agents", cloudConfig: "agent: {insecure: true}"},
		{name: "the agents' CA file", cloudConfig: "agent: {caFile: /ca.crt}"},
		{name: "a certificate validity of 10m", cloudConfig: "agent: {enroll: {validity: 10m}}"},
		{name: "a certificate validity of 2160h", cloudConfig: "agent: {enroll: {validity: 2160h}}"},
		{name: "a certificate validity of 9m59s", cloudConfig: "agent: {enroll: {validity: 9m59s}}"},
		{name: "a certificate validity of 2160h1s", cloudConfig: "agent: {enroll: {validity: 2160h1s}}"},
		{name: "a pending retry of 1s", cloudConfig: "allocation: {pendingRetry: 1s}"},
		{name: "a pending retry of 0.5s", cloudConfig: "allocation: {pendingRetry: 0.5s}"},
		{name: "a pool status interval of 100ms", cloudConfig: "allocation: {poolStatusInterval: 100ms}"},
		{name: "a pool status interval of 99ms", cloudConfig: "allocation: {poolStatusInterval: 99ms}"},
		{name: "a drain delay of 10m", cloudConfig: "drain: {delay: 10m}"},
		{name: "a drain delay of 500ms", cloudConfig: "drain: {delay: 500ms}"},
		{name: "a drain delay of 10m1s", cloudConfig: "drain: {delay: 10m1s}"},
		{name: "a drain label", cloudConfig: "drain: {label: example.com/drain}"},
		{name: "a drain label that is no label key", cloudConfig: "drain: {label: \"not a key\"}"},
		{name: "a drain label with an empty prefix", cloudConfig: "drain: {label: /drain}"},
		{name: "onCordon as text", cloudConfig: "drain: {onCordon: \"yes\"}"},
		{name: "a zone label", cloudConfig: "topology: {zoneLabel: topology.example.com/rack}"},
		{name: "a zone label of two slashes", cloudConfig: "topology: {zoneLabel: a/b/c}"},
		{name: "an instance type label starting with a dash", cloudConfig: "instanceTypeLabel: -hw"},
		{name: "an IPv6 subnet", cloudConfig: "topology: {subnets: [{cidr: \"2001:db8::/32\", region: site-1}]}"},
		{name: "a subnet of 33 bits", cloudConfig: "topology: {subnets: [{cidr: 198.51.100.0/33, zone: a}]}"},
		{name: "a subnet that is no CIDR", cloudConfig: "topology: {subnets: [{cidr: rack-a, zone: a}]}"},
		{name: "a subnet with a leading zero", cloudConfig: "topology: {subnets: [{cidr: 198.051.100.0/24, zone: a}]}"},
		{name: "a subnet without zone or region", cloudConfig: "topology: {subnets: [{cidr: 198.51.100.0/24}]}"},
		{name: "a subnet with an empty zone only", cloudConfig: "topology: {subnets: [{cidr: 198.51.100.0/24, zone: \"\"}]}"},
		{name: "a zone that is no label value", cloudConfig: "topology: {subnets: [{cidr: 198.51.100.0/24, zone: rack a}]}"},
		{name: "two rules for one subnet", cloudConfig: "topology: {subnets: [{cidr: 198.51.100.0/24, zone: a}, {cidr: 198.51.100.0/24, zone: b}]}"},
		{name: "a subnet with host bits", cloudConfig: "topology: {subnets: [{cidr: 198.51.100.1/24, zone: a}]}", ccmOnly: "a pattern cannot tell host bits; the CCM's error names the field and the CIDR to write"},
		{name: "a class without a domain", cloudConfig: "services: {loadBalancerClass: vip}"},
		{name: "a class with a domain", cloudConfig: "services: {loadBalancerClass: lb.example.com/vip}"},
		{name: "a password namespace in capitals", cloudConfig: "bgp: {passwordSecretNamespace: BGP}"},
		{name: "nodes initialised as text", cloudConfig: "nodes: {initialize: \"false\"}"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var fragment map[string]any
			if err := yaml.Unmarshal([]byte(tc.cloudConfig), &fragment); err != nil {
				t.Fatal(err)
			}
			// What the chart writes around the operator's values (ccm-cloud-config.yaml).
			written := map[string]any{"agent": map[string]any{"port": 7472,
				"enroll": map[string]any{"enabled": true, "namespace": "kube-system", "serviceAccount": "metalvip-agent"}}}
			mergeInto(written, fragment)
			text, err := yaml.Marshal(written)
			if err != nil {
				t.Fatal(err)
			}
			_, ccmErr := config.Parse(text)
			values, _ := yaml.Marshal(map[string]any{"cloudConfig": fragment})
			out, chartErr := helmTemplateValues(t, "kube-system", string(values))
			ccmOK, chartOK := ccmErr == nil, chartErr == nil
			switch {
			case tc.ccmOnly != "":
				if ccmOK || !chartOK {
					t.Errorf("known to pass the chart and stop the CCM (%s); now the CCM says %v, the chart %v", tc.ccmOnly, ccmErr, chartErr)
				}
			case tc.chartOnly != "":
				if !ccmOK || chartOK {
					t.Errorf("known to be refused by the chart alone (%s); now the CCM says %v, the chart %v", tc.chartOnly, ccmErr, chartErr)
				}
			case ccmOK && !chartOK:
				t.Errorf("the CCM accepts %s, the chart refuses it:\n%s", tc.cloudConfig, out)
			case !ccmOK && chartOK:
				t.Errorf("the chart accepts %s, the CCM would refuse it at start: %v", tc.cloudConfig, ccmErr)
			case !chartOK && !strings.Contains(out, "cloudConfig") && !strings.Contains(out, "/cloudConfig/"):
				t.Errorf("the chart's refusal does not name the value:\n%s", out)
			}
		})
	}
}

// mergeInto sets src's keys in dst, deeply.
func mergeInto(dst, src map[string]any) {
	for k, v := range src {
		if sm, ok := v.(map[string]any); ok {
			if dm, ok := dst[k].(map[string]any); ok {
				mergeInto(dm, sm)
				continue
			}
		}
		dst[k] = v
	}
}

// TestThePodKnobsAreKubernetesFields: the schema's pod settings (securityContext, affinity,
// tolerations, update strategies) accept exactly the fields of the Kubernetes types they
// become, so a misspelt one fails at install and none is missing.
func TestThePodKnobsAreKubernetesFields(t *testing.T) {
	b, err := os.ReadFile(chartDir + "/values.schema.json")
	if err != nil {
		t.Fatal(err)
	}
	var schema struct {
		Defs map[string]schemaObject `json:"$defs"`
	}
	if err := json.Unmarshal(b, &schema); err != nil {
		t.Fatal(err)
	}
	for def, typ := range map[string]reflect.Type{
		"podSecurityContext":                    reflect.TypeFor[corev1.PodSecurityContext](),
		"securityContext":                       reflect.TypeFor[corev1.SecurityContext](),
		"securityContext.capabilities":          reflect.TypeFor[corev1.Capabilities](),
		"podSecurityContext.seccompProfile":     reflect.TypeFor[corev1.SeccompProfile](),
		"podSecurityContext.seLinuxOptions":     reflect.TypeFor[corev1.SELinuxOptions](),
		"podSecurityContext.windowsOptions":     reflect.TypeFor[corev1.WindowsSecurityContextOptions](),
		"podSecurityContext.appArmorProfile":    reflect.TypeFor[corev1.AppArmorProfile](),
		"affinity":                              reflect.TypeFor[corev1.Affinity](),
		"toleration":                            reflect.TypeFor[corev1.Toleration](),
		"deploymentStrategy":                    reflect.TypeFor[appsv1.DeploymentStrategy](),
		"deploymentStrategy.rollingUpdate":      reflect.TypeFor[appsv1.RollingUpdateDeployment](),
		"daemonSetUpdateStrategy":               reflect.TypeFor[appsv1.DaemonSetUpdateStrategy](),
		"daemonSetUpdateStrategy.rollingUpdate": reflect.TypeFor[appsv1.RollingUpdateDaemonSet](),
	} {
		name, sub, _ := strings.Cut(def, ".")
		o, ok := schema.Defs[name]
		if !ok {
			t.Errorf("values.schema.json has no $defs.%s", name)
			continue
		}
		if sub != "" {
			o = o.Properties[sub]
		}
		var want []string
		for f := range typ.Fields() {
			if n, _, _ := strings.Cut(f.Tag.Get("json"), ","); n != "" && n != "-" {
				want = append(want, n)
			}
		}
		got := slices.Collect(func(yield func(string) bool) {
			for k := range o.Properties {
				if !yield(k) {
					return
				}
			}
		})
		sort.Strings(want)
		sort.Strings(got)
		if !slices.Equal(got, want) {
			t.Errorf("$defs.%s has the fields %v; %s has %v", def, got, typ, want)
		}
		if string(o.AdditionalProperties) != "false" {
			t.Errorf("$defs.%s accepts fields it does not list", def)
		}
	}
}

type schemaObject struct {
	Properties           map[string]schemaObject `json:"properties"`
	AdditionalProperties json.RawMessage         `json:"additionalProperties"`
}

// checkPodKnobs: the pod template carries podLabels beside the chart's own and podAnnotations,
// and runs as the ServiceAccount the values name, which the chart makes with its annotations.
func checkPodKnobs(t *testing.T, docs []*unstructured.Unstructured, what string, tpl corev1.PodTemplateSpec, sa, note string) {
	t.Helper()
	if l := tpl.Labels; l["example.com/team"] != "network" || l["app.kubernetes.io/part-of"] != "metalvip" || l["app.kubernetes.io/name"] == "" {
		t.Errorf("%s pod labels %v, want podLabels beside the chart's own", what, l)
	}
	if a := tpl.Annotations["example.com/note"]; a != note {
		t.Errorf("%s pod annotations %v, want example.com/note=%s", what, tpl.Annotations, note)
	}
	if tpl.Spec.ServiceAccountName != sa {
		t.Errorf("%s runs as %q, want %q", what, tpl.Spec.ServiceAccountName, sa)
	}
	if d := findObject(docs, "ServiceAccount", sa); d == nil || d.GetAnnotations()["example.com/owner"] != "network-team" {
		t.Errorf("%s: no ServiceAccount %s with the values' annotations (%v)", what, sa, d)
	}
}

func findObject(docs []*unstructured.Unstructured, kind, name string) *unstructured.Unstructured {
	for _, d := range docs {
		if d.GetKind() == kind && d.GetName() == name {
			return d
		}
	}
	return nil
}

// TestTheChartLeavesIdentitiesToTheOperator: with rbac.create and serviceAccount.create false
// the chart makes no ServiceAccount of its components and no RBAC object, and runs them as the
// ServiceAccounts named (the agents' is the one whose tokens the CCM enrolls); with RBAC on,
// the bindings name the CCM's.
func TestTheChartLeavesIdentitiesToTheOperator(t *testing.T) {
	named := []string{"ccm.serviceAccount.name=ccm-byo", "agent.serviceAccount.name=agents-byo"}
	docs := renderChart(t, append(named, "rbac.create=false", "ccm.serviceAccount.create=false", "agent.serviceAccount.create=false")...)
	for _, d := range docs {
		switch d.GetKind() {
		case "Role", "RoleBinding", "ClusterRole", "ClusterRoleBinding":
			t.Errorf("%s %s rendered with rbac.create false", d.GetKind(), d.GetName())
		case "ServiceAccount":
			if n := d.GetName(); n == "ccm-byo" || n == "agents-byo" || n == "metalvip-cloud-controller-manager" || n == "metalvip-agent" {
				t.Errorf("ServiceAccount %s rendered with serviceAccount.create false", n)
			}
		}
	}
	var ccm appsv1.Deployment
	typed(t, docs, "Deployment", "metalvip-cloud-controller-manager", &ccm)
	var agent appsv1.DaemonSet
	typed(t, docs, "DaemonSet", "metalvip-agent", &agent)
	if ccm.Spec.Template.Spec.ServiceAccountName != "ccm-byo" || agent.Spec.Template.Spec.ServiceAccountName != "agents-byo" {
		t.Errorf("the CCM runs as %q, the agents as %q", ccm.Spec.Template.Spec.ServiceAccountName, agent.Spec.Template.Spec.ServiceAccountName)
	}
	if cfg := renderCloudConfig(t, "kube-system", "agent: {serviceAccount: {create: false, name: agents-byo}}"); cfg.Agent.Enroll.ServiceAccount != "agents-byo" {
		t.Errorf("the CCM enrolls the tokens of %q", cfg.Agent.Enroll.ServiceAccount)
	}

	bound := 0
	for _, d := range renderChart(t, append(named, "ccm.serviceAccount.create=false")...) {
		if k := d.GetKind(); k != "RoleBinding" && k != "ClusterRoleBinding" {
			continue
		}
		subjects, _, _ := unstructured.NestedSlice(d.Object, "subjects")
		for _, s := range subjects {
			if n := s.(map[string]any)["name"]; n == "metalvip-cloud-controller-manager" {
				t.Errorf("%s %s binds the chart's CCM ServiceAccount, not ccm-byo", d.GetKind(), d.GetName())
			} else if n == "ccm-byo" {
				bound++
			}
		}
	}
	if bound < 4 {
		t.Errorf("ccm-byo is bound %d times, want the CCM's 4 bindings at least", bound)
	}
}

// TestTheChartNotesFitTheTLSMode: helm's notes after an install tell an enroll install (the
// default) nothing about TLS Secrets, which it does not need, warn of the CA key when the
// namespace is not kube-system, and name the Secrets to make in files mode.
func TestTheChartNotesFitTheTLSMode(t *testing.T) {
	notes := func(t *testing.T, namespace string, set ...string) string {
		t.Helper()
		args := []string{"install", "metalvip", chartDir, "--dry-run=client", "--namespace", namespace}
		for _, s := range set {
			args = append(args, "--set", s)
		}
		out, err := helm(t, args...)
		if err != nil {
			t.Fatalf("helm %s: %v\n%s", strings.Join(args, " "), err, out)
		}
		_, n, ok := strings.Cut(out, "\nNOTES:\n")
		if !ok {
			t.Fatalf("helm %s printed no notes:\n%s", strings.Join(args, " "), out)
		}
		return n
	}
	for _, tc := range []struct {
		name, namespace string
		set             []string
		want, not       []string
	}{
		{
			name: "enroll in kube-system", namespace: "kube-system",
			want: []string{"installed in kube-system", "kind: IPPool"},
			not:  []string{"Secret", "metalvipctl certs", "WARNING"},
		},
		{
			name: "enroll in another namespace", namespace: "metalvip-system",
			want: []string{"WARNING: metalvip-system holds the agents' CA key"},
			not:  []string{"metalvipctl certs", "metalvip-ccm-tls"},
		},
		{
			name: "files", namespace: "metalvip-system", set: []string{"tls.mode=files", "tls.ccmSecretName=ccm-tls", "tls.agentSecretName=agents-tls"},
			want: []string{"TLS Secrets (ccm-tls,\nagents-tls)", "metalvipctl certs", "--namespace metalvip-system --manifests"},
			not:  []string{"WARNING", "CA key"},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			n := notes(t, tc.namespace, tc.set...)
			for _, w := range tc.want {
				if !strings.Contains(n, w) {
					t.Errorf("the notes lack %q:\n%s", w, n)
				}
			}
			for _, w := range tc.not {
				if strings.Contains(n, w) {
					t.Errorf("the notes say %q:\n%s", w, n)
				}
			}
		})
	}
}
