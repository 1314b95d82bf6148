package ipam

import (
	"errors"
	"net/netip"
	"strings"
	"testing"
)

// TestFault8AConflictToldToATenantNamesNoServiceOfAnotherNamespace (issue 30, fault 8): the
// text of a conflict for the Service's owner (Error.For) names a holder only of the Service's
// own namespace; the error itself, which goes to the CCM's log, names it whatever its
// namespace.
func TestFault8AConflictToldToATenantNamesNoServiceOfAnotherNamespace(t *testing.T) {
	a := newAlloc(t, Pool{Name: "p", Ranges: mustRanges(t, "203.0.113.0/28"), AutoAssign: true})
	for _, s := range []Service{
		svc("bank/ledger", withIPs("203.0.113.1")),
		svc("bank/vault", withIPs("203.0.113.2"), withKey("web")),
		svc("shop/cart", withIPs("203.0.113.2"), withKey("web"), withPorts(Port{"TCP", 443})),
	} {
		if _, err := a.Assign(s); err != nil {
			t.Fatal(err)
		}
	}
	local := func(s *Service) { s.LocalTraffic = true }
	for _, tc := range []struct {
		name  string
		err   func() error
		kind  error
		ns    string
		named []string // holders the text names; every other bank/ or shop/ key must be absent
	}{
		{"an address held in another namespace", func() error { _, err := a.Assign(svc("tenant/x", withIPs("203.0.113.1"))); return err }, ErrInUse, "tenant", nil},
		{"an address held in the same namespace", func() error { _, err := a.Assign(svc("bank/x", withIPs("203.0.113.1"))); return err }, ErrInUse, "bank", []string{"bank/ledger"}},
		{"an address shared under another key in another namespace", func() error {
			_, err := a.Assign(svc("tenant/x", withIPs("203.0.113.2"), withKey("db")))
			return err
		}, ErrInUse, "tenant", nil},
		{"an address shared with another traffic policy in another namespace", func() error {
			_, err := a.Assign(svc("tenant/x", withIPs("203.0.113.2"), withKey("web"), withPorts(Port{"TCP", 8080}), local))
			return err
		}, ErrSharing, "tenant", nil},
		{"a port used on a shared address in another namespace", func() error {
			_, err := a.Assign(svc("tenant/x", withIPs("203.0.113.2"), withKey("web")))
			return err
		}, ErrSharing, "tenant", nil},
		{"a port used on a shared address in the same namespace", func() error {
			_, err := a.Assign(svc("shop/x", withIPs("203.0.113.2"), withKey("web"), withPorts(Port{"TCP", 443})))
			return err
		}, ErrSharing, "shop", []string{"shop/cart"}},
		{"a restored status showing an address held by Services of two namespaces", func() error {
			return a.Restore(svc("shop/y", withPorts(Port{"TCP", 443})), Allocation{Pool: "p", IPs: []netip.Addr{ip("203.0.113.2")}})
		}, ErrConflict, "shop", []string{"shop/cart"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.err()
			var e *Error
			if !errors.Is(err, tc.kind) || !errors.As(err, &e) {
				t.Fatalf("got %v, want %v", err, tc.kind)
			}
			if !strings.Contains(e.Error(), e.Holder) || e.Holder == "" {
				t.Errorf("the error for the log %q does not name the holder %q", e.Error(), e.Holder)
			}
			told := e.For(tc.ns)
			for _, k := range []string{"bank/ledger", "bank/vault", "shop/cart"} {
				named := false
				for _, n := range tc.named {
					named = named || n == k
				}
				if named != strings.Contains(told, k) {
					t.Errorf("told %q; naming %s: %v, want %v", told, k, !named, named)
				}
			}
			if !strings.HasPrefix(e.Holder, tc.ns+"/") && !strings.Contains(told, "a Service in another namespace") {
				t.Errorf("told %q, want it to say a Service in another namespace holds the address", told)
			}
		})
	}
}
