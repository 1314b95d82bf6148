// Package metricsauth guards an HTTP handler (the agent's /metrics) as the API server's
// delegated authentication and authorization guard the CCM's: every request's bearer token is
// authenticated by a TokenReview and its user authorised by a SubjectAccessReview for the
// non-resource URL it asks for (verb get), so that the same ClusterRole
// (nonResourceURLs: [/metrics], verbs: [get]) opens both components' metrics.
//
// What it costs the API server is bounded: answers are cached by the token's SHA-256 for a
// short TTL (refusals too, so a scraper with a bad token asks once per TTL), the cache holds a
// bounded number of entries, and at most MaxInFlight reviews run at once; a request that
// cannot get a slot within Wait is answered 429 without any review, so a flood of random
// tokens costs the API server MaxInFlight requests at a time, never one per request.
//
// It decides who may read; it must not touch what is served (the wrapped handler) nor hold
// a token longer than the review takes.
package metricsauth

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/klog/v2"
)

// Defaults of Options.
const (
	DefaultTTL         = 10 * time.Second
	DefaultMaxEntries  = 1024
	DefaultMaxInFlight = 4
	DefaultWait        = 2 * time.Second
	// reviewTimeout bounds one TokenReview plus SubjectAccessReview.
	reviewTimeout = 10 * time.Second
	// maxTokenBytes: a longer Authorization header is refused before any review (a
	// ServiceAccount token is about 1 kB).
	maxTokenBytes = 16 << 10
)

// Options shape a Filter.
type Options struct {
	// Client makes the TokenReviews and SubjectAccessReviews; its identity needs the
	// ClusterRole system:auth-delegator.
	Client kubernetes.Interface
	// TTL is how long an answer (allowed or refused) is kept; DefaultTTL when zero.
	TTL time.Duration
	// MaxEntries bounds the cache; DefaultMaxEntries when zero.
	MaxEntries int
	// MaxInFlight bounds the reviews running at once; DefaultMaxInFlight when zero.
	MaxInFlight int
	// Wait is how long a request waits for a review slot before a 429; DefaultWait when zero.
	Wait time.Duration
	// Now is the clock of the cache (tests); time.Now when nil.
	Now func() time.Time
}

// Filter authenticates and authorises requests; see the package comment.
type Filter struct {
	opts  Options
	slots chan struct{}

	mu    sync.Mutex
	cache map[key]entry
}

type key struct {
	token [sha256.Size]byte
	path  string
}

// entry is a review's answer: status is 200 (allowed), 401 or 403.
type entry struct {
	status int
	reason string
	until  time.Time
}

// New returns a Filter.
func New(opts Options) *Filter {
	if opts.TTL <= 0 {
		opts.TTL = DefaultTTL
	}
	if opts.MaxEntries <= 0 {
		opts.MaxEntries = DefaultMaxEntries
	}
	if opts.MaxInFlight <= 0 {
		opts.MaxInFlight = DefaultMaxInFlight
	}
	if opts.Wait <= 0 {
		opts.Wait = DefaultWait
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	return &Filter{opts: opts, slots: make(chan struct{}, opts.MaxInFlight), cache: map[key]entry{}}
}

// Wrap serves next to the requests whose bearer token may get their path.
func (f *Filter) Wrap(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		// Cheapest first: the method, the header's shape and size, the cache, then a review.
		if r.Method != http.MethodGet && r.Method != http.MethodHead {
			w.Header().Set("Allow", "GET, HEAD")
			http.Error(w, "only GET and HEAD", http.StatusMethodNotAllowed)
			return
		}
		token, ok := bearer(r.Header.Get("Authorization"))
		if !ok {
			unauthorized(w, "a bearer token is required (Authorization: Bearer <ServiceAccount token>)")
			return
		}
		k := key{token: sha256.Sum256([]byte(token)), path: r.URL.Path}
		e, ok := f.cached(k)
		if !ok {
			var err error
			if e, err = f.review(r.Context(), token, r.URL.Path); err != nil {
				if errors.Is(err, errBusy) {
					w.Header().Set("Retry-After", "1")
					http.Error(w, err.Error(), http.StatusTooManyRequests)
					return
				}
				klog.V(2).InfoS("Cannot review a metrics request", "err", err)
				http.Error(w, "cannot review the token with the API server now", http.StatusServiceUnavailable)
				return
			}
			f.keep(k, e)
		}
		switch e.status {
		case http.StatusOK:
			next.ServeHTTP(w, r)
		case http.StatusUnauthorized:
			unauthorized(w, e.reason)
		default:
			http.Error(w, e.reason, e.status)
		}
	})
}

func unauthorized(w http.ResponseWriter, msg string) {
	w.Header().Set("WWW-Authenticate", `Bearer realm="metalvip"`)
	http.Error(w, msg, http.StatusUnauthorized)
}

// bearer returns the token of an "Authorization: Bearer <token>" header.
func bearer(h string) (string, bool) {
	scheme, token, ok := strings.Cut(h, " ")
	if !ok || !strings.EqualFold(scheme, "Bearer") {
		return "", false
	}
	token = strings.TrimSpace(token)
	if token == "" || len(token) > maxTokenBytes {
		return "", false
	}
	return token, true
}

func (f *Filter) cached(k key) (entry, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	e, ok := f.cache[k]
	if !ok {
		return entry{}, false
	}
	if !f.opts.Now().Before(e.until) {
		delete(f.cache, k)
		return entry{}, false
	}
	return e, true
}

// keep stores e, first dropping the expired entries when the cache is full, then any one.
func (f *Filter) keep(k key, e entry) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.cache) >= f.opts.MaxEntries {
		now := f.opts.Now()
		for old, oe := range f.cache {
			if !now.Before(oe.until) {
				delete(f.cache, old)
			}
		}
		for old := range f.cache {
			if len(f.cache) < f.opts.MaxEntries {
				break
			}
			delete(f.cache, old)
		}
	}
	f.cache[k] = e
}

// entries is the cache's size (tests).
func (f *Filter) entries() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.cache)
}

var errBusy = errors.New("too many metrics requests under review; retry in a second")

// review asks the API server who holds token and whether they may get path.
func (f *Filter) review(ctx context.Context, token, path string) (entry, error) {
	timer := time.NewTimer(f.opts.Wait)
	defer timer.Stop()
	select {
	case f.slots <- struct{}{}:
		defer func() { <-f.slots }()
	case <-timer.C:
		return entry{}, errBusy
	case <-ctx.Done():
		return entry{}, ctx.Err()
	}
	ctx, cancel := context.WithTimeout(ctx, reviewTimeout)
	defer cancel()
	until := f.opts.Now().Add(f.opts.TTL)
	tr, err := f.opts.Client.AuthenticationV1().TokenReviews().Create(ctx, &authenticationv1.TokenReview{
		Spec: authenticationv1.TokenReviewSpec{Token: token},
	}, metav1.CreateOptions{})
	if err != nil {
		return entry{}, fmt.Errorf("TokenReview: %w", err)
	}
	if !tr.Status.Authenticated {
		return entry{status: http.StatusUnauthorized, reason: "the token is not valid (TokenReview)", until: until}, nil
	}
	u := tr.Status.User
	extra := make(map[string]authorizationv1.ExtraValue, len(u.Extra))
	for k, v := range u.Extra {
		extra[k] = authorizationv1.ExtraValue(v)
	}
	sar, err := f.opts.Client.AuthorizationV1().SubjectAccessReviews().Create(ctx, &authorizationv1.SubjectAccessReview{
		Spec: authorizationv1.SubjectAccessReviewSpec{
			User: u.Username, UID: u.UID, Groups: u.Groups, Extra: extra,
			NonResourceAttributes: &authorizationv1.NonResourceAttributes{Path: path, Verb: "get"},
		},
	}, metav1.CreateOptions{})
	if err != nil {
		return entry{}, fmt.Errorf("SubjectAccessReview: %w", err)
	}
	if !sar.Status.Allowed {
		return entry{status: http.StatusForbidden, until: until,
			reason: fmt.Sprintf("%s may not get %s; bind it to the ClusterRole metalvip:metrics-reader", u.Username, path)}, nil
	}
	return entry{status: http.StatusOK, until: until}, nil
}
