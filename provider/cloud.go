// Package provider is metalvip's thin adapter to k8s.io/cloud-provider: it makes the "metalvip"
// provider and translates the framework's calls into calls on the domain packages. It decides
// nothing about IPs or announcements itself (that is loadbalancer/) and never touches the wire
// (that is nodeagent/).
package provider

import (
	"context"
	"maps"
	"os"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/dynamic/dynamicinformer"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/record"
	cloudprovider "k8s.io/cloud-provider"
	"k8s.io/klog/v2"

	"github.com/metalvip/metalvip/internal/certs"
	"github.com/metalvip/metalvip/internal/identity"
	"github.com/metalvip/metalvip/loadbalancer/agentclient"
	"github.com/metalvip/metalvip/loadbalancer/announcer"
	"github.com/metalvip/metalvip/loadbalancer/desired"
	"github.com/metalvip/metalvip/loadbalancer/objects"
	"github.com/metalvip/metalvip/loadbalancer/services"
	"github.com/metalvip/metalvip/provider/config"
)

// ProviderName is the name given to --cloud-provider and the scheme of every ProviderID.
const ProviderName = "metalvip"

// ProviderIDPrefix starts every ProviderID metalvip sets: metalvip://<node-name>.
const ProviderIDPrefix = ProviderName + "://"

// Options are the process's settings that come from the framework's flags, not the
// cloud-config.
type Options struct {
	LeaderElection LeaderElection
	// ServiceWorkers is how many Services are synced at once (--concurrent-service-syncs).
	ServiceWorkers int
	// StartedUp, when set, is called once every informer's cache has synced: start-up is over.
	StartedUp func()
}

// Cloud is metalvip's cloudprovider.Interface.
type Cloud struct {
	cfg       *config.Config
	opts      Options
	instances *instances
	allocs    *services.Allocations
	services  *services.ServiceController
	announcer *announcer.Announcer
	enroller  *identity.Authority // agent.enroll: the agents' CA; nil otherwise
	dyn       dynamicinformer.DynamicSharedInformerFactory
	synced    []cache.InformerSynced // of the framework's informers this provider reads, set by SetInformers
	// registered is closed by SetInformers: the loops started in Initialize wait for it.
	registered chan struct{}
}

var (
	_ cloudprovider.Interface    = (*Cloud)(nil)
	_ cloudprovider.InformerUser = (*Cloud)(nil)
)

// ReadConfig reads a cloud-config file ("" gives the defaults).
func ReadConfig(file string) (*config.Config, error) {
	if file == "" {
		return config.Default(), nil
	}
	f, err := os.Open(file)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return config.Read(f)
}

// New returns the provider for a parsed cloud-config.
func New(cfg *config.Config, opts Options) *Cloud {
	if cfg.Failover.KeySecret != "" {
		klog.InfoS("WARNING: failover.keySecret in the cloud-config is no longer used: every agent has heartbeat keys of its own; remove it", "keySecret", cfg.Failover.KeySecret)
	}
	return &Cloud{
		cfg:  cfg,
		opts: opts,
		// A FakeRecorder without a channel drops events until Initialize gives a real one.
		instances:  &instances{cfg: cfg, recorder: &record.FakeRecorder{}},
		registered: make(chan struct{}),
	}
}

// Initialize sets the provider up and starts its loops; they end when stop closes. The loops
// wait for SetInformers, which the framework calls right after.
func (c *Cloud) Initialize(clientBuilder cloudprovider.ControllerClientBuilder, stop <-chan struct{}) {
	client := clientBuilder.ClientOrDie("metalvip-cloud-provider")
	broadcaster := record.NewBroadcaster()
	broadcaster.StartStructuredLogging(2)
	broadcaster.StartRecordingToSink(&typedcorev1.EventSinkImpl{Interface: client.CoreV1().Events("")})
	recorder := broadcaster.NewRecorder(scheme.Scheme, v1.EventSource{Component: services.EventSource})
	c.instances.recorder = recorder
	dyn := dynamic.NewForConfigOrDie(clientBuilder.ConfigOrDie("metalvip-cloud-provider"))
	c.dyn = dynamicinformer.NewDynamicSharedInformerFactory(dyn, 0)
	objects := objects.NewObjects()
	serves := c.Serves()
	c.allocs = services.New(services.Config{
		Client:         client,
		Dynamic:        dyn,
		Recorder:       recorder,
		Objects:        objects,
		Serves:         serves,
		PendingRetry:   c.cfg.Allocation.PendingRetry.Duration,
		StatusInterval: c.cfg.Allocation.PoolStatusInterval.Duration,
	})
	c.services = services.NewServiceController(client, c.allocs, serves)
	ac := c.cfg.Agent
	switch {
	case ac.Enroll.Enabled:
		c.enroller = identity.NewAuthority(client, identity.AuthorityOptions{
			Namespace: ac.Enroll.Namespace, ServiceAccount: ac.Enroll.ServiceAccount, Validity: ac.Enroll.Validity.Duration,
		})
	case !ac.Insecure && ac.CAFile == "":
		// Logged as an error: a CCM that announces nothing looks healthy otherwise.
		klog.ErrorS(nil, "No agent TLS settings in the cloud-config (agent.enroll, or caFile, certFile, keyFile): addresses are allocated but nothing is announced; set agent.enroll.enabled (docs/cloud-config.md)")
	}
	if ac.Insecure || ac.CAFile != "" || c.enroller != nil {
		if ac.Insecure {
			klog.InfoS("WARNING: talking to agents in plaintext without authenticating them (agent.insecure); for labs only")
		}
		f := c.cfg.Failover
		agents := agentclient.Config{
			Port: ac.Port, Insecure: ac.Insecure, Timeout: ac.Timeout.Duration,
			TLS: certs.Files{CA: ac.CAFile, Cert: ac.CertFile, Key: ac.KeyFile},
		}
		if c.enroller != nil {
			agents.Enroll = c.enroller
		}
		c.announcer = announcer.New(announcer.Config{
			Client:   client,
			Dynamic:  dyn,
			Recorder: recorder,
			Objects:  objects,
			Serves:   serves,
			Agents:   agents,
			Options: desired.Options{
				GratuitousRefresh: f.GratuitousRefresh.Duration,
				HeartbeatInterval: f.Interval.Duration,
				HeartbeatMisses:   f.Misses,
				HeartbeatPort:     f.Port,
			},
			MaxCandidates:      f.MaxCandidates,
			PasswordNamespace:  c.cfg.BGP.PasswordSecretNamespace,
			EgressClusterCIDRs: c.cfg.Egress.Prefixes(),
			Pacer:              c.services.Pacer(),
			Records:            c.allocs,
			Drain: desired.Drain{
				Label: c.cfg.Drain.Label, OnCordon: c.cfg.Drain.OnCordon != nil && *c.cfg.Drain.OnCordon,
				Delay: c.cfg.Drain.Delay.Duration,
			},
		})
	}

	ctx, cancel := context.WithCancel(context.Background())
	go func() {
		<-stop
		cancel()
		broadcaster.Shutdown()
	}()
	go c.run(ctx, client)
	klog.InfoS("metalvip provider initialised", "agentPort", ac.Port, "subnetRules", len(c.cfg.Topology.Subnets), "announcing", c.announcer != nil,
		"loadBalancerClass", serves.Class, "classless", serves.Classless, "initialisesNodes", c.cfg.Nodes.Initializes())
}

// run starts the allocator and the announcer once the informers are registered.
func (c *Cloud) run(ctx context.Context, client kubernetes.Interface) {
	select {
	case <-ctx.Done():
		return
	case <-c.registered:
	}
	c.dyn.Start(ctx.Done())
	if c.opts.StartedUp != nil {
		go func() {
			c.dyn.WaitForCacheSync(ctx.Done())
			if cache.WaitForCacheSync(ctx.Done(), c.synced...) {
				c.opts.StartedUp()
			}
		}()
	}
	go c.allocs.Run(ctx)
	go c.services.Run(ctx, max(c.opts.ServiceWorkers, 1))
	if c.announcer == nil {
		return
	}
	le := c.opts.LeaderElection
	if le.Namespace == "" {
		le.Namespace = "kube-system"
	}
	if le.Name == "" {
		le.Name = "metalvip-cloud-controller-manager"
	}
	start := time.Now()
	if c.enroller != nil {
		// Every replica, leading or not, publishes the CA: agents wait for it to start.
		if err := c.enroller.Load(ctx); err != nil {
			return // ctx ended
		}
		klog.InfoS("Agents are enrolled: their certificates come from this CCM", "namespace", c.cfg.Agent.Enroll.Namespace, "validity", c.enroller.Validity())
		// Viewers (metalvipctl agent) ask for a certificate by CertificateSigningRequest,
		// never with the CA's key.
		go c.enroller.ServeViewers(ctx)
	}
	fence, err := newLeaseFence(ctx, client, le)
	if err != nil {
		return // ctx ended
	}
	klog.InfoS("Announcing through the agents", "term", fence.Term(), "agentPort", c.cfg.Agent.Port, "waited", time.Since(start).Round(time.Millisecond))
	c.announcer.Run(ctx, fence)
}

// SetInformers registers the allocator's and the announcer's informers with the framework's
// factory (which it starts after its controllers are set up).
func (c *Cloud) SetInformers(factory informers.SharedInformerFactory) {
	if c.allocs == nil {
		return
	}
	// The caches hold every Service, Node, EndpointSlice and Namespace: keep out what nothing
	// here reads (managed fields, and but for Nodes kubectl's last-applied copy).
	for inf, f := range map[cache.SharedIndexInformer]cache.TransformFunc{
		factory.Core().V1().Services().Informer():            trim,
		factory.Discovery().V1().EndpointSlices().Informer(): trim,
		factory.Core().V1().Namespaces().Informer():          trim,
		// The framework's node controller updates whole Nodes from its cache: only what an
		// update leaves alone when missing (managed fields) may go.
		factory.Core().V1().Nodes().Informer(): trimManaged,
	} {
		if err := inf.SetTransform(f); err != nil {
			klog.ErrorS(err, "An informer started before the provider could trim its objects")
		}
		c.synced = append(c.synced, inf.HasSynced)
	}
	c.allocs.Register(factory, c.dyn)
	c.services.Register(factory)
	if c.announcer != nil {
		c.announcer.Register(factory, c.dyn)
	}
	select {
	case <-c.registered:
	default:
		close(c.registered)
	}
}

// LoadBalancer is none: metalvip serves Services with its own controller
// (services.ServiceController), so the framework's service controller does not start. Its
// way costs three more API writes per Service (a finalizer patch and two Events, then a sync
// again for the allocation record), measured in docs/benchmarks.md, and it serves class-less
// Services only.
func (c *Cloud) LoadBalancer() (cloudprovider.LoadBalancer, bool) { return nil, false }

// Instances is the legacy interface; InstancesV2 replaces it.
func (c *Cloud) Instances() (cloudprovider.Instances, bool) { return nil, false }

// InstancesV2 initialises nodes: ProviderID, addresses, zone and region. In the
// LoadBalancer-only mode (nodes.initialize: false) there is none, so the framework's node
// controllers do not start and Nodes stay as their kubelets made them.
func (c *Cloud) InstancesV2() (cloudprovider.InstancesV2, bool) {
	if !c.cfg.Nodes.Initializes() {
		return nil, false
	}
	return c.instances, true
}

// Serves says which Services this CCM serves.
func (c *Cloud) Serves() desired.Serves {
	return desired.Serves{Class: c.cfg.Services.LoadBalancerClass, Classless: c.cfg.Services.ServesClassless()}
}

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

// trimManaged drops an object's managed fields from the cache: an update made from the
// trimmed copy leaves them as they are on the server.
func trimManaged(obj any) (any, error) {
	if acc, err := meta.Accessor(obj); err == nil {
		acc.SetManagedFields(nil)
	}
	return obj, nil
}

// trim drops what no controller of this process reads from objects it only patches (never
// updates whole): managed fields and kubectl's last-applied copy.
func trim(obj any) (any, error) {
	if acc, err := meta.Accessor(obj); err == nil {
		acc.SetManagedFields(nil)
		if a := acc.GetAnnotations(); a != nil {
			if _, ok := a[lastApplied]; ok {
				a = maps.Clone(a)
				delete(a, lastApplied)
				acc.SetAnnotations(a)
			}
		}
	}
	return obj, nil
}

const lastApplied = "kubectl.kubernetes.io/last-applied-configuration"
