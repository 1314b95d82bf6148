package main

import (
	"bytes"
	"strings"
	"testing"
)

// TestVersionsFlagWhatMayNotRunTogether: every agent is judged against the CCM whose state it
// holds (two CCM builds during the CCM's rolling update), an agent that does not answer is
// listed with why, and each pair outside the skew, or an agent without an answer, is a warning.
func TestVersionsFlagWhatMayNotRunTogether(t *testing.T) {
	old, cur := &build{Version: "v0.2.0", Commit: "aaa"}, &build{Version: "v0.4.0", Commit: "bbb"}
	rep := versionReport{Client: build{Version: "v0.4.0", Commit: "bbb"}, Agents: []agentVersion{
		{Node: "a", Version: "v0.4.0", Commit: "bbb", AppliedBy: cur},
		{Node: "b", Version: "v0.3.0", Commit: "ccc", AppliedBy: cur},
		{Node: "c", Version: "v0.2.0", Commit: "aaa", AppliedBy: cur},
		{Node: "d", Version: "v0.2.0", Commit: "aaa", AppliedBy: old},
		{Node: "e", Error: "context deadline exceeded"},
		{Node: "f", Version: "v0.4.0", Commit: "bbb"},
	}}
	judgeSkew(&rep)
	want := map[string]string{
		"a": "ok", "b": "ok: one minor version older than the CCM", "c": "unsupported: 2 minor versions apart (one is supported)",
		"d": "ok", "e": "unknown: no answer", "f": "unknown: no state applied since the agent started (or its CCM does not say its version)",
	}
	for _, a := range rep.Agents {
		if a.Skew != want[a.Node] {
			t.Errorf("agent of %s: %q, want %q", a.Node, a.Skew, want[a.Node])
		}
	}
	if len(rep.CCM) != 2 || rep.CCM[0].build != *old || rep.CCM[0].Agents != 1 || rep.CCM[1].build != *cur || rep.CCM[1].Agents != 3 {
		t.Errorf("CCM builds %+v; want v0.2.0 on one agent, v0.4.0 on three", rep.CCM)
	}
	if len(rep.Warnings) != 3 || !strings.Contains(rep.Warnings[0], "the agent of c (v0.2.0) and the CCM (v0.4.0): unsupported") ||
		!strings.Contains(rep.Warnings[1], "the agent of e did not answer") || !strings.Contains(rep.Warnings[2], "metalvipctl (v0.4.0) and the CCM (v0.2.0): unsupported") {
		t.Errorf("warnings %q; want the agent of c, the agent of e, metalvipctl against the older CCM", rep.Warnings)
	}
	var b bytes.Buffer
	printVersions(&b, rep, false, false)
	for _, line := range []string{"CCM          v0.2.0  (commit aaa), the state of 1 of 6 agents", "c     v0.2.0  v0.4.0  unsupported", "e     -       -       unknown: no answer", "WARNING: the agent of c"} {
		if !strings.Contains(b.String(), line) {
			t.Errorf("the table has no line with %q:\n%s", line, b.String())
		}
	}
}
