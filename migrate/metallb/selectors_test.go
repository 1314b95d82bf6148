package metallb

import (
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"pgregory.net/rapid"
)

// TestMergedSelectorsMatchWhatMetalLBMatched: when mergeSelectors says it is exact, the one
// selector matches exactly the label sets one of MetalLB's selectors matched.
func TestMergedSelectorsMatchWhatMetalLBMatched(t *testing.T) {
	keys, values := []string{"rack", "zone"}, []string{"a", "b", "c"}
	selector := rapid.Custom(func(t *rapid.T) metav1.LabelSelector {
		k := rapid.SampledFrom(keys).Draw(t, "key")
		switch rapid.IntRange(0, 3).Draw(t, "shape") {
		case 0:
			return metav1.LabelSelector{MatchLabels: map[string]string{k: rapid.SampledFrom(values).Draw(t, "value")}}
		case 1:
			vs := rapid.SliceOfNDistinct(rapid.SampledFrom(values), 1, 3, rapid.ID[string]).Draw(t, "values")
			return metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{{Key: k, Operator: metav1.LabelSelectorOpIn, Values: vs}}}
		case 2:
			return metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{{Key: k, Operator: metav1.LabelSelectorOpExists}}}
		default:
			return metav1.LabelSelector{}
		}
	})
	rapid.Check(t, func(t *rapid.T) {
		sels := rapid.SliceOfN(selector, 1, 4).Draw(t, "selectors")
		merged, exact := mergeSelectors(sels)
		matchesMerged := func(l labels.Set) bool {
			if merged == nil {
				return true
			}
			s, err := metav1.LabelSelectorAsSelector(merged)
			if err != nil {
				t.Fatalf("merged selector %v does not parse: %v", merged, err)
			}
			return s.Matches(l)
		}
		for range 20 {
			l := labels.Set{}
			for _, k := range keys {
				if rapid.Bool().Draw(t, "has "+k) {
					l[k] = rapid.SampledFrom(values).Draw(t, k)
				}
			}
			metalLB := false
			for i := range sels {
				s, _ := metav1.LabelSelectorAsSelector(&sels[i])
				metalLB = metalLB || s.Matches(l)
			}
			if exact && matchesMerged(l) != metalLB {
				t.Fatalf("selectors %v merged into %v (exact) disagree on %v: merged %v, MetalLB %v", sels, merged, l, matchesMerged(l), metalLB)
			}
			if !exact && matchesMerged(l) && !metalLB {
				t.Fatalf("the inexact merge %v of %v matches %v, which none of MetalLB's did: it must only narrow", merged, sels, l)
			}
		}
	})
}
