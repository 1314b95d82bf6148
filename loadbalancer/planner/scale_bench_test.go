package planner

import "testing"

// A replan at the scale of make bench-scale: a node joining, returning or relabelled costs one.
func BenchmarkCompute20000VIPs1000Nodes(b *testing.B) {
	vips := vipsN(20000, L2)
	nodes := nodesN(1000)
	prev := Compute(nil, vips, nodes, Options{})
	b.ReportAllocs()
	for b.Loop() {
		Compute(prev, vips, nodes, Options{})
	}
}

// A node's death at the same scale: only the VIPs that named it are placed again.
func BenchmarkANodeDies20000VIPs1000Nodes(b *testing.B) {
	vips := vipsN(20000, L2)
	nodes := nodesN(1000)
	dead := make([]Node, len(nodes))
	copy(dead, nodes)
	dead[500].AgentReachable = false
	p := New(Options{})
	p.Reset(Compute(nil, vips, nodes, Options{}), vips, nodes)
	b.ReportAllocs()
	for b.Loop() {
		b.StopTimer()
		p.SetNodes(nodes) // back (a rebalance), outside the measure
		b.StartTimer()
		if len(p.SetNodes(dead)) == 0 {
			b.Fatal("a node died and nothing changed")
		}
	}
}
