package memlimit

import (
	"os"
	"path/filepath"
	"runtime/debug"
	"testing"
)

func TestParse(t *testing.T) {
	for in, want := range map[string]int64{"536870912\n": 536870912, "max\n": 0, "1": 1} {
		got, ok, err := parse(in)
		if err != nil || got != want || ok != (want > 0) {
			t.Errorf("parse(%q) = %d, %v, %v; want %d", in, got, ok, err, want)
		}
	}
	for _, bad := range []string{"", "-1", "0", "12k", "max max"} {
		if _, _, err := parse(bad); err == nil {
			t.Errorf("parse(%q) took it", bad)
		}
	}
}

func TestGOMEMLIMITWins(t *testing.T) {
	t.Setenv("GOMEMLIMIT", "100MiB")
	before := debug.SetMemoryLimit(-1)
	if got, why := Set(); got != 0 || why == "" {
		t.Errorf("Set() = %d, %q with GOMEMLIMIT set; want 0 and the reason", got, why)
	}
	if after := debug.SetMemoryLimit(-1); after != before {
		t.Errorf("the runtime's limit changed from %d to %d", before, after)
	}
}

func TestSetTakesShareOfTheCgroupLimit(t *testing.T) {
	t.Setenv("GOMEMLIMIT", "")
	f := filepath.Join(t.TempDir(), "memory.max")
	if err := os.WriteFile(f, []byte("536870912\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	old := cgroupFile
	cgroupFile = f
	before := debug.SetMemoryLimit(-1)
	t.Cleanup(func() { cgroupFile = old; debug.SetMemoryLimit(before) })
	got, why := Set()
	limit := int64(536870912)
	if want := int64(float64(limit) * Share); got != want || debug.SetMemoryLimit(-1) != want {
		t.Errorf("Set() = %d (%s), runtime limit %d; want %d", got, why, debug.SetMemoryLimit(-1), want)
	}
	if err := os.WriteFile(f, []byte("max\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if got, why := Set(); got != 0 || why == "" {
		t.Errorf("Set() = %d, %q with no limit; want 0 and the reason", got, why)
	}
}
