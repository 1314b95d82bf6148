// Package protocompat checks that the agent API evolves only compatibly: the CCM and the
// agents of two versions side by side (a rolling update) must understand each other. The
// baseline is the API of the last release (proto/breaking-baseline.binpb, a buf image that
// `make proto-baseline` writes); proto/buf.yaml says which changes break (FILE: removed or
// renumbered fields, changed types, renamed messages, and the like).
package protocompat

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

const protoDir = "../../../proto"

// breaking runs buf breaking over the module in dir against the baseline; it returns buf's
// report and whether it found a breaking change.
func breaking(t *testing.T, dir string) (string, bool) {
	t.Helper()
	baseline, err := filepath.Abs(filepath.Join(protoDir, "breaking-baseline.binpb"))
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("go", "tool", "buf", "breaking", dir, "--against", baseline)
	out, err := cmd.CombinedOutput()
	var exit *exec.ExitError
	switch {
	case err == nil:
		return string(out), false
	case errors.As(err, &exit) && exit.ExitCode() == 100:
		return string(out), true // buf's exit code for "breaking changes found"
	}
	t.Fatalf("buf breaking %s: %v\n%s", dir, err, out)
	return "", false
}

// TestTheAgentAPIIsCompatibleWithTheLastRelease: the proto as it is now breaks nothing of the
// baseline.
func TestTheAgentAPIIsCompatibleWithTheLastRelease(t *testing.T) {
	if out, broke := breaking(t, protoDir); broke {
		t.Errorf("the agent API breaks the last release's (proto/breaking-baseline.binpb): a CCM and agents of the two versions would not understand each other. Add fields instead; reserve what you remove.\n%s", out)
	}
}

// TestABreakingChangeIsCaught: deliberate breaking changes to a copy of the proto are each
// found, so the check above cannot pass by not looking; a field added is not one.
func TestABreakingChangeIsCaught(t *testing.T) {
	src, err := os.ReadFile(filepath.Join(protoDir, "metalvip/agent/v1/agent.proto"))
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name, from, to, says string
		breaks               bool
	}{
		{"a field renumbered", "uint64 term = 1;", "uint64 term = 99;", "term", true},
		{"a field's type changed", "uint64 term = 1;", "string term = 1;", "term", true},
		{"a field removed without reserving its number", "uint64 term = 1;", "", "term", true},
		{"a field added", "uint64 term = 1;", "uint64 term = 1;\n  uint64 added_later = 99;", "", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if !strings.Contains(string(src), tc.from) {
				t.Fatalf("agent.proto has no %q to change", tc.from)
			}
			dir := t.TempDir()
			for _, f := range []string{"buf.yaml", "metalvip/agent/v1/agent.proto"} {
				b, err := os.ReadFile(filepath.Join(protoDir, f))
				if err != nil {
					t.Fatal(err)
				}
				if strings.HasSuffix(f, ".proto") {
					b = []byte(strings.Replace(string(b), tc.from, tc.to, 1))
				}
				if err := os.MkdirAll(filepath.Dir(filepath.Join(dir, f)), 0o755); err != nil {
					t.Fatal(err)
				}
				if err := os.WriteFile(filepath.Join(dir, f), b, 0o644); err != nil {
					t.Fatal(err)
				}
			}
			out, broke := breaking(t, dir)
			if broke != tc.breaks || !strings.Contains(out, tc.says) {
				t.Errorf("%s: buf breaking says broke %v, want %v (naming %q):\n%s", tc.name, broke, tc.breaks, tc.says, out)
			}
		})
	}
}
