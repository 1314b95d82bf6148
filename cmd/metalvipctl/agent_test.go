package main

import (
	"bytes"
	"strings"
	"testing"

	agentv1 "github.com/metalvip/metalvip/proto/metalvip/agent/v1"
)

// TestAgentSaysWhatKubeProxyServes: metalvipctl agent shows whether the node's kube-proxy is
// healthy and which health check node ports serve, and says nothing of it when the agent does
// not check.
func TestAgentSaysWhatKubeProxyServes(t *testing.T) {
	for _, tc := range []struct {
		dp   *agentv1.DataPlane
		want []string
		not  string
	}{
		{nil, nil, "kube-proxy"},
		{&agentv1.DataPlane{Ready: true, SinceUnixMillis: 1_700_000_000_000, ServingPorts: []uint32{31000}, WaitingPorts: []uint32{31001}},
			[]string{"kube-proxy: healthy (since 2023-11-14T22:13:20Z)", "serving [31000], waiting [31001]"}, "NOT"},
		{&agentv1.DataPlane{Ready: false, SinceUnixMillis: 1_700_000_000_000, Detail: "kube-proxy does not answer: connection refused"},
			[]string{"kube-proxy: NOT healthy since 2023-11-14T22:13:20Z, the node takes no VIP: kube-proxy does not answer: connection refused"}, "ports"},
	} {
		var out bytes.Buffer
		printAgent(&out, &agentv1.GetStateResponse{Node: "node1", DataPlane: tc.dp})
		for _, w := range tc.want {
			if !strings.Contains(out.String(), w) {
				t.Errorf("output lacks %q:\n%s", w, out.String())
			}
		}
		if strings.Contains(out.String(), tc.not) {
			t.Errorf("output says %q:\n%s", tc.not, out.String())
		}
	}
}

// TestAgentSaysWhatItDoesForEgress: metalvipctl agent shows each egress VIP's egress node as
// the node sees it, whether it source-NATs or routes its pods there, and the connections NATed.
func TestAgentSaysWhatItDoesForEgress(t *testing.T) {
	var out bytes.Buffer
	printAgent(&out, &agentv1.GetStateResponse{Node: "node1", Egress: []*agentv1.EgressStatus{
		{Vip: "203.0.113.96", Node: "node1", Active: true, Sources: 2, Flows: 1234},
		{Vip: "203.0.113.97", Node: "node3", Sources: 1},
	}})
	for _, w := range []string{"EGRESS VIP", "203.0.113.96  node1        source-NATs", "1234", "203.0.113.97  node3        routes its pods to node3"} {
		if !strings.Contains(out.String(), w) {
			t.Errorf("output lacks %q:\n%s", w, out.String())
		}
	}
}
