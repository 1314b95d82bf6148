package integration

import (
	"context"
	"crypto/x509"
	"encoding/pem"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"

	"github.com/metalvip/metalvip/internal/certs"
	"github.com/metalvip/metalvip/internal/identity"
	agentv1 "github.com/metalvip/metalvip/proto/metalvip/agent/v1"
	"github.com/metalvip/metalvip/test/kubeapi"
)

// TestFault9AViewerReadsAnAgentWithoutTheCAKey: with enrolled agents `metalvipctl agent NODE`
// asks the CCM for a viewer's certificate (a CertificateSigningRequest for metalvip.io/viewer),
// which the CCM, running with the manifests' RBAC, signs for a user bound to the ClusterRole
// metalvip:viewer and denies, saying why, to one who may create the request but not view
// agents. The CA Secret, which metalvipctl used to read (its key makes the CCM's identity), is
// refused by name. Issue 30, fault 9.
func TestFault9AViewerReadsAnAgentWithoutTheCAKey(t *testing.T) {
	srv := kubeapi.Get(t)
	applyManifests(t, srv)
	_, ccm := ccmClient(t, srv)
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	// The CCM's side, as it runs in enroll mode, with its ServiceAccount's rights.
	auth := identity.NewAuthority(ccm, identity.AuthorityOptions{Namespace: "kube-system"})
	if err := auth.Load(ctx); err != nil {
		t.Fatalf("load the CA with the CCM's rights: %v", err)
	}
	go auth.ServeViewers(ctx)

	// An agent serving with a certificate of that CA.
	sec, err := srv.Client.CoreV1().Secrets("kube-system").Get(ctx, identity.CAName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	ca := certs.Pair{Cert: sec.Data[corev1.TLSCertKey], Key: sec.Data[corev1.TLSPrivateKeyKey]}
	dir := t.TempDir()
	pair, err := certs.Issue(ca, "viewer-node", certs.Server, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	for name, data := range map[string][]byte{"ca.crt": ca.Cert, "viewer-node.crt": pair.Cert, "viewer-node.key": pair.Key} {
		if err := os.WriteFile(filepath.Join(dir, name), data, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	port := serveAgent(t, dir, "viewer-node", &agentv1.GetStateResponse{Node: "viewer-node", Term: 9, Generation: 4})
	createNode(t, srv, &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: "viewer-node"},
		Status:     corev1.NodeStatus{Addresses: []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: "127.0.0.1"}}},
	})

	// alice is bound to metalvip:viewer; bob may ask for a certificate, but not view agents.
	bind(t, srv, "viewer-alice", "metalvip:viewer", "alice")
	role := &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: "viewer-test-no-agents"}, Rules: []rbacv1.PolicyRule{
		{APIGroups: []string{"certificates.k8s.io"}, Resources: []string{"certificatesigningrequests"}, Verbs: []string{"create", "get"}},
		{APIGroups: []string{""}, Resources: []string{"configmaps"}, ResourceNames: []string{identity.CAName}, Verbs: []string{"get"}},
		{APIGroups: []string{""}, Resources: []string{"nodes"}, Verbs: []string{"get"}},
	}}
	if _, err := srv.Client.RbacV1().ClusterRoles().Create(ctx, role, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = srv.Client.RbacV1().ClusterRoles().Delete(context.Background(), role.Name, metav1.DeleteOptions{})
	})
	bind(t, srv, "viewer-bob", role.Name, "bob")

	tmp := t.TempDir()
	run := func(user string, args ...string) (string, error) {
		cmd := exec.Command(ctlBinary, append([]string{"agent", "viewer-node", "--kubeconfig", impersonating(t, srv, user), "--port", strconv.Itoa(port)}, args...)...)
		cmd.Dir = t.TempDir()
		cmd.Env = append(os.Environ(), "TMPDIR="+tmp)
		out, err := cmd.CombinedOutput()
		return string(out), err
	}
	for _, tc := range []struct {
		name, user string
		args       []string
		want       string
		ok         bool
	}{
		{"a viewer gets a certificate from the CCM", "alice", nil, "Agent viewer-node: term 9, generation 4", true},
		{"one who may not view agents is denied, with the reason", "bob", nil, "may not get metalvip.io agents/state", false},
		{"the CA Secret is refused, even to whoever may read it", "", []string{"--tls-secret", "kube-system/" + identity.CAName}, "never uses the CA's key", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out, err := run(tc.user, tc.args...)
			if (err == nil) != tc.ok || !strings.Contains(out, tc.want) {
				t.Fatalf("metalvipctl agent as %s %v: %v, want ok=%v and %q in:\n%s", tc.user, tc.args, err, tc.ok, tc.want, out)
			}
		})
	}
	// alice's certificate names the viewer (it may read, never Apply) and lasts an hour at most.
	list, err := srv.Client.CertificatesV1().CertificateSigningRequests().List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	signed := 0
	for _, csr := range list.Items {
		if csr.Spec.SignerName != identity.ViewerSigner || csr.Spec.Username != "alice" || len(csr.Status.Certificate) == 0 {
			continue
		}
		signed++
		b, _ := pem.Decode(csr.Status.Certificate)
		if b == nil {
			t.Fatalf("alice's certificate is no PEM: %q", csr.Status.Certificate)
		}
		c, err := x509.ParseCertificate(b.Bytes)
		if err != nil {
			t.Fatal(err)
		}
		if c.Subject.CommonName != certs.ViewerName || time.Until(c.NotAfter) > identity.ViewerValidity {
			t.Errorf("alice's certificate: %q until %s; want %q for an hour at most", c.Subject.CommonName, c.NotAfter, certs.ViewerName)
		}
	}
	if signed != 1 {
		t.Errorf("%d signed requests of alice; want 1", signed)
	}
	if left, _ := filepath.Glob(filepath.Join(tmp, "*")); len(left) > 0 {
		t.Errorf("left behind: %v", left)
	}
}

// bind binds the ClusterRole role to user.
func bind(t *testing.T, srv *kubeapi.Server, name, role, user string) {
	t.Helper()
	b := &rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: name},
		RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: role},
		Subjects: []rbacv1.Subject{{APIGroup: rbacv1.GroupName, Kind: "User", Name: user}}}
	if _, err := srv.Client.RbacV1().ClusterRoleBindings().Create(context.Background(), b, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = srv.Client.RbacV1().ClusterRoleBindings().Delete(context.Background(), name, metav1.DeleteOptions{})
	})
}

// impersonating writes a kubeconfig of the admin acting as user (the API server then knows the
// requests, a CertificateSigningRequest's requester included, as user's).
func impersonating(t *testing.T, srv *kubeapi.Server, user string) string {
	t.Helper()
	kc := clientcmdapi.NewConfig()
	kc.Clusters["test"] = &clientcmdapi.Cluster{Server: srv.Config.Host, CertificateAuthorityData: srv.Config.CAData}
	kc.AuthInfos["test"] = &clientcmdapi.AuthInfo{Token: srv.Config.BearerToken, Impersonate: user}
	kc.Contexts["test"] = &clientcmdapi.Context{Cluster: "test", AuthInfo: "test"}
	kc.CurrentContext = "test"
	path := filepath.Join(t.TempDir(), "kubeconfig-"+user)
	if err := clientcmd.WriteToFile(*kc, path); err != nil {
		t.Fatal(err)
	}
	return path
}
