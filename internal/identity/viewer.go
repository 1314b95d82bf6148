package identity

import (
	"context"
	"encoding/pem"
	"errors"
	"fmt"
	"time"

	authorizationv1 "k8s.io/api/authorization/v1"
	certificatesv1 "k8s.io/api/certificates/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/klog/v2"

	"github.com/metalvip/metalvip/internal/certs"
)

// A viewer (metalvipctl agent, a person) reads an agents' state with a short certificate of the
// agents' CA for the name certs.ViewerName. It asks for one with a CertificateSigningRequest
// for ViewerSigner; the CCM signs it when the requester may "get" the virtual resource
// ViewerAccess (the ClusterRole metalvip:viewer grants it), so reading an agent's state never
// takes the CA's key: whoever holds that key can make the CCM's identity.
const (
	// ViewerSigner is the signerName of a viewer's CertificateSigningRequest.
	ViewerSigner = "metalvip.io/viewer"
	// ViewerValidity is the longest a viewer's certificate lasts (a shorter
	// spec.expirationSeconds is kept).
	ViewerValidity = time.Hour
)

// ViewerAccess is what a requester must be allowed, by the API server's authorizer, for its
// viewer certificate to be signed: get on metalvip.io agents/state (no such resource is
// served; RBAC names it all the same).
var ViewerAccess = authorizationv1.ResourceAttributes{Group: "metalvip.io", Resource: "agents", Subresource: "state", Verb: "get"}

// ServeViewers signs the viewers' CertificateSigningRequests until ctx ends: approved (by this
// CCM, or by a person) and signed when the requester is allowed ViewerAccess, denied with the
// reason otherwise. Load must have succeeded. Every replica serves them: two signing one
// request race on its status, and one wins.
func (a *Authority) ServeViewers(ctx context.Context) {
	factory := informers.NewSharedInformerFactoryWithOptions(a.client, 0, informers.WithTweakListOptions(func(o *metav1.ListOptions) {
		o.FieldSelector = fields.OneTermEqualSelector("spec.signerName", ViewerSigner).String()
	}))
	inf := factory.Certificates().V1().CertificateSigningRequests()
	queue := workqueue.NewTypedRateLimitingQueueWithConfig(workqueue.DefaultTypedControllerRateLimiter[string](),
		workqueue.TypedRateLimitingQueueConfig[string]{Name: "metalvip-viewer-csr"})
	_, _ = inf.Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj any) { enqueue(queue, obj) },
		UpdateFunc: func(_, obj any) { enqueue(queue, obj) },
	})
	factory.Start(ctx.Done())
	go func() { <-ctx.Done(); queue.ShutDown() }()
	if !cache.WaitForCacheSync(ctx.Done(), inf.Informer().HasSynced) {
		return
	}
	for {
		name, quit := queue.Get()
		if quit {
			return
		}
		csr, err := inf.Lister().Get(name)
		if err == nil {
			err = a.serveViewer(ctx, csr.DeepCopy())
		}
		if err != nil && ctx.Err() == nil {
			klog.ErrorS(err, "Viewer certificate request not served yet", "csr", name)
			queue.AddRateLimited(name)
		} else {
			queue.Forget(name)
		}
		queue.Done(name)
	}
}

func enqueue(q workqueue.TypedRateLimitingInterface[string], obj any) {
	if csr, ok := obj.(*certificatesv1.CertificateSigningRequest); ok && csr.Spec.SignerName == ViewerSigner {
		q.Add(csr.Name)
	}
}

// serveViewer decides one request; an error means try again (the API server did not answer).
func (a *Authority) serveViewer(ctx context.Context, csr *certificatesv1.CertificateSigningRequest) error {
	if len(csr.Status.Certificate) > 0 || hasCondition(csr, certificatesv1.CertificateDenied) || hasCondition(csr, certificatesv1.CertificateFailed) {
		return nil
	}
	pub, problem := viewerRequest(csr)
	if problem == "" {
		allowed, why, err := a.mayView(ctx, csr)
		if err != nil {
			return err
		}
		if !allowed {
			problem = fmt.Sprintf("%s may not get %s %s/%s (the ClusterRole metalvip:viewer grants it)%s", csr.Spec.Username, ViewerAccess.Group, ViewerAccess.Resource, ViewerAccess.Subresource, why)
		}
	}
	if problem != "" {
		reason := "NotAllowed"
		if hasCondition(csr, certificatesv1.CertificateApproved) {
			// A person approved it; this CCM still signs only what the rule allows.
			return a.condition(ctx, csr, certificatesv1.CertificateFailed, reason, problem, true)
		}
		klog.InfoS("Viewer certificate refused", "csr", csr.Name, "user", csr.Spec.Username, "reason", problem)
		return a.condition(ctx, csr, certificatesv1.CertificateDenied, reason, problem, false)
	}
	if !hasCondition(csr, certificatesv1.CertificateApproved) {
		csr.Status.Conditions = append(csr.Status.Conditions, certificatesv1.CertificateSigningRequestCondition{
			Type: certificatesv1.CertificateApproved, Status: corev1.ConditionTrue, Reason: "MayViewAgents",
			Message:        fmt.Sprintf("%s may get %s %s/%s", csr.Spec.Username, ViewerAccess.Group, ViewerAccess.Resource, ViewerAccess.Subresource),
			LastUpdateTime: metav1.Now(),
		})
		updated, err := a.client.CertificatesV1().CertificateSigningRequests().UpdateApproval(ctx, csr.Name, csr, metav1.UpdateOptions{})
		if err != nil {
			return fmt.Errorf("approve: %w", err)
		}
		csr = updated
	}
	a.mu.Lock()
	ca := a.ca
	a.mu.Unlock()
	if ca.Cert == nil {
		return errors.New("the agents' CA is not loaded yet")
	}
	validity := ViewerValidity
	if s := csr.Spec.ExpirationSeconds; s != nil && time.Duration(*s)*time.Second < validity {
		validity = time.Duration(*s) * time.Second
	}
	cert, err := certs.IssueFor(ca, pub, certs.ViewerName, certs.Client, validity)
	if err != nil {
		return fmt.Errorf("sign: %w", err)
	}
	csr.Status.Certificate = cert
	if _, err := a.client.CertificatesV1().CertificateSigningRequests().UpdateStatus(ctx, csr, metav1.UpdateOptions{}); err != nil {
		return fmt.Errorf("write the certificate: %w", err)
	}
	klog.InfoS("Viewer certificate signed", "csr", csr.Name, "user", csr.Spec.Username, "validity", validity)
	return nil
}

// viewerRequest returns the request's public key, or why it is refused.
func viewerRequest(csr *certificatesv1.CertificateSigningRequest) (any, string) {
	if len(csr.Spec.Request) > MaxRequestBytes {
		return nil, fmt.Sprintf("the request is %d bytes, over %d", len(csr.Spec.Request), MaxRequestBytes)
	}
	b, _ := pem.Decode(csr.Spec.Request)
	if b == nil || b.Type != "CERTIFICATE REQUEST" {
		return nil, "the request is no PEM CERTIFICATE REQUEST"
	}
	pub, err := parseRequest(b.Bytes)
	if err != nil {
		return nil, err.Error()
	}
	client := false
	for _, u := range csr.Spec.Usages {
		switch u {
		case certificatesv1.UsageClientAuth:
			client = true
		case certificatesv1.UsageDigitalSignature, certificatesv1.UsageKeyEncipherment:
		default:
			return nil, fmt.Sprintf("usage %q: a viewer's certificate is for client auth only", u)
		}
	}
	if !client {
		return nil, `a viewer's certificate needs the usage "client auth"`
	}
	return pub, ""
}

// mayView asks the API server's authorizer whether the requester may have ViewerAccess.
func (a *Authority) mayView(ctx context.Context, csr *certificatesv1.CertificateSigningRequest) (bool, string, error) {
	extra := map[string]authorizationv1.ExtraValue{}
	for k, v := range csr.Spec.Extra {
		extra[k] = authorizationv1.ExtraValue(v)
	}
	attrs := ViewerAccess
	sar, err := a.client.AuthorizationV1().SubjectAccessReviews().Create(ctx, &authorizationv1.SubjectAccessReview{Spec: authorizationv1.SubjectAccessReviewSpec{
		User: csr.Spec.Username, Groups: csr.Spec.Groups, UID: csr.Spec.UID, Extra: extra, ResourceAttributes: &attrs,
	}}, metav1.CreateOptions{})
	if err != nil {
		return false, "", fmt.Errorf("access review: %w", err)
	}
	why := ""
	if sar.Status.Reason != "" {
		why = ": " + sar.Status.Reason
	}
	return sar.Status.Allowed, why, nil
}

// condition adds a condition of type t; failed ones go through the status, denials through
// the approval subresource.
func (a *Authority) condition(ctx context.Context, csr *certificatesv1.CertificateSigningRequest, t certificatesv1.RequestConditionType, reason, msg string, status bool) error {
	csr.Status.Conditions = append(csr.Status.Conditions, certificatesv1.CertificateSigningRequestCondition{
		Type: t, Status: corev1.ConditionTrue, Reason: reason, Message: msg, LastUpdateTime: metav1.Now(),
	})
	var err error
	if status {
		_, err = a.client.CertificatesV1().CertificateSigningRequests().UpdateStatus(ctx, csr, metav1.UpdateOptions{})
	} else {
		_, err = a.client.CertificatesV1().CertificateSigningRequests().UpdateApproval(ctx, csr.Name, csr, metav1.UpdateOptions{})
	}
	return err
}

func hasCondition(csr *certificatesv1.CertificateSigningRequest, t certificatesv1.RequestConditionType) bool {
	for _, c := range csr.Status.Conditions {
		if c.Type == t && c.Status == corev1.ConditionTrue {
			return true
		}
	}
	return false
}
