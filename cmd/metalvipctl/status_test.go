package main

import (
	"encoding/json"
	"reflect"
	"strings"
	"testing"

	"time"

	"github.com/metalvip/metalvip/loadbalancer/desired"
	"sigs.k8s.io/yaml"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

func TestAnnouncedByReadsTheCondition(t *testing.T) {
	msg := "203.0.113.5 (L2): node-a, standby node-b, node-c; 203.0.113.128 (L2 per client): node1, node2, node3; " +
		"203.0.113.64 (BGP): node1, node2; 203.0.113.65 (L2): no eligible node; 203.0.113.66 (BGP): node1, refused by node2"
	addrs, err := desired.ParseAddresses(msg)
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"node-a (standby node-b, node-c)", "node1, node2, node3 (per client)", "node1, node2", "no eligible node", "node1; refused by node2"}
	if len(addrs) != len(want) {
		t.Fatalf("%d addresses, want %d", len(addrs), len(want))
	}
	for i, a := range addrs {
		if got := announcedBy(a); got != want[i] {
			t.Errorf("%s: %q, want %q", a.Addr, got, want[i])
		}
	}
}

func TestNewerBreaksSameSecondTiesByResourceVersion(t *testing.T) {
	at := metav1.NewTime(time.Date(2026, 11, 30, 13, 0, 0, 0, time.UTC))
	ev := func(rv string, ts metav1.Time) corev1.Event {
		return corev1.Event{ObjectMeta: metav1.ObjectMeta{ResourceVersion: rv}, LastTimestamp: ts}
	}
	if !newer(ev("120", at), ev("99", at)) || newer(ev("99", at), ev("120", at)) {
		t.Error("within one second, the higher resourceVersion must win")
	}
	later := metav1.NewTime(at.Add(time.Second))
	if !newer(ev("5", later), ev("120", at)) {
		t.Error("a later timestamp must win whatever the resourceVersions")
	}
}

// TestStatusPrintsTheSameObjectAsJSONAndYAML: -o json and -o yaml carry the same Status, field
// for field, so a script may read either.
func TestStatusPrintsTheSameObjectAsJSONAndYAML(t *testing.T) {
	st := &Status{
		Pools:    []PoolStatus{{Name: "l2", Mode: "L2", AllocatedIPv4: 2, AvailableIPv4: 14, Ready: "True"}},
		Services: []ServiceStatus{{Namespace: "web", Name: "front", Addresses: []string{"203.0.113.1"}, Pool: "l2", AnnouncedBy: "node1 (standby node2)"}},
		Agents:   []AgentStatus{{Node: "node1", Address: "198.51.100.11", Agent: "reachable"}},
	}
	var fromJSON, fromYAML Status
	for _, tc := range []struct {
		output string
		into   *Status
		decode func([]byte, any) error
	}{
		{"json", &fromJSON, json.Unmarshal},
		{"yaml", &fromYAML, func(b []byte, v any) error { return yaml.UnmarshalStrict(b, v) }},
	} {
		var b strings.Builder
		if err := writeStatus(&b, st, tc.output); err != nil {
			t.Fatalf("-o %s: %v", tc.output, err)
		}
		if err := tc.decode([]byte(b.String()), tc.into); err != nil {
			t.Fatalf("-o %s printed what does not decode as a Status: %v\n%s", tc.output, err, b.String())
		}
		if tc.output == "yaml" && !strings.Contains(b.String(), "announcedBy: node1 (standby node2)") {
			t.Errorf("-o yaml does not name the fields as the json tags do:\n%s", b.String())
		}
	}
	if !reflect.DeepEqual(fromJSON, *st) || !reflect.DeepEqual(fromYAML, *st) {
		t.Errorf("json %+v, yaml %+v; want %+v", fromJSON, fromYAML, *st)
	}
}
