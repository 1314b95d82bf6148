// Package e2elb is Kubernetes' own e2e suite cut to the sig-network specs, built as e2e.test is
// (go test -c) from the k8s.io/kubernetes release the tests' components come from. The
// conformance run (test/conformance) focuses it on the LoadBalancer specs. Only
// test/e2e/network is linked: the whole e2e.test links every SIG's specs and takes minutes more.
package e2elb

import (
	"flag"
	"os"
	"testing"

	"github.com/onsi/ginkgo/v2"
	"github.com/onsi/gomega"

	"k8s.io/apimachinery/pkg/types"
	"k8s.io/component-base/logs"
	"k8s.io/klog/v2"
	"k8s.io/kubernetes/test/e2e/framework"
	"k8s.io/kubernetes/test/e2e/framework/config"

	// The specs.
	_ "k8s.io/kubernetes/test/e2e/network"

	// As e2e.test configures the framework.
	_ "k8s.io/kubernetes/test/e2e/framework/debug/init"
	_ "k8s.io/kubernetes/test/e2e/framework/metrics/init"
	_ "k8s.io/kubernetes/test/e2e/framework/node/init"
	_ "k8s.io/kubernetes/test/utils/ktesting/format"
)

func TestMain(m *testing.M) {
	runID := flag.String("run-id", "", "the e2e-run label of every namespace the specs create (default: a random UUID); "+
		"runs beside each other on one cluster tell their namespaces apart by it (the conformance run gives each its pool)")
	config.CopyFlags(config.Flags, flag.CommandLine)
	framework.RegisterCommonFlags(flag.CommandLine)
	framework.RegisterClusterFlags(flag.CommandLine)
	flag.Parse()
	if *runID != "" {
		framework.RunID = types.UID(*runID)
	}
	framework.AfterReadingAllFlags(&framework.TestContext)
	os.Exit(m.Run())
}

func TestE2E(t *testing.T) {
	logs.InitLogs()
	defer logs.FlushLogs()
	klog.EnableContextualLogging(true)
	gomega.RegisterFailHandler(framework.Fail)
	suiteConfig, reporterConfig := framework.CreateGinkgoConfig()
	ginkgo.RunSpecs(t, "Kubernetes sig-network e2e (metalvip conformance)", suiteConfig, reporterConfig)
}
