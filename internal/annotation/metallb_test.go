package annotation

import (
	"strings"
	"testing"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/validation"
	"pgregory.net/rapid"
)

// request is what a Service asks for, as the allocator reads it.
type request struct {
	pool, ips, key string
	err            string // "" when every accessor succeeds, else the joined errors
}

func readRequest(svc *v1.Service) request {
	var r request
	var errs []string
	pool, err := PoolFromService(svc)
	if err != nil {
		errs = append(errs, err.Error())
	}
	ips, err := IPsFromService(svc)
	if err != nil {
		errs = append(errs, err.Error())
	}
	key, err := SharingKeyFromService(svc)
	if err != nil {
		errs = append(errs, err.Error())
	}
	r.pool, r.ips, r.key, r.err = pool, FormatIPs(ips), key, strings.Join(errs, "; ")
	return r
}

func TestMetalLBAnnotations(t *testing.T) {
	for _, tc := range []struct {
		name string
		ann  map[string]string
		lbIP string
		want request
		// warnings are substrings, one for each warning expected, in order.
		warnings []string
	}{
		{
			name: "a MetalLB address pool is the pool when metalvip names none",
			ann:  map[string]string{"metallb.io/address-pool": "gold"},
			want: request{pool: "gold"},
		},
		{
			name: "the older metallb.universe.tf spelling of the pool is honoured",
			ann:  map[string]string{"metallb.universe.tf/address-pool": "gold"},
			want: request{pool: "gold"},
		},
		{
			name:     "metalvip's pool wins over MetalLB's and MetalLB's is reported",
			ann:      map[string]string{"metalvip.io/pool": "silver", "metallb.io/address-pool": "gold"},
			want:     request{pool: "silver"},
			warnings: []string{`annotation metallb.io/address-pool="gold" is ignored: metalvip.io/pool="silver" is set and wins`},
		},
		{
			name: "the same pool under both names is no conflict",
			ann:  map[string]string{"metalvip.io/pool": "gold", "metallb.io/address-pool": " gold"},
			want: request{pool: "gold"},
		},
		{
			name:     "metallb.io wins over metallb.universe.tf, as in MetalLB",
			ann:      map[string]string{"metallb.io/address-pool": "gold", "metallb.universe.tf/address-pool": "old"},
			want:     request{pool: "gold"},
			warnings: []string{`metallb.universe.tf/address-pool="old" is ignored: metallb.io/address-pool="gold" is set and wins`},
		},
		{
			name: "MetalLB's loadBalancerIPs request one address per family",
			ann:  map[string]string{"metallb.io/loadBalancerIPs": "203.0.113.5, 2001:db8::5"},
			want: request{ips: "203.0.113.5,2001:db8::5"},
		},
		{
			name: "the older spelling of loadBalancerIPs is honoured",
			ann:  map[string]string{"metallb.universe.tf/loadBalancerIPs": "203.0.113.6"},
			want: request{ips: "203.0.113.6"},
		},
		{
			name: "the same addresses in another order are no conflict",
			ann:  map[string]string{"metalvip.io/ips": "203.0.113.5,2001:db8::5", "metallb.io/loadBalancerIPs": "2001:db8::5,203.0.113.5"},
			want: request{ips: "203.0.113.5,2001:db8::5"},
		},
		{
			name:     "metalvip's addresses win over MetalLB's and MetalLB's are reported",
			ann:      map[string]string{"metalvip.io/ips": "203.0.113.5", "metallb.io/loadBalancerIPs": "203.0.113.9"},
			want:     request{ips: "203.0.113.5"},
			warnings: []string{`metallb.io/loadBalancerIPs="203.0.113.9" is ignored: metalvip.io/ips="203.0.113.5"`},
		},
		{
			name: "a bad address in MetalLB's loadBalancerIPs is an error naming MetalLB's annotation",
			ann:  map[string]string{"metallb.io/loadBalancerIPs": "203.0.113.300"},
			want: request{err: `annotation metallb.io/loadBalancerIPs: "203.0.113.300" is not an IP address`},
		},
		{
			name: "spec.loadBalancerIP must be among MetalLB's loadBalancerIPs",
			ann:  map[string]string{"metallb.io/loadBalancerIPs": "203.0.113.5"},
			lbIP: "203.0.113.7",
			want: request{err: `spec.loadBalancerIP 203.0.113.7 is not among annotation metallb.io/loadBalancerIPs="203.0.113.5"`},
		},
		{
			name: "empty MetalLB annotations request nothing, as in MetalLB",
			ann:  map[string]string{"metallb.io/address-pool": "", "metallb.io/loadBalancerIPs": " ", "metallb.io/allow-shared-ip": ""},
			lbIP: "203.0.113.8",
			want: request{ips: "203.0.113.8"},
		},
		{
			name: "an empty metalvip pool is still an error: metalvip's own annotations are strict",
			ann:  map[string]string{"metalvip.io/pool": ""},
			want: request{err: `annotation metalvip.io/pool="" is not an IPPool name`},
		},
		{
			name:     "a bad metalvip pool name is an error even when MetalLB's is fine",
			ann:      map[string]string{"metalvip.io/pool": "Bad Name", "metallb.io/address-pool": "gold"},
			want:     request{err: `annotation metalvip.io/pool="Bad Name" is not an IPPool name`},
			warnings: []string{`metallb.io/address-pool="gold" is ignored`},
		},
		{
			name: "a MetalLB pool name that is no object name is an error naming MetalLB's annotation",
			ann:  map[string]string{"metallb.io/address-pool": "Gold Pool"},
			want: request{err: `annotation metallb.io/address-pool="Gold Pool" is not an IPPool name`},
		},
		{
			name: "a MetalLB sharing key that is a label value is kept as it is",
			ann:  map[string]string{"metallb.io/allow-shared-ip": "dns"},
			want: request{key: "dns"},
		},
		{
			name: "the older spelling of allow-shared-ip is honoured",
			ann:  map[string]string{"metallb.universe.tf/allow-shared-ip": "dns"},
			want: request{key: "dns"},
		},
		{
			name:     "a MetalLB sharing key that is no label value is rewritten to one and reported",
			ann:      map[string]string{"metallb.io/allow-shared-ip": "web & api"},
			want:     request{key: "metallb-88b8fd29ee385b666a38cf7e"}, // the first 96 bits of SHA-256("web & api")
			warnings: []string{`annotation metallb.io/allow-shared-ip="web & api" is not a valid sharing key`},
		},
		{
			name:     "metalvip's sharing key wins over MetalLB's and MetalLB's is reported",
			ann:      map[string]string{"metalvip.io/sharing-key": "dns", "metallb.io/allow-shared-ip": "web"},
			want:     request{key: "dns"},
			warnings: []string{`metallb.io/allow-shared-ip="web" is ignored: metalvip.io/sharing-key="dns" is set and wins`},
		},
		{
			name: "MetalLB's record of the pool is reported as having no effect",
			ann:  map[string]string{"metallb.io/ip-allocated-from-pool": "gold", "metallb.universe.tf/ip-allocated-from-pool": "gold"},
			warnings: []string{
				"annotation metallb.io/ip-allocated-from-pool is MetalLB's record",
				"annotation metallb.universe.tf/ip-allocated-from-pool is MetalLB's record",
			},
		},
		{
			name:     "an unknown MetalLB annotation is reported, never silently ignored",
			ann:      map[string]string{"metallb.io/loadBalancerIP": "203.0.113.5", "metallb.universe.tf/something": "x"},
			warnings: []string{"annotation metallb.io/loadBalancerIP is MetalLB's and not one metalvip knows", "annotation metallb.universe.tf/something is MetalLB's and not one"},
		},
		{
			name: "annotations of other tools are not reported",
			ann:  map[string]string{"example.com/owner": "team-a", "metallb.example.com/x": "y"},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			svc := service(tc.ann, tc.lbIP)
			got := readRequest(svc)
			if tc.want.err != "" {
				if !strings.Contains(got.err, tc.want.err) {
					t.Errorf("errors = %q, want one containing %q", got.err, tc.want.err)
				}
				got.err, tc.want.err = "", ""
				got.pool, got.ips, got.key = tc.want.pool, tc.want.ips, tc.want.key // a failed accessor's value is not used
			}
			if got != tc.want {
				t.Errorf("read %+v, want %+v", got, tc.want)
			}
			warns := Warnings(svc)
			if len(warns) != len(tc.warnings) {
				t.Fatalf("warnings = %q, want %d", warns, len(tc.warnings))
			}
			for i, w := range tc.warnings {
				if !strings.Contains(warns[i], w) {
					t.Errorf("warning %d = %q, want it to contain %q", i, warns[i], w)
				}
			}
		})
	}
}

// The spellings of each annotation, metalvip's first, as a generator picks among them.
var allSpellings = [][]Name{
	{Pool, MetalLBAddressPool, MetalLBLegacyAddressPool},
	{IPs, MetalLBLoadBalancerIPs, MetalLBLegacyLoadBalancerIPs},
	{SharingKey, MetalLBAllowSharedIP, MetalLBLegacyAllowSharedIP},
}

// TestTheWinningSpellingAloneDecides: whatever other spellings a Service carries, what it asks
// for is what the winning spelling alone asks for, and every other spelling that asks for
// something else is reported.
func TestTheWinningSpellingAloneDecides(t *testing.T) {
	values := [][]string{
		{"gold", "silver", "", "Bad Name"},
		{"203.0.113.1", "203.0.113.2,2001:db8::2", "", "nonsense"},
		{"dns", "web & api", "", "x"},
	}
	rapid.Check(t, func(t *rapid.T) {
		ann := map[string]string{}
		for i, names := range allSpellings {
			for _, n := range names {
				if rapid.Bool().Draw(t, "set "+string(n)) {
					ann[string(n)] = rapid.SampledFrom(values[i]).Draw(t, "value of "+string(n))
				}
			}
		}
		svc := service(ann, "")
		got := readRequest(svc)
		alone := map[string]string{}
		overruled := 0
		for _, names := range allSpellings {
			winner := Name("")
			for _, n := range names {
				v, ok := ann[string(n)]
				if !ok {
					continue
				}
				if winner == "" {
					winner, alone[string(n)] = n, v
				} else if !sameRequest(names[0], ann[string(winner)], v) {
					overruled++
				}
			}
		}
		if want := readRequest(service(alone, "")); got != want {
			t.Fatalf("annotations %v read as %+v; the winners alone %v read as %+v", ann, got, alone, want)
		}
		reported := 0
		for _, w := range Warnings(svc) {
			if strings.Contains(w, "is set and wins") {
				reported++
			}
		}
		if reported != overruled {
			t.Fatalf("annotations %v: %d overruled spellings reported, want %d: %q", ann, reported, overruled, Warnings(svc))
		}
	})
}

// TestMetalLBSharingKeysShareExactlyWhenMetalLBWould: two MetalLB values give the same metalvip
// key exactly when they are equal, and every key is a valid one.
func TestMetalLBSharingKeysShareExactlyWhenMetalLBWould(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		a := rapid.String().Draw(t, "a")
		b := rapid.OneOf(rapid.Just(a), rapid.String()).Draw(t, "b")
		ka, _ := metalLBSharingKey(a)
		kb, _ := metalLBSharingKey(b)
		if (ka == kb) != (a == b) {
			t.Fatalf("%q -> %q and %q -> %q", a, ka, b, kb)
		}
		for v, k := range map[string]string{a: ka, b: kb} {
			if (k == "") != (v == "") {
				t.Fatalf("%q -> %q: only the empty value is no key", v, k)
			}
			if k != "" && len(validation.IsValidLabelValue(k)) > 0 {
				t.Fatalf("%q -> %q, which is no label value", v, k)
			}
		}
	})
}

func FuzzMetalLBAnnotations(f *testing.F) {
	for _, s := range []string{"", "gold", "203.0.113.1,2001:db8::1", "web & api", " , "} {
		f.Add(s, s)
	}
	f.Fuzz(func(t *testing.T, a, b string) {
		svc := service(map[string]string{
			"metallb.io/address-pool": a, "metallb.universe.tf/address-pool": b,
			"metallb.io/loadBalancerIPs": a, "metallb.universe.tf/loadBalancerIPs": b,
			"metallb.io/allow-shared-ip": a, "metallb.universe.tf/allow-shared-ip": b,
			"metallb.io/" + a: b,
		}, "")
		key, err := SharingKeyFromService(svc)
		if err != nil {
			t.Fatalf("a MetalLB sharing key %q was refused: %v", a, err)
		}
		if key != "" && len(validation.IsValidLabelValue(key)) > 0 {
			t.Fatalf("%q gave key %q, which is no label value", a, key)
		}
		_, _ = PoolFromService(svc)
		_, _ = IPsFromService(svc)
		for _, w := range Warnings(svc) {
			if w == "" {
				t.Fatal("an empty warning")
			}
		}
	})
}
