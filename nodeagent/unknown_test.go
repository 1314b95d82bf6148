package nodeagent

import (
	"fmt"
	"slices"
	"testing"

	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	agentv1 "github.com/metalvip/metalvip/proto/metalvip/agent/v1"
)

// withUnknown appends field num (a varint) to m's encoding, as a newer CCM's build would send
// a field this one does not know.
func withUnknown(t *testing.T, m proto.Message, num protowire.Number) []byte {
	t.Helper()
	b, err := proto.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	b = protowire.AppendTag(b, num, protowire.VarintType)
	return protowire.AppendVarint(b, 1)
}

// Issue 32: fields of a newer CCM are found wherever they are (the state, an announcement, a
// nested message), named by path and number; a state without any gives none; many are cut.
func TestUnknownFieldsAreFoundByPathAndNumber(t *testing.T) {
	bgp := &agentv1.BGPAnnouncement{}
	var bgpOnly agentv1.BGPAnnouncement
	if err := proto.Unmarshal(withUnknown(t, bgp, 900), &bgpOnly); err != nil {
		t.Fatal(err)
	}
	an := &agentv1.Announcement{Vip: "203.0.113.20", Bgp: &bgpOnly}
	st := &agentv1.DesiredState{Node: "node-a", Term: 1, Generation: 1, Announcements: []*agentv1.Announcement{{Vip: "203.0.113.10"}, an}}
	var got agentv1.DesiredState
	if err := proto.Unmarshal(withUnknown(t, st, 901), &got); err != nil {
		t.Fatal(err)
	}
	want := []string{"announcements[1].bgp: field 900", "state: field 901"}
	if u := unknownFields(got.ProtoReflect()); !slices.Equal(u, want) {
		t.Errorf("unknown fields %q; want %q", u, want)
	}
	clean := &agentv1.DesiredState{Node: "node-a", Term: 1, Generation: 1, Announcements: []*agentv1.Announcement{{Vip: "203.0.113.10", Bgp: &agentv1.BGPAnnouncement{}}}}
	if u := unknownFields(clean.ProtoReflect()); len(u) != 0 {
		t.Errorf("a state this build wrote has unknown fields %q", u)
	}
	b, err := proto.Marshal(clean)
	if err != nil {
		t.Fatal(err)
	}
	for i := range 30 {
		b = protowire.AppendTag(b, protowire.Number(1000+i), protowire.VarintType)
		b = protowire.AppendVarint(b, 1)
	}
	var many agentv1.DesiredState
	if err := proto.Unmarshal(b, &many); err != nil {
		t.Fatal(err)
	}
	u := unknownFields(many.ProtoReflect())
	if len(u) != maxUnknownFields || u[len(u)-1] != fmt.Sprintf("and %d more", 30-maxUnknownFields+1) {
		t.Errorf("30 unknown fields reported as %d lines ending %q", len(u), u[len(u)-1])
	}
}

// The agent applies a state with a field it does not know and says so in its answer and in
// GetState.
func TestAnAgentSaysWhichFieldsItDoesNotKnow(t *testing.T) {
	h := serve(t, t.TempDir())
	var st agentv1.DesiredState
	if err := proto.Unmarshal(withUnknown(t, state(1, 1, bgpVIP("203.0.113.20")), 902), &st); err != nil {
		t.Fatal(err)
	}
	resp, err := h.ccm(t).Apply(ctx(t), &agentv1.ApplyRequest{State: &st})
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{"state: field 902"}; !slices.Equal(resp.GetUnknownFields(), want) {
		t.Errorf("Apply answered unknown fields %q; want %q", resp.GetUnknownFields(), want)
	}
	gs, err := h.ccm(t).GetState(ctx(t), &agentv1.GetStateRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if len(gs.GetUnknownFields()) != 1 || len(gs.GetAnnounced()) == 0 {
		t.Errorf("GetState: unknown fields %q, announced %d; want the field, and the state applied", gs.GetUnknownFields(), len(gs.GetAnnounced()))
	}
}
