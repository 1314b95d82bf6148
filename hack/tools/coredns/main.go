// Command coredns is CoreDNS with the plugins a test cluster's DNS needs (kubernetes, forward
// is left out: the lab has no upstream), built from CoreDNS's Go module as the Kubernetes
// components are built from theirs (hack/kube.sh). The conformance cluster runs it beside the
// API server; kubelets point their pods at it.
package main

import (
	"github.com/coredns/coredns/core/dnsserver"
	"github.com/coredns/coredns/coremain"

	// The plugins, in the order they run (dnsserver.Directives).
	_ "github.com/coredns/coredns/plugin/errors"
	_ "github.com/coredns/coredns/plugin/health"
	_ "github.com/coredns/coredns/plugin/kubernetes"
	_ "github.com/coredns/coredns/plugin/log"
	_ "github.com/coredns/coredns/plugin/ready"
)

func init() {
	dnsserver.Directives = []string{"errors", "log", "health", "ready", "kubernetes"}
}

func main() { coremain.Run() }
