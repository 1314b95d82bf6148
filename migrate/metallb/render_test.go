package metallb

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestTheOutputOfTheTestConfiguration renders the configuration test/migration applies and
// compares it with testdata/metallb.golden: every comment and its place, every field
// and its order. Run with -update after an intended change and read the diff.
func TestTheOutputOfTheTestConfiguration(t *testing.T) {
	in := Config{Namespace: "metallb-system"}
	src := filepath.Join("..", "..", "test", "migration", "testdata", "metallb.yaml")
	if _, err := in.ReadFiles([]string{src, filepath.Join("testdata", "extra.yaml")}, nil); err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	if err := Render(&out, Convert(in, "metalvip-bgp-secrets")); err != nil {
		t.Fatal(err)
	}
	golden := filepath.Join("testdata", "metallb.golden")
	if *update {
		if err := os.WriteFile(golden, out.Bytes(), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(golden)
	if err != nil {
		t.Fatal(err)
	}
	if out.String() != string(want) {
		t.Errorf("output differs from %s (run with -update and read the diff):\n%s", golden, out.String())
	}
	// The output is YAML a client reads back as the objects converted.
	objs, err := decodeObjects(&out)
	if err != nil {
		t.Fatalf("the output does not parse: %v", err)
	}
	for _, u := range objs {
		if u.GetAPIVersion() != "metalvip.io/v1alpha1" || u.GetLabels()[convertedLabel] != "metallb" {
			t.Errorf("%s %s: apiVersion %s, labels %v", u.GetKind(), u.GetName(), u.GetAPIVersion(), u.GetLabels())
		}
	}
	// Every CHECK comment is counted in the header.
	checks := strings.Count(string(want), "# CHECK:")
	if !strings.Contains(string(want), fmt.Sprintf("CHECK: mark where metalvip will not do what MetalLB did (%d here)", checks)) {
		t.Errorf("the header does not count the %d CHECK comments", checks)
	}
}

// FuzzMigrateMetalLB: whatever MetalLB objects a file holds, the converter does not panic, and
// what it prints parses back as YAML.
func FuzzMigrateMetalLB(f *testing.F) {
	seed, err := os.ReadFile(filepath.Join("..", "..", "test", "migration", "testdata", "metallb.yaml"))
	if err != nil {
		f.Fatal(err)
	}
	f.Add(string(seed))
	f.Add(pool("p", `{addresses: ["203.0.113.0 - 203.0.113.9"], serviceAllocation: {namespaceSelectors: [{matchLabels: {a: b}}, {}]}}`))
	f.Add(doc("BGPPeer", "v1beta2", "r", `{myASN: 1, peerASN: 2, peerAddress: "::1", holdTime: 1h, keepaliveTime: -5s}`))
	f.Fuzz(func(t *testing.T, text string) {
		objs, err := decodeObjects(strings.NewReader(text))
		if err != nil {
			return
		}
		in := Config{Namespace: "metallb-system"}
		for _, u := range objs {
			if _, err := in.take(u); err != nil {
				return
			}
		}
		var out bytes.Buffer
		if err := Render(&out, Convert(in, "metalvip-bgp-secrets")); err != nil {
			t.Fatalf("render: %v", err)
		}
		if _, err := decodeObjects(&out); err != nil {
			t.Fatalf("the output does not parse: %v\n%s", err, out.String())
		}
	})
}
