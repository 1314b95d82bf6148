package memlimit

import (
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
