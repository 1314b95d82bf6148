// Package provider is metalvip's thin adapter to k8s.io/cloud-provider: it registers the
// "metalvip" provider and translates the framework's calls into calls on the domain packages.
// It decides nothing about IPs or announcements itself (that is loadbalancer/) and never
// touches the wire (that is nodeagent/).
package provider

import (
	"context"
	"io"

	v1 "k8s.io/api/core/v1"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/dynamic/dynamicinformer"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/tools/record"
	cloudprovider "k8s.io/cloud-provider"
	"k8s.io/klog/v2"

	"github.com/metalvip/metalvip/internal/certs"
	"github.com/metalvip/metalvip/loadbalancer"
	"github.com/metalvip/metalvip/provider/config"
)

// ProviderName is the name given to --cloud-provider and the scheme of every ProviderID.
const ProviderName = "metalvip"

// ProviderIDPrefix starts every ProviderID metalvip sets: metalvip://<node-name>.
const ProviderIDPrefix = ProviderName + "://"

func init() {
	cloudprovider.RegisterCloudProvider(ProviderName, func(r io.Reader) (cloudprovider.Interface, error) {
		cfg, err := config.Read(r)
		if err != nil {
			return nil, err
		}
		return New(cfg), nil
	})
}

// Cloud is metalvip's cloudprovider.Interface.
type Cloud struct {
	cfg       *config.Config
	instances *instances
	lb        *loadBalancer
	announcer *loadbalancer.Announcer
	dyn       dynamicinformer.DynamicSharedInformerFactory
	ctx       context.Context // ends when the framework's stop channel closes
}

var (
	_ cloudprovider.Interface    = (*Cloud)(nil)
	_ cloudprovider.InformerUser = (*Cloud)(nil)
)

// New returns the provider for a parsed cloud-config.
func New(cfg *config.Config) *Cloud {
	return &Cloud{
		cfg: cfg,
		// A FakeRecorder without a channel drops events until Initialize gives a real one.
		instances: &instances{cfg: cfg, recorder: &record.FakeRecorder{}},
	}
}

// Initialize starts the provider's own housekeeping; it ends when stop closes.
func (c *Cloud) Initialize(clientBuilder cloudprovider.ControllerClientBuilder, stop <-chan struct{}) {
	client := clientBuilder.ClientOrDie("metalvip-cloud-provider")
	broadcaster := record.NewBroadcaster()
	broadcaster.StartStructuredLogging(2)
	broadcaster.StartRecordingToSink(&typedcorev1.EventSinkImpl{Interface: client.CoreV1().Events("")})
	recorder := broadcaster.NewRecorder(scheme.Scheme, v1.EventSource{Component: "metalvip-cloud-controller-manager"})
	c.instances.recorder = recorder
	ctx, cancel := context.WithCancel(context.Background())
	c.ctx = ctx
	go func() {
		<-stop
		cancel()
		broadcaster.Shutdown()
	}()
	dyn := dynamic.NewForConfigOrDie(clientBuilder.ConfigOrDie("metalvip-cloud-provider"))
	c.dyn = dynamicinformer.NewDynamicSharedInformerFactory(dyn, 0)
	c.lb = &loadBalancer{allocs: loadbalancer.New(loadbalancer.Config{
		Client:         client,
		Dynamic:        dyn,
		Recorder:       recorder,
		PendingRetry:   c.cfg.Allocation.PendingRetry.Duration,
		StatusInterval: c.cfg.Allocation.PoolStatusInterval.Duration,
	})}
	c.announcer = c.newAnnouncer(ctx, client, recorder)
	klog.InfoS("metalvip provider initialised", "agentPort", c.cfg.Agent.Port, "subnetRules", len(c.cfg.Topology.Subnets))
}

// SetInformers starts the allocator on the framework's shared informers; the framework
// starts them after its controllers are set up.
func (c *Cloud) SetInformers(factory informers.SharedInformerFactory) {
	if c.lb == nil {
		return
	}
	c.lb.allocs.Start(c.ctx, factory, c.dyn)
	if c.announcer != nil {
		c.announcer.Start(c.ctx, factory, c.dyn)
	}
	c.dyn.Start(c.ctx.Done())
}

// newAnnouncer sets up the push of plans to the agents; without agent TLS settings (and not
// insecure) there is nothing to push to, and addresses are only allocated.
func (c *Cloud) newAnnouncer(ctx context.Context, client kubernetes.Interface, recorder record.EventRecorder) *loadbalancer.Announcer {
	ac := c.cfg.Agent
	if !ac.Insecure && ac.CAFile == "" {
		klog.InfoS("No agent TLS settings in the cloud-config (agent.caFile, certFile, keyFile): addresses are allocated but not announced")
		return nil
	}
	if ac.Insecure {
		klog.InfoS("WARNING: talking to agents in plaintext without authenticating them (agent.insecure); for labs only")
	}
	t := term(ctx, client)
	klog.InfoS("Announcing through the agents", "term", t, "agentPort", ac.Port)
	f := c.cfg.Failover
	return loadbalancer.NewAnnouncer(loadbalancer.AnnouncerConfig{
		Client:   client,
		Recorder: recorder,
		Agents: loadbalancer.AgentConfig{
			Port: ac.Port, Insecure: ac.Insecure, Timeout: ac.Timeout.Duration,
			TLS: certs.Files{CA: ac.CAFile, Cert: ac.CertFile, Key: ac.KeyFile},
		},
		Term:              t,
		HeartbeatInterval: f.Interval.Duration,
		HeartbeatMisses:   f.Misses,
		HeartbeatPort:     f.Port,
		GratuitousRefresh: f.GratuitousRefresh.Duration,
		MaxCandidates:     f.MaxCandidates,
	})
}

// LoadBalancer gives Services of type LoadBalancer addresses from the IP pools.
func (c *Cloud) LoadBalancer() (cloudprovider.LoadBalancer, bool) {
	if c.lb == nil {
		return nil, false // not initialised: the framework calls Initialize first
	}
	return c.lb, true
}

// Instances is the legacy interface; InstancesV2 replaces it.
func (c *Cloud) Instances() (cloudprovider.Instances, bool) { return nil, false }

// InstancesV2 initialises nodes: ProviderID, addresses, zone and region.
func (c *Cloud) InstancesV2() (cloudprovider.InstancesV2, bool) { return c.instances, true }

// Zones is deprecated in favour of InstancesV2.
func (c *Cloud) Zones() (cloudprovider.Zones, bool) { return nil, false }

// Clusters is not used by external cloud providers.
func (c *Cloud) Clusters() (cloudprovider.Clusters, bool) { return nil, false }

// Routes: pod networking is the CNI's business on bare metal.
func (c *Cloud) Routes() (cloudprovider.Routes, bool) { return nil, false }

// ProviderName returns "metalvip".
func (c *Cloud) ProviderName() string { return ProviderName }

// HasClusterID is true: metalvip tags nothing in an outside cloud, so it needs no cluster ID.
func (c *Cloud) HasClusterID() bool { return true }

func providerID(nodeName string) string { return ProviderIDPrefix + nodeName }
