package services

import (
	"context"
	"fmt"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/component-base/metrics"
	"k8s.io/component-base/metrics/legacyregistry"

	"github.com/metalvip/metalvip/api/v1alpha1"
	"github.com/metalvip/metalvip/loadbalancer/objects"
)

// scrapePools gathers g's pool metrics as `name{label="value",...}` -> value.
func scrapePools(t *testing.T, g prometheus.Gatherer) map[string]float64 {
	t.Helper()
	mfs, err := g.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]float64{}
	for _, mf := range mfs {
		if !strings.HasPrefix(mf.GetName(), "metalvip_pool_") {
			continue
		}
		for _, m := range mf.GetMetric() {
			var labels []string
			for _, l := range m.GetLabel() {
				labels = append(labels, fmt.Sprintf("%s=%q", l.GetName(), l.GetValue()))
			}
			out[mf.GetName()+"{"+strings.Join(labels, ",")+"}"] = m.GetGauge().GetValue()
		}
	}
	return out
}

// TestPoolMetricsSayWhatTheAllocatorHolds: the per-pool metrics come from the real allocator
// at scrape time: a pool filled partly, then fully, shows its held and free addresses per
// family (a /64's free count as a float); an invalid pool and one an older pool shadows show
// usable 0; the CCM's own registry serves the same while the allocator runs.
func TestPoolMetricsSayWhatTheAllocatorHolds(t *testing.T) {
	ctx := context.Background()
	allocs, _, _ := runAllocations(t, []any{"10.1.0.0/30", "2001:db8::/64"}, nil)
	c := &poolCollector{}
	c.allocs.Store(allocs)
	reg := metrics.NewKubeRegistry()
	reg.CustomMustRegister(c)

	svc := func(name string) *v1.Service {
		return &v1.Service{
			ObjectMeta: metav1.ObjectMeta{Namespace: "tenant", Name: name, UID: types.UID(name)},
			Spec: v1.ServiceSpec{Type: v1.ServiceTypeLoadBalancer, IPFamilies: []v1.IPFamily{v1.IPv4Protocol},
				Ports: []v1.ServicePort{{Protocol: v1.ProtocolTCP, Port: 443}}},
		}
	}
	assign := func(names ...string) {
		t.Helper()
		for _, n := range names {
			if _, err := allocs.Assign(ctx, svc(n)); err != nil {
				t.Fatalf("assign %s: %v", n, err)
			}
		}
	}
	want := func(t *testing.T, got map[string]float64, series string, value float64) {
		t.Helper()
		v, ok := got[series]
		switch {
		case !ok:
			t.Errorf("no series %s; got %v", series, got)
		case v != value:
			t.Errorf("%s = %g, want %g", series, v, value)
		}
	}
	slash64 := math.Ldexp(1, 64)

	t.Run("a pool half full shows two held and two free IPv4 addresses, and its /64 free", func(t *testing.T) {
		assign("a", "b")
		got := scrapePools(t, reg)
		want(t, got, `metalvip_pool_addresses_allocated{family="ipv4",pool="p"}`, 2)
		want(t, got, `metalvip_pool_addresses_available{family="ipv4",pool="p"}`, 2)
		want(t, got, `metalvip_pool_addresses_allocated{family="ipv6",pool="p"}`, 0)
		want(t, got, `metalvip_pool_addresses_available{family="ipv6",pool="p"}`, slash64)
		want(t, got, `metalvip_pool_usable{pool="p"}`, 1)
	})
	t.Run("a full pool shows no IPv4 address free and stays usable", func(t *testing.T) {
		assign("c", "d")
		if _, err := allocs.Assign(ctx, svc("e")); err == nil {
			t.Fatal("a fifth Service got an address from a /30")
		}
		got := scrapePools(t, reg)
		want(t, got, `metalvip_pool_addresses_allocated{family="ipv4",pool="p"}`, 4)
		want(t, got, `metalvip_pool_addresses_available{family="ipv4",pool="p"}`, 0)
		want(t, got, `metalvip_pool_usable{pool="p"}`, 1)
	})
	t.Run("the CCM's registry serves the same figures while the allocator runs", func(t *testing.T) {
		got := scrapePools(t, legacyregistry.DefaultGatherer)
		want(t, got, `metalvip_pool_addresses_allocated{family="ipv4",pool="p"}`, 4)
		want(t, got, `metalvip_pool_usable{pool="p"}`, 1)
	})

	note := func(name string, created time.Time, addresses ...any) {
		allocs.cfg.Objects.Note(&unstructured.Unstructured{Object: map[string]any{
			"apiVersion": v1alpha1.GroupVersion.String(), "kind": "IPPool",
			"metadata": map[string]any{"name": name, "generation": int64(1), "creationTimestamp": created.UTC().Format(time.RFC3339)},
			"spec":     map[string]any{"addresses": addresses},
		}}, false, objects.KindPool)
	}
	note("broken", time.Now(), "not-an-address")
	note("shadowed", time.Now(), "10.1.0.2/31") // inside p, which is older
	t.Run("an invalid pool and a pool an older one shadows are not usable", func(t *testing.T) {
		var got map[string]float64
		for i := 0; i < 100; i++ { // the pool sync is asynchronous: up to 5 s
			got = scrapePools(t, reg)
			if _, ok := got[`metalvip_pool_usable{pool="shadowed"}`]; ok {
				break
			}
			time.Sleep(50 * time.Millisecond)
		}
		want(t, got, `metalvip_pool_usable{pool="broken"}`, 0)
		want(t, got, `metalvip_pool_usable{pool="shadowed"}`, 0)
		want(t, got, `metalvip_pool_usable{pool="p"}`, 1)
		if _, ok := got[`metalvip_pool_addresses_allocated{family="ipv4",pool="broken"}`]; ok {
			t.Errorf("an invalid pool shows addresses: %v", got)
		}
		if _, ok := got[`metalvip_pool_addresses_allocated{family="ipv6",pool="shadowed"}`]; ok {
			t.Errorf("an IPv4-only pool shows an IPv6 series: %v", got)
		}
	})
}
