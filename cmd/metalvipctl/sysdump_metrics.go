package main

import (
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"net/http"
	"path"
	"strconv"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
)

// metricsReader is the ServiceAccount whose ClusterRole may get /metrics and nothing else
// (manifests/monitoring/metrics-reader.yaml, the chart's metrics-reader.yaml).
const metricsReader = "metalvip-metrics-reader"

// maxMetrics bounds one component's metrics snapshot.
const maxMetrics = 16 << 20

// collectMetrics adds a snapshot of every metalvip pod's /metrics (metrics/NAMESPACE/POD.txt),
// read over HTTPS at the pod's address with a token of the metrics reader that expires in 10
// minutes: the bundle's reader gets no credential that outlives it, and the token may read
// /metrics alone. The components' serving certificates are their own (self-signed, or of
// metalvip's CA): not verified, which the token's reach makes harmless.
func collectMetrics(ctx context.Context, client kubernetes.Interface, s *sysdump) {
	pods, err := client.CoreV1().Pods("").List(ctx, metav1.ListOptions{LabelSelector: podsSelector})
	if err != nil {
		s.failed("metrics", err)
		return
	}
	tokens := map[string]string{} // namespace -> the reader's token
	hc := &http.Client{
		Timeout:   5 * time.Second,
		Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}, Proxy: nil},
	}
	for _, p := range pods.Items {
		name := path.Join("metrics", p.Namespace, p.Name+".txt")
		port := metricsPort(p)
		if port == 0 || p.Status.PodIP == "" {
			s.failed(name, fmt.Errorf("pod %s/%s has no metrics port or no address yet", p.Namespace, p.Name))
			continue
		}
		tok, ok := tokens[p.Namespace]
		if !ok {
			exp := int64(600)
			tr, err := client.CoreV1().ServiceAccounts(p.Namespace).CreateToken(ctx, metricsReader,
				&authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: &exp}}, metav1.CreateOptions{})
			if err != nil {
				s.failed(name, fmt.Errorf("a token of %s/%s: %w", p.Namespace, metricsReader, err))
				continue
			}
			tok = tr.Status.Token
			tokens[p.Namespace] = tok
		}
		b, err := scrape(ctx, hc, "https://"+net.JoinHostPort(p.Status.PodIP, strconv.Itoa(int(port)))+"/metrics", tok)
		if err != nil {
			s.failed(name, err)
			continue
		}
		s.add(name, b)
	}
}

// metricsPort is the container port metalvip serves /metrics on: the agent's "metrics", the
// CCM's "https" (its secure port).
func metricsPort(p corev1.Pod) int32 {
	for _, c := range p.Spec.Containers {
		for _, port := range c.Ports {
			if port.Name == "metrics" || port.Name == "https" {
				return port.ContainerPort
			}
		}
	}
	return 0
}

func scrape(ctx context.Context, hc *http.Client, url, token string) ([]byte, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := hc.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, maxMetrics))
	if err != nil {
		return nil, err
	}
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("GET %s: %s", url, resp.Status)
	}
	return b, nil
}
