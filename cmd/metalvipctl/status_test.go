package main

import (
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

func TestEventAddressAndAnnouncedBy(t *testing.T) {
	for _, tc := range []struct {
		reason, msg, addr, by string
	}{
		{"Announced", "203.0.113.5 (L2) is answered by node-a, standby node-b, node-c", "203.0.113.5", "node-a (standby node-b, node-c)"},
		{"Announced", "203.0.113.5 (L2) is answered by node-a (was node-c; moved to keep the nodes balanced)", "203.0.113.5", "node-a"},
		{"Announced", "203.0.113.128 (L2 per client) is answered by node1, node2, node3 (each for its share of clients)", "203.0.113.128", "node1, node2, node3 (per client)"},
		{"Announced", "203.0.113.64 (BGP) is advertised by node1, node2", "203.0.113.64", "node1, node2"},
		{"Announced", "No node may announce 203.0.113.65: none is eligible (node selector, ...)", "203.0.113.65", "No node may announce 203.0.113.65: none is eligible (node selector, ...)"},
		{"TookOver", "Node node2 answers for 203.0.113.1 now: first live candidate: higher-ranked candidates are down", "203.0.113.1", "node2 (took over)"},
	} {
		e := corev1.Event{Reason: tc.reason, Message: tc.msg}
		if got := eventAddress(e); got != tc.addr {
			t.Errorf("eventAddress(%q) = %q, want %q", tc.msg, got, tc.addr)
		}
		if got := announcedBy(e); got != tc.by {
			t.Errorf("announcedBy(%q) = %q, want %q", tc.msg, got, tc.by)
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
