package metallb

import (
	"bytes"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/metalvip/metalvip/api/v1alpha1"
)

// corpusDir holds real MetalLB configurations gathered from MetalLB's repository, its
// operator's, OpenShift's docs and public posts, each with its source (README.md there).
const corpusDir = "../../test/migration/testdata/corpus"

// Issue 31: the converter on real MetalLB configurations keeps every address (0 IP changes)
// and changes who answers or routes nowhere silently: each thing the corpus holds that metalvip
// does differently carries a CHECK. MetalLB's legacy ConfigMap is refused with the way to
// convert it. The printed conversion of each is kept as a golden file (-update rewrites them),
// so that a change of what the converter says about real configurations shows in review.
func TestTheConverterOnRealMetalLBConfigurations(t *testing.T) {
	files, err := filepath.Glob(filepath.Join(corpusDir, "*.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if len(files) < 30 {
		t.Fatalf("%d configurations in %s; the corpus has at least 30", len(files), corpusDir)
	}
	converted, refused, checks := 0, 0, 0
	for _, file := range files {
		name := strings.TrimSuffix(filepath.Base(file), ".yaml")
		t.Run(name, func(t *testing.T) {
			raw, err := os.ReadFile(file)
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.HasPrefix(raw, []byte("# source: ")) {
				t.Errorf("%s does not begin with its source", file)
			}
			objs, err := decodeObjects(bytes.NewReader(raw))
			if err != nil {
				t.Fatal(err)
			}
			in := Config{Namespace: namespaceOf(objs)}
			skipped, err := in.ReadFiles([]string{file}, nil)
			var out bytes.Buffer
			if err != nil {
				// Only MetalLB's legacy ConfigMap is refused, saying how to convert it.
				if !hasLegacyConfigMap(objs) || !strings.Contains(err.Error(), "configmaptocrs") {
					t.Fatalf("refused: %v", err)
				}
				refused++
				fmt.Fprintf(&out, "refused: %v\n", err)
			} else {
				conv := Convert(in, "metalvip-bgp-secrets")
				converted++
				checks += conv.Checks()
				keepsEveryAddress(t, objs, conv)
				saysWhatChanges(t, objs, conv)
				for _, s := range skipped {
					fmt.Fprintf(&out, "# skipped: %s\n", s)
				}
				if err := Render(&out, conv); err != nil {
					t.Fatal(err)
				}
			}
			golden(t, filepath.Join("testdata", "corpus", name+".golden"), out.Bytes())
		})
	}
	t.Logf("%d real MetalLB configurations: %d converted (%d CHECK notes in all), %d refused (MetalLB's legacy ConfigMap)", len(files), converted, checks, refused)
}

func golden(t *testing.T, path string, got []byte) {
	t.Helper()
	if *update {
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, got, 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (go test ./migrate/metallb -run RealMetalLB -update writes it)", err)
	}
	if !bytes.Equal(got, want) {
		t.Errorf("the conversion differs from %s (review, then -update):\n%s", path, got)
	}
}

// namespaceOf is the namespace of the file's MetalLB objects, as an operator converting them
// gives it (--namespace); metallb-system when they name none.
func namespaceOf(objs []*unstructured.Unstructured) string {
	for _, u := range objs {
		if strings.HasPrefix(u.GetAPIVersion(), metalLBGroup+"/") && u.GetNamespace() != "" {
			return u.GetNamespace()
		}
	}
	return "metallb-system"
}

func hasLegacyConfigMap(objs []*unstructured.Unstructured) bool {
	return slices.ContainsFunc(objs, func(u *unstructured.Unstructured) bool {
		return u.GetAPIVersion() == "v1" && u.GetKind() == "ConfigMap" && legacyConfig(u)
	})
}

// keepsEveryAddress checks that every MetalLB pool's addresses are its IPPool's, or that a
// CHECK says which were left out and why.
func keepsEveryAddress(t *testing.T, objs []*unstructured.Unstructured, conv Conversion) {
	t.Helper()
	for _, u := range objs {
		if u.GetKind() != "IPAddressPool" {
			continue
		}
		given, _, _ := unstructured.NestedStringSlice(u.Object, "spec", "addresses")
		var o *Object
		for i := range conv.Objects {
			if conv.Objects[i].Kind == "IPPool" && conv.Objects[i].Name == u.GetName() {
				o = &conv.Objects[i]
			}
		}
		if o == nil {
			t.Errorf("IPAddressPool %s gave no IPPool of its name (a Service's metallb.io/address-pool names it)", u.GetName())
			continue
		}
		var want []span
		for _, a := range given {
			s, err := parseSpan(a)
			if err != nil {
				if !hasNotePrefix(*o, fmt.Sprintf("CHECK: %q left out", a)) {
					t.Errorf("pool %s: %q is no address range (%v) and no CHECK says it is left out", u.GetName(), a, err)
				}
				continue
			}
			want = append(want, s)
		}
		var got []span
		for _, r := range o.Spec.(v1alpha1.IPPoolSpec).Addresses {
			s, err := parseSpan(string(r))
			if err != nil {
				t.Fatalf("pool %s: the converter wrote %q: %v", u.GetName(), r, err)
			}
			got = append(got, s)
		}
		if w, g := merged(want), merged(got); !slices.Equal(w, g) {
			t.Errorf("pool %s: MetalLB's addresses %v, the IPPool's %v", u.GetName(), w, g)
		}
		if avoid, _, _ := unstructured.NestedBool(u.Object, "spec", "avoidBuggyIPs"); avoid != o.Spec.(v1alpha1.IPPoolSpec).AvoidBuggyIPs {
			t.Errorf("pool %s: avoidBuggyIPs %v became %v", u.GetName(), avoid, !avoid)
		}
	}
}

// saysWhatChanges checks that what metalvip does differently, where the corpus holds it,
// carries a CHECK: answering on other interfaces, announcing by one mode of two, routes not
// aggregated, peers' settings metalvip does not have.
func saysWhatChanges(t *testing.T, objs []*unstructured.Unstructured, conv Conversion) {
	t.Helper()
	all := strings.Join(conv.General, "\n")
	for _, o := range conv.Objects {
		for _, n := range o.Notes {
			all += "\n" + n.Text
		}
	}
	need := func(what, check string) {
		t.Helper()
		if !strings.Contains(all, check) || !strings.Contains(all, "CHECK:") {
			t.Errorf("%s, and no CHECK says %q", what, check)
		}
	}
	for _, u := range objs {
		spec, _, _ := unstructured.NestedMap(u.Object, "spec")
		if strings.HasSuffix(u.GetKind(), "Advertisement") && !selectsAPool(u, objs) {
			continue // the converter says it selects no pool, and nothing comes of it
		}
		switch u.GetKind() {
		case "L2Advertisement":
			if ifs, _, _ := unstructured.NestedStringSlice(spec, "interfaces"); len(ifs) == 0 {
				need("L2Advertisement "+u.GetName()+" answers on every interface", "every interface")
			}
			if _, ok := spec["serviceSelectors"]; ok {
				need("L2Advertisement "+u.GetName()+" has serviceSelectors", "announces every Service of the pool")
			}
		case "BGPAdvertisement":
			// Kept in a pool's aggregationLength, or a CHECK says why not.
			kept := func(l int64, v6 bool) bool {
				return slices.ContainsFunc(conv.Objects, func(o Object) bool {
					ps, ok := o.Spec.(v1alpha1.IPPoolSpec)
					if !ok || ps.Announce.BGP == nil {
						return false
					}
					got := ps.Announce.BGP.AggregationLength
					if v6 {
						got = ps.Announce.BGP.AggregationLengthV6
					}
					return got != nil && int64(*got) == l
				})
			}
			if l, ok, _ := unstructured.NestedInt64(spec, "aggregationLength"); ok && l < 32 && holdsFamily(u, objs, true) && !kept(l, false) {
				need("BGPAdvertisement "+u.GetName()+" aggregates IPv4 routes and no pool does", "prefix lengths")
			}
			if l, ok, _ := unstructured.NestedInt64(spec, "aggregationLengthV6"); ok && l < 128 && holdsFamily(u, objs, false) && !kept(l, true) {
				need("BGPAdvertisement "+u.GetName()+" aggregates IPv6 routes and no pool does", "prefix lengths")
			}
			if ps, _, _ := unstructured.NestedStringSlice(spec, "peers"); len(ps) > 0 {
				need("BGPAdvertisement "+u.GetName()+" goes to some peers only", "advertised only to the peers")
			}
			if _, ok := spec["serviceSelectors"]; ok {
				need("BGPAdvertisement "+u.GetName()+" has serviceSelectors", "announces every Service of the pool")
			}
		case "BGPPeer":
			for field, check := range map[string]string{
				"vrf": "peered in VRF", "routerID": "sent router ID",
			} {
				if v, ok := spec[field]; ok && v != "" {
					need("BGPPeer "+u.GetName()+" sets "+field, check)
				}
			}
			// Kept: the peer says the same, or a CHECK says why not.
			var peer *v1alpha1.BGPPeerSpec
			for _, o := range conv.Objects {
				if ps, ok := o.Spec.(v1alpha1.BGPPeerSpec); ok && o.Kind == "BGPPeer" && o.Name == u.GetName() {
					peer = &ps
				}
			}
			if v, _ := spec["sourceAddress"].(string); v != "" && peer != nil && peer.SourceAddress != v {
				need("BGPPeer "+u.GetName()+" sets sourceAddress "+v+" and the peer does not", "sourceAddress")
			}
			if v, _ := spec["connectTime"].(string); v != "" && peer != nil && peer.ConnectRetrySeconds == nil {
				need("BGPPeer "+u.GetName()+" sets connectTime "+v+" and the peer has no connectRetrySeconds", "connectTime")
			}
		case "Community":
			cs, _, _ := unstructured.NestedSlice(spec, "communities")
			for _, c := range cs {
				v, _, _ := unstructured.NestedString(c.(map[string]any), "value")
				if !strings.HasPrefix(v, "large:") || !communityUsed(c.(map[string]any), objs) {
					continue
				}
				// Kept in a pool's largeCommunities, or a CHECK says why not.
				kept := slices.ContainsFunc(conv.Objects, func(o Object) bool {
					ps, ok := o.Spec.(v1alpha1.IPPoolSpec)
					return ok && ps.Announce.BGP != nil && slices.Contains(ps.Announce.BGP.LargeCommunities, strings.TrimPrefix(v, "large:"))
				})
				if !kept {
					need("Community "+u.GetName()+" has the large community "+v+", used, and no pool keeps it", "large community")
				}
			}
		}
	}
	for _, pool := range poolsOf(objs) {
		if announcedBy(pool, objs, "L2Advertisement") && announcedBy(pool, objs, "BGPAdvertisement") {
			need("pool "+pool.GetName()+" is announced by L2 and by BGP", "both by L2")
		}
	}
}

func poolsOf(objs []*unstructured.Unstructured) []*unstructured.Unstructured {
	var out []*unstructured.Unstructured
	for _, u := range objs {
		if u.GetKind() == "IPAddressPool" {
			out = append(out, u)
		}
	}
	return out
}

// announcedBy reports whether an advertisement of kind selects pool: by name, by label
// (matchLabels only; the corpus uses nothing else to select pools) or by selecting every pool.
func announcedBy(pool *unstructured.Unstructured, objs []*unstructured.Unstructured, kind string) bool {
	for _, u := range objs {
		if u.GetKind() == kind && selects(u, pool) {
			return true
		}
	}
	return false
}

func selectsAPool(ad *unstructured.Unstructured, objs []*unstructured.Unstructured) bool {
	return slices.ContainsFunc(poolsOf(objs), func(p *unstructured.Unstructured) bool { return selects(ad, p) })
}

func selects(ad, pool *unstructured.Unstructured) bool {
	names, _, _ := unstructured.NestedStringSlice(ad.Object, "spec", "ipAddressPools")
	sels, _, _ := unstructured.NestedSlice(ad.Object, "spec", "ipAddressPoolSelectors")
	if len(names) == 0 && len(sels) == 0 {
		return true
	}
	if slices.Contains(names, pool.GetName()) {
		return true
	}
	for _, s := range sels {
		ml, _, _ := unstructured.NestedStringMap(s.(map[string]any), "matchLabels")
		if len(ml) == 0 {
			continue
		}
		all := true
		for k, v := range ml {
			all = all && pool.GetLabels()[k] == v
		}
		if all {
			return true
		}
	}
	return false
}

// holdsFamily reports whether a pool the advertisement selects holds IPv4 (v4) or IPv6
// addresses.
func holdsFamily(ad *unstructured.Unstructured, objs []*unstructured.Unstructured, v4 bool) bool {
	for _, p := range poolsOf(objs) {
		if !selects(ad, p) {
			continue
		}
		as, _, _ := unstructured.NestedStringSlice(p.Object, "spec", "addresses")
		for _, a := range as {
			if s, err := parseSpan(a); err == nil && s.from.Is4() == v4 {
				return true
			}
		}
	}
	return false
}

// communityUsed reports whether an advertisement names the alias of c.
func communityUsed(c map[string]any, objs []*unstructured.Unstructured) bool {
	name, _, _ := unstructured.NestedString(c, "name")
	for _, u := range objs {
		if u.GetKind() != "BGPAdvertisement" {
			continue
		}
		cs, _, _ := unstructured.NestedStringSlice(u.Object, "spec", "communities")
		if slices.Contains(cs, name) {
			return true
		}
	}
	return false
}

func hasNotePrefix(o Object, prefix string) bool {
	return slices.ContainsFunc(o.Notes, func(n Note) bool { return strings.HasPrefix(n.Text, prefix) })
}

// span is an inclusive address range.
type span struct{ from, to netip.Addr }

func (s span) String() string { return s.from.String() + "-" + s.to.String() }

// parseSpan reads a CIDR (host bits ignored, as MetalLB's parser does), "a-b" or "a - b".
func parseSpan(s string) (span, error) {
	s = strings.TrimSpace(s)
	if p, err := netip.ParsePrefix(s); err == nil {
		p = p.Masked()
		// The last address: every host bit set.
		b := p.Addr().AsSlice()
		host := p.Addr().BitLen() - p.Bits()
		for i := len(b) - 1; i >= 0 && host > 0; i-- {
			k := min(host, 8)
			b[i] |= byte(1<<k - 1)
			host -= k
		}
		last, _ := netip.AddrFromSlice(b)
		return span{p.Addr(), last}, nil
	}
	a, b, ok := strings.Cut(s, "-")
	if !ok {
		return span{}, fmt.Errorf("neither a CIDR nor a range")
	}
	from, err := netip.ParseAddr(strings.TrimSpace(a))
	if err != nil {
		return span{}, err
	}
	to, err := netip.ParseAddr(strings.TrimSpace(b))
	if err != nil {
		return span{}, err
	}
	if to.Less(from) || from.Is4() != to.Is4() {
		return span{}, fmt.Errorf("an empty range")
	}
	return span{from, to}, nil
}

// merged sorts spans and joins those that overlap or touch.
func merged(ss []span) []span {
	ss = slices.Clone(ss)
	slices.SortFunc(ss, func(a, b span) int { return a.from.Compare(b.from) })
	var out []span
	for _, s := range ss {
		if n := len(out); n > 0 && out[n-1].from.Is4() == s.from.Is4() && (!out[n-1].to.Next().IsValid() || !out[n-1].to.Next().Less(s.from)) {
			if out[n-1].to.Less(s.to) {
				out[n-1].to = s.to
			}
			continue
		}
		out = append(out, s)
	}
	return out
}
