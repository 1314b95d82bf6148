package metallb

import (
	"encoding/json"
	"fmt"
	"reflect"
	"slices"
	"strings"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
)

// MetalLB's configuration objects (go.universe.tf/metallb/api v0.16: IPAddressPool,
// L2Advertisement, BGPAdvertisement, Community and BFDProfile in metallb.io/v1beta1, BGPPeer in
// metallb.io/v1beta2), decoded here rather than imported: metalvip's own module does not
// depend on MetalLB's. test/migration creates these objects against the CRDs generated from
// MetalLB's Go types with unknown fields refused, so a field spelt differently here fails it.
const metalLBGroup = "metallb.io"

type mlbMeta struct {
	Name      string            `json:"name"`
	Namespace string            `json:"namespace,omitempty"`
	Labels    map[string]string `json:"labels,omitempty"`
}

type mlbPool struct {
	Meta mlbMeta `json:"metadata"`
	Spec struct {
		Addresses         []string              `json:"addresses"`
		AutoAssign        *bool                 `json:"autoAssign,omitempty"`
		AvoidBuggyIPs     bool                  `json:"avoidBuggyIPs,omitempty"`
		ServiceAllocation *mlbServiceAllocation `json:"serviceAllocation,omitempty"`
	} `json:"spec"`
}

type mlbServiceAllocation struct {
	Priority           int                    `json:"priority,omitempty"`
	Namespaces         []string               `json:"namespaces,omitempty"`
	NamespaceSelectors []metav1.LabelSelector `json:"namespaceSelectors,omitempty"`
	ServiceSelectors   []metav1.LabelSelector `json:"serviceSelectors,omitempty"`
}

// mlbPoolSelection is how an advertisement picks pools; shared by both kinds.
type mlbPoolSelection struct {
	IPAddressPools         []string               `json:"ipAddressPools,omitempty"`
	IPAddressPoolSelectors []metav1.LabelSelector `json:"ipAddressPoolSelectors,omitempty"`
}

type mlbL2Advertisement struct {
	Meta mlbMeta `json:"metadata"`
	Spec struct {
		mlbPoolSelection
		NodeSelectors          []metav1.LabelSelector     `json:"nodeSelectors,omitempty"`
		Interfaces             []string                   `json:"interfaces,omitempty"`
		ServiceSelectors       []metav1.LabelSelector     `json:"serviceSelectors,omitempty"`
		PreferredNodeSelectors []mlbPreferredNodeSelector `json:"preferredNodeSelectors,omitempty"`
	} `json:"spec"`
}

type mlbPreferredNodeSelector struct {
	Weight     int32                `json:"weight"`
	Preference metav1.LabelSelector `json:"preference"`
}

type mlbBGPAdvertisement struct {
	Meta mlbMeta `json:"metadata"`
	Spec struct {
		mlbPoolSelection
		AggregationLength   *int32                 `json:"aggregationLength,omitempty"`
		AggregationLengthV6 *int32                 `json:"aggregationLengthV6,omitempty"`
		LocalPref           uint32                 `json:"localPref,omitempty"`
		AsPathPrepend       uint8                  `json:"asPathPrepend,omitempty"`
		Communities         []string               `json:"communities,omitempty"`
		NodeSelectors       []metav1.LabelSelector `json:"nodeSelectors,omitempty"`
		Peers               []string               `json:"peers,omitempty"`
		ServiceSelectors    []metav1.LabelSelector `json:"serviceSelectors,omitempty"`
	} `json:"spec"`
}

type mlbPeer struct {
	Meta mlbMeta `json:"metadata"`
	Spec struct {
		MyASN                  uint32                 `json:"myASN"`
		PeerASN                uint32                 `json:"peerASN,omitempty"`
		LocalASN               uint32                 `json:"localASN,omitempty"`
		DynamicASN             string                 `json:"dynamicASN,omitempty"`
		PeerAddress            string                 `json:"peerAddress,omitempty"`
		Interface              string                 `json:"interface,omitempty"`
		SourceAddress          string                 `json:"sourceAddress,omitempty"`
		PeerPort               uint16                 `json:"peerPort,omitempty"`
		HoldTime               *metav1.Duration       `json:"holdTime,omitempty"`
		KeepaliveTime          *metav1.Duration       `json:"keepaliveTime,omitempty"`
		ConnectTime            *metav1.Duration       `json:"connectTime,omitempty"`
		RouterID               string                 `json:"routerID,omitempty"`
		NodeSelectors          []metav1.LabelSelector `json:"nodeSelectors,omitempty"`
		Password               string                 `json:"password,omitempty"`
		PasswordSecret         mlbSecretReference     `json:"passwordSecret,omitzero"`
		BFDProfile             string                 `json:"bfdProfile,omitempty"`
		EnableGracefulRestart  bool                   `json:"enableGracefulRestart,omitempty"`
		EBGPMultiHop           bool                   `json:"ebgpMultiHop,omitempty"`
		VRF                    string                 `json:"vrf,omitempty"`
		DisableMP              bool                   `json:"disableMP,omitempty"`
		DualStackAddressFamily bool                   `json:"dualStackAddressFamily,omitempty"`
	} `json:"spec"`
}

type mlbSecretReference struct {
	Name      string `json:"name,omitempty"`
	Namespace string `json:"namespace,omitempty"`
}

type mlbCommunity struct {
	Meta mlbMeta `json:"metadata"`
	Spec struct {
		Communities []struct {
			Name  string `json:"name,omitempty"`
			Value string `json:"value,omitempty"`
		} `json:"communities,omitempty"`
	} `json:"spec"`
}

type mlbBFDProfile struct {
	Meta mlbMeta `json:"metadata"`
	Spec struct {
		ReceiveInterval  *uint32 `json:"receiveInterval,omitempty"`
		TransmitInterval *uint32 `json:"transmitInterval,omitempty"`
		DetectMultiplier *uint32 `json:"detectMultiplier,omitempty"`
		EchoInterval     *uint32 `json:"echoInterval,omitempty"`
		EchoMode         *bool   `json:"echoMode,omitempty"`
		PassiveMode      *bool   `json:"passiveMode,omitempty"`
		MinimumTTL       *uint32 `json:"minimumTtl,omitempty"`
	} `json:"spec"`
}

// Config is MetalLB's configuration in one namespace, as read from a cluster or files. The
// zero value with Namespace set is empty; Add, ReadFiles and ReadCluster fill it.
type Config struct {
	Namespace   string // MetalLB's namespace: objects of another are not its configuration
	pools       []mlbPool
	l2          []mlbL2Advertisement
	bgp         []mlbBGPAdvertisement
	peers       []mlbPeer
	communities []mlbCommunity
	bfdProfiles []mlbBFDProfile
	namespaces  []kubeNamespace // nil: not known (files without Namespace objects)
	// lbClass is the loadBalancerClass MetalLB served alone (its controller's --lb-class), ""
	// when none or not known.
	lbClass string
	// unknown lists fields this converter does not know, per object: a newer MetalLB's, to
	// be reported rather than dropped unseen.
	unknown map[string][]string
}

// kubeNamespace is what the converter needs of a Namespace: MetalLB resolves a pool's
// namespaceSelectors against them.
type kubeNamespace struct {
	Name   string
	Labels map[string]string
}

// metalLBKinds are the kinds the converter reads, with the version and resource it lists them
// at.
var metalLBKinds = map[string]struct{ version, resource string }{
	"IPAddressPool":    {"v1beta1", "ipaddresspools"},
	"L2Advertisement":  {"v1beta1", "l2advertisements"},
	"BGPAdvertisement": {"v1beta1", "bgpadvertisements"},
	"BGPPeer":          {"v1beta2", "bgppeers"},
	"Community":        {"v1beta1", "communities"},
	"BFDProfile":       {"v1beta1", "bfdprofiles"},
}

// Add decodes one MetalLB object of a kind the converter reads into the configuration.
func (c *Config) Add(u *unstructured.Unstructured) error {
	kind := u.GetKind()
	ref := fmt.Sprintf("%s %s/%s", kind, u.GetNamespace(), u.GetName())
	if u.GetName() == "" {
		return fmt.Errorf("a %s without a name", kind)
	}
	var into any
	switch kind {
	case "IPAddressPool":
		c.pools = append(c.pools, mlbPool{})
		into = &c.pools[len(c.pools)-1]
	case "L2Advertisement":
		c.l2 = append(c.l2, mlbL2Advertisement{})
		into = &c.l2[len(c.l2)-1]
	case "BGPAdvertisement":
		c.bgp = append(c.bgp, mlbBGPAdvertisement{})
		into = &c.bgp[len(c.bgp)-1]
	case "BGPPeer":
		c.peers = append(c.peers, mlbPeer{})
		into = &c.peers[len(c.peers)-1]
	case "Community":
		c.communities = append(c.communities, mlbCommunity{})
		into = &c.communities[len(c.communities)-1]
	case "BFDProfile":
		c.bfdProfiles = append(c.bfdProfiles, mlbBFDProfile{})
		into = &c.bfdProfiles[len(c.bfdProfiles)-1]
	default:
		return fmt.Errorf("%s: not a kind the converter reads", ref)
	}
	spec, _ := u.Object["spec"].(map[string]any)
	raw, err := json.Marshal(map[string]any{"metadata": u.Object["metadata"], "spec": spec})
	if err == nil {
		err = json.Unmarshal(raw, into)
	}
	if err != nil {
		return fmt.Errorf("%s does not decode as MetalLB's %s: %w", ref, kind, err)
	}
	specType := reflect.TypeOf(into).Elem()
	if f, ok := specType.FieldByName("Spec"); ok {
		if unknown := unknownFields(spec, f.Type, "spec"); len(unknown) > 0 {
			if c.unknown == nil {
				c.unknown = map[string][]string{}
			}
			c.unknown[kind+"/"+u.GetName()] = unknown
		}
	}
	return nil
}

// unknownFields lists the paths in obj that t has no field for.
func unknownFields(obj any, t reflect.Type, path string) []string {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	var out []string
	switch t.Kind() {
	case reflect.Struct:
		m, ok := obj.(map[string]any)
		if !ok {
			return nil
		}
		fields := jsonFields(t)
		for k, v := range m {
			ft, ok := fields[k]
			if !ok {
				out = append(out, path+"."+k)
				continue
			}
			out = append(out, unknownFields(v, ft, path+"."+k)...)
		}
	case reflect.Slice:
		items, ok := obj.([]any)
		if !ok {
			return nil
		}
		for i, v := range items {
			out = append(out, unknownFields(v, t.Elem(), fmt.Sprintf("%s[%d]", path, i))...)
		}
	}
	slices.Sort(out)
	return out
}

// jsonFields maps the JSON names of a struct's fields (inline ones included) to their types.
// metav1.Duration is a string on the wire and has no fields to look into.
func jsonFields(t reflect.Type) map[string]reflect.Type {
	out := map[string]reflect.Type{}
	for i := range t.NumField() {
		f := t.Field(i)
		tag := f.Tag.Get("json")
		name, opts, _ := strings.Cut(tag, ",")
		if f.Anonymous && (name == "" || strings.Contains(opts, "inline")) {
			for k, v := range jsonFields(f.Type) {
				out[k] = v
			}
			continue
		}
		if name == "" || name == "-" {
			continue
		}
		ft := f.Type
		if ft == reflect.TypeFor[metav1.Duration]() || ft == reflect.TypeFor[*metav1.Duration]() {
			ft = reflect.TypeFor[string]()
		}
		out[name] = ft
	}
	return out
}
