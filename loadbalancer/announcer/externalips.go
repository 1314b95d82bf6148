package announcer

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/klog/v2"

	"github.com/metalvip/metalvip/loadbalancer/desired"
	"github.com/metalvip/metalvip/loadbalancer/report"
)

// ConditionExternalIPs is the Service condition that says which of its spec.externalIPs are
// announced, and why the others are not.
const ConditionExternalIPs = "metalvip.io/ExternalIPsAnnounced"

// lbHolder returns the Service (not key) whose LoadBalancer status shows ip, or "".
func (a *Announcer) lbHolder(ip netip.Addr, key string) string {
	s := &a.loop
	for _, k := range s.shown.services[ip] {
		if k != key && !slices.Contains(s.extIPs[k], ip) {
			return k
		}
	}
	return ""
}

// externalIPsCondition is the ExternalIPsAnnounced condition of a Service of generation gen
// whose externalIPs ext are announced and refused are not; asks is false when it asks for none
// (ext and refused empty: the condition goes).
func externalIPsCondition(gen int64, ext []netip.Addr, refused []desired.ExternalIPRefusal) (c metav1.Condition, asks bool) {
	if len(ext) == 0 && len(refused) == 0 {
		return c, false
	}
	c = metav1.Condition{Type: ConditionExternalIPs, Status: metav1.ConditionTrue, Reason: "Announced", ObservedGeneration: gen}
	var ips []string
	for _, ip := range ext {
		ips = append(ips, ip.String())
	}
	c.Message = "Announced: " + strings.Join(ips, ", ")
	if len(ext) == 0 {
		c.Message = "None announced"
	}
	if len(refused) > 0 {
		var why []string
		for _, r := range refused {
			why = append(why, fmt.Sprintf("%s: %s", r.IP, r.Reason))
		}
		c.Status, c.Reason = metav1.ConditionFalse, "Refused"
		c.Message += "; refused: " + strings.Join(why, "; ")
	}
	return c, true
}

// externalIPsStatus warns once per refusal with an Event and sets the Service's
// ExternalIPsAnnounced condition when it changed. ext and refused both empty: the Service no
// longer asks, and the condition goes.
func (a *Announcer) externalIPsStatus(svc *v1.Service, ext []netip.Addr, refused []desired.ExternalIPRefusal) {
	s := &a.loop
	key := desired.Key(svc)
	for _, r := range refused {
		a.warnOnce("ext-refused/"+key+"/"+r.IP, r.Reason, func() {
			klog.V(2).InfoS("externalIP not announced", "service", key, "externalIP", r.IP, "holder", r.Holder, "reason", r.Reason)
			a.cfg.Recorder.Eventf(svc, v1.EventTypeWarning, report.ReasonExternalIPRefused, "externalIP %s is not announced: %s", r.IP, r.Reason)
		})
	}
	c, asks := externalIPsCondition(svc.Generation, ext, refused)
	c.Type = ConditionExternalIPs
	a.ownCondition(svc, s.extSaid, c, asks, report.ManagerExternalIPs)
}

// communitiesRefused warns once per change, with an Event, that the Service asks for BGP
// communities its pool does not allow (desired.ServiceCommunities); refused "" forgets it.
func (a *Announcer) communitiesRefused(svc *v1.Service, refused string) {
	key := "bgp-communities/" + desired.Key(svc)
	if refused == "" {
		a.tell.forget(key)
		return
	}
	a.warnOnce(key, refused, func() {
		klog.V(2).InfoS("BGP communities refused", "service", desired.Key(svc), "reason", refused)
		a.cfg.Recorder.Eventf(svc, v1.EventTypeWarning, report.ReasonBGPCommunityRefused, "%s; the routes carry the others", refused)
	})
}
