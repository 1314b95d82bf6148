package main

import (
	"strings"
	"testing"
)

func TestParseFlags(t *testing.T) {
	if f, err := parseFlags([]string{"--node-name", "n1", "--insecure", "--listen-address", "127.0.0.1:9000"}); err != nil || f.node != "n1" || !f.insecure {
		t.Errorf("valid flags: %+v, %v", f, err)
	}
	if f, err := parseFlags([]string{"--node-name", "n1", "--insecure"}); err != nil || f.metricsAuth != "none" {
		t.Errorf("--metrics-auth default: %+v, %v; want none (plain HTTP, as the labs scrape)", f, err)
	}
	if f, err := parseFlags([]string{"--node-name", "n1", "--insecure", "--metrics-auth", "kubernetes", "--kubeconfig", "/k"}); err != nil || f.metricsAuth != "kubernetes" || f.kubeconfig != "/k" {
		t.Errorf("--metrics-auth=kubernetes: %+v, %v", f, err)
	}
	// kube-proxy checked on the node's address: its health check node ports there.
	if f, err := parseFlags([]string{"--node-name", "n1", "--insecure", "--listen-address", "198.51.100.7", "--kube-proxy-healthz", "http://127.0.0.1:10256/healthz"}); err != nil {
		t.Fatal(err)
	} else if c := dataPlaneConfig(f); c.Healthz != "http://127.0.0.1:10256/healthz" || c.PortHost.String() != "198.51.100.7" || c.Misses != 11 {
		t.Errorf("data plane %+v", c)
	}
	if f, err := parseFlags([]string{"--node-name", "n1", "--insecure", "--data-plane-grace", "3s"}); err != nil {
		t.Fatal(err)
	} else if c := dataPlaneConfig(f); c.Healthz != "" || c.PortHost.String() != "127.0.0.1" || c.Misses != 4 {
		t.Errorf("data plane, kube-proxy not checked, listening everywhere: %+v", c)
	}
	if _, err := parseFlags([]string{"--node-name", "n1", "--tls-ca", "a", "--tls-cert", "b", "--tls-key", "c"}); err != nil {
		t.Errorf("TLS flags: %v", err)
	}
	if f, err := parseFlags([]string{"--node-name", "n1", "--tls-mode", "enroll", "--tls-ca", "a"}); err != nil || f.tokenFile == "" {
		t.Errorf("enroll flags: %+v, %v", f, err)
	}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--insecure"}, "--node-name"},
		{[]string{"--node-name", "n1"}, "--tls-ca, --tls-cert and --tls-key are required"},
		{[]string{"--node-name", "n1", "--insecure", "--tls-ca", "x"}, "--insecure turns TLS off"},
		{[]string{"--node-name", "n1", "--insecure", "--router-id", "2001:db8::1"}, "not an IPv4 address"},
		{[]string{"--node-name", "n1", "--insecure", "--gratuitous-refresh", "10ms"}, "too short"},
		{[]string{"--node-name", "n1", "--insecure", "--listen-address", "7472"}, "--listen-address"},
		{[]string{"--node-name", "n1", "--insecure", "extra"}, "unexpected arguments"},
		{[]string{"--node-name", "n1", "--insecure", "--heartbeat-key-lifetime", "10m"}, "at least 1h"},
		{[]string{"--node-name", "n1", "--tls-mode", "auto"}, "write files or enroll"},
		{[]string{"--node-name", "n1", "--tls-mode", "enroll"}, "needs --tls-ca"},
		{[]string{"--node-name", "n1", "--tls-mode", "enroll", "--tls-ca", "a", "--tls-key", "k"}, "remove --tls-cert and --tls-key"},
		{[]string{"--node-name", "n1", "--tls-mode", "enroll", "--insecure"}, "--insecure turns TLS off"},
		{[]string{"--node-name", "n1", "--tls-mode", "enroll", "--tls-ca", "a", "--token-file", ""}, "needs --token-file"},
		{[]string{"--node-name", "n1", "--insecure", "--metrics-auth", "token"}, "write none or kubernetes"},
		{[]string{"--node-name", "n1", "--insecure", "--metrics-auth", "kubernetes", "--metrics-address", ""}, "--metrics-address is empty"},
		{[]string{"--node-name", "n1", "--insecure", "--kubeconfig", "/k"}, "add one of them"},
		{[]string{"--node-name", "n1", "--insecure", "--restart-grace", "500ms"}, "give 0 (off) or 1s to 30s"},
		{[]string{"--node-name", "n1", "--insecure", "--restart-grace", "31s"}, "give 0 (off) or 1s to 30s"},
		{[]string{"--node-name", "n1", "--insecure", "--kube-proxy-healthz", "127.0.0.1:10256"}, "give kube-proxy's health URL"},
		{[]string{"--node-name", "n1", "--insecure", "--kube-proxy-healthz", "ftp://127.0.0.1/healthz"}, "give kube-proxy's health URL"},
		{[]string{"--node-name", "n1", "--insecure", "--data-plane-grace", "1s"}, "give 2s to 5m"},
		{[]string{"--node-name", "n1", "--insecure", "--pod-name", "metalvip-agent-x"}, "go together"},
	} {
		if _, err := parseFlags(tc.args); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("parseFlags(%v) = %v; want an error with %q", tc.args, err, tc.want)
		}
	}
}

func TestListenAddresses(t *testing.T) {
	for _, tc := range []struct{ name, in, want string }{
		{"a bare IPv4 address gets the default port", "198.51.100.10", "198.51.100.10:7472"},
		{"a bare IPv6 address gets brackets and the default port", "2001:db8::10", "[2001:db8::10]:7472"},
		{"a bracketed bare IPv6 address gets the default port", "[2001:db8::10]", "[2001:db8::10]:7472"},
		{"host:port is kept", "198.51.100.10:9000", "198.51.100.10:9000"},
		{"[v6]:port is kept", "[2001:db8::10]:9000", "[2001:db8::10]:9000"},
		{"every address with a port is kept", ":7472", ":7472"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f, err := parseFlags([]string{"--node-name", "n1", "--insecure", "--listen-address", tc.in})
			if err != nil || f.listen != tc.want {
				t.Fatalf("--listen-address %q: got %q, %v; want %q", tc.in, f.listen, err, tc.want)
			}
		})
	}
	for _, in := range []string{"7472", "node-a", "198.51.100.10:0", "198.51.100.10:70000", "2001:db8::10:"} {
		if _, err := parseFlags([]string{"--node-name", "n1", "--insecure", "--listen-address", in}); err == nil {
			t.Errorf("--listen-address %q accepted", in)
		}
	}
	if f, err := parseFlags([]string{"--node-name", "n1", "--insecure", "--metrics-address", ""}); err != nil || f.metrics != "" {
		t.Errorf("--metrics-address empty: %q, %v; want none", f.metrics, err)
	}
	if f, err := parseFlags([]string{"--node-name", "n1", "--insecure"}); err != nil || f.metrics != ":7474" {
		t.Errorf("--metrics-address default: %q, %v", f.metrics, err)
	}
}
