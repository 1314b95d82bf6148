package metallb

import (
	"slices"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"

	"github.com/metalvip/metalvip/api/v1alpha1"
)

// convertServiceAllocation maps MetalLB's limits. MetalLB admits a Service whose namespace is
// listed OR matches one of the namespace selectors, AND that matches one of the service
// selectors; metalvip takes one list and one selector of each, all of which must hold.
func convertServiceAllocation(sa *mlbServiceAllocation, known []kubeNamespace, add func(string, string, ...any)) *v1alpha1.ServiceAllocation {
	out := &v1alpha1.ServiceAllocation{}
	listed := slices.Compact(slices.Sorted(slices.Values(sa.Namespaces)))
	sels := sa.NamespaceSelectors
	resolve := func() []string {
		if known == nil {
			return nil
		}
		set := map[string]bool{}
		for _, n := range listed {
			set[n] = true
		}
		for i := range sels {
			s, err := metav1.LabelSelectorAsSelector(&sels[i])
			if err != nil {
				continue
			}
			for _, ns := range known {
				if s.Matches(labels.Set(ns.Labels)) {
					set[ns.Name] = true
				}
			}
		}
		return sortedKeys(set)
	}
	switch {
	case len(sels) == 0:
		out.Namespaces = listed
	case len(listed) == 0:
		sel, exact := mergeSelectors(sels)
		if exact {
			out.NamespaceSelector = apiSelector(sel)
			break
		}
		if ns := resolve(); len(ns) > 0 {
			out.Namespaces = ns
			add("spec.serviceAllocation.namespaces", "CHECK: the namespaces matching MetalLB's namespaceSelectors %s when converted; a namespace labelled later is not added", formatSelectors(sels))
			break
		}
		out.NamespaceSelector = apiSelector(sel)
		add("spec.serviceAllocation.namespaceSelector", "CHECK: MetalLB admitted namespaces matching any of %s; metalvip takes one selector, the first is kept. Give those namespaces one common label and select it", formatSelectors(sels))
	default:
		if ns := resolve(); len(ns) > 0 {
			out.Namespaces = ns
			add("spec.serviceAllocation.namespaces", "CHECK: MetalLB admitted the namespaces listed or matching %s; this list holds both as they were when converted, a namespace labelled later is not added", formatSelectors(sels))
			break
		}
		out.Namespaces = listed
		add("spec.serviceAllocation.namespaces", "CHECK: MetalLB also admitted namespaces matching %s; metalvip requires both the list and a selector to hold, so only the list is kept: add the namespaces the selectors match", formatSelectors(sels))
	}
	if len(sa.ServiceSelectors) > 0 {
		sel, exact := mergeSelectors(sa.ServiceSelectors)
		out.ServiceSelector = apiSelector(sel)
		if !exact {
			add("spec.serviceAllocation.serviceSelector", "CHECK: MetalLB admitted Services matching any of %s; metalvip takes one selector, the first is kept. Give those Services one common label and select it", formatSelectors(sa.ServiceSelectors))
		}
	}
	if len(out.Namespaces) == 0 && out.NamespaceSelector == nil && out.ServiceSelector == nil {
		return nil
	}
	return out
}
