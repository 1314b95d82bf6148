package main

import "testing"

func TestReplaceSectionKeepsTheRestOfTheReport(t *testing.T) {
	doc := "# Benchmarks\n\nintro\n\n## A\n\na\n\n## Drains\n\nold\n\n## B\n\nb\n"
	for _, tc := range []struct {
		name, sec, want string
	}{
		{"a section of the same title is replaced in place", "## Drains\n\nnew\n",
			"# Benchmarks\n\nintro\n\n## A\n\na\n\n## Drains\n\nnew\n\n## B\n\nb\n"},
		{"a new section whose title extends another's goes after it", "## Drains: L2\n\nl2\n",
			"# Benchmarks\n\nintro\n\n## A\n\na\n\n## Drains\n\nold\n\n## Drains: L2\n\nl2\n\n## B\n\nb\n"},
		{"a new section of another title goes at the end", "## C\n\nc\n",
			"# Benchmarks\n\nintro\n\n## A\n\na\n\n## Drains\n\nold\n\n## B\n\nb\n\n## C\n\nc\n\n"},
		{"the last section is replaced up to the end", "## B\n\nnew b\n",
			"# Benchmarks\n\nintro\n\n## A\n\na\n\n## Drains\n\nold\n\n## B\n\nnew b\n\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := replaceSection(doc, tc.sec); got != tc.want {
				t.Errorf("got\n%q\nwant\n%q", got, tc.want)
			}
		})
	}
}
