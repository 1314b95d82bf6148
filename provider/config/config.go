// Package config reads the metalvip cloud-config file (--cloud-config): the process settings
// of the cloud-controller-manager. It decides what a valid file is and what each setting
// defaults to; it must not hold cluster objects (IP pools and BGP peers are CRDs).
//
// The file is YAML and read strictly: an unknown or misspelt field, a value of the wrong type
// or a value out of range is an error that names the line, the field and what to write
// instead. docs/cloud-config.md documents every field.
package config

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"
	"k8s.io/apimachinery/pkg/util/validation"
)

// APIVersion and Kind name the file format. Both are optional in a file; when given they must
// match, so that a file written for a later format is refused rather than half understood.
const (
	APIVersion = "metalvip.io/v1alpha1"
	Kind       = "CloudConfig"
)

// Defaults.
const (
	DefaultHeartbeatInterval  = 50 * time.Millisecond
	DefaultHeartbeatMisses    = 3
	DefaultHeartbeatPort      = 7473
	DefaultPasswordNamespace  = "metalvip-bgp-secrets"
	DefaultLoadBalancerClass  = "metalvip.io/vip"
	DefaultMaxCandidates      = 4
	DefaultGratuitousRefresh  = 30 * time.Second
	DefaultAgentPort          = 7472
	DefaultAgentTimeout       = 5 * time.Second
	DefaultPendingRetry       = 10 * time.Second
	DefaultPoolStatusInterval = time.Second
	DefaultDrainLabel         = "metalvip.io/drain"
	DefaultDrainDelay         = 15 * time.Second
)

// Config is the whole cloud-config file.
type Config struct {
	APIVersion string `yaml:"apiVersion"`
	Kind       string `yaml:"kind"`

	// Agent says how the CCM reaches the metalvip-agent on each node.
	Agent Agent `yaml:"agent"`

	// Topology maps nodes to zones and regions.
	Topology Topology `yaml:"topology"`

	// Allocation holds the timers of address allocation.
	Allocation Allocation `yaml:"allocation"`

	// Failover holds the settings of the agents' heartbeats and of L2 announcing.
	Failover Failover `yaml:"failover"`

	// BGP holds the CCM's settings for BGP peers.
	BGP BGP `yaml:"bgp"`

	// Drain says which nodes are being drained and how long they keep announcing.
	Drain Drain `yaml:"drain"`

	// Nodes says whether the CCM initialises nodes.
	Nodes Nodes `yaml:"nodes"`

	// Egress holds what Services' egress through their addresses needs (docs/egress.md).
	Egress Egress `yaml:"egress"`

	// Services says which Services of type LoadBalancer the CCM serves.
	Services Services `yaml:"services"`

	// InstanceTypeLabel names a Node label whose value becomes the node's instance type
	// (node.kubernetes.io/instance-type). Empty: no instance type.
	InstanceTypeLabel string `yaml:"instanceTypeLabel"`
}

// Agent holds the settings for the CCM's connection to the node agents.
type Agent struct {
	// Port is the TCP port every agent listens on (its --listen-address).
	Port int `yaml:"port"`
	// CAFile is the PEM bundle of the CA that signs the agents' certificates.
	CAFile string `yaml:"caFile"`
	// CertFile and KeyFile are the CCM's client certificate and key, presented to agents.
	CertFile string `yaml:"certFile"`
	KeyFile  string `yaml:"keyFile"`
	// Insecure turns mutual TLS off. For labs only; the CCM logs a warning at start.
	Insecure bool `yaml:"insecure"`
	// Enroll: the CCM issues every agent its certificate (docs/agent-tls.md) instead of
	// caFile, certFile and keyFile.
	Enroll Enroll `yaml:"enroll"`
	// Timeout bounds a single call to an agent.
	Timeout Duration `yaml:"timeout"`
}

// Enroll holds the settings of the agents' enrollment.
type Enroll struct {
	// Enabled: agents prove their node with a projected ServiceAccount token and the CCM
	// signs their certificates with a CA it keeps in the Secret metalvip-ca.
	Enabled bool `yaml:"enabled"`
	// Namespace of the CA Secret and ConfigMap (metalvip-ca) and of the agents'
	// ServiceAccount. Default kube-system.
	Namespace string `yaml:"namespace"`
	// ServiceAccount is the agents' ServiceAccount: only its tokens enroll. Default
	// metalvip-agent.
	ServiceAccount string `yaml:"serviceAccount"`
	// Validity of an agent's certificate (and the CCM's); renewed at two thirds. Default 24h.
	Validity Duration `yaml:"validity"`
}

// Failover holds the settings of L2 failover among the agents.
type Failover struct {
	// Interval between the heartbeats candidates exchange.
	Interval Duration `yaml:"interval"`
	// Misses: intervals without a heartbeat before a node counts as dead.
	Misses int `yaml:"misses"`
	// Port: the UDP port of the heartbeats, the same on every node.
	Port int `yaml:"port"`
	// KeySecret is no longer used (every agent has heartbeat keys of its own); a file that
	// still sets it is read, with a warning in the log.
	KeySecret string `yaml:"keySecret"`
	// MaxCandidates caps the ranked candidates of an L2 VIP.
	MaxCandidates int `yaml:"maxCandidates"`
	// GratuitousRefresh: how often owned L2 VIPs are announced again.
	GratuitousRefresh Duration `yaml:"gratuitousRefresh"`
}

// Nodes says whether the CCM initialises nodes.
type Nodes struct {
	// Initialize: the CCM initialises nodes (providerID, addresses, zone and region; the
	// kubelets run with --cloud-provider=external). false is the LoadBalancer-only mode: the
	// kubelets stay as they are, the node controllers do not run, and Services are announced
	// from the Nodes as they are. Default true.
	Initialize *bool `yaml:"initialize"`
}

// Initializes reports whether the CCM initialises nodes.
func (n Nodes) Initializes() bool { return n.Initialize == nil || *n.Initialize }

// Services says which Services of type LoadBalancer the CCM serves.
type Services struct {
	// LoadBalancerClass is the class metalvip serves besides class-less Services: Services of
	// another class are another implementation's and metalvip never touches them. Default
	// metalvip.io/vip.
	LoadBalancerClass string `yaml:"loadBalancerClass"`
	// Classless: serve Services without a loadBalancerClass too (through the framework's
	// service controller). false leaves them to another implementation. Default true.
	Classless *bool `yaml:"classless"`
}

// ServesClassless reports whether class-less Services are served.
func (s Services) ServesClassless() bool { return s.Classless == nil || *s.Classless }

// Drain says which nodes are being drained: a drained node's BGP routes carry
// GRACEFUL_SHUTDOWN for Delay before they are withdrawn, and the L2 VIPs it answers move to
// the next candidate while it keeps answering for Delay (make-before-break).
type Drain struct {
	// Label marks a node as being drained when present (any value). Default metalvip.io/drain.
	Label string `yaml:"label"`
	// OnCordon: a cordoned node (spec.unschedulable, kubectl cordon or drain) is being
	// drained too. Default true.
	OnCordon *bool `yaml:"onCordon"`
	// Delay between the start of a drain and the withdrawal. Default 15s; 0s is not allowed
	// (write 1s for a quick one), at most 10m.
	Delay Duration `yaml:"delay"`
}

// BGP holds the CCM's settings for BGP peers.
type BGP struct {
	// PasswordSecretNamespace is the one namespace BGPPeer password Secrets are read from;
	// the CCM may read Secrets there and nowhere else.
	PasswordSecretNamespace string `yaml:"passwordSecretNamespace"`
}

// Egress holds the cluster's facts that egress through a Service's address needs.
type Egress struct {
	// ClusterCIDRs are the destinations a pod reaches as itself, never from a Service's
	// address: the cluster's pod and ClusterIP ranges, and the node subnets if pods reach
	// nodes. Required for egress (a Service asking for it without them gets a Warning Event);
	// at most 16 CIDRs.
	ClusterCIDRs []string `yaml:"clusterCIDRs"`
}

// MaxEgressClusterCIDRs bounds egress.clusterCIDRs.
const MaxEgressClusterCIDRs = 16

// Prefixes returns egress.clusterCIDRs parsed (validate has checked them).
func (e Egress) Prefixes() []netip.Prefix {
	var out []netip.Prefix
	for _, c := range e.ClusterCIDRs {
		if p, err := netip.ParsePrefix(c); err == nil {
			out = append(out, p)
		}
	}
	return out
}

// Allocation holds the timers of address allocation.
type Allocation struct {
	// PendingRetry is how often a Service waiting for an address (pool exhausted, requested
	// address taken, no pool) is tried again.
	PendingRetry Duration `yaml:"pendingRetry"`
	// PoolStatusInterval bounds how often IPPool status is written: changes are batched.
	PoolStatusInterval Duration `yaml:"poolStatusInterval"`
}

// Topology maps nodes to zone and region. A label wins over a subnet rule; among subnet
// rules the most specific prefix containing the node's address wins.
type Topology struct {
	// ZoneLabel and RegionLabel name Node labels whose values become the zone and region.
	ZoneLabel   string `yaml:"zoneLabel"`
	RegionLabel string `yaml:"regionLabel"`
	// Subnets map a node's primary internal address to a zone and region.
	Subnets []SubnetRule `yaml:"subnets"`
}

// SubnetRule places nodes whose primary address is inside CIDR in Zone and Region.
type SubnetRule struct {
	CIDR   string `yaml:"cidr"`
	Zone   string `yaml:"zone"`
	Region string `yaml:"region"`

	prefix netip.Prefix
}

// Prefix is the parsed CIDR; valid after Parse.
func (r SubnetRule) Prefix() netip.Prefix { return r.prefix }

// Duration is a time.Duration written as a Go duration string ("250ms", "5s", "1m").
type Duration struct{ time.Duration }

// UnmarshalYAML accepts Go duration strings only, so "5" (seconds? milliseconds?) is refused.
func (d *Duration) UnmarshalYAML(n *yaml.Node) error {
	v, err := time.ParseDuration(n.Value)
	if err != nil || n.Kind != yaml.ScalarNode {
		return &FieldError{Line: n.Line, Msg: fmt.Sprintf("%q is not a duration; write a number with a unit, such as \"500ms\" or \"5s\"", n.Value)}
	}
	d.Duration = v
	return nil
}

// FieldError is a problem at one place in the file.
type FieldError struct {
	Line  int    // 1-based; 0 when the field is absent from the file
	Field string // dotted path, e.g. "topology.subnets[0].cidr"
	Msg   string
}

func (e *FieldError) Error() string {
	var b strings.Builder
	if e.Line > 0 {
		fmt.Fprintf(&b, "line %d: ", e.Line)
	}
	if e.Field != "" {
		b.WriteString(e.Field)
		b.WriteString(": ")
	}
	b.WriteString(e.Msg)
	return b.String()
}

// Default returns the configuration used when no file is given.
func Default() *Config {
	c := &Config{}
	c.setDefaults()
	return c
}

func (c *Config) setDefaults() {
	if c.Agent.Port == 0 {
		c.Agent.Port = DefaultAgentPort
	}
	if c.Agent.Timeout.Duration == 0 {
		c.Agent.Timeout.Duration = DefaultAgentTimeout
	}
	if e := &c.Agent.Enroll; e.Enabled {
		if e.Namespace == "" {
			e.Namespace = "kube-system"
		}
		if e.ServiceAccount == "" {
			e.ServiceAccount = "metalvip-agent"
		}
		if e.Validity.Duration == 0 {
			e.Validity.Duration = 24 * time.Hour
		}
	}
	if c.Allocation.PendingRetry.Duration == 0 {
		c.Allocation.PendingRetry.Duration = DefaultPendingRetry
	}
	if c.Allocation.PoolStatusInterval.Duration == 0 {
		c.Allocation.PoolStatusInterval.Duration = DefaultPoolStatusInterval
	}
	f := &c.Failover
	if f.Interval.Duration == 0 {
		f.Interval.Duration = DefaultHeartbeatInterval
	}
	if f.Misses == 0 {
		f.Misses = DefaultHeartbeatMisses
	}
	if f.Port == 0 {
		f.Port = DefaultHeartbeatPort
	}
	if c.BGP.PasswordSecretNamespace == "" {
		c.BGP.PasswordSecretNamespace = DefaultPasswordNamespace
	}
	if c.Services.LoadBalancerClass == "" {
		c.Services.LoadBalancerClass = DefaultLoadBalancerClass
	}
	if f.MaxCandidates == 0 {
		f.MaxCandidates = DefaultMaxCandidates
	}
	if c.Drain.Label == "" {
		c.Drain.Label = DefaultDrainLabel
	}
	if c.Drain.OnCordon == nil {
		yes := true
		c.Drain.OnCordon = &yes
	}
	if c.Drain.Delay.Duration == 0 {
		c.Drain.Delay.Duration = DefaultDrainDelay
	}
	if f.GratuitousRefresh.Duration == 0 {
		f.GratuitousRefresh.Duration = DefaultGratuitousRefresh
	}
}

// Read parses a cloud-config. A nil reader or an empty file gives the defaults.
func Read(r io.Reader) (*Config, error) {
	if r == nil {
		return Default(), nil
	}
	data, err := io.ReadAll(r)
	if err != nil {
		return nil, fmt.Errorf("read cloud-config: %w", err)
	}
	return Parse(data)
}

// Parse parses and validates a cloud-config. Every error it returns names the line and field.
func Parse(data []byte) (*Config, error) {
	c := &Config{}
	if len(bytes.TrimSpace(data)) > 0 {
		var doc yaml.Node
		dec := yaml.NewDecoder(bytes.NewReader(data))
		if err := dec.Decode(&doc); err != nil && !errors.Is(err, io.EOF) {
			return nil, fmt.Errorf("cloud-config: %w", cleanYAMLError(err))
		}
		var extra yaml.Node
		if err := dec.Decode(&extra); !errors.Is(err, io.EOF) {
			return nil, errors.New("cloud-config: the file holds more than one YAML document; write a single document")
		}
		if len(doc.Content) > 0 {
			root := doc.Content[0]
			if err := checkFields(root, c, ""); err != nil {
				return nil, fmt.Errorf("cloud-config: %w", err)
			}
			if err := root.Decode(c); err != nil {
				return nil, fmt.Errorf("cloud-config: %w", cleanYAMLError(err))
			}
			if err := c.validate(root); err != nil {
				return nil, fmt.Errorf("cloud-config: %w", err)
			}
		}
	}
	c.setDefaults()
	return c, nil
}

// cleanYAMLError turns the yaml package's multi-line type errors into one line each.
func cleanYAMLError(err error) error {
	var fe *FieldError
	if errors.As(err, &fe) {
		return fe
	}
	var te *yaml.TypeError
	if errors.As(err, &te) {
		msgs := make([]string, 0, len(te.Errors))
		for _, m := range te.Errors {
			msgs = append(msgs, strings.Replace(m, "cannot unmarshal !!", "a value of type !!", 1))
		}
		return errors.New(strings.Join(msgs, "; "))
	}
	return errors.New(strings.TrimPrefix(err.Error(), "yaml: "))
}

func (c *Config) validate(root *yaml.Node) error {
	var errs []error
	add := func(path, msg string) {
		errs = append(errs, &FieldError{Line: lineOf(root, path), Field: path, Msg: msg})
	}

	if c.APIVersion != "" && c.APIVersion != APIVersion {
		add("apiVersion", fmt.Sprintf("%q is not a format this version reads; write %q or leave it out", c.APIVersion, APIVersion))
	}
	if c.Kind != "" && c.Kind != Kind {
		add("kind", fmt.Sprintf("%q is not a cloud-config kind; write %q or leave it out", c.Kind, Kind))
	}

	a := c.Agent
	if a.Port < 0 || a.Port > 65535 {
		add("agent.port", fmt.Sprintf("%d is not a TCP port; write a number from 1 to 65535 (default %d)", a.Port, DefaultAgentPort))
	}
	if a.Timeout.Duration < 0 {
		add("agent.timeout", fmt.Sprintf("%s is negative; write a positive duration such as \"5s\"", a.Timeout.Duration))
	}
	for _, d := range []struct {
		path string
		v    time.Duration
		min  time.Duration
	}{
		{"allocation.pendingRetry", c.Allocation.PendingRetry.Duration, time.Second},
		{"allocation.poolStatusInterval", c.Allocation.PoolStatusInterval.Duration, 100 * time.Millisecond},
	} {
		if d.v != 0 && d.v < d.min {
			add(d.path, fmt.Sprintf("%s is too short; write at least %s", d.v, d.min))
		}
	}
	fo := c.Failover
	if fo.Interval.Duration != 0 && (fo.Interval.Duration < 10*time.Millisecond || fo.Interval.Duration > 10*time.Second) {
		add("failover.interval", fmt.Sprintf("%s is out of range; write 10ms to 10s (default %s)", fo.Interval.Duration, DefaultHeartbeatInterval))
	}
	if fo.Misses < 0 || fo.Misses > 100 {
		add("failover.misses", fmt.Sprintf("%d is out of range; write 2 to 100 (default %d)", fo.Misses, DefaultHeartbeatMisses))
	} else if fo.Misses == 1 {
		add("failover.misses", "1 would declare a node dead on a single lost packet; write at least 2")
	}
	if fo.Port < 0 || fo.Port > 65535 {
		add("failover.port", fmt.Sprintf("%d is not a UDP port; write 1 to 65535 (default %d)", fo.Port, DefaultHeartbeatPort))
	}
	if lc := c.Services.LoadBalancerClass; lc != "" && (!strings.Contains(lc, "/") || len(validation.IsQualifiedName(lc)) > 0) {
		add("services.loadBalancerClass", fmt.Sprintf("%q is not a class name; write a domain-prefixed name such as %q (Kubernetes requires the prefix)", lc, DefaultLoadBalancerClass))
	}
	if ns := c.BGP.PasswordSecretNamespace; ns != "" && len(validation.IsDNS1123Label(ns)) > 0 {
		add("bgp.passwordSecretNamespace", fmt.Sprintf("%q is not a namespace name; write e.g. %q", ns, DefaultPasswordNamespace))
	}
	if n := len(c.Egress.ClusterCIDRs); n > MaxEgressClusterCIDRs {
		add("egress.clusterCIDRs", fmt.Sprintf("%d CIDRs; write at most %d (merge adjacent ranges)", n, MaxEgressClusterCIDRs))
	}
	for i, cidr := range c.Egress.ClusterCIDRs {
		if p, err := netip.ParsePrefix(cidr); err != nil {
			add("egress.clusterCIDRs", fmt.Sprintf("[%d] %q is not a CIDR; write one such as \"10.244.0.0/16\"", i, cidr))
		} else if p != p.Masked() {
			add("egress.clusterCIDRs", fmt.Sprintf("[%d] %q has bits set after its prefix length; write %s", i, cidr, p.Masked()))
		}
	}
	if d := c.Drain.Delay.Duration; d < 0 || d > 10*time.Minute {
		add("drain.delay", fmt.Sprintf("%s is out of range; write 1s to 10m (default %s)", d, DefaultDrainDelay))
	}
	if l := c.Drain.Label; l != "" && len(validation.IsQualifiedName(l)) > 0 {
		add("drain.label", fmt.Sprintf("%q is not a label key; write one such as %q", l, DefaultDrainLabel))
	}
	if fo.MaxCandidates < 0 || fo.MaxCandidates == 1 || fo.MaxCandidates > 16 {
		add("failover.maxCandidates", fmt.Sprintf("%d: write 2 to 16 (default %d); one candidate has no failover", fo.MaxCandidates, DefaultMaxCandidates))
	}
	if fo.GratuitousRefresh.Duration != 0 && fo.GratuitousRefresh.Duration < time.Second {
		add("failover.gratuitousRefresh", fmt.Sprintf("%s is too short; write at least 1s", fo.GratuitousRefresh.Duration))
	}
	if a.Insecure && (a.CAFile != "" || a.CertFile != "" || a.KeyFile != "") {
		add("agent.insecure", "insecure: true turns TLS off, so caFile, certFile and keyFile would be ignored; remove either insecure or the files")
	}
	if e := a.Enroll; e.Enabled {
		if a.Insecure || a.CAFile != "" || a.CertFile != "" || a.KeyFile != "" {
			add("agent.enroll.enabled", "enrolled agents get their certificates from the CCM, so insecure, caFile, certFile and keyFile would be ignored; remove either enroll or them")
		}
		if v := e.Validity.Duration; v != 0 && (v < 10*time.Minute || v > 90*24*time.Hour) {
			add("agent.enroll.validity", fmt.Sprintf("%s: write 10m to 2160h (default 24h)", e.Validity.Duration))
		}
		if e.Namespace != "" && len(validation.IsDNS1123Label(e.Namespace)) > 0 {
			add("agent.enroll.namespace", fmt.Sprintf("%q is not a namespace name", e.Namespace))
		}
		if e.ServiceAccount != "" && len(validation.IsDNS1123Subdomain(e.ServiceAccount)) > 0 {
			add("agent.enroll.serviceAccount", fmt.Sprintf("%q is not a ServiceAccount name", e.ServiceAccount))
		}
	} else if !a.Insecure {
		switch {
		case a.CAFile == "" && a.CertFile == "" && a.KeyFile == "":
			// Unset: the agent connection is configured later (by the planner) or not used.
		case a.CAFile == "" || a.CertFile == "" || a.KeyFile == "":
			add("agent", "caFile, certFile and keyFile go together; give all three (see docs/cloud-config.md)")
		}
	}

	for _, l := range []struct{ path, value string }{
		{"topology.zoneLabel", c.Topology.ZoneLabel},
		{"topology.regionLabel", c.Topology.RegionLabel},
		{"instanceTypeLabel", c.InstanceTypeLabel},
	} {
		if l.value != "" && !validLabelKey(l.value) {
			add(l.path, fmt.Sprintf("%q is not a label key; write a key such as \"example.com/rack\"", l.value))
		}
	}

	seen := map[netip.Prefix]int{}
	for i := range c.Topology.Subnets {
		r := &c.Topology.Subnets[i]
		path := fmt.Sprintf("topology.subnets[%d]", i)
		p, err := netip.ParsePrefix(r.CIDR)
		switch {
		case r.CIDR == "":
			add(path+".cidr", "missing; write the subnet in CIDR form, such as \"198.51.100.0/26\"")
		case err != nil:
			add(path+".cidr", fmt.Sprintf("%q is not a CIDR; write an address and prefix length, such as \"198.51.100.0/26\"", r.CIDR))
		case p.Masked() != p:
			add(path+".cidr", fmt.Sprintf("%q has host bits set; write %q", r.CIDR, p.Masked().String()))
		default:
			if j, dup := seen[p]; dup {
				add(path+".cidr", fmt.Sprintf("%s is already mapped by topology.subnets[%d]; merge the two rules", p, j))
			}
			seen[p] = i
			r.prefix = p
		}
		if r.Zone == "" && r.Region == "" {
			add(path, "a subnet rule needs a zone, a region or both")
		}
		for _, v := range []struct{ field, value string }{{"zone", r.Zone}, {"region", r.Region}} {
			if v.value != "" && !validLabelValue(v.value) {
				add(path+"."+v.field, fmt.Sprintf("%q cannot be a label value (63 characters at most: letters, digits, '-', '_', '.', starting and ending with a letter or digit)", v.value))
			}
		}
	}
	return errors.Join(errs...)
}

// Locate returns the zone and region of a node with the given labels and primary address.
// A configured label wins; otherwise the most specific subnet rule containing addr.
func (t *Topology) Locate(labels map[string]string, addr netip.Addr) (zone, region string) {
	if addr.IsValid() {
		bits := -1
		for _, r := range t.Subnets {
			if r.prefix.IsValid() && r.prefix.Contains(addr) && r.prefix.Bits() > bits {
				zone, region, bits = r.Zone, r.Region, r.prefix.Bits()
			}
		}
	}
	if v, ok := labels[t.ZoneLabel]; ok && t.ZoneLabel != "" {
		zone = v
	}
	if v, ok := labels[t.RegionLabel]; ok && t.RegionLabel != "" {
		region = v
	}
	return zone, region
}
