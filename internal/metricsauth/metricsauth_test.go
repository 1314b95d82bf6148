package metricsauth

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/rest"
	k8stesting "k8s.io/client-go/testing"

	"github.com/metalvip/metalvip/test/kubeapi"
)

func TestMain(m *testing.M) { kubeapi.Main(m) }

// served is what the guarded handler answers.
const served = "metalvip_agent_build_info 1\n"

func guarded(f *Filter) *httptest.Server {
	mux := http.NewServeMux()
	mux.Handle("/metrics", f.Wrap(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, served) })))
	srv := httptest.NewServer(mux)
	return srv
}

func get(t *testing.T, url, token string) (int, string) {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(body)
}

// TestTheAPIServerDecidesWhoReadsMetrics runs the filter with a ServiceAccount bound to
// system:auth-delegator (as the agent's is) against a real kube-apiserver: a reader bound to a
// ClusterRole with get on /metrics reads, another ServiceAccount is refused 403, no token or
// a forged one 401.
func TestTheAPIServerDecidesWhoReadsMetrics(t *testing.T) {
	srv := kubeapi.Get(t)
	ns := srv.Namespace(t)
	ctx := context.Background()
	c := srv.Client
	for _, sa := range []string{"agent", "reader", "stranger"} {
		if _, err := c.CoreV1().ServiceAccounts(ns).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: sa}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	role := ns + "-metrics-reader"
	bind := func(name, clusterRole, sa string) {
		t.Helper()
		b := &rbacv1.ClusterRoleBinding{
			ObjectMeta: metav1.ObjectMeta{Name: name},
			RoleRef:    rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "ClusterRole", Name: clusterRole},
			Subjects:   []rbacv1.Subject{{Kind: "ServiceAccount", Name: sa, Namespace: ns}},
		}
		if _, err := c.RbacV1().ClusterRoleBindings().Create(ctx, b, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			_ = c.RbacV1().ClusterRoleBindings().Delete(context.Background(), name, metav1.DeleteOptions{})
		})
	}
	if _, err := c.RbacV1().ClusterRoles().Create(ctx, &rbacv1.ClusterRole{
		ObjectMeta: metav1.ObjectMeta{Name: role},
		Rules:      []rbacv1.PolicyRule{{NonResourceURLs: []string{"/metrics"}, Verbs: []string{"get"}}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.RbacV1().ClusterRoles().Delete(context.Background(), role, metav1.DeleteOptions{}) })
	bind(ns+"-reader", role, "reader")
	bind(ns+"-agent", "system:auth-delegator", "agent")
	token := func(sa string) string {
		t.Helper()
		tr, err := c.CoreV1().ServiceAccounts(ns).CreateToken(ctx, sa, &authenticationv1.TokenRequest{}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return tr.Status.Token
	}
	cfg := rest.AnonymousClientConfig(srv.Config)
	cfg.BearerToken = token("agent")
	agent, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	h := guarded(New(Options{Client: agent}))
	defer h.Close()
	reader, stranger := token("reader"), token("stranger")
	// RBAC takes a moment to see a new binding.
	deadline := time.Now().Add(10 * time.Second)
	for {
		f := New(Options{Client: agent})
		if e, err := f.review(ctx, reader, "/metrics"); err == nil && e.status == http.StatusOK {
			break
		} else if time.Now().After(deadline) {
			t.Fatalf("the reader is still refused after 10 s: %+v %v", e, err)
		}
		time.Sleep(200 * time.Millisecond)
	}
	for _, tc := range []struct {
		name, token string
		want        int
		body        string
	}{
		{"a reader bound to get /metrics reads the metrics", reader, http.StatusOK, served},
		{"a reader is served again from the cache", reader, http.StatusOK, served},
		{"a ServiceAccount without the role is forbidden", stranger, http.StatusForbidden, "system:serviceaccount:" + ns + ":stranger may not get /metrics"},
		{"no token is unauthorised", "", http.StatusUnauthorized, "a bearer token is required"},
		{"a forged token is unauthorised", reader[:len(reader)-4] + "AAAA", http.StatusUnauthorized, "not valid"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			code, body := get(t, h.URL+"/metrics", tc.token)
			if code != tc.want || !strings.Contains(body, tc.body) {
				t.Fatalf("got %d %q, want %d with %q", code, body, tc.want, tc.body)
			}
		})
	}
}

// reviews is a fake API server's review endpoints: tokens "good-*" are users, "allowed-*" of
// them may get /metrics; release, when set, holds every TokenReview until closed.
type reviews struct {
	tokenReviews, sars atomic.Int32
	running, most      atomic.Int32
	release            chan struct{}
}

func (rv *reviews) client() kubernetes.Interface {
	c := fake.NewClientset()
	c.PrependReactor("create", "tokenreviews", func(a k8stesting.Action) (bool, runtime.Object, error) {
		rv.tokenReviews.Add(1)
		n := rv.running.Add(1)
		defer rv.running.Add(-1)
		for m := rv.most.Load(); n > m && !rv.most.CompareAndSwap(m, n); m = rv.most.Load() {
		}
		if rv.release != nil {
			<-rv.release
		}
		tr := a.(k8stesting.CreateAction).GetObject().(*authenticationv1.TokenReview)
		tok := tr.Spec.Token
		if strings.HasPrefix(tok, "good-") || strings.HasPrefix(tok, "allowed-") {
			tr.Status = authenticationv1.TokenReviewStatus{Authenticated: true, User: authenticationv1.UserInfo{Username: tok}}
		}
		return true, tr, nil
	})
	c.PrependReactor("create", "subjectaccessreviews", func(a k8stesting.Action) (bool, runtime.Object, error) {
		rv.sars.Add(1)
		sar := a.(k8stesting.CreateAction).GetObject().(*authorizationv1.SubjectAccessReview)
		sar.Status.Allowed = strings.HasPrefix(sar.Spec.User, "allowed-") && sar.Spec.NonResourceAttributes.Path == "/metrics"
		return true, sar, nil
	})
	return c
}

// TestAnswersAreCachedForTheTTL: a token is reviewed once per TTL, allowed or not.
func TestAnswersAreCachedForTheTTL(t *testing.T) {
	rv := &reviews{}
	now := time.Unix(1e9, 0)
	var mu sync.Mutex
	clock := func() time.Time { mu.Lock(); defer mu.Unlock(); return now }
	h := guarded(New(Options{Client: rv.client(), TTL: 10 * time.Second, Now: clock}))
	defer h.Close()
	for i := range 5 {
		if code, _ := get(t, h.URL+"/metrics", "allowed-prometheus"); code != http.StatusOK {
			t.Fatalf("scrape %d: %d", i, code)
		}
		if code, _ := get(t, h.URL+"/metrics", "bad"); code != http.StatusUnauthorized {
			t.Fatalf("bad token %d: %d", i, code)
		}
		if code, _ := get(t, h.URL+"/metrics", "good-stranger"); code != http.StatusForbidden {
			t.Fatalf("stranger %d: %d", i, code)
		}
	}
	if n, s := rv.tokenReviews.Load(), rv.sars.Load(); n != 3 || s != 2 {
		t.Fatalf("15 requests of 3 tokens within the TTL made %d TokenReviews and %d SubjectAccessReviews, want 3 and 2", n, s)
	}
	mu.Lock()
	now = now.Add(10 * time.Second)
	mu.Unlock()
	if code, _ := get(t, h.URL+"/metrics", "allowed-prometheus"); code != http.StatusOK || rv.tokenReviews.Load() != 4 {
		t.Fatalf("after the TTL: %d, %d TokenReviews in all, want 200 and a new review (4)", code, rv.tokenReviews.Load())
	}
}

// TestTheCacheStaysBounded: a thousand different tokens leave at most MaxEntries answers.
func TestTheCacheStaysBounded(t *testing.T) {
	rv := &reviews{}
	f := New(Options{Client: rv.client(), MaxEntries: 16})
	h := guarded(f)
	defer h.Close()
	for i := range 1000 {
		if code, _ := get(t, h.URL+"/metrics", fmt.Sprintf("forged-%d", i)); code != http.StatusUnauthorized {
			t.Fatalf("forged token %d: %d", i, code)
		}
	}
	if n := f.entries(); n > 16 {
		t.Fatalf("the cache holds %d answers, more than MaxEntries 16", n)
	}
}

// TestAFloodOfTokensWaitsForAFewReviews: with the API server slow, at most MaxInFlight reviews
// run at once and the requests that find no slot in time get 429 without a review.
func TestAFloodOfTokensWaitsForAFewReviews(t *testing.T) {
	rv := &reviews{release: make(chan struct{})}
	f := New(Options{Client: rv.client(), MaxInFlight: 2, Wait: 200 * time.Millisecond})
	h := guarded(f)
	defer h.Close()
	const flood = 10
	codes := make(chan int, flood)
	var wg sync.WaitGroup
	for i := range flood {
		wg.Go(func() {
			code, _ := get(t, h.URL+"/metrics", fmt.Sprintf("forged-%d", i))
			codes <- code
		})
	}
	// Those without a slot give up after Wait; then the two under review are let go.
	time.Sleep(time.Second)
	close(rv.release)
	wg.Wait()
	close(codes)
	count := map[int]int{}
	for c := range codes {
		count[c]++
	}
	if count[http.StatusTooManyRequests] != flood-2 || count[http.StatusUnauthorized] != 2 {
		t.Fatalf("answers %v, want %d × 429 and 2 × 401", count, flood-2)
	}
	if m := rv.most.Load(); m > 2 {
		t.Fatalf("%d reviews ran at once, MaxInFlight is 2", m)
	}
}

// TestCheapRefusalsReviewNothing: a wrong method, scheme or an oversized token costs no review.
func TestCheapRefusalsReviewNothing(t *testing.T) {
	rv := &reviews{}
	h := guarded(New(Options{Client: rv.client()}))
	defer h.Close()
	for _, tc := range []struct {
		name, method, auth string
		want               int
	}{
		{"a POST is not allowed", http.MethodPost, "Bearer allowed-x", http.StatusMethodNotAllowed},
		{"basic authentication is unauthorised", http.MethodGet, "Basic YTpi", http.StatusUnauthorized},
		{"an empty bearer token is unauthorised", http.MethodGet, "Bearer ", http.StatusUnauthorized},
		{"a 20 kB token is unauthorised", http.MethodGet, "Bearer good-" + strings.Repeat("x", 20<<10), http.StatusUnauthorized},
	} {
		t.Run(tc.name, func(t *testing.T) {
			req, _ := http.NewRequest(tc.method, h.URL+"/metrics", nil)
			req.Header.Set("Authorization", tc.auth)
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			if resp.StatusCode != tc.want {
				t.Fatalf("%d, want %d", resp.StatusCode, tc.want)
			}
		})
	}
	if n := rv.tokenReviews.Load(); n != 0 {
		t.Fatalf("%d TokenReviews for requests refused before any review", n)
	}
}
