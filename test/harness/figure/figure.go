// Package figure formats the figures the benchmark programs (test/bench, test/scale) write,
// one way for both, so that their reports read alike: durations, sizes, percentiles and
// counts of API requests. It measures nothing.
package figure

import (
	"fmt"
	"slices"
	"strings"
	"time"
)

// Percentile is the p-th percentile (0 to 100) of xs by the nearest rank, 0 for none.
func Percentile(xs []float64, p float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	i := int(float64(len(s))*p/100+0.5) - 1
	return s[max(0, min(i, len(s)-1))]
}

// Median is the 50th percentile.
func Median(xs []float64) float64 { return Percentile(xs, 50) }

// Duration gives d to three significant figures or so, in the unit that suits it; "-" for
// zero, which the reports use for "not measured".
func Duration(d time.Duration) string {
	switch {
	case d == 0:
		return "-"
	case d >= 10*time.Second:
		return fmt.Sprintf("%.1f s", d.Seconds())
	case d >= time.Second:
		return fmt.Sprintf("%.2f s", d.Seconds())
	case d >= time.Millisecond:
		return fmt.Sprintf("%.1f ms", float64(d)/float64(time.Millisecond))
	default:
		return fmt.Sprintf("%.1f us", float64(d)/float64(time.Microsecond))
	}
}

// MiB gives b bytes in MiB to a tenth (targets such as "RSS under 72 MiB" are met or missed
// by less than one).
func MiB(b int64) string { return fmt.Sprintf("%.1f MiB", float64(b)/(1<<20)) }

// Bytes gives b bytes in the unit that suits it.
func Bytes(b float64) string {
	switch {
	case b >= 1<<20:
		return fmt.Sprintf("%.1f MiB", b/(1<<20))
	case b >= 1<<10:
		return fmt.Sprintf("%.1f KiB", b/(1<<10))
	}
	return fmt.Sprintf("%.0f B", b)
}

// Thousands writes n with commas between its thousands.
func Thousands(n int) string {
	s := fmt.Sprint(n)
	for i := len(s) - 3; i > 0; i -= 3 {
		s = s[:i] + "," + s[i:]
	}
	return s
}

// Counts are counters by name (requests by verb and resource), as read at one moment.
type Counts map[string]float64

// Minus is what each counter gained since o; those that did not are left out.
func (c Counts) Minus(o Counts) Counts {
	out := Counts{}
	for k, v := range c {
		if d := v - o[k]; d > 0 {
			out[k] = d
		}
	}
	return out
}

// Total is the sum of the counters.
func (c Counts) Total() float64 {
	t := 0.0
	for _, v := range c {
		t += v
	}
	return t
}

// Describe lists the counters divided by per (1 for the counts themselves), most first and
// ties by name, as "name figure" with the figure to decimals places; those under least after
// the division are left out.
func (c Counts) Describe(per, least float64, decimals int) string {
	keys := make([]string, 0, len(c))
	for k := range c {
		keys = append(keys, k)
	}
	slices.SortFunc(keys, func(x, y string) int {
		if c[x] != c[y] {
			if c[x] > c[y] {
				return -1
			}
			return 1
		}
		return strings.Compare(x, y)
	})
	var parts []string
	for _, k := range keys {
		if v := c[k] / per; v >= least {
			parts = append(parts, fmt.Sprintf("%s %.*f", k, decimals, v))
		}
	}
	return strings.Join(parts, ", ")
}
