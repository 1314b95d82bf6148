package nodeagent

import (
	"slices"
	"testing"
)

// facts are liveness facts given as values.
type facts struct {
	alive map[string]bool
	sees  map[string]bool
}

func (f facts) Alive(n string) bool { return f.alive[n] }
func (f facts) Sees(n string) bool  { return f.sees[n] }

func live(alive ...string) facts {
	f := facts{alive: map[string]bool{"me": true}, sees: map[string]bool{}}
	for _, n := range alive {
		f.alive[n], f.sees[n] = true, true
	}
	return f
}

func (f facts) blind(nodes ...string) facts {
	for _, n := range nodes {
		f.sees[n] = false
	}
	return f
}

func TestOwnership(t *testing.T) {
	for _, tc := range []struct {
		name       string
		cands      []string
		live       LivenessFacts
		wantActive bool
		wantReason string
	}{
		{"without heartbeats the first candidate answers", []string{"me", "b"}, nil, true, "first candidate"},
		{"without heartbeats a second candidate stands by", []string{"b", "me"}, nil, false, "standby for b"},
		{"without heartbeats a node that is no candidate does not answer", []string{"b", "c"}, nil, false, "not a candidate"},
		{"no candidates at all means nobody answers", nil, live(), false, "not a candidate"},
		{"the first candidate answers when the others see it", []string{"me", "b", "c"}, live("b", "c"), true, "first candidate"},
		{"a live higher-ranked candidate keeps this node standing by", []string{"b", "me"}, live("b"), false, "standby: b is alive and ranks higher"},
		{"the first live candidate answers when every higher one is dead", []string{"b", "c", "me"}, live(), true, "first live candidate: higher-ranked candidates are down"},
		{"the first live candidate waits for a lower one that does not see it yet", []string{"b", "me", "c"}, live("c").blind("c"), false, "taking over: waiting for c to release"},
		{"a dead lower-ranked candidate is not waited for", []string{"me", "c"}, live(), true, "first candidate"},
		{"a node that is no candidate does not answer though all are dead", []string{"b", "c"}, live(), false, "not a candidate"},
		{"a node that is no candidate does not answer while one is alive", []string{"b", "c"}, live("c"), false, "not a candidate"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := decideL2("me", tc.cands, false, tc.live)
			if d.Active != tc.wantActive || d.Reason != tc.wantReason || d.Sharing != nil {
				t.Errorf("decideL2 = %+v; want active %v, %q", d, tc.wantActive, tc.wantReason)
			}
		})
	}
}

func TestPerClientSharing(t *testing.T) {
	for _, tc := range []struct {
		name        string
		cands       []string
		live        LivenessFacts
		wantActive  bool
		wantSharing []string
		wantReason  string
	}{
		{"every live candidate shares the clients", []string{"c", "me", "b"}, live("b", "c"), true, []string{"b", "c", "me"}, "answers its share of clients with c, b"},
		{"a dead candidate gets no share", []string{"c", "me", "b"}, live("b"), true, []string{"b", "me"}, "answers its share of clients with b"},
		{"alone, this node answers every client", []string{"me", "b"}, live(), true, []string{"me"}, "answers every client: no other candidate is alive"},
		{"without heartbeats every candidate shares", []string{"me", "b"}, nil, true, []string{"b", "me"}, "answers its share of clients with b"},
		{"a node that is no candidate has no share", []string{"b", "c"}, live("b", "c"), false, nil, "not a candidate"},
		{"a candidate listed twice gets one share", []string{"b", "me", "b"}, live("b"), true, []string{"b", "me"}, "answers its share of clients with b"},
		{"a live candidate that does not see this node yet: no share (it answers it)", []string{"c", "me", "b"}, live("b", "c").blind("c"), false, nil, "joining: waiting for c to see this node before answering a share"},
		{"a dead candidate that does not see this node is no matter", []string{"c", "me", "b"}, live("b").blind("c"), true, []string{"b", "me"}, "answers its share of clients with b"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := decideL2("me", tc.cands, true, tc.live)
			if d.Active != tc.wantActive || !slices.Equal(d.Sharing, tc.wantSharing) || d.Reason != tc.wantReason {
				t.Errorf("decideL2 = %+v; want active %v sharing %v, %q", d, tc.wantActive, tc.wantSharing, tc.wantReason)
			}
		})
	}
}
