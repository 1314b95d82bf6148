package version

import (
	"strings"
	"testing"
)

// TestSkewIsTheUpgradeGuidesRule: the CCM and an agent may run together within one minor
// version either way, never across a major version; development builds cannot be judged.
func TestSkewIsTheUpgradeGuidesRule(t *testing.T) {
	for _, tc := range []struct{ ccm, agent, want string }{
		{"v0.3.0", "v0.3.2", "ok"},
		{"v0.3.0", "v0.2.9", "ok: one minor version older than the CCM"},
		{"v0.3.0", "v0.4.0", "ok: one minor version newer than the CCM"},
		{"v0.3.0", "v0.1.0", "unsupported: 2 minor versions apart (one is supported)"},
		{"v0.3.0", "v0.6.1", "unsupported: 3 minor versions apart (one is supported)"},
		{"v1.0.0", "v0.9.0", "unsupported: major versions 1 and 0"},
		{"v0.3.0", "v0.4.0-rc.1", "ok: one minor version newer than the CCM"},
		{"(devel)", "v0.3.0", "unknown: a development build, not a release"},
		{"v0.3.0", "", "unknown: a development build, not a release"},
	} {
		if got := Skew(tc.ccm, tc.agent); got != tc.want {
			t.Errorf("Skew(%q, %q) = %q, want %q", tc.ccm, tc.agent, got, tc.want)
		}
	}
}

// TestPrintableKeepsWhatAnotherProcessSaysShortAndPlain: a build said by another process is
// shown at most 64 characters long, its control characters and escapes replaced.
func TestPrintableKeepsWhatAnotherProcessSaysShortAndPlain(t *testing.T) {
	for in, want := range map[string]string{
		"v0.3.0":                 "v0.3.0",
		"v0.3.0\x1b]0;owned\x07": "v0.3.0?]0;owned?",
		"v0.3.0\nWARNING: fake":  "v0.3.0?WARNING: fake",
		strings.Repeat("9", 100): strings.Repeat("9", 64),
		"v0.3.0-é":               "v0.3.0-??",
	} {
		if got := Printable(in); got != want {
			t.Errorf("Printable(%q) = %q, want %q", in, got, want)
		}
	}
}
