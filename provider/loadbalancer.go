package provider

import (
	"context"
	"errors"
	"strings"

	v1 "k8s.io/api/core/v1"
	cloudprovider "k8s.io/cloud-provider"
	cloudproviderapi "k8s.io/cloud-provider/api"

	"github.com/metalvip/metalvip/loadbalancer"
)

// loadBalancer adapts the framework's LoadBalancer calls to loadbalancer.Allocations.
type loadBalancer struct {
	allocs *loadbalancer.Allocations
}

var _ cloudprovider.LoadBalancer = (*loadBalancer)(nil)

// GetLoadBalancer reports the Service's addresses, and that a load balancer exists while
// anything is held or recorded for it, so that the framework never skips the cleanup.
func (l *loadBalancer) GetLoadBalancer(_ context.Context, _ string, svc *v1.Service) (*v1.LoadBalancerStatus, bool, error) {
	st, exists := l.allocs.Get(svc)
	return st, exists, nil
}

// GetLoadBalancerName is the Service's namespace and name: there is no outside object to name.
func (l *loadBalancer) GetLoadBalancerName(_ context.Context, _ string, svc *v1.Service) string {
	return strings.Join([]string{svc.Namespace, svc.Name}, "/")
}

// EnsureLoadBalancer gives the Service its addresses. An allocation that waiting may fix is
// the framework's retry error: it tries again later without counting a failure.
func (l *loadBalancer) EnsureLoadBalancer(ctx context.Context, _ string, svc *v1.Service, _ []*v1.Node) (*v1.LoadBalancerStatus, error) {
	st, err := l.allocs.Ensure(ctx, svc)
	var retry *loadbalancer.RetryError
	if errors.As(err, &retry) {
		return nil, cloudproviderapi.NewRetryError(err.Error(), retry.After)
	}
	return st, err
}

// UpdateLoadBalancer is called when the set of nodes changes. Addresses do not depend on
// nodes, so there is nothing to change here.
func (l *loadBalancer) UpdateLoadBalancer(context.Context, string, *v1.Service, []*v1.Node) error {
	return nil
}

// EnsureLoadBalancerDeleted gives up the Service's addresses.
func (l *loadBalancer) EnsureLoadBalancerDeleted(ctx context.Context, _ string, svc *v1.Service) error {
	return l.allocs.Delete(ctx, svc)
}
