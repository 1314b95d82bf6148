package e2e

import (
	"context"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/metalvip/metalvip/internal/identity"
	"github.com/metalvip/metalvip/test/cluster"
	"github.com/metalvip/metalvip/test/harness"
	"github.com/metalvip/metalvip/test/kubeapi"
)

// TestHandMadeCertificatesStillWork: with `metalvipctl certs`' way (a CA, the CCM's
// certificate and one per node, in files; --tls-mode=files) the agents serve the files' and
// VIPs are answered and fail over; the CCM makes no CA of its own.
func TestHandMadeCertificatesStillWork(t *testing.T) {
	c := cluster.New(t, kubeapi.Get(t), cluster.Options{CCMBinary: ccmBinary, AgentBinary: agentBinary, Files: true})
	vip := c.Service("handmade")
	harness.Eventually(t, 30*time.Second, "the VIP is answered", func() bool { return c.Owner(vip) != "" })
	owner := c.Owner(vip)
	if cert := servedCertificate(t, c, owner); cert.Subject.CommonName != owner {
		t.Errorf("%s's agent serves a certificate for %q", owner, cert.Subject.CommonName)
	}
	t.Logf("failover with hand-made certificates: %s", c.Failover(vip, owner))
	if _, err := c.Srv.Client.CoreV1().Secrets(c.NS).Get(context.Background(), identity.CAName, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("the CCM with hand-made certificates made a CA Secret: %v", err)
	}
}
