// Command metalvip-agent runs on every node (a DaemonSet with hostNetwork). It takes its node's
// desired state from metalvip-cloud-controller-manager over mutually authenticated gRPC and
// announces VIPs by ARP/NDP and BGP. It holds no Kubernetes credential that grants anything:
// with --tls-mode=enroll, a projected ServiceAccount token that proves its node to the CCM and
// that RBAC allows nothing.
//
// With --control-plane-config it also serves the control-plane VIP in front of the
// kube-apiservers from a local file (a static pod on each control-plane node, see
// docs/control-plane.md); without TLS flags it then serves no gRPC at all (no CCM).
package main

import (
	"context"
	"encoding/base64"
	"errors"
	"flag"
	"fmt"
	"net"
	"net/netip"
	"net/url"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"

	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"k8s.io/klog/v2"

	"github.com/metalvip/metalvip/internal/agentapi"
	"github.com/metalvip/metalvip/internal/certs"
	"github.com/metalvip/metalvip/internal/connlimit"
	"github.com/metalvip/metalvip/internal/identity"
	"github.com/metalvip/metalvip/internal/memlimit"
	"github.com/metalvip/metalvip/internal/metricsauth"
	"github.com/metalvip/metalvip/internal/version"
	"github.com/metalvip/metalvip/nodeagent"
	"github.com/metalvip/metalvip/nodeagent/bgp"
	"github.com/metalvip/metalvip/nodeagent/dataplane"
	"github.com/metalvip/metalvip/nodeagent/failover"
	"github.com/metalvip/metalvip/nodeagent/l2"
)

type flags struct {
	node, listen, stateDir    string
	metrics, metricsAuth      string
	kubeconfig                string
	caFile, certFile, keyFile string
	tlsMode, tokenFile        string
	insecure                  bool
	interfaces                string
	routerID                  string
	refresh, shutdownTimeout  time.Duration
	restartGrace              time.Duration
	podName, podNamespace     string
	keyLifetime               time.Duration
	controlPlane              string
	printKey                  bool
	kubeProxyHealthz          string
	dataPlaneGrace            time.Duration
}

func parseFlags(args []string) (*flags, error) {
	f := &flags{}
	fs := flag.NewFlagSet("metalvip-agent", flag.ContinueOnError)
	fs.StringVar(&f.node, "node-name", os.Getenv("NODE_NAME"), "this node's name, as the Node object has it (default $NODE_NAME)")
	fs.StringVar(&f.listen, "listen-address", ":7472", "where the gRPC service listens: host:port, [v6]:port, or a bare address (port 7472), so $(NODE_IP) suits IPv4 and IPv6 nodes")
	fs.StringVar(&f.metrics, "metrics-address", ":7474", "where /metrics (Prometheus), /healthz and /readyz are served: host:port, [v6]:port or a bare address (port 7474); empty for none")
	fs.StringVar(&f.metricsAuth, "metrics-auth", "none", "who may read /metrics: none (plain HTTP, anyone who reaches the port) or kubernetes (HTTPS with the agent's certificate; a bearer token checked by a TokenReview and a SubjectAccessReview for get on /metrics; /healthz and /readyz stay open)")
	fs.StringVar(&f.kubeconfig, "kubeconfig", "", "--metrics-auth=kubernetes: the kubeconfig of the API server that reviews tokens (default: in-cluster, the Pod's ServiceAccount)")
	fs.StringVar(&f.stateDir, "state-dir", "/var/lib/metalvip-agent", "folder for the last applied state, so that a restart resumes announcing")
	fs.StringVar(&f.tlsMode, "tls-mode", "files", "where this agent's certificate comes from: files (--tls-cert, --tls-key, made by metalvipctl certs) or enroll (issued by the CCM for a projected ServiceAccount token, kept in --state-dir; docs/agent-tls.md)")
	fs.StringVar(&f.caFile, "tls-ca", "", "PEM file of the CA that signs the CCM's certificate (enroll: the ConfigMap metalvip-ca, mounted)")
	fs.StringVar(&f.certFile, "tls-cert", "", "PEM file of this agent's certificate (naming the node); files mode")
	fs.StringVar(&f.keyFile, "tls-key", "", "PEM file of this agent's key; files mode")
	fs.StringVar(&f.tokenFile, "token-file", "/var/run/secrets/metalvip/token", "enroll mode: this agent's projected ServiceAccount token (audience metalvip-agent), read at every enrollment")
	fs.BoolVar(&f.insecure, "insecure", false, "serve plaintext without authenticating the CCM: for labs only")
	fs.StringVar(&f.interfaces, "interfaces", "", "comma-separated interfaces to answer ARP/NDP on when an announcement names none (default: the interface of the default route)")
	fs.StringVar(&f.routerID, "router-id", "", "BGP router ID when the CCM gives none (default: the first IPv4 address of the first interface)")
	fs.DurationVar(&f.refresh, "gratuitous-refresh", 30*time.Second, "how often owned L2 VIPs are announced again (keep under the switches' FDB ageing)")
	fs.DurationVar(&f.shutdownTimeout, "shutdown-timeout", 5*time.Second, "how long a SIGTERM may take to withdraw routes and close sessions")
	fs.DurationVar(&f.restartGrace, "restart-grace", 0, "on SIGTERM, tell the heartbeat peers and the CCM that this agent restarts and is back within this long (1s to 30s; 0: off): its L2 VIPs wait for it instead of moving away and back. A draining node hands over instead; with --pod-name, only a Pod being deleted through the API (a rolling update) counts as a restart. See docs/upgrading.md")
	fs.StringVar(&f.podName, "pod-name", "", "this agent's Pod (with --pod-namespace): on SIGTERM, --restart-grace applies only if the Pod is being deleted through the API (a rolling update), not when the kubelet stops it on its own (a node shutting down); read with --kubeconfig or in-cluster")
	fs.StringVar(&f.podNamespace, "pod-namespace", "", "the namespace of --pod-name")
	fs.DurationVar(&f.keyLifetime, "heartbeat-key-lifetime", 30*24*time.Hour, "how old this node's heartbeat key may grow before a new one replaces it, without a failover (0: never by age; SIGHUP rotates at once)")
	fs.StringVar(&f.controlPlane, "control-plane-config", "", "local file of the control-plane VIP (standalone mode, docs/control-plane.md); read again when it changes")
	fs.StringVar(&f.kubeProxyHealthz, "kube-proxy-healthz", "", "kube-proxy's health URL (http://127.0.0.1:10256/healthz): this node takes no VIP while kube-proxy is not healthy, and announces a BGP Service with externalTrafficPolicy Local (stands by for an L2 one after the nodes that serve) only once kube-proxy says on its health check node port (on the --listen-address host) that it sends the traffic to this node's endpoints. Empty: not checked (nodes without kube-proxy). See docs/announcing.md")
	fs.DurationVar(&f.dataPlaneGrace, "data-plane-grace", 10*time.Second, "with --kube-proxy-healthz: how long kube-proxy may fail to answer healthy (a restart of kube-proxy) before this node takes no VIP; 2s to 5m")
	fs.BoolVar(&f.printKey, "print-heartbeat-key", false, "print this node's control-plane heartbeat public key (made in --state-dir if there is none) for the control-plane file, and exit")
	klog.InitFlags(fs)
	fs.BoolFunc("version", "print the version and exit", func(string) error { fmt.Println(version.String("metalvip-agent")); os.Exit(0); return nil })
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	if fs.NArg() > 0 {
		return nil, fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	if f.printKey {
		return f, nil
	}
	if f.node == "" && f.controlPlane == "" {
		return nil, errors.New("--node-name (or $NODE_NAME) is required")
	}
	tlsGiven := f.caFile != "" || f.certFile != "" || f.keyFile != ""
	switch {
	case f.tlsMode != "files" && f.tlsMode != "enroll":
		return nil, fmt.Errorf("--tls-mode=%q: write files or enroll", f.tlsMode)
	case f.tlsMode == "enroll" && f.insecure:
		return nil, errors.New("--insecure turns TLS off; remove it or --tls-mode=enroll")
	case f.tlsMode == "enroll" && (f.certFile != "" || f.keyFile != ""):
		return nil, errors.New("--tls-mode=enroll: the certificate comes from the CCM; remove --tls-cert and --tls-key")
	case f.tlsMode == "enroll" && f.caFile == "":
		return nil, errors.New("--tls-mode=enroll needs --tls-ca: the CA bundle the CCM publishes in the ConfigMap metalvip-ca (docs/agent-tls.md)")
	case f.tlsMode == "enroll" && f.tokenFile == "":
		return nil, errors.New("--tls-mode=enroll needs --token-file: the projected ServiceAccount token (docs/agent-tls.md)")
	case f.tlsMode == "enroll":
	case f.insecure && tlsGiven:
		return nil, errors.New("--insecure turns TLS off; remove it or the --tls-* flags")
	case f.controlPlane != "" && !f.insecure && !tlsGiven:
		// Standalone: the control-plane VIP alone, no gRPC service.
	case !f.insecure && (f.caFile == "" || f.certFile == "" || f.keyFile == ""):
		return nil, errors.New("--tls-ca, --tls-cert and --tls-key are required (see docs/agent-tls.md), or --insecure for a lab")
	}
	if f.keyLifetime != 0 && f.keyLifetime < time.Hour {
		return nil, fmt.Errorf("--heartbeat-key-lifetime=%s is too short; give 0 or at least 1h (peers learn a new key through the CCM)", f.keyLifetime)
	}
	if f.refresh < time.Second {
		return nil, fmt.Errorf("--gratuitous-refresh=%s is too short; give at least 1s", f.refresh)
	}
	if f.restartGrace != 0 && (f.restartGrace < time.Second || f.restartGrace > failover.MaxRestartGrace) {
		return nil, fmt.Errorf("--restart-grace=%s: give 0 (off) or 1s to %s", f.restartGrace, failover.MaxRestartGrace)
	}
	switch {
	case f.metricsAuth != "none" && f.metricsAuth != "kubernetes":
		return nil, fmt.Errorf("--metrics-auth=%q: write none or kubernetes", f.metricsAuth)
	case f.metricsAuth == "kubernetes" && f.metrics == "":
		return nil, errors.New("--metrics-auth=kubernetes guards the metrics endpoint, but --metrics-address is empty (none served); give an address or remove --metrics-auth")
	case f.metricsAuth == "none" && f.kubeconfig != "" && f.podName == "":
		return nil, errors.New("--kubeconfig is used by --metrics-auth=kubernetes and --pod-name alone; remove it or add one of them")
	case (f.podName == "") != (f.podNamespace == ""):
		return nil, errors.New("--pod-name and --pod-namespace go together")
	}
	if f.routerID != "" {
		if a, err := netip.ParseAddr(f.routerID); err != nil || !a.Is4() {
			return nil, fmt.Errorf("--router-id=%q is not an IPv4 address", f.routerID)
		}
	}
	var err error
	if f.kubeProxyHealthz != "" {
		u, err := url.Parse(f.kubeProxyHealthz)
		if err != nil || u.Scheme != "http" && u.Scheme != "https" || u.Host == "" {
			return nil, fmt.Errorf("--kube-proxy-healthz=%q: give kube-proxy's health URL, such as http://127.0.0.1:10256/healthz", f.kubeProxyHealthz)
		}
	}
	if f.dataPlaneGrace < 2*time.Second || f.dataPlaneGrace > 5*time.Minute {
		return nil, fmt.Errorf("--data-plane-grace=%s: give 2s to 5m", f.dataPlaneGrace)
	}
	if f.listen, err = hostPort(f.listen, "7472"); err != nil {
		return nil, fmt.Errorf("--listen-address: %w", err)
	}
	if f.metrics != "" {
		if f.metrics, err = hostPort(f.metrics, "7474"); err != nil {
			return nil, fmt.Errorf("--metrics-address: %w", err)
		}
	}
	return f, nil
}

func main() {
	f, err := parseFlags(os.Args[1:])
	if errors.Is(err, flag.ErrHelp) {
		os.Exit(0)
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "metalvip-agent: %v\n", err)
		os.Exit(2)
	}
	if f.printKey {
		key, err := nodeagent.ControlPlaneKey(f.stateDir)
		if err != nil {
			fmt.Fprintf(os.Stderr, "metalvip-agent: %v\n", err)
			os.Exit(1)
		}
		fmt.Println(base64.StdEncoding.EncodeToString(key))
		os.Exit(0)
	}
	if err := run(f); err != nil {
		klog.ErrorS(err, "metalvip-agent stopped")
		klog.Flush()
		os.Exit(1)
	}
	klog.Flush()
}

func run(f *flags) error {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	memlimit.SetAndLog()

	ifaces, err := interfaces(f.interfaces)
	if err != nil {
		return err
	}
	routerID, err := routerID(f.routerID, ifaces)
	if err != nil {
		return err
	}
	var cp *nodeagent.ControlPlane
	if f.controlPlane != "" {
		cp, err = nodeagent.NewControlPlane(nodeagent.ControlPlaneOptions{File: f.controlPlane, StateDir: f.stateDir, Interfaces: ifaces})
		if err != nil {
			return err
		}
		if node := cp.Node(); f.node == "" {
			f.node = node
		} else if f.node != node {
			return fmt.Errorf("--node-name is %q but %s is for node %q", f.node, f.controlPlane, node)
		}
	}
	// The gRPC service's TLS material, read before anything starts; /metrics over HTTPS serves
	// the same certificate (nil: no gRPC TLS, a self-signed one).
	var src certs.Source
	var enrollee *identity.Enrollee
	switch {
	case f.insecure || (f.controlPlane != "" && f.caFile == ""):
	case f.tlsMode == "enroll":
		if enrollee, err = identity.NewEnrollee(identity.EnrolleeOptions{Node: f.node, CAFile: f.caFile, TokenFile: f.tokenFile, Dir: f.stateDir}); err != nil {
			return fmt.Errorf("enrollment: %w", err)
		}
		src = enrollee
	default:
		if src, err = certs.FileSource(certs.Files{CA: f.caFile, Cert: f.certFile, Key: f.keyFile}); err != nil {
			return fmt.Errorf("TLS: %w", err)
		}
	}
	var guard *metricsauth.Filter
	if f.metricsAuth == "kubernetes" {
		if guard, err = newMetricsGuard(f.kubeconfig); err != nil {
			return fmt.Errorf("--metrics-auth=kubernetes: %w", err)
		}
	}
	speaker := l2.New(l2.Options{Refresh: f.refresh})
	reg := newRegistry()
	agent, err := nodeagent.New(ctx, nodeagent.Options{
		Observer: newObserver(reg),
		Node:     f.node, StateDir: f.stateDir, Interfaces: ifaces, RouterID: routerID, L2: speaker,
		NewBGP:               func(ctx context.Context, cfg bgp.Config) (nodeagent.BGP, error) { return bgp.New(ctx, cfg) },
		HeartbeatKeyLifetime: f.keyLifetime,
		ControlPlane:         cp,
		DataPlane:            dataPlaneConfig(f),
	})
	if err != nil {
		speaker.Close()
		return err
	}
	reg.MustRegister(newGauges(agent))
	var metrics *metricsServer
	if f.metrics != "" {
		if metrics, err = newMetricsServer(f.metrics, reg, agent, guard, src, f.node); err != nil {
			_ = agent.Close(context.Background())
			return fmt.Errorf("--metrics-address: %w", err)
		}
		defer metrics.Close()
		klog.InfoS("Serving metrics and health", "address", metrics.lis.Addr().String(), "auth", f.metricsAuth)
	}
	if f.controlPlane != "" && !f.insecure && f.caFile == "" {
		if metrics != nil {
			metrics.ready.Store(true)
		}
		klog.InfoS("metalvip-agent serving the control-plane VIP alone (no TLS flags: no gRPC service, no CCM)", "node", f.node, "interfaces", ifaces)
		<-ctx.Done()
		klog.InfoS("Shutting down: withdrawing routes and closing sessions")
		sctx, cancel := context.WithTimeout(context.Background(), f.shutdownTimeout)
		defer cancel()
		return agent.Close(sctx)
	}

	var creds credentials.TransportCredentials
	var serverOpts []nodeagent.ServerOption
	switch {
	case f.insecure:
		klog.InfoS("WARNING: serving plaintext with no client authentication (--insecure); anyone who reaches this port can make this node announce addresses")
		creds = insecure.NewCredentials()
	default:
		cfg, err := certs.ServerConfigFrom(src, certs.CCMName, certs.ViewerName)
		if err != nil {
			_ = agent.Close(context.Background())
			return fmt.Errorf("TLS: %w", err)
		}
		creds = credentials.NewTLS(cfg)
		if enrollee != nil {
			serverOpts = append(serverOpts, nodeagent.WithEnrollee(enrollee))
		}
	}
	srv := nodeagent.NewServer(agent, creds, !f.insecure, serverOpts...)
	tcp, err := net.Listen("tcp", f.listen)
	if err != nil {
		_ = agent.Close(context.Background())
		return err
	}
	lis := connlimit.New(tcp, agentapi.MaxConnsPerAddr, agentapi.MaxPendingHandshakes)
	klog.InfoS("metalvip-agent serving", "node", f.node, "address", lis.Addr().String(), "interfaces", ifaces, "routerID", routerID, "tls", !f.insecure, "tlsMode", f.tlsMode)
	serveErr := make(chan error, 1)
	go func() { serveErr <- srv.Serve(lis) }()
	if metrics != nil {
		metrics.ready.Store(true)
	}
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)
	go func() {
		for {
			select {
			case <-ctx.Done():
				return
			case <-hup:
				agent.RotateHeartbeatKey()
			}
		}
	}()

	select {
	case <-ctx.Done():
		klog.InfoS("Shutting down: withdrawing routes and closing sessions")
	case err := <-serveErr:
		_ = agent.Close(context.Background())
		return err
	}
	sctx, cancel := context.WithTimeout(context.Background(), f.shutdownTimeout)
	defer cancel()
	err = agent.Restart(sctx, restartGrace(sctx, f)) // Close, unless a planned restart has a grace
	done := make(chan struct{})
	go func() { srv.GracefulStop(); close(done) }()
	select {
	case <-done:
	case <-sctx.Done():
		srv.Stop()
	}
	return err
}

// dataPlaneConfig is how the agent asks kube-proxy: its health URL every second, failing
// --data-plane-grace in a row before the node takes no VIP; the health check node ports on
// the listen address's host (the node's address; kube-proxy serves them on the node's
// addresses), or on 127.0.0.1 when it listens on every address.
func dataPlaneConfig(f *flags) dataplane.Config {
	host := netip.MustParseAddr("127.0.0.1")
	if h, _, err := net.SplitHostPort(f.listen); err == nil {
		if a, err := netip.ParseAddr(h); err == nil && !a.IsUnspecified() {
			host = a.Unmap()
		} else if err == nil && a.Is6() {
			host = netip.IPv6Loopback()
		}
	}
	// Failed answers a second apart span the grace: one more than its seconds.
	return dataplane.Config{Healthz: f.kubeProxyHealthz, PortHost: host, Interval: time.Second,
		Misses: int(f.dataPlaneGrace/time.Second) + 1}
}

// hostPort returns s as host:port: s itself when it is one, else s as a bare IP address with
// port def ("198.51.100.1", "2001:db8::1" and "[2001:db8::1]" alike).
func hostPort(s, def string) (string, error) {
	if _, port, err := net.SplitHostPort(s); err == nil {
		if n, err := strconv.ParseUint(port, 10, 16); err != nil || n == 0 {
			return "", fmt.Errorf("%q: the port must be 1 to 65535", s)
		}
		return s, nil
	}
	a, err := netip.ParseAddr(strings.TrimSuffix(strings.TrimPrefix(s, "["), "]"))
	if err != nil {
		return "", fmt.Errorf("%q is neither host:port, [v6]:port nor an IP address", s)
	}
	return net.JoinHostPort(a.String(), def), nil
}

// interfaces returns the named interfaces, or the one holding the default route.
func interfaces(list string) ([]string, error) {
	if list != "" {
		var out []string
		for n := range strings.SplitSeq(list, ",") {
			n = strings.TrimSpace(n)
			if _, err := net.InterfaceByName(n); err != nil {
				return nil, fmt.Errorf("--interfaces: %s: %w", n, err)
			}
			out = append(out, n)
		}
		return out, nil
	}
	name, err := defaultRouteInterface()
	if err != nil {
		return nil, fmt.Errorf("no --interfaces given and %w", err)
	}
	return []string{name}, nil
}

func routerID(flag string, ifaces []string) (netip.Addr, error) {
	if flag != "" {
		return netip.MustParseAddr(flag), nil // checked by parseFlags
	}
	ifi, err := net.InterfaceByName(ifaces[0])
	if err != nil {
		return netip.Addr{}, err
	}
	addrs, err := ifi.Addrs()
	if err != nil {
		return netip.Addr{}, err
	}
	for _, a := range addrs {
		if p, err := netip.ParsePrefix(a.String()); err == nil && p.Addr().Is4() {
			return p.Addr(), nil
		}
	}
	// An IPv6-only node: L2 needs no router ID, and BGP says what is missing when it is used.
	klog.InfoS("No IPv4 address for a BGP router ID; BGP needs --router-id on this node", "interface", ifaces[0])
	return netip.Addr{}, nil
}
