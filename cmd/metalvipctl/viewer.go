package main

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"os"
	"path/filepath"
	"time"

	certificatesv1 "k8s.io/api/certificates/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/metalvip/metalvip/internal/certs"
	"github.com/metalvip/metalvip/internal/identity"
)

// viewerWait bounds the wait for the CCM to sign a viewer's request.
const viewerWait = 30 * time.Second

// viewerByCSR asks the CCM for a viewer's certificate of an hour (enrolled agents): a key made
// here, a CertificateSigningRequest for identity.ViewerSigner, which the CCM signs when the
// kubeconfig's user may get metalvip.io agents/state (ClusterRole metalvip:viewer). The key
// never leaves this process but for a private temporary folder, removed by cleanup; the CA's
// key is never needed. ca is the agents' CA certificate (the ConfigMap metalvip-ca).
func viewerByCSR(ctx context.Context, client kubernetes.Interface, ca []byte) (certs.Files, func(), error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return certs.Files{}, nil, err
	}
	der, err := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{Subject: pkix.Name{CommonName: certs.ViewerName}}, key)
	if err != nil {
		return certs.Files{}, nil, err
	}
	seconds := int32(identity.ViewerValidity / time.Second)
	csr, err := client.CertificatesV1().CertificateSigningRequests().Create(ctx, &certificatesv1.CertificateSigningRequest{
		ObjectMeta: metav1.ObjectMeta{GenerateName: "metalvip-viewer-"},
		Spec: certificatesv1.CertificateSigningRequestSpec{
			Request:           pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE REQUEST", Bytes: der}),
			SignerName:        identity.ViewerSigner,
			Usages:            []certificatesv1.KeyUsage{certificatesv1.UsageDigitalSignature, certificatesv1.UsageClientAuth},
			ExpirationSeconds: &seconds,
		},
	}, metav1.CreateOptions{})
	if err != nil {
		return certs.Files{}, nil, fmt.Errorf("ask for a viewer's certificate: %w (the ClusterRole metalvip:viewer lets a user create one; docs/agent-tls.md)", err)
	}
	deadline := time.Now().Add(viewerWait)
	var cert []byte
	for cert == nil {
		got, err := client.CertificatesV1().CertificateSigningRequests().Get(ctx, csr.Name, metav1.GetOptions{})
		if err != nil {
			return certs.Files{}, nil, fmt.Errorf("the viewer's certificate request %s: %w", csr.Name, err)
		}
		for _, c := range got.Status.Conditions {
			if (c.Type == certificatesv1.CertificateDenied || c.Type == certificatesv1.CertificateFailed) && c.Status == corev1.ConditionTrue {
				return certs.Files{}, nil, fmt.Errorf("the viewer's certificate request %s was %s: %s", csr.Name, c.Type, c.Message)
			}
		}
		if len(got.Status.Certificate) > 0 {
			cert = got.Status.Certificate
			break
		}
		if time.Now().After(deadline) {
			return certs.Files{}, nil, fmt.Errorf("the viewer's certificate request %s was not signed within %s: is the CCM running, with agent.enroll? (kubectl get csr %s)", csr.Name, viewerWait, csr.Name)
		}
		select {
		case <-ctx.Done():
			return certs.Files{}, nil, ctx.Err()
		case <-time.After(200 * time.Millisecond):
		}
	}
	kd, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return certs.Files{}, nil, err
	}
	return privateFiles(map[string][]byte{"ca.crt": ca, "tls.crt": cert, "tls.key": pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kd})})
}

// privateFiles writes a client identity (ca.crt, tls.crt, tls.key) into a private temporary
// folder for certs.ClientConfig; cleanup removes it.
func privateFiles(data map[string][]byte) (certs.Files, func(), error) {
	dir, err := os.MkdirTemp("", "metalvipctl-tls-")
	if err != nil {
		return certs.Files{}, nil, err
	}
	cleanup := func() { _ = os.RemoveAll(dir) }
	files := certs.Files{CA: filepath.Join(dir, "ca.crt"), Cert: filepath.Join(dir, "tls.crt"), Key: filepath.Join(dir, "tls.key")}
	for k, path := range map[string]string{"ca.crt": files.CA, "tls.crt": files.Cert, "tls.key": files.Key} {
		if err := os.WriteFile(path, data[k], 0o600); err != nil {
			cleanup()
			return certs.Files{}, nil, err
		}
	}
	return files, cleanup, nil
}
