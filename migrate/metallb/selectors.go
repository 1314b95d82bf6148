package metallb

import (
	"fmt"
	"reflect"
	"slices"
	"strings"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/metalvip/metalvip/api/v1alpha1"
)

// mergeSelectors turns MetalLB's list of selectors (any may match) into one. It is exact when
// the list holds one selector, or selectors that each ask for one value of the same label
// (written as one "In"); otherwise it returns the first and exact is false.
func mergeSelectors(sels []metav1.LabelSelector) (sel *metav1.LabelSelector, exact bool) {
	var uniq []metav1.LabelSelector
	for _, s := range sels {
		if len(s.MatchLabels) == 0 && len(s.MatchExpressions) == 0 {
			return nil, true // matches everything
		}
		if !slices.ContainsFunc(uniq, func(u metav1.LabelSelector) bool { return reflect.DeepEqual(u, s) }) {
			uniq = append(uniq, s)
		}
	}
	switch len(uniq) {
	case 0:
		return nil, true
	case 1:
		return &uniq[0], true
	}
	key := ""
	values := map[string]bool{}
	for _, s := range uniq {
		k, vs, ok := oneLabel(s)
		if !ok || (key != "" && k != key) {
			return &uniq[0], false
		}
		key = k
		for _, v := range vs {
			values[v] = true
		}
	}
	return &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{{
		Key: key, Operator: metav1.LabelSelectorOpIn, Values: sortedKeys(values),
	}}}, true
}

// apiSelector writes a selector as metalvip's API holds it; nil stays nil (every node or
// object).
func apiSelector(s *metav1.LabelSelector) *v1alpha1.LabelSelector {
	if s == nil {
		return nil
	}
	out := &v1alpha1.LabelSelector{}
	if s.MatchLabels != nil {
		out.MatchLabels = make(map[string]v1alpha1.LabelValue, len(s.MatchLabels))
		for k, v := range s.MatchLabels {
			out.MatchLabels[k] = v1alpha1.LabelValue(v)
		}
	}
	for _, r := range s.MatchExpressions {
		req := v1alpha1.LabelSelectorRequirement{Key: r.Key, Operator: r.Operator}
		for _, v := range r.Values {
			req.Values = append(req.Values, v1alpha1.LabelValue(v))
		}
		out.MatchExpressions = append(out.MatchExpressions, req)
	}
	return out
}

// oneLabel returns the label and values of a selector that asks only for a label to have one
// of some values.
func oneLabel(s metav1.LabelSelector) (key string, values []string, ok bool) {
	switch {
	case len(s.MatchLabels) == 1 && len(s.MatchExpressions) == 0:
		for k, v := range s.MatchLabels {
			return k, []string{v}, true
		}
	case len(s.MatchLabels) == 0 && len(s.MatchExpressions) == 1 && s.MatchExpressions[0].Operator == metav1.LabelSelectorOpIn:
		return s.MatchExpressions[0].Key, s.MatchExpressions[0].Values, true
	}
	return "", nil, false
}

func formatSelectors(sels []metav1.LabelSelector) string {
	s := make([]string, len(sels))
	for i := range sels {
		s[i] = "{" + metav1.FormatLabelSelector(&sels[i]) + "}"
	}
	return strings.Join(s, ", ")
}

func formatPreferences(ps []mlbPreferredNodeSelector) string {
	s := make([]string, len(ps))
	for i := range ps {
		s[i] = fmt.Sprintf("%d:{%s}", ps[i].Weight, metav1.FormatLabelSelector(&ps[i].Preference))
	}
	return strings.Join(s, ", ")
}
