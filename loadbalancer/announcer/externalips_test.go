package announcer

import (
	"net/netip"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/metalvip/metalvip/loadbalancer/desired"
)

// TestTheExternalIPsConditionSaysWhatIsAnnouncedAndWhyNotTheRest.
func TestTheExternalIPsConditionSaysWhatIsAnnouncedAndWhyNotTheRest(t *testing.T) {
	a, b := netip.MustParseAddr("203.0.113.10"), netip.MustParseAddr("2001:db8::10")
	held := desired.ExternalIPRefusal{IP: "203.0.113.11", Reason: "it is the LoadBalancer address of web/other"}
	for _, tc := range []struct {
		name    string
		ext     []netip.Addr
		refused []desired.ExternalIPRefusal
		asks    bool
		status  metav1.ConditionStatus
		reason  string
		message string
	}{
		{"asks for none: no condition", nil, nil, false, "", "", ""},
		{"all announced", []netip.Addr{a, b}, nil, true, metav1.ConditionTrue, "Announced", "Announced: 203.0.113.10, 2001:db8::10"},
		{"one refused", []netip.Addr{a}, []desired.ExternalIPRefusal{held}, true, metav1.ConditionFalse, "Refused",
			"Announced: 203.0.113.10; refused: 203.0.113.11: it is the LoadBalancer address of web/other"},
		{"all refused", nil, []desired.ExternalIPRefusal{held}, true, metav1.ConditionFalse, "Refused",
			"None announced; refused: 203.0.113.11: it is the LoadBalancer address of web/other"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, asks := externalIPsCondition(7, tc.ext, tc.refused)
			if asks != tc.asks || c.Status != tc.status || c.Reason != tc.reason || c.Message != tc.message {
				t.Fatalf("asks %v, %s %s %q; want asks %v, %s %s %q", asks, c.Status, c.Reason, c.Message, tc.asks, tc.status, tc.reason, tc.message)
			}
			if asks && (c.Type != ConditionExternalIPs || c.ObservedGeneration != 7) {
				t.Errorf("type %q generation %d", c.Type, c.ObservedGeneration)
			}
		})
	}
}
