package integration

import (
	"crypto/tls"
	"fmt"
	"net"
	"net/http"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"

	"github.com/metalvip/metalvip/test/kubeapi"
)

// TestTheCCMAnswersItsProbes: the startup, liveness and readiness probes of manifests/ (which
// the chart renders alike) ask the real CCM, elected leader, what the kubelet would: HTTPS on
// the secure port, no credentials, no verified certificate. A probe on a path the framework
// does not serve (there is no /readyz) or behind authentication keeps the CCM unready forever.
func TestTheCCMAnswersItsProbes(t *testing.T) {
	var d appsv1.Deployment
	typed(t, manifestDocs(t), "Deployment", "metalvip-cloud-controller-manager", &d)
	c := d.Spec.Template.Spec.Containers[0]
	probes := map[string]*corev1.Probe{"startup": c.StartupProbe, "liveness": c.LivenessProbe, "readiness": c.ReadinessProbe}
	for name, p := range probes {
		if p == nil || p.HTTPGet == nil || p.HTTPGet.Scheme != corev1.URISchemeHTTPS || p.HTTPGet.Port.IntValue() != int(c.Ports[0].ContainerPort) {
			t.Fatalf("%s probe %+v: want HTTPS on the secure port %d", name, p, c.Ports[0].ContainerPort)
		}
	}

	srv := kubeapi.Get(t)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := l.Addr().(*net.TCPAddr).Port
	_ = l.Close()
	startCCM(t, srv, "", fmt.Sprintf("--secure-port=%d", port), "--bind-address=127.0.0.1",
		"--leader-elect=true", "--leader-elect-resource-namespace=kube-system", "--leader-elect-resource-name=metalvip-probes-test")

	client := &http.Client{Timeout: 2 * time.Second, Transport: &http.Transport{
		TLSClientConfig: &tls.Config{InsecureSkipVerify: true}, // as the kubelet probes
	}}
	for name, p := range probes {
		url := fmt.Sprintf("https://127.0.0.1:%d%s", port, p.HTTPGet.Path)
		deadline := time.Now().Add(30 * time.Second)
		var last string
		for {
			resp, err := client.Get(url)
			if err == nil {
				_ = resp.Body.Close()
				last = resp.Status
				if resp.StatusCode == http.StatusOK {
					break
				}
			} else {
				last = err.Error()
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s probe: GET %s without credentials: %s after 30 s, want 200 OK", name, url, last)
			}
			time.Sleep(200 * time.Millisecond)
		}
	}
}
