package metallb

import (
	"encoding/json"
	"flag"
	"fmt"
	"slices"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"
)

var update = flag.Bool("update", false, "rewrite the golden files of the converter")

// convertText converts MetalLB objects given as YAML documents, as read from a file.
func convertText(t *testing.T, docs string) Conversion {
	t.Helper()
	in := Config{Namespace: "metallb-system"}
	objs, err := decodeObjects(strings.NewReader(docs))
	if err != nil {
		t.Fatal(err)
	}
	for _, u := range objs {
		if _, err := in.take(u); err != nil {
			t.Fatal(err)
		}
	}
	return Convert(in, "metalvip-bgp-secrets")
}

func object(t *testing.T, c Conversion, kind, name string) Object {
	t.Helper()
	for _, o := range c.Objects {
		if o.Kind == kind && o.Name == name {
			return o
		}
	}
	t.Fatalf("no %s %s among %d objects; general notes %q", kind, name, len(c.Objects), c.General)
	return Object{}
}

// specContains reports the first field of want (YAML) that spec lacks or holds otherwise.
func specContains(t *testing.T, spec any, want string) string {
	t.Helper()
	raw, err := json.Marshal(spec)
	if err != nil {
		t.Fatal(err)
	}
	var got, w any
	if err := json.Unmarshal(raw, &got); err != nil {
		t.Fatal(err)
	}
	if err := yaml.Unmarshal([]byte(want), &w); err != nil {
		t.Fatal(err)
	}
	return contained(w, got, "spec")
}

func contained(want, got any, path string) string {
	switch w := want.(type) {
	case map[string]any:
		g, ok := got.(map[string]any)
		if !ok {
			return fmt.Sprintf("%s (got %v)", path, got)
		}
		for _, k := range sortedKeys(w) {
			if d := contained(w[k], g[k], path+"."+k); d != "" {
				return d
			}
		}
	case []any:
		g, ok := got.([]any)
		if !ok || len(g) != len(w) {
			return fmt.Sprintf("%s (got %v, want %v)", path, got, want)
		}
		for i := range w {
			if d := contained(w[i], g[i], fmt.Sprintf("%s[%d]", path, i)); d != "" {
				return d
			}
		}
	default:
		if fmt.Sprint(want) != fmt.Sprint(got) {
			return fmt.Sprintf("%s (got %v, want %v)", path, got, want)
		}
	}
	return ""
}

// absent reports fields of the spec that must not be printed, by top-level-dotted path.
func absent(t *testing.T, spec any, paths ...string) string {
	t.Helper()
	raw, _ := json.Marshal(spec)
	var m map[string]any
	_ = json.Unmarshal(raw, &m)
	for _, p := range paths {
		var cur any = m
		found := true
		for seg := range strings.SplitSeq(p, ".") {
			mm, ok := cur.(map[string]any)
			if !ok {
				found = false
				break
			}
			if cur, ok = mm[seg]; !ok {
				found = false
				break
			}
		}
		if found {
			return p
		}
	}
	return ""
}

type wantNote struct {
	path, text string // text is a substring; a CHECK note's text starts with "CHECK:"
}

func hasNote(o Object, w wantNote) bool {
	return slices.ContainsFunc(o.Notes, func(n Note) bool { return n.Path == w.path && strings.Contains(n.Text, w.text) })
}

const header = `apiVersion: metallb.io/v1beta1
kind: IPAddressPool
metadata: {name: %s, namespace: metallb-system%s}
spec: %s
`

func pool(name, spec string) string { return fmt.Sprintf(header, name, "", spec) + "---\n" }
func labelled(name, labels, spec string) string {
	return fmt.Sprintf(header, name, ", labels: "+labels, spec) + "---\n"
}

func doc(kind, version, name, spec string) string {
	return fmt.Sprintf("apiVersion: metallb.io/%s\nkind: %s\nmetadata: {name: %s, namespace: metallb-system}\nspec: %s\n---\n", version, kind, name, spec)
}

func countChecks(o Object) int {
	n := 0
	for _, nt := range o.Notes {
		if strings.HasPrefix(nt.Text, "CHECK:") {
			n++
		}
	}
	return n
}

func countWantChecks(ws []wantNote) int {
	n := 0
	for _, w := range ws {
		if strings.HasPrefix(w.text, "CHECK:") {
			n++
		}
	}
	return n
}

// Convert sorts what it reads by name, on its own copy: a caller that converts twice, or keeps
// the Config, sees it as it read it.
func TestConvertLeavesItsInputAsItWas(t *testing.T) {
	in := Config{Namespace: "metallb-system"}
	objs, err := decodeObjects(strings.NewReader(pool("silver", `{addresses: [203.0.113.0/24]}`) + pool("gold", `{addresses: [198.51.100.0/24]}`)))
	if err != nil {
		t.Fatal(err)
	}
	for _, u := range objs {
		if err := in.Add(u); err != nil {
			t.Fatal(err)
		}
	}
	c := Convert(in, "metalvip-bgp-secrets")
	if c.Objects[0].Name != "gold" || c.Objects[1].Name != "silver" {
		t.Errorf("converted %s, %s; want gold, silver (by name)", c.Objects[0].Name, c.Objects[1].Name)
	}
	if in.pools[0].Meta.Name != "silver" {
		t.Errorf("the Config's pools were reordered to %s first", in.pools[0].Meta.Name)
	}
}
