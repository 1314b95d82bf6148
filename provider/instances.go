package provider

import (
	"context"
	"fmt"
	"net/netip"
	"strings"
	"sync"

	v1 "k8s.io/api/core/v1"
	"k8s.io/client-go/tools/record"
	cloudprovider "k8s.io/cloud-provider"
	cloudproviderapi "k8s.io/cloud-provider/api"
	nodeutil "k8s.io/component-helpers/node/util"
	"k8s.io/klog/v2"

	"github.com/metalvip/metalvip/provider/config"
)

// instances implements InstancesV2 for machines that no API describes: everything comes from
// the Node object itself and the cloud-config.
//
// Decisions, documented in docs/nodes.md:
//   - InstanceExists is always true. Bare metal has no inventory to ask, and a false answer
//     makes the node-lifecycle controller delete the Node; a decommissioned machine is
//     removed by deleting its Node.
//   - InstanceShutdown is always false. There is no out-of-band power state to read, and
//     "the agent does not answer" is not "powered off" (the NIC may be dead); the lifecycle
//     controller then leaves NotReady nodes to the usual node-lifecycle handling.
//   - A Node whose providerID names another provider is left alone: no metadata, no change.
type instances struct {
	cfg      *config.Config
	recorder record.EventRecorder

	mu sync.Mutex
	// reported remembers the bad provided-node-ip value already reported per node, so that
	// the framework's retries do not repeat the Event.
	reported map[string]string
}

var _ cloudprovider.InstancesV2 = (*instances)(nil)

// InstanceExists never reports false: see the type comment.
func (i *instances) InstanceExists(_ context.Context, _ *v1.Node) (bool, error) {
	return true, nil
}

// InstanceShutdown never reports true: see the type comment.
func (i *instances) InstanceShutdown(_ context.Context, _ *v1.Node) (bool, error) {
	return false, nil
}

// InstanceMetadata gives the ProviderID, addresses, zone, region and instance type.
func (i *instances) InstanceMetadata(_ context.Context, node *v1.Node) (*cloudprovider.InstanceMetadata, error) {
	if foreign(node) {
		klog.V(4).InfoS("Leaving node with another provider's providerID alone", "node", klog.KObj(node), "providerID", node.Spec.ProviderID)
		if hasUninitializedTaint(node) {
			// nil tells the cloud-node controller to skip the node and keep its taint:
			// initialising it is the other provider's job.
			return nil, nil
		}
		// Empty metadata: no addresses, so the periodic address sync changes nothing.
		return &cloudprovider.InstanceMetadata{}, nil
	}

	addrs, err := nodeAddresses(node)
	if err != nil {
		i.reportOnce(node, err)
		return nil, err
	}
	var primary netip.Addr
	for _, a := range addrs {
		if a.Type == v1.NodeInternalIP {
			primary, _ = netip.ParseAddr(a.Address)
			break
		}
	}
	zone, region := i.cfg.Topology.Locate(node.Labels, primary)
	var instanceType string
	if l := i.cfg.InstanceTypeLabel; l != "" {
		instanceType = node.Labels[l]
	}
	return &cloudprovider.InstanceMetadata{
		ProviderID:    providerID(node.Name),
		NodeAddresses: addrs,
		Zone:          zone,
		Region:        region,
		InstanceType:  instanceType,
	}, nil
}

// nodeAddresses returns the kubelet's provided node IPs as InternalIP first, then the
// addresses the kubelet reported, without duplicates. The framework checks that every
// provided IP is among the addresses returned, so they must all be there.
func nodeAddresses(node *v1.Node) ([]v1.NodeAddress, error) {
	var out []v1.NodeAddress
	seen := map[v1.NodeAddress]bool{}
	add := func(a v1.NodeAddress) {
		if !seen[a] {
			seen[a] = true
			out = append(out, a)
		}
	}
	if s, ok := node.Annotations[cloudproviderapi.AnnotationAlphaProvidedIPAddr]; ok {
		ips, err := nodeutil.ParseNodeIPAnnotation(s)
		if err != nil {
			return nil, fmt.Errorf("node %s: annotation %s=%q: %w", node.Name, cloudproviderapi.AnnotationAlphaProvidedIPAddr, s, err)
		}
		for _, ip := range ips {
			a, _ := netip.AddrFromSlice(ip)
			add(v1.NodeAddress{Type: v1.NodeInternalIP, Address: a.Unmap().String()})
		}
	}
	for _, a := range node.Status.Addresses {
		if a.Type == v1.NodeInternalIP || a.Type == v1.NodeExternalIP {
			p, err := netip.ParseAddr(a.Address)
			if err != nil {
				continue // not ours to fix; the kubelet reported it
			}
			a.Address = p.Unmap().String()
		}
		add(a)
	}
	return out, nil
}

func foreign(node *v1.Node) bool {
	id := node.Spec.ProviderID
	return id != "" && !strings.HasPrefix(id, ProviderIDPrefix)
}

func hasUninitializedTaint(node *v1.Node) bool {
	for _, t := range node.Spec.Taints {
		if t.Key == cloudproviderapi.TaintExternalCloudProvider {
			return true
		}
	}
	return false
}

func (i *instances) reportOnce(node *v1.Node, err error) {
	value := node.Annotations[cloudproviderapi.AnnotationAlphaProvidedIPAddr]
	i.mu.Lock()
	defer i.mu.Unlock()
	if i.reported == nil {
		i.reported = map[string]string{}
	}
	if i.reported[node.Name] == value {
		return
	}
	i.reported[node.Name] = value
	i.recorder.Eventf(node, v1.EventTypeWarning, "InvalidProvidedNodeIP",
		"%v; fix the kubelet's --node-ip so that the node can be initialised", err)
}
