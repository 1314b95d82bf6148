package services

import (
	"strings"
	"sync"
	"sync/atomic"

	"k8s.io/component-base/metrics"
	"k8s.io/component-base/metrics/legacyregistry"
)

// The pool metrics are read from the allocator when scraped, never kept beside it: they say
// what the IPPool status says (allocatedIPv4, availableIPv4...), from the same counts.
var (
	poolAllocatedDesc = metrics.NewDesc("metalvip_pool_addresses_allocated",
		"Addresses of the pool's ranges held by Services, by family (ipv4, ipv6; only the families the pool's ranges hold).",
		[]string{"pool", "family"}, nil, metrics.ALPHA, "")
	poolAvailableDesc = metrics.NewDesc("metalvip_pool_addresses_available",
		"Addresses of the pool's ranges not held, by family: what it can still give while metalvip_pool_usable is 1 (approximate above 2^53, as for a /64).",
		[]string{"pool", "family"}, nil, metrics.ALPHA, "")
	poolUsableDesc = metrics.NewDesc("metalvip_pool_usable",
		"1 when the pool gives out addresses, 0 when it gives none: its spec is invalid, or it overlaps an older pool (see its Ready condition).",
		[]string{"pool"}, nil, metrics.ALPHA, "")

	// poolMetrics is the collector the CCM serves: the Allocations running now (the leader's), none
	// before the allocator is rebuilt or in a CCM that does not lead.
	poolMetrics   = &poolCollector{}
	registerPools sync.Once
)

// poolCollector reports each IPPool's figures, at scrape time, from the allocator of the
// Allocations it holds.
type poolCollector struct {
	metrics.BaseStableCollector
	allocs atomic.Pointer[Allocations]
}

var _ metrics.StableCollector = (*poolCollector)(nil)

func (c *poolCollector) DescribeWithStability(ch chan<- *metrics.Desc) {
	ch <- poolAllocatedDesc
	ch <- poolAvailableDesc
	ch <- poolUsableDesc
}

func (c *poolCollector) CollectWithStability(ch chan<- metrics.Metric) {
	a := c.allocs.Load()
	if a == nil {
		return
	}
	a.collectPools(ch)
}

// registerPoolMetrics adds the pool metrics to the CCM's registry (legacyregistry), once.
func registerPoolMetrics() {
	registerPools.Do(func() { legacyregistry.CustomMustRegister(poolMetrics) })
}

// servePoolMetrics makes the CCM's registry report a's pools until the returned function is
// called.
func servePoolMetrics(a *Allocations) (stop func()) {
	poolMetrics.allocs.Store(a)
	return func() { poolMetrics.allocs.CompareAndSwap(a, nil) }
}

// collectPools sends every pool's figures: usable for every IPPool (0 for an invalid one),
// allocated and available for the pools the allocator uses, per family their ranges hold.
// It costs O(pools + ranges) under a.mu, never a walk over addresses.
func (a *Allocations) collectPools(ch chan<- metrics.Metric) {
	set := a.cfg.Objects.Set()
	a.mu.Lock()
	defer a.mu.Unlock()
	for _, p := range set.Pools() {
		if !p.Valid() {
			ch <- metrics.NewLazyConstMetric(poolUsableDesc, metrics.GaugeValue, 0, p.Name)
			continue
		}
		usable, families, ok := a.ipam.Usage(p.Name)
		if !ok {
			continue // valid, but not given to the allocator yet: the next pool sync does
		}
		u := 0.0
		if usable {
			u = 1
		}
		ch <- metrics.NewLazyConstMetric(poolUsableDesc, metrics.GaugeValue, u, p.Name)
		for _, f := range families {
			family := strings.ToLower(f.Family.String())
			ch <- metrics.NewLazyConstMetric(poolAllocatedDesc, metrics.GaugeValue, float64(f.Allocated), p.Name, family)
			ch <- metrics.NewLazyConstMetric(poolAvailableDesc, metrics.GaugeValue, f.Available, p.Name, family)
		}
	}
}
