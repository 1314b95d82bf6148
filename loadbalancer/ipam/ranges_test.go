package ipam

import (
	"net/netip"
	"testing"
)

func TestFreeSetMergesAndSplits(t *testing.T) {
	s := newFreeSet(false)
	s.add(Range{ip("203.0.113.0"), ip("203.0.113.3")})
	s.add(Range{ip("203.0.113.8"), ip("203.0.113.9")})
	if !s.take(ip("203.0.113.1")) || s.take(ip("203.0.113.1")) || s.take(ip("203.0.113.5")) {
		t.Fatal("take of a free address must succeed once; of a taken or absent one, fail")
	}
	if s.t.Len() != 3 {
		t.Errorf("after splitting .0-.3 at .1: %d intervals, want 3", s.t.Len())
	}
	s.add(Range{ip("203.0.113.1"), ip("203.0.113.1")})
	s.add(Range{ip("203.0.113.4"), ip("203.0.113.7")})
	if s.t.Len() != 1 {
		var got []Range
		s.t.Ascend(func(r Range) bool { got = append(got, r); return true })
		t.Errorf("giving back .1 and .4-.7 should merge everything into one interval: %v", got)
	}
	if a, ok := s.lowest(); !ok || a != ip("203.0.113.0") {
		t.Errorf("lowest = %v, %v", a, ok)
	}
	for a := ip("203.0.113.0"); a.Compare(ip("203.0.113.9")) <= 0; a = a.Next() {
		if !s.has(a) {
			t.Errorf("%s missing", a)
		}
	}
	// The last address of the space is handled (Next is invalid there).
	top := newFreeSet(false)
	top.add(Range{ip("255.255.255.254"), netip.MustParseAddr("255.255.255.255")})
	if !top.take(ip("255.255.255.255")) {
		t.Error("taking 255.255.255.255 failed")
	}
	top.add(Range{ip("255.255.255.255"), ip("255.255.255.255")})
	if top.t.Len() != 1 {
		t.Error("giving back the last address did not merge")
	}
}
