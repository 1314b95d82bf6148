package integration

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"

	"github.com/metalvip/metalvip/test/testenv"
)

// docFix is one place where issue 35 found a doc wrong when followed literally: check finds
// the mistake in the file's text, and mistake writes it back into a correct text, so that
// TestDocFixesSeeTheirMistake can show each check failing on it.
type docFix struct {
	name, file string
	check      func(text string) error
	mistake    func(text string) string
}

func repoFile(t *testing.T, path string) string {
	t.Helper()
	root, err := testenv.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(filepath.Join(root, path))
	if err != nil {
		t.Fatal(err)
	}
	return string(data)
}

// section is the text from the heading that starts with title to the next heading of its level.
func section(text, title string) string {
	i := strings.Index(text, "\n"+title)
	if i < 0 {
		return ""
	}
	level := strings.SplitN(title, " ", 2)[0] + " "
	rest := text[i+1+len(title):]
	if j := strings.Index(rest, "\n"+level); j >= 0 {
		rest = rest[:j]
	}
	return rest
}

var (
	// A kind of metalvip's that another project has too (Calico: IPPool, BGPPeer; MetalLB:
	// BGPPeer), named in a kubectl command without its group.
	shortKindRE = regexp.MustCompile(`^(ippools?|bgppeers?)(\.[a-z0-9.]+)?$`)
	// An image of metalvip's named with its registry.
	imageRE = regexp.MustCompile(`\b([a-z0-9.-]+\.(?:io|com|example))/metalvip/([a-z0-9-]+)(:[A-Za-z0-9._-]+)?`)
	// A kubectl server-side apply of the chart's CRDs.
	crdApplyRE = regexp.MustCompile(`kubectl apply --server-side[^\n` + "`" + `]*charts/metalvip/crds`)
	// install-kubeadm.md's steps, as other docs name them.
	kubeadmStepsRE = regexp.MustCompile(`\(install-kubeadm\.md\)\s+steps\s+(\d)\s+and\s+(\d)`)
	helmInstallRE  = regexp.MustCompile(`(?m)^\s*helm (install|upgrade)\b.*$`)
	metricRE       = regexp.MustCompile("`(metalvip_[a-z_]+)")
	pushResultRE   = regexp.MustCompile("`([a-z]+)`")
	agentMetricRE  = regexp.MustCompile(`"(metalvip_agent_[a-z_]+)"`)
	ccmPushRE      = regexp.MustCompile(`agentApplies\.WithLabelValues\("([a-z]+)"\)`)
)

func docFixes(t *testing.T) []docFix {
	kubeadmStep := func(n string) string {
		m := regexp.MustCompile(`(?m)^## ` + n + `\. (.*)$`).FindStringSubmatch(repoFile(t, "docs/install-kubeadm.md"))
		if m == nil {
			return ""
		}
		return m[1]
	}
	// stepsName: the doc names install-kubeadm.md's steps whose headings say want.
	stepsName := func(want ...string) func(string) error {
		return func(text string) error {
			m := kubeadmStepsRE.FindStringSubmatch(text)
			if m == nil {
				return fmt.Errorf("names no steps of install-kubeadm.md")
			}
			for i, w := range want {
				if h := kubeadmStep(m[i+1]); !strings.Contains(h, w) {
					return fmt.Errorf("step %s of install-kubeadm.md is %q, not the one about %s", m[i+1], h, w)
				}
			}
			return nil
		}
	}
	swapSteps := func(text string) string {
		return kubeadmStepsRE.ReplaceAllString(text, "(install-kubeadm.md) steps $2 and $1")
	}
	manifestImages := manifestImages(t)
	var chart struct{ AppVersion string }
	if err := yaml.Unmarshal([]byte(repoFile(t, "charts/metalvip/Chart.yaml")), &chart); err != nil {
		t.Fatal(err)
	}
	images := func(text string) error {
		for _, m := range imageRE.FindAllStringSubmatch(text, -1) {
			if m[1] == "registry.example" || m[1] == "github.com" {
				continue // the docs' own registry, for make release; the Go module
			}
			want := "ghcr.io/metalvip/" + m[2] + ":" + chart.AppVersion
			if !slices.Contains(manifestImages, want) {
				return fmt.Errorf("%s: make images tags no image %s", m[0], m[2])
			}
			if m[1] != "ghcr.io" || (m[3] != "" && m[3] != ":"+chart.AppVersion) {
				return fmt.Errorf("%s: make images tags it %s", m[0], want)
			}
		}
		return nil
	}
	fullKinds := func(text string) error {
		for i, l := range strings.Split(text, "\n") {
			k := strings.Index(l, "kubectl ")
			if k < 0 {
				continue
			}
			for _, word := range strings.FieldsFunc(l[k:], func(r rune) bool { return r == ' ' || r == ',' || r == '`' }) {
				if m := shortKindRE.FindStringSubmatch(word); m != nil && m[2] != ".metalvip.io" {
					return fmt.Errorf("line %d: %q: Calico has IPPools and BGPPeers too, MetalLB BGPPeers: write %s.metalvip.io", i+1, strings.TrimSpace(l), m[1])
				}
			}
		}
		return nil
	}
	helmMajor := regexp.MustCompile(`helm\.sh/helm/v(\d+) `).FindStringSubmatch(repoFile(t, "hack/tools/go.mod"))
	if helmMajor == nil {
		t.Fatal("hack/tools/go.mod pins no helm.sh/helm")
	}
	agentMetrics := map[string]bool{}
	for _, m := range agentMetricRE.FindAllStringSubmatch(repoFile(t, "cmd/metalvip-agent/metrics.go"), -1) {
		agentMetrics[m[1]] = true
	}
	var pushResults []string
	for _, m := range ccmPushRE.FindAllStringSubmatch(repoFile(t, "loadbalancer/agentclient/conn.go"), -1) {
		if !slices.Contains(pushResults, m[1]) {
			pushResults = append(pushResults, m[1])
		}
	}
	slices.Sort(pushResults)
	if len(pushResults) == 0 || len(agentMetrics) == 0 {
		t.Fatalf("found no push results (%v) or agent metrics (%v) in the code", pushResults, agentMetrics)
	}

	return []docFix{
		{
			name: "install-helm.md upgrades changed CRDs over Helm's field manager (--force-conflicts)",
			file: "docs/install-helm.md",
			check: func(text string) error {
				applies := crdApplyRE.FindAllString(text, -1)
				if len(applies) == 0 {
					return fmt.Errorf("applies no CRDs before an upgrade")
				}
				for _, a := range applies {
					if !strings.Contains(a, "--force-conflicts") {
						return fmt.Errorf("%q stops with a conflict at the first CRD change: Helm's install owns the fields", a)
					}
				}
				return nil
			},
			mistake: func(text string) string { return strings.ReplaceAll(text, " --force-conflicts", "") },
		},
		{
			name: "upgrading.md upgrades changed CRDs over Helm's field manager too",
			file: "docs/upgrading.md",
			check: func(text string) error {
				for _, a := range crdApplyRE.FindAllString(text, -1) {
					if !strings.Contains(a, "--force-conflicts") {
						return fmt.Errorf("%q stops with a conflict at the first CRD change", a)
					}
				}
				return nil
			},
			mistake: func(text string) string { return strings.ReplaceAll(text, " --force-conflicts", "") },
		},
		{
			name: "the MetalLB guide's helm install leaves the password namespace it made by hand alone",
			file: "docs/migrating-from-metallb.md",
			check: func(text string) error {
				if !strings.Contains(text, "kubectl create namespace metalvip-bgp-secrets") {
					return nil
				}
				lines := helmInstallRE.FindAllString(text, -1)
				if len(lines) == 0 {
					return fmt.Errorf("no helm install command")
				}
				for _, l := range lines {
					if !strings.Contains(l, "createPasswordSecretNamespace=false") {
						return fmt.Errorf("%q: Helm refuses to take over the namespace the guide created by hand", strings.TrimSpace(l))
					}
				}
				return nil
			},
			mistake: func(text string) string {
				return strings.ReplaceAll(text, " --set createPasswordSecretNamespace=false", "")
			},
		},
		{
			name:    "the MetalLB guide points at install-kubeadm.md's images and install steps",
			file:    "docs/migrating-from-metallb.md",
			check:   stepsName("images", "metalvip"),
			mistake: swapSteps,
		},
		{
			name:    "install-helm.md points at install-kubeadm.md's kubelet and images steps",
			file:    "docs/install-helm.md",
			check:   stepsName("cloud provider", "images"),
			mistake: swapSteps,
		},
		{
			name: "the MetalLB guide needs no metalvipctl certs material",
			file: "docs/migrating-from-metallb.md",
			check: func(text string) error {
				for i, l := range strings.Split(text, "\n") {
					if strings.Contains(l, "metalvipctl certs") && !strings.Contains(l, "instead") {
						return fmt.Errorf("line %d: %q: the CCM enrolls the agents; certificates by hand are the exception", i+1, strings.TrimSpace(l))
					}
				}
				return nil
			},
			mistake: func(text string) string {
				return strings.Replace(text, "## What changes for you\n", "## What changes for you\n\nRun `metalvipctl certs --manifests | kubectl apply -f -` first.\n", 1)
			},
		},
		{
			name: "install-kubeadm.md's images reach nodes that join later",
			file: "docs/install-kubeadm.md",
			check: func(text string) error {
				s := section(text, "## 3. The images on the nodes")
				if !strings.Contains(s, "joins later") || !strings.Contains(s, "ImagePullBackOff") {
					return fmt.Errorf("step 3 does not say that a node joining later needs the images too (else ImagePullBackOff: nothing publishes them)")
				}
				return nil
			},
			mistake: func(text string) string {
				return strings.ReplaceAll(strings.ReplaceAll(text, "joins later", "exists"), "ImagePullBackOff", "an error")
			},
		},
		{
			name: "the docs name the images make images tags (ghcr.io, the chart's appVersion)",
			file: "docs/control-plane.md",
			check: func(text string) error {
				root, err := testenv.RepoRoot()
				if err != nil {
					return err
				}
				docs, _ := filepath.Glob(filepath.Join(root, "docs", "*.md"))
				for _, f := range append(docs, filepath.Join(root, "README.md")) {
					f, _ = filepath.Rel(root, f)
					if f == "docs/control-plane.md" {
						continue // the text under test
					}
					if err := images(repoFile(t, f)); err != nil {
						return fmt.Errorf("%s: %w", f, err)
					}
				}
				return images(text)
			},
			mistake: func(text string) string { return strings.ReplaceAll(text, "ghcr.io/metalvip/", "docker.io/metalvip/") },
		},
		{
			name:    "kubectl commands name metalvip's IPPools and BGPPeers in full (operations.md)",
			file:    "docs/operations.md",
			check:   fullKinds,
			mistake: func(text string) string { return strings.ReplaceAll(text, "ippools.metalvip.io", "ippools") },
		},
		{
			name:    "kubectl commands name metalvip's IPPools and BGPPeers in full (install-kubeadm.md)",
			file:    "docs/install-kubeadm.md",
			check:   fullKinds,
			mistake: func(text string) string { return strings.ReplaceAll(text, "ippools.metalvip.io", "ippools") },
		},
		{
			name:    "kubectl commands name metalvip's IPPools and BGPPeers in full (the MetalLB guide, whose BGPPeers are there too)",
			file:    "docs/migrating-from-metallb.md",
			check:   fullKinds,
			mistake: func(text string) string { return strings.ReplaceAll(text, "bgppeers.metalvip.io", "bgppeers") },
		},
		{
			name:    "kubectl commands name metalvip's IPPools and BGPPeers in full (announcing.md)",
			file:    "docs/announcing.md",
			check:   fullKinds,
			mistake: func(text string) string { return strings.ReplaceAll(text, "bgppeers.metalvip.io", "bgppeers") },
		},
		{
			name: "operations.md's metalvipctl agent works with enrolled agents, not only with files mode's Secret",
			file: "docs/operations.md",
			check: func(text string) error {
				if !strings.Contains(text, "With enrolled agents") || !strings.Contains(text, "viewer's certificate") {
					return fmt.Errorf("metalvipctl agent is described with files mode's Secret only")
				}
				return nil
			},
			mistake: func(text string) string { return strings.ReplaceAll(text, "With enrolled agents", "With files") },
		},
		{
			name: "cloud-config.md's complete example has an agent section that enrolls (else nothing is announced)",
			file: "docs/examples/cloud-config.yaml",
			check: func(text string) error {
				var c struct {
					Agent struct {
						Enroll struct{ Enabled bool }
					}
				}
				if err := yaml.Unmarshal([]byte(text), &c); err != nil {
					return err
				}
				if !c.Agent.Enroll.Enabled {
					return fmt.Errorf("agent.enroll.enabled is not true: the CCM allocates addresses and reaches no agent")
				}
				return nil
			},
			mistake: func(text string) string { return strings.Replace(text, "enabled: true", "enabled: false", 1) },
		},
		{
			name: "operations.md lists the push results the CCM emits, and no other",
			file: "docs/operations.md",
			check: func(text string) error {
				for _, l := range strings.Split(text, "\n") {
					if !strings.HasPrefix(l, "| `metalvip_ccm_pushes_total") {
						continue
					}
					var listed []string
					for _, m := range pushResultRE.FindAllStringSubmatch(strings.SplitN(l, "|", 3)[2], -1) {
						listed = append(listed, m[1])
					}
					slices.Sort(listed)
					if !slices.Equal(listed, pushResults) {
						return fmt.Errorf("lists results %v; the CCM emits %v", listed, pushResults)
					}
					return nil
				}
				return fmt.Errorf("no metalvip_ccm_pushes_total row")
			},
			mistake: func(text string) string { return strings.Replace(text, "`fenced` (", "`stale` (", 1) },
		},
		{
			name: "no metric in operations.md's CCM table is also the agent's, with other labels",
			file: "docs/operations.md",
			check: func(text string) error {
				for _, m := range metricRE.FindAllStringSubmatch(section(text, "## Metrics"), -1) {
					if agentMetrics[m[1]] {
						return fmt.Errorf("%s: the agent serves a metric of that name too", m[1])
					}
				}
				return nil
			},
			mistake: func(text string) string {
				return strings.Replace(text, "`metalvip_ccm_pushes_total{result}`", "`metalvip_agent_applies_total{result}`", 1)
			},
		},
		{
			name: "install-helm.md says the Helm the tests run is " + "Helm " + helmMajor[1],
			file: "docs/install-helm.md",
			check: func(text string) error {
				intro := text
				if k := strings.Index(text, "\n## "); k >= 0 {
					intro = text[:k]
				}
				if !strings.Contains(intro, "Helm "+helmMajor[1]) {
					return fmt.Errorf("does not name Helm %s, the one hack/tools/go.mod pins, as the tested one", helmMajor[1])
				}
				for _, sentence := range strings.Split(strings.ReplaceAll(intro, "\n", " "), ". ") {
					if strings.Contains(sentence, "Helm 3") && !strings.Contains(strings.ToLower(sentence), "no test") {
						return fmt.Errorf("%q: no test runs Helm 3", sentence)
					}
				}
				return nil
			},
			mistake: func(text string) string { return strings.ReplaceAll(text, "Helm "+helmMajor[1], "Helm 3.8+") },
		},
	}
}

// TestDocsKeepTheirFixes: each place issue 35 found wrong stays right.
func TestDocsKeepTheirFixes(t *testing.T) {
	for _, f := range docFixes(t) {
		t.Run(f.name, func(t *testing.T) {
			if err := f.check(repoFile(t, f.file)); err != nil {
				t.Errorf("%s: %v", f.file, err)
			}
		})
	}
}

// TestDocFixesSeeTheirMistake: each check fails once its mistake is back in the text.
func TestDocFixesSeeTheirMistake(t *testing.T) {
	for _, f := range docFixes(t) {
		t.Run(f.name, func(t *testing.T) {
			text := repoFile(t, f.file)
			wrong := f.mistake(text)
			if wrong == text {
				t.Fatalf("the mistake changes nothing in %s: the row no longer matches the doc", f.file)
			}
			if err := f.check(wrong); err == nil {
				t.Errorf("%s with the mistake back passes the check", f.file)
			} else {
				t.Logf("caught: %v", err)
			}
		})
	}
}
