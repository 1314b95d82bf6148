package cluster

import (
	"context"
	"fmt"
	"net/netip"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/metalvip/metalvip/internal/annotation"
	"github.com/metalvip/metalvip/loadbalancer/desired"
	"github.com/metalvip/metalvip/test/harness"
)

type SvcOpt func(*corev1.Service)

func Local(s *corev1.Service) {
	s.Spec.ExternalTrafficPolicy = corev1.ServiceExternalTrafficPolicyLocal
}

func InPool(p string) SvcOpt { return Annotate(annotation.Pool, p) }

// Annotate sets one annotation.
func Annotate(name annotation.Name, value string) SvcOpt {
	return func(s *corev1.Service) {
		if s.Annotations == nil {
			s.Annotations = map[string]string{}
		}
		s.Annotations[string(name)] = value
	}
}

// ServiceNoWait creates a LoadBalancer Service and does not wait for an address.
func (c *Cluster) ServiceNoWait(name string, opts ...SvcOpt) {
	c.T.Helper()
	c.createService(name, opts...)
}

// Service creates a LoadBalancer Service and waits for its address.
func (c *Cluster) Service(name string, opts ...SvcOpt) netip.Addr {
	c.T.Helper()
	c.createService(name, opts...)
	var ip netip.Addr
	harness.Eventually(c.T, 30*time.Second, name+" gets an address", func() bool {
		got, err := c.Srv.Client.CoreV1().Services(c.NS).Get(c.ctx, name, metav1.GetOptions{})
		if err != nil || len(got.Status.LoadBalancer.Ingress) == 0 {
			return false
		}
		ip, err = netip.ParseAddr(got.Status.LoadBalancer.Ingress[0].IP)
		return err == nil
	})
	return ip
}

// ServiceIPs creates a LoadBalancer Service and waits until it has n addresses.
func (c *Cluster) ServiceIPs(name string, n int, opts ...SvcOpt) []netip.Addr {
	c.T.Helper()
	c.createService(name, opts...)
	var ips []netip.Addr
	harness.Eventually(c.T, 30*time.Second, fmt.Sprintf("%s gets %d addresses", name, n), func() bool {
		got, err := c.Srv.Client.CoreV1().Services(c.NS).Get(c.ctx, name, metav1.GetOptions{})
		if err != nil || len(got.Status.LoadBalancer.Ingress) != n {
			return false
		}
		ips = ips[:0]
		for _, in := range got.Status.LoadBalancer.Ingress {
			ip, err := netip.ParseAddr(in.IP)
			if err != nil {
				return false
			}
			ips = append(ips, ip)
		}
		return true
	})
	return ips
}

func (c *Cluster) createService(name string, opts ...SvcOpt) {
	s := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: c.NS, Name: name},
		Spec: corev1.ServiceSpec{Type: corev1.ServiceTypeLoadBalancer, Selector: map[string]string{"app": name},
			Ports: []corev1.ServicePort{{Name: "http", Port: 80, TargetPort: intstr.FromInt32(8080), Protocol: corev1.ProtocolTCP}}},
	}
	for _, o := range opts {
		o(s)
	}
	if _, err := c.Srv.Client.CoreV1().Services(c.NS).Create(c.ctx, s, metav1.CreateOptions{}); err != nil {
		c.T.Fatalf("create service %s: %v", name, err)
	}
}

// endpoints sets the Service's ready endpoints to one pod on each of nodes.
func (c *Cluster) Endpoints(svc string, nodes ...string) {
	c.T.Helper()
	es := &discoveryv1.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Namespace: c.NS, Name: svc + "-slice", Labels: map[string]string{discoveryv1.LabelServiceName: svc}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Ports:       []discoveryv1.EndpointPort{{Name: ptr("http"), Port: ptr(int32(8080)), Protocol: ptr(corev1.ProtocolTCP)}},
	}
	for i, n := range nodes {
		es.Endpoints = append(es.Endpoints, discoveryv1.Endpoint{
			Addresses: []string{fmt.Sprintf("10.244.%d.%d", i, 10+i)}, NodeName: ptr(n),
			Conditions: discoveryv1.EndpointConditions{Ready: ptr(true)},
		})
	}
	slices := c.Srv.Client.DiscoveryV1().EndpointSlices(c.NS)
	old, err := slices.Get(c.ctx, es.Name, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		_, err = slices.Create(c.ctx, es, metav1.CreateOptions{})
	case err == nil:
		es.ResourceVersion = old.ResourceVersion
		_, err = slices.Update(c.ctx, es, metav1.UpdateOptions{})
	}
	if err != nil {
		c.T.Fatalf("%v", err)
	}
}

func ptr[T any](v T) *T { return &v }

// Announced returns the message of a Service's metalvip.io/Announced condition, "" when it has
// none.
func (c *Cluster) Announced(name string) string {
	s, err := c.Srv.Client.CoreV1().Services(c.NS).Get(c.ctx, name, metav1.GetOptions{})
	if err != nil {
		return ""
	}
	for _, cd := range s.Status.Conditions {
		if cd.Type == desired.ConditionAnnounced {
			return cd.Message
		}
	}
	return ""
}

// Events returns the messages of a Service's Events of reason, one a line.
func (c *Cluster) Events(name, reason string) string {
	l, err := c.Srv.Client.CoreV1().Events(c.NS).List(c.ctx, metav1.ListOptions{
		FieldSelector: fields.Set{"involvedObject.name": name, "reason": reason}.String(),
	})
	if err != nil {
		return ""
	}
	var b strings.Builder
	for _, e := range l.Items {
		b.WriteString(e.Message + "\n")
	}
	return b.String()
}

// deleteServices deletes the namespace's Services, taking off the finalizers of those the CCM
// (stopped, or about to be) has not released within a few seconds.
func (c *Cluster) deleteServices() {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	svcs := c.Srv.Client.CoreV1().Services(c.NS)
	l, err := svcs.List(ctx, metav1.ListOptions{})
	if err != nil {
		return
	}
	for _, s := range l.Items {
		_ = svcs.Delete(ctx, s.Name, metav1.DeleteOptions{})
	}
	deadline := time.Now().Add(5 * time.Second)
	for time.Now().Before(deadline) {
		if l, err = svcs.List(ctx, metav1.ListOptions{}); err != nil || len(l.Items) == 0 {
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
	for _, s := range l.Items {
		_, _ = svcs.Patch(ctx, s.Name, types.MergePatchType, []byte(`{"metadata":{"finalizers":null}}`), metav1.PatchOptions{})
	}
}
