package metallb

import (
	"cmp"
	"fmt"
	"slices"
	"time"

	"github.com/metalvip/metalvip/api/v1alpha1"
	"github.com/metalvip/metalvip/internal/agentapi"
)

// convertPeer makes one BGPPeer. skipped, when not empty, says why there is none.
func convertPeer(p mlbPeer, in Config, passwordNamespace string) (o Object, skipped string) {
	ref := fmt.Sprintf("BGPPeer %s/%s", in.Namespace, p.Meta.Name)
	o = Object{Kind: "BGPPeer", Name: p.Meta.Name, From: ref}
	add := func(path, format string, args ...any) {
		o.Notes = append(o.Notes, Note{path, fmt.Sprintf(format, args...)})
	}
	sp := p.Spec
	switch {
	case sp.Interface != "" && sp.PeerAddress != "":
		return o, fmt.Sprintf("%s not converted: it gives both peerAddress and interface, which MetalLB refuses too: keep one", ref)
	case sp.Interface != "":
		if err := agentapi.CheckInterfaceName(sp.Interface); err != nil {
			return o, fmt.Sprintf("%s not converted: interface: %v", ref, err)
		}
	case sp.PeerAddress == "":
		return o, fmt.Sprintf("%s not converted: it has no peerAddress", ref)
	case sp.MyASN == 0:
		return o, fmt.Sprintf("%s not converted: myASN is 0", ref)
	}
	spec := v1alpha1.BGPPeerSpec{Address: sp.PeerAddress, Interface: sp.Interface, MyASN: int64(sp.MyASN), GracefulRestart: sp.EnableGracefulRestart}
	if sp.Interface != "" {
		add("spec.interface", "MetalLB's unnumbered session over %s: metalvip peers with the link's one link-local neighbour too, carries IPv4 and IPv6 over it, and sends Router Advertisements (lifetime 0) on the link as MetalLB's FRR did", sp.Interface)
	}
	if sp.LocalASN != 0 {
		spec.MyASN = int64(sp.LocalASN)
		add("spec.myASN", "MetalLB's localASN %d, the AS the router sees (metalvip's ASN is per peer already; MetalLB's myASN was %d)", sp.LocalASN, sp.MyASN)
	}
	switch {
	case sp.PeerASN != 0:
		spec.PeerASN = int64(sp.PeerASN)
	case sp.DynamicASN == "internal":
		spec.PeerASN = int64(sp.MyASN)
		add("spec.peerASN", "MetalLB's dynamicASN internal: the router is in the nodes' own AS")
	case sp.DynamicASN != "":
		return o, fmt.Sprintf("%s not converted: dynamicASN %s accepts a router of any other AS, and a metalvip BGPPeer needs the router's AS number: convert it by hand with peerASN", ref, sp.DynamicASN)
	default:
		return o, fmt.Sprintf("%s not converted: it gives neither peerASN nor dynamicASN", ref)
	}
	if sp.PeerPort != 0 && sp.PeerPort != 179 {
		port := int32(sp.PeerPort)
		spec.Port = &port
	}
	hold := int32(90)
	if d := sp.KeepaliveTime; sp.HoldTime == nil && d != nil {
		// MetalLB takes three keepalives as the hold time when none is given (its
		// parseTimers); metalvip's default is 90 s whatever the keepalive.
		if k, _ := seconds(d.Duration); k > 0 && 3*k <= 65535 {
			h := 3 * k
			spec.HoldTimeSeconds = &h
			hold = h
			add("spec.holdTimeSeconds", "MetalLB's hold time: three times its keepaliveTime %s, as MetalLB takes it when no holdTime is given", d.Duration)
		}
	}
	if d := sp.HoldTime; d != nil {
		h, whole := seconds(d.Duration)
		if !whole {
			add("spec.holdTimeSeconds", "MetalLB's holdTime %s, in whole seconds", d.Duration)
		}
		if h != 0 && h < 3 || h > 65535 {
			add("spec.holdTimeSeconds", "CHECK: MetalLB's holdTime %s left out: give 0 or 3 to 65535 seconds; the default is 90", d.Duration)
		} else {
			spec.HoldTimeSeconds = &h
			hold = h
		}
	}
	if d := sp.KeepaliveTime; d != nil {
		k, whole := seconds(d.Duration)
		switch {
		case k < 0 || k > 21845 || k*3 > hold:
			add("spec.keepaliveSeconds", "CHECK: MetalLB's keepaliveTime %s left out: metalvip wants at most a third of the hold time (%ds), and takes a third by default", d.Duration, hold)
		default:
			if !whole {
				add("spec.keepaliveSeconds", "MetalLB's keepaliveTime %s, in whole seconds", d.Duration)
			}
			spec.KeepaliveSeconds = &k
		}
	}
	if sp.EBGPMultiHop && sp.Interface != "" {
		add("spec", "MetalLB's ebgpMultiHop left out: an unnumbered router is on the link, one hop away")
	} else if sp.EBGPMultiHop {
		hops := int32(255)
		spec.EBGPMultihop = &hops
		add("spec.ebgpMultihop", "MetalLB's ebgpMultiHop allows a router any number of hops away")
	}
	if len(sp.NodeSelectors) > 0 {
		sel, exact := mergeSelectors(sp.NodeSelectors)
		spec.NodeSelector = apiSelector(sel)
		if !exact {
			add("spec.nodeSelector", "CHECK: MetalLB peered from nodes matching any of %s; metalvip takes one selector, the first is kept. Give those nodes one common label and select it", formatSelectors(sp.NodeSelectors))
		}
	}
	switch {
	case sp.PasswordSecret.Name != "":
		ns := cmp.Or(sp.PasswordSecret.Namespace, in.Namespace)
		spec.PasswordSecretRef = &v1alpha1.SecretKeyRef{Namespace: passwordNamespace, Name: sp.PasswordSecret.Name, Key: "password"}
		add("spec.passwordSecretRef", "CHECK: the CCM reads passwords only in %s: copy MetalLB's Secret there before applying, or the session stays down:\n"+
			"kubectl -n %s create secret generic %s --from-literal=password=\"$(kubectl -n %s get secret %s -o jsonpath='{.data.password}' | base64 -d)\"",
			passwordNamespace, passwordNamespace, sp.PasswordSecret.Name, ns, sp.PasswordSecret.Name)
		if sp.Password != "" {
			add("spec.passwordSecretRef", "CHECK: MetalLB's BGPPeer also gives a password in plain text; the Secret is used")
		}
	case sp.Password != "":
		name := p.Meta.Name + "-password"
		spec.PasswordSecretRef = &v1alpha1.SecretKeyRef{Namespace: passwordNamespace, Name: name, Key: "password"}
		add("spec.passwordSecretRef", "CHECK: MetalLB's BGPPeer holds the password in plain text (not printed here); put it in a Secret before applying, or the session stays down:\n"+
			"kubectl -n %s create secret generic %s --from-literal=password=\"$(kubectl -n %s get bgppeers.metallb.io %s -o jsonpath='{.spec.password}')\"",
			passwordNamespace, name, in.Namespace, p.Meta.Name)
	}
	if sp.BFDProfile != "" {
		convertBFD(&spec, sp.BFDProfile, in.bfdProfiles, add)
	}
	if sp.SourceAddress != "" && sp.Interface != "" {
		add("spec", "CHECK: MetalLB's sourceAddress %s left out: an unnumbered session runs from the node's link-local address on %s", sp.SourceAddress, sp.Interface)
	} else if sp.SourceAddress != "" {
		spec.SourceAddress = sp.SourceAddress
		if len(sp.NodeSelectors) == 0 {
			add("spec.sourceAddress", "CHECK: MetalLB opened the session from %s on every node; metalvip does too, and a node that does not hold the address refuses the peer (an Event says so): select the node that holds it", sp.SourceAddress)
		} else {
			add("spec.sourceAddress", "MetalLB opened the session from %s; so does metalvip, on the nodes selected that hold it (the others refuse the peer and say so)", sp.SourceAddress)
		}
	}
	if sp.RouterID != "" {
		add("spec", "CHECK: MetalLB sent router ID %s; metalvip sends the node's own", sp.RouterID)
	}
	if d := sp.ConnectTime; d != nil {
		c, whole := seconds(d.Duration)
		switch {
		case c < 1 || c > 65535:
			add("spec.connectRetrySeconds", "CHECK: MetalLB's connectTime %s left out: give 1 to 65535 seconds; the default is 5", d.Duration)
		default:
			if !whole {
				add("spec.connectRetrySeconds", "MetalLB's connectTime %s, in whole seconds", d.Duration)
			}
			spec.ConnectRetrySeconds = &c
		}
	}
	if sp.VRF != "" {
		add("spec", "CHECK: MetalLB peered in VRF %s; metalvip peers in the nodes' default VRF", sp.VRF)
	}
	if sp.DualStackAddressFamily && sp.Interface == "" {
		add("spec", "CHECK: MetalLB carried both address families over this session; metalvip's carries only the family of the router's address: add a BGPPeer at the router's other address for the other family")
	}
	o.Spec = spec
	return o, ""
}

// convertBFD merges a BFD profile into the peer's bfd settings.
func convertBFD(spec *v1alpha1.BGPPeerSpec, name string, profiles []mlbBFDProfile, add func(string, string, ...any)) {
	i := slices.IndexFunc(profiles, func(p mlbBFDProfile) bool { return p.Meta.Name == name })
	if i < 0 {
		add("spec", "CHECK: BFD profile %q does not exist, so MetalLB ran no BFD for this session and neither does metalvip", name)
		return
	}
	if spec.EBGPMultihop != nil {
		add("spec", "CHECK: BFD profile %s left out: metalvip's BFD is single-hop and this router is multihop", name)
		return
	}
	bp := profiles[i].Spec
	bfd := &v1alpha1.BFDSettings{Enabled: true}
	ms := func(v *uint32) *int32 {
		if v == nil {
			return nil
		}
		x := int32(min(*v, 1<<31-1))
		return &x
	}
	bfd.MinRxMilliseconds, bfd.MinTxMilliseconds, bfd.Multiplier = ms(bp.ReceiveInterval), ms(bp.TransmitInterval), ms(bp.DetectMultiplier)
	add("spec.bfd", "from BFD profile %s", name)
	if bp.EchoMode != nil && *bp.EchoMode { // an echo interval alone, echo off, sends none
		add("spec.bfd", "CHECK: the profile's echo mode is not kept: metalvip sends no BFD echo packets")
	}
	if bp.PassiveMode != nil && *bp.PassiveMode {
		add("spec.bfd", "CHECK: the profile is passive; metalvip's BFD sessions are active")
	}
	if bp.MinimumTTL != nil {
		add("spec.bfd", "the profile's minimumTtl applies to multihop sessions only; metalvip's BFD is single-hop")
	}
	spec.BFD = bfd
}

// seconds returns d in whole seconds, and whether it was whole.
func seconds(d time.Duration) (int32, bool) {
	s := d / time.Second
	return int32(min(s, 1<<31-1)), d%time.Second == 0
}
