package identity

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"strings"
	"testing"
	"time"

	authorizationv1 "k8s.io/api/authorization/v1"
	certificatesv1 "k8s.io/api/certificates/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"

	"github.com/metalvip/metalvip/internal/certs"
)

// A viewer's request is signed only for a requester the authorizer allows ViewerAccess, only
// for client auth, for the viewer's name whatever the request says, for an hour at most; every
// refusal says why, and a request a person approved is still refused (Failed) when the rule
// does not allow it.
func TestViewerRequestsAreSignedOnlyForViewers(t *testing.T) {
	ca, err := certs.NewCA("test-ca", time.Hour*24)
	if err != nil {
		t.Fatal(err)
	}
	request := func(key any, cn string) []byte {
		der, err := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{Subject: pkix.Name{CommonName: cn}}, key)
		if err != nil {
			t.Fatal(err)
		}
		return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE REQUEST", Bytes: der})
	}
	ecKey, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	rsaKey, _ := rsa.GenerateKey(rand.Reader, 2048)
	good := request(ecKey, "metalvip-ccm") // the name asked for is not taken
	client := []certificatesv1.KeyUsage{certificatesv1.UsageDigitalSignature, certificatesv1.UsageClientAuth}
	approved := []certificatesv1.CertificateSigningRequestCondition{{Type: certificatesv1.CertificateApproved, Status: corev1.ConditionTrue}}
	secs := func(s int32) *int32 { return &s }
	for _, tc := range []struct {
		name       string
		user       string
		req        []byte
		usages     []certificatesv1.KeyUsage
		expiration *int32
		conditions []certificatesv1.CertificateSigningRequestCondition
		want       string // a condition type, or "signed"
		why        string
		validity   time.Duration
	}{
		{"a viewer's request is signed for an hour", "alice", good, client, nil, nil, "signed", "", time.Hour},
		{"a shorter expiration is kept", "alice", good, client, secs(600), nil, "signed", "", 10 * time.Minute},
		{"a longer one is cut to an hour", "alice", good, client, secs(86400), nil, "signed", "", time.Hour},
		{"one who may not view is denied", "bob", good, client, nil, nil, "Denied", "bob may not get metalvip.io agents/state", 0},
		{"approved by a person, still refused", "bob", good, client, nil, approved, "Failed", "bob may not get", 0},
		{"a server usage is denied", "alice", good, []certificatesv1.KeyUsage{certificatesv1.UsageServerAuth}, nil, nil, "Denied", `usage "server auth"`, 0},
		{"client auth is needed", "alice", good, []certificatesv1.KeyUsage{certificatesv1.UsageDigitalSignature}, nil, nil, "Denied", `needs the usage "client auth"`, 0},
		{"an RSA key is denied", "alice", request(rsaKey, "x"), client, nil, nil, "Denied", "ECDSA P-256", 0},
		{"no PEM is denied", "alice", []byte("nonsense"), client, nil, nil, "Denied", "no PEM CERTIFICATE REQUEST", 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			csr := &certificatesv1.CertificateSigningRequest{
				ObjectMeta: metav1.ObjectMeta{Name: "req"},
				Spec: certificatesv1.CertificateSigningRequestSpec{Request: tc.req, SignerName: ViewerSigner, Usages: tc.usages,
					Username: tc.user, Groups: []string{"system:authenticated"}, ExpirationSeconds: tc.expiration},
				Status: certificatesv1.CertificateSigningRequestStatus{Conditions: tc.conditions},
			}
			cs := fake.NewClientset(csr)
			cs.PrependReactor("create", "subjectaccessreviews", func(a k8stesting.Action) (bool, runtime.Object, error) {
				sar := a.(k8stesting.CreateAction).GetObject().(*authorizationv1.SubjectAccessReview)
				ra := sar.Spec.ResourceAttributes
				sar.Status.Allowed = sar.Spec.User == "alice" && ra != nil && *ra == ViewerAccess
				return true, sar, nil
			})
			a := NewAuthority(cs, AuthorityOptions{})
			a.ca = ca
			if err := a.serveViewer(context.Background(), csr.DeepCopy()); err != nil {
				t.Fatal(err)
			}
			got, err := cs.CertificatesV1().CertificateSigningRequests().Get(context.Background(), "req", metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			if tc.want != "signed" {
				if len(got.Status.Certificate) > 0 {
					t.Fatal("signed; want refused")
				}
				for _, c := range got.Status.Conditions {
					if string(c.Type) == tc.want && strings.Contains(c.Message, tc.why) {
						return
					}
				}
				t.Fatalf("conditions %+v; want %s saying %q", got.Status.Conditions, tc.want, tc.why)
			}
			b, _ := pem.Decode(got.Status.Certificate)
			if b == nil {
				t.Fatalf("no certificate; conditions %+v", got.Status.Conditions)
			}
			c, err := x509.ParseCertificate(b.Bytes)
			if err != nil {
				t.Fatal(err)
			}
			if c.Subject.CommonName != certs.ViewerName || len(c.ExtKeyUsage) != 1 || c.ExtKeyUsage[0] != x509.ExtKeyUsageClientAuth {
				t.Errorf("certificate for %q with %v; want %q for client auth only", c.Subject.CommonName, c.ExtKeyUsage, certs.ViewerName)
			}
			// Back-dated a tenth of the validity (certs.IssueFor): the end is what counts.
			if left := time.Until(c.NotAfter); left > tc.validity || left < tc.validity-time.Minute {
				t.Errorf("valid for %s more; want %s", left.Round(time.Second), tc.validity)
			}
			if !hasCondition(got, certificatesv1.CertificateApproved) {
				t.Error("signed without the Approved condition")
			}
		})
	}
}
