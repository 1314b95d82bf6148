package controlplane

import (
	"bytes"
	"context"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"strings"
	"sync"
)

// Hysteresis turns single checks into readiness: Rise successes in a row make the API server
// ready, Fall failures in a row make it not ready; anything shorter changes nothing, so that
// one slow answer does not move the VIP and one lucky answer does not bring it back. It
// starts not ready. Values in, a verdict out: no clock, no goroutine.
type Hysteresis struct {
	Rise, Fall int
	ready      bool
	streak     int // results in a row that disagree with ready
}

// Observe takes one check's result and returns the readiness after it, and whether it changed.
func (h *Hysteresis) Observe(ok bool) (ready, changed bool) {
	if ok == h.ready {
		h.streak = 0
		return h.ready, false
	}
	h.streak++
	need := h.Rise
	if h.ready {
		need = h.Fall
	}
	if h.streak >= max(need, 1) {
		h.ready, h.streak = !h.ready, 0
		return h.ready, true
	}
	return h.ready, false
}

// Ready is the readiness after the results observed so far.
func (h *Hysteresis) Ready() bool { return h.ready }

// Checker checks the local kube-apiserver once: nil when it is ready.
type Checker func(context.Context) error

// ReadyzChecker returns a Checker that GETs h.URL and takes 200 as ready. An https URL's
// server is verified with the CA in h.CAFile, read again at every check so that a CA that
// appears (kubeadm init writes it) or changes is used at once; until it can be read, every
// check fails: the VIP never follows an API server it cannot authenticate.
func ReadyzChecker(h Health) Checker {
	r := &readyz{url: h.URL, caFile: h.CAFile, https: strings.HasPrefix(h.URL, "https:")}
	if !r.https {
		r.client = &http.Client{Transport: transport(nil)}
	}
	return r.check
}

type readyz struct {
	url, caFile string
	https       bool

	mu     sync.Mutex
	caSum  [32]byte
	client *http.Client
}

func transport(pool *x509.CertPool) *http.Transport {
	return &http.Transport{
		TLSClientConfig:     &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12},
		MaxIdleConnsPerHost: 1,
		DisableCompression:  true,
		Proxy:               nil, // the local API server, never through a proxy
	}
}

func (r *readyz) clientFor() (*http.Client, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if !r.https {
		return r.client, nil
	}
	pem, err := os.ReadFile(r.caFile)
	if err != nil {
		return nil, fmt.Errorf("CA file: %w", err)
	}
	sum := sha256.Sum256(pem)
	if r.client != nil && sum == r.caSum {
		return r.client, nil
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		return nil, fmt.Errorf("CA file %s holds no PEM certificate", r.caFile)
	}
	if r.client != nil {
		r.client.CloseIdleConnections()
	}
	r.client, r.caSum = &http.Client{Transport: transport(pool)}, sum
	return r.client, nil
}

func (r *readyz) check(ctx context.Context) error {
	c, err := r.clientFor()
	if err != nil {
		return err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, r.url, nil)
	if err != nil {
		return err
	}
	resp, err := c.Do(req)
	if err != nil {
		var ue *url.Error
		if errors.As(err, &ue) {
			return ue.Err // without the method and URL, the same at every check
		}
		return err
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 4<<10))
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("/readyz: %s: %s", resp.Status, failedChecks(body))
	}
	return nil
}

// failedChecks picks the failed checks ("[-]etcd failed: ...") out of a /readyz answer.
func failedChecks(body []byte) string {
	var out []string
	for line := range bytes.SplitSeq(body, []byte("\n")) {
		if bytes.HasPrefix(line, []byte("[-]")) {
			out = append(out, string(bytes.TrimSpace(line)))
		}
	}
	if len(out) == 0 {
		return strings.TrimSpace(string(body))
	}
	return strings.Join(out, "; ")
}
