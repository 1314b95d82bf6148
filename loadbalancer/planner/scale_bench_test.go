package planner

import "testing"

// A replan at the scale of make bench-scale: every node change (a node dead, back, relabelled)
// costs one.
func BenchmarkCompute20000VIPs1000Nodes(b *testing.B) {
	vips := vipsN(20000, L2)
	nodes := nodesN(1000)
	prev := Compute(nil, vips, nodes, Options{})
	b.ReportAllocs()
	for b.Loop() {
		Compute(prev, vips, nodes, Options{})
	}
}
