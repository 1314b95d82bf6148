package main

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"net/netip"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/klog/v2"

	"github.com/metalvip/metalvip/internal/certs"
	"github.com/metalvip/metalvip/internal/metricsauth"
	"github.com/metalvip/metalvip/internal/version"
	"github.com/metalvip/metalvip/nodeagent"
)

// healthWait is how long /healthz waits for the agent's state lock before calling it stuck.
const healthWait = 5 * time.Second

// observer counts, as they happen, what the agent's gauges cannot show at scrape time.
type observer struct {
	applies   *prometheus.CounterVec
	failovers *prometheus.CounterVec
	takeover  prometheus.Histogram
	rtt       prometheus.Histogram
}

var _ nodeagent.Observer = (*observer)(nil)

func newObserver(reg prometheus.Registerer) *observer {
	o := &observer{
		applies: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "metalvip_agent_applies_total",
			Help: "Desired states applied that changed something, by result: accepted (every item taken) or partly_refused (some items refused, the rest applied).",
		}, []string{"result"}),
		failovers: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "metalvip_agent_failovers_total",
			Help: "L2 VIPs this node started (took_over) or stopped (released) answering for.",
		}, []string{"direction"}),
		takeover: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "metalvip_agent_takeover_seconds",
			Help:    "For a takeover after the node answering before died: the time from when that node was last proven alive to this node answering.",
			Buckets: []float64{.01, .025, .05, .1, .15, .2, .3, .5, 1, 2, 5, 10},
		}),
		rtt: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "metalvip_agent_heartbeat_rtt_seconds",
			Help:    "Round trip of heartbeats: from sending one to hearing a peer echo it.",
			Buckets: []float64{.0001, .00025, .0005, .001, .0025, .005, .01, .025, .05, .1},
		}),
	}
	for _, r := range []string{"accepted", "partly_refused"} {
		o.applies.WithLabelValues(r)
	}
	for _, d := range []string{"took_over", "released"} {
		o.failovers.WithLabelValues(d)
	}
	reg.MustRegister(o.applies, o.failovers, o.takeover, o.rtt)
	return o
}

func (o *observer) Applied(refused int) {
	if refused == 0 {
		o.applies.WithLabelValues("accepted").Inc()
	} else {
		o.applies.WithLabelValues("partly_refused").Inc()
	}
}

func (o *observer) TookOver(_ netip.Addr, after time.Duration) {
	o.failovers.WithLabelValues("took_over").Inc()
	if after > 0 {
		o.takeover.Observe(after.Seconds())
	}
}

func (o *observer) Released(netip.Addr) { o.failovers.WithLabelValues("released").Inc() }

func (o *observer) HeartbeatRTT(d time.Duration) { o.rtt.Observe(d.Seconds()) }

// gauges reads the agent's state and counters at scrape time.
type gauges struct {
	agent *nodeagent.Agent

	vips, hbPeers, hbAlive, sessions, refused, generation, saved *prometheus.Desc
	requests, replies, gratuitous, hbSent, hbAccepted, hbStalls  *prometheus.Desc
	hbRefused, egressFlows                                       *prometheus.Desc
}

func newGauges(a *nodeagent.Agent) *gauges {
	d := func(name, help string, labels ...string) *prometheus.Desc {
		return prometheus.NewDesc(name, help, labels, nil)
	}
	return &gauges{
		agent:       a,
		vips:        d("metalvip_agent_vips", "VIPs of the held state by what this node does: answered or standby (L2), advertised (BGP).", "state"),
		hbPeers:     d("metalvip_agent_heartbeat_peers", "Nodes this node exchanges heartbeats with."),
		hbAlive:     d("metalvip_agent_heartbeat_peers_alive", "Heartbeat peers alive now."),
		sessions:    d("metalvip_agent_bgp_sessions", "BGP sessions by state (established, idle, active...).", "state"),
		refused:     d("metalvip_agent_refused_items", "Items of the held state the agent refused (see metalvipctl agent for the reasons)."),
		generation:  d("metalvip_agent_state_generation", "Generation of the held desired state."),
		saved:       d("metalvip_agent_state_saved", "1 when the held desired state is saved in the state directory, 0 when the last one could not be (a full or read-only disk: applied in memory, a restart would resume an older one)."),
		requests:    d("metalvip_agent_l2_requests_total", "ARP requests and neighbor solicitations heard.", "protocol"),
		replies:     d("metalvip_agent_l2_replies_total", "ARP replies and neighbor advertisements sent in answer.", "protocol"),
		gratuitous:  d("metalvip_agent_l2_gratuitous_total", "Gratuitous ARPs and unsolicited neighbor advertisements sent.", "protocol"),
		hbSent:      d("metalvip_agent_heartbeats_sent_total", "Heartbeats sent."),
		hbAccepted:  d("metalvip_agent_heartbeats_accepted_total", "Heartbeats verified and proving a peer alive."),
		hbStalls:    d("metalvip_agent_heartbeat_stalls_total", "Times the agent found it had not run for over two heartbeat intervals (starved of CPU, paused): no peer counts as dead for a failover deadline after each."),
		hbRefused:   d("metalvip_agent_heartbeats_refused_total", "Heartbeats refused, by reason (ttl, source, key, replay, stale, mac...).", "reason"),
		egressFlows: d("metalvip_agent_egress_flows_total", "Connections this node source-NATed to an egress VIP it is the egress node of now, since the agent started (docs/egress.md).", "vip", "services"),
	}
}

func (g *gauges) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{g.vips, g.hbPeers, g.hbAlive, g.sessions, g.refused, g.generation, g.saved,
		g.requests, g.replies, g.gratuitous, g.hbSent, g.hbAccepted, g.hbStalls, g.hbRefused, g.egressFlows} {
		ch <- d
	}
}

func (g *gauges) Collect(ch chan<- prometheus.Metric) {
	s := g.agent.Gauges()
	gauge := func(d *prometheus.Desc, v float64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, labels...)
	}
	counter := func(d *prometheus.Desc, v uint64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, float64(v), labels...)
	}
	gauge(g.vips, float64(s.L2Answered), "answered")
	gauge(g.vips, float64(s.L2Standby), "standby")
	gauge(g.vips, float64(s.BGPRoutes), "advertised")
	gauge(g.hbPeers, float64(s.HeartbeatPeers))
	gauge(g.hbAlive, float64(s.HeartbeatPeersAlive))
	for state, n := range s.BGPSessions {
		gauge(g.sessions, float64(n), state)
	}
	gauge(g.refused, float64(s.Refused))
	gauge(g.generation, float64(s.Generation))
	saved := 0.0
	if s.StateSaved {
		saved = 1
	}
	gauge(g.saved, saved)
	if l2 := s.L2; l2 != nil {
		counter(g.requests, l2.GetArpRequests(), "arp")
		counter(g.requests, l2.GetNeighborSolicitations(), "ndp")
		counter(g.replies, l2.GetArpReplies(), "arp")
		counter(g.replies, l2.GetNeighborAdvertisements(), "ndp")
		counter(g.gratuitous, l2.GetGratuitousArps(), "arp")
		counter(g.gratuitous, l2.GetUnsolicitedAdvertisements(), "ndp")
	}
	if hb := s.Heartbeats; hb != nil {
		counter(g.hbSent, hb.GetSent())
		counter(g.hbAccepted, hb.GetAccepted())
		counter(g.hbStalls, hb.GetStalls())
		for reason, n := range hb.GetRefused() {
			counter(g.hbRefused, n, reason)
		}
	}
	for _, e := range s.Egress {
		counter(g.egressFlows, e.Flows, e.VIP, e.Services)
	}
}

// metricsServer serves /metrics, /healthz and /readyz: in plain HTTP, or with a guard over
// HTTPS with /metrics authenticated and authorised (the probes stay open: kubelet sends no
// token).
type metricsServer struct {
	srv   *http.Server
	lis   net.Listener
	ready atomic.Bool
}

// newMetricsServer listens on addr at once, so that a port in use is an error at start. With
// guard it serves HTTPS with src's certificate (the gRPC service's: the CCM's or metalvipctl's
// CA signed it for node), or, without src, a self-signed one made now for node.
func newMetricsServer(addr string, reg *prometheus.Registry, agent *nodeagent.Agent, guard *metricsauth.Filter, src certs.Source, node string) (*metricsServer, error) {
	var cfg *tls.Config
	if guard != nil {
		cert := func(*tls.ClientHelloInfo) (*tls.Certificate, error) { return src.Certificate() }
		if src == nil {
			own, err := selfSigned(node)
			if err != nil {
				return nil, fmt.Errorf("a certificate for HTTPS: %w", err)
			}
			cert = func(*tls.ClientHelloInfo) (*tls.Certificate, error) { return own, nil }
		}
		cfg = &tls.Config{MinVersion: tls.VersionTLS12, GetCertificate: cert}
	}
	lis, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, err
	}
	if cfg != nil {
		lis = tls.NewListener(lis, cfg)
	}
	m := &metricsServer{lis: lis}
	mux := http.NewServeMux()
	var metrics http.Handler = promhttp.HandlerFor(reg, promhttp.HandlerOpts{Registry: reg})
	if guard != nil {
		metrics = guard.Wrap(metrics)
	}
	mux.Handle("/metrics", metrics)
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) {
		if err := agent.Healthy(healthWait); err != nil {
			http.Error(w, err.Error(), http.StatusServiceUnavailable)
			return
		}
		_, _ = w.Write([]byte("ok\n"))
	})
	mux.HandleFunc("/readyz", func(w http.ResponseWriter, _ *http.Request) {
		if !m.ready.Load() {
			http.Error(w, "not serving the CCM yet", http.StatusServiceUnavailable)
			return
		}
		if err := agent.Healthy(healthWait); err != nil {
			http.Error(w, err.Error(), http.StatusServiceUnavailable)
			return
		}
		_, _ = w.Write([]byte("ok\n"))
	})
	m.srv = &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second, ReadTimeout: 10 * time.Second, WriteTimeout: 20 * time.Second,
		ErrorLog: log.New(io.Discard, "", 0)} // TLS handshake noise from port scanners
	go func() {
		if err := m.srv.Serve(lis); err != nil && !errors.Is(err, http.ErrServerClosed) {
			klog.ErrorS(err, "Metrics and health endpoint stopped")
		}
	}()
	return m, nil
}

// newMetricsGuard reviews tokens with the API server of kubeconfig (in-cluster when empty).
func newMetricsGuard(kubeconfig string) (*metricsauth.Filter, error) {
	cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		return nil, fmt.Errorf("the API server's configuration (--kubeconfig, or in-cluster: the Pod needs its ServiceAccount token): %w", err)
	}
	cfg = rest.CopyConfig(cfg)
	cfg.UserAgent = "metalvip-agent"
	c, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, err
	}
	return metricsauth.New(metricsauth.Options{Client: c}), nil
}

// selfSigned is the metrics certificate of an agent with no gRPC TLS (--insecure, standalone
// control-plane mode): signed by a CA made for it and thrown away, so nothing can verify it;
// it only keeps the token off the wire.
func selfSigned(node string) (*tls.Certificate, error) {
	ca, err := certs.NewCA("metalvip-agent-metrics."+node, 10*365*24*time.Hour)
	if err != nil {
		return nil, err
	}
	p, err := certs.Issue(ca, node, certs.Server, 10*365*24*time.Hour)
	if err != nil {
		return nil, err
	}
	c, err := tls.X509KeyPair(p.Cert, p.Key)
	return &c, err
}

func (m *metricsServer) Close() {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	_ = m.srv.Shutdown(ctx)
}

// newRegistry is the agent's own registry: its metrics, the Go runtime's and the process's.
func newRegistry() *prometheus.Registry {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	v := version.Get()
	info := prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "metalvip_agent_build_info", Help: "The agent's build: always 1.",
		ConstLabels: prometheus.Labels{"version": v.Version, "commit": v.Commit},
	})
	info.Set(1)
	reg.MustRegister(info)
	return reg
}
