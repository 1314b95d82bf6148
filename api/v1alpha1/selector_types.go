package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
)

// LabelSelector is a label selector written as metav1.LabelSelector is (the same YAML), with
// bounds on its lists and strings so that the API server can check it with CEL within its
// cost budget, and with the checks metav1.LabelSelectorAsSelector makes: a selector the API
// server accepts converts without error (AsSelector). Empty selects everything.
type LabelSelector struct {
	// MatchLabels: every key must have the given value.
	//
	// +kubebuilder:validation:MaxProperties=32
	// +kubebuilder:validation:XValidation:rule=`self.all(k, k.matches('^([a-z0-9]([-a-z0-9]*[a-z0-9])?([.][a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$'))`,message="every key must be a label key: a name of at most 63 letters, digits, '-', '_' or '.', starting and ending with a letter or digit, optionally after a DNS prefix and a slash, such as topology.kubernetes.io/zone"
	// +kubebuilder:validation:XValidation:rule="self.all(k, !k.contains('/') || k.indexOf('/') <= 253)",message="the prefix of a label key (before the slash) is at most 253 characters"
	// +optional
	MatchLabels map[string]LabelValue `json:"matchLabels,omitempty"`

	// MatchExpressions: every requirement must hold.
	//
	// +kubebuilder:validation:MaxItems=32
	// +listType=atomic
	// +optional
	MatchExpressions []LabelSelectorRequirement `json:"matchExpressions,omitempty"`
}

// LabelSelectorRequirement is a key, an operator and values, as in metav1.
//
// +kubebuilder:validation:XValidation:rule="!(self.operator in ['In', 'NotIn']) || (has(self.values) && size(self.values) > 0)",message="operators In and NotIn need at least one value: add values, or use Exists or DoesNotExist"
// +kubebuilder:validation:XValidation:rule="!(self.operator in ['Exists', 'DoesNotExist']) || !has(self.values) || size(self.values) == 0",message="operators Exists and DoesNotExist take no values: remove values, or use In or NotIn"
type LabelSelectorRequirement struct {
	// Key is the label key the requirement applies to.
	//
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=317
	// +kubebuilder:validation:XValidation:rule=`self.matches('^([a-z0-9]([-a-z0-9]*[a-z0-9])?([.][a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$')`,message="must be a label key: a name of at most 63 letters, digits, '-', '_' or '.', starting and ending with a letter or digit, optionally after a DNS prefix and a slash, such as topology.kubernetes.io/zone"
	// +kubebuilder:validation:XValidation:rule="!self.contains('/') || self.indexOf('/') <= 253",message="the prefix of a label key (before the slash) is at most 253 characters"
	Key string `json:"key"`

	// Operator is In, NotIn, Exists or DoesNotExist.
	//
	// +kubebuilder:validation:Enum=In;NotIn;Exists;DoesNotExist
	Operator metav1.LabelSelectorOperator `json:"operator"`

	// Values: with In and NotIn at least one; with Exists and DoesNotExist none.
	//
	// +kubebuilder:validation:MaxItems=64
	// +listType=atomic
	// +optional
	Values []LabelValue `json:"values,omitempty"`
}

// LabelValue is a label value: empty, or at most 63 letters, digits, '-', '_' or '.',
// starting and ending with a letter or digit.
//
// +kubebuilder:validation:MaxLength=63
// +kubebuilder:validation:XValidation:rule=`self.matches('^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$')`,message="must be a label value: empty, or at most 63 letters, digits, '-', '_' or '.', starting and ending with a letter or digit, such as rack-a"
type LabelValue string

// Meta returns the selector as a metav1.LabelSelector; nil for nil.
func (s *LabelSelector) Meta() *metav1.LabelSelector {
	if s == nil {
		return nil
	}
	out := &metav1.LabelSelector{}
	if s.MatchLabels != nil {
		out.MatchLabels = make(map[string]string, len(s.MatchLabels))
		for k, v := range s.MatchLabels {
			out.MatchLabels[k] = string(v)
		}
	}
	for _, r := range s.MatchExpressions {
		req := metav1.LabelSelectorRequirement{Key: r.Key, Operator: r.Operator}
		for _, v := range r.Values {
			req.Values = append(req.Values, string(v))
		}
		out.MatchExpressions = append(out.MatchExpressions, req)
	}
	return out
}

// AsSelector converts the selector as metav1.LabelSelectorAsSelector does: nil selects
// nothing, empty everything, and an error says what is wrong.
func (s *LabelSelector) AsSelector() (labels.Selector, error) {
	return metav1.LabelSelectorAsSelector(s.Meta())
}
