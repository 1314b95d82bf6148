package announcer

import (
	"strings"
	"testing"

	"k8s.io/client-go/tools/record"

	agentv1 "github.com/metalvip/metalvip/proto/metalvip/agent/v1"
)

// TestAnAgentOutsideTheSkewIsAWarningOnItsNode: an agent whose version may not run with the
// CCM's is a Warning Event on its Node; one within the skew, or a development build, is none.
func TestAnAgentOutsideTheSkewIsAWarningOnItsNode(t *testing.T) {
	defer func(f func() string) { ccmVersion = f }(ccmVersion)
	ccmVersion = func() string { return "v0.4.0" }
	rec := record.NewFakeRecorder(10)
	a := &Announcer{cfg: Config{Recorder: rec}}
	for _, v := range []string{"v0.4.1", "v0.3.0", "v0.5.0", "(devel)"} {
		a.agentBuild("node1", &agentv1.Build{Version: v})
	}
	a.agentBuild("node2", &agentv1.Build{Version: "v0.2.0"})
	close(rec.Events)
	var got []string
	for e := range rec.Events {
		got = append(got, e)
	}
	if len(got) != 1 || !strings.HasPrefix(got[0], "Warning AgentVersionSkew metalvip-agent v0.2.0 on node2 and the CCM v0.4.0: unsupported: 2 minor versions apart") {
		t.Errorf("events %q; want one Warning for node2's v0.2.0", got)
	}
}
