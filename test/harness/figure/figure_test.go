package figure

import (
	"testing"
	"time"
)

func TestFiguresReadTheSameInEveryReport(t *testing.T) {
	for _, c := range []struct{ got, want string }{
		{Duration(0), "-"},
		{Duration(1500 * time.Microsecond), "1.5 ms"},
		{Duration(12 * time.Second), "12.0 s"},
		{MiB(66<<20 + 1<<19), "66.5 MiB"},
		{Bytes(2048), "2.0 KiB"},
		{Thousands(1234567), "1,234,567"},
		{Thousands(999), "999"},
	} {
		if c.got != c.want {
			t.Errorf("got %q, want %q", c.got, c.want)
		}
	}
	if p := Percentile([]float64{5, 1, 4, 2, 3}, 99); p != 5 {
		t.Errorf("p99 of 1..5 = %v, want 5", p)
	}
	if m := Median(nil); m != 0 {
		t.Errorf("median of none = %v, want 0", m)
	}
	if d := (Counts{"a": 5, "b": 2}).Minus(Counts{"a": 3, "b": 2}); len(d) != 1 || d["a"] != 2 || d.Total() != 2 {
		t.Errorf("minus: %v", d)
	}
	if got, want := (Counts{"b": 10, "a": 10, "c": 30, "d": 1}).Describe(10, 0.5, 2), "c 3.00, a 1.00, b 1.00"; got != want {
		t.Errorf("Describe: %q, want %q", got, want)
	}
}
