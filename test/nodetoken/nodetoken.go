// Package nodetoken makes, for tests without kubelets, what kubelet gives an agent pod: a Pod
// of the agents' ServiceAccount on a Node, and a projected ServiceAccount token bound to it
// (the TokenRequest API, as kubelet calls it for a projected volume). It decides nothing and
// touches only the objects it creates.
package nodetoken

import (
	"context"
	"crypto"
	"crypto/rand"
	"crypto/rsa"
	"crypto/sha256"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"os"
	"strings"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
)

// ServiceAccount makes the ServiceAccount namespace/name if it does not exist.
func ServiceAccount(ctx context.Context, c kubernetes.Interface, namespace, name string) error {
	no := false
	_, err := c.CoreV1().ServiceAccounts(namespace).Create(ctx, &corev1.ServiceAccount{
		ObjectMeta:                   metav1.ObjectMeta{Namespace: namespace, Name: name},
		AutomountServiceAccountToken: &no,
	}, metav1.CreateOptions{})
	if apierrors.IsAlreadyExists(err) {
		return nil
	}
	return err
}

// Pod makes a Pod of serviceAccount bound to node (spec.nodeName, as the scheduler binds it;
// no kubelet runs it) and returns it.
func Pod(ctx context.Context, c kubernetes.Interface, namespace, name, serviceAccount, node string) (*corev1.Pod, error) {
	no := false
	return c.CoreV1().Pods(namespace).Create(ctx, &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: name, Labels: map[string]string{"app.kubernetes.io/name": "metalvip-agent"}},
		Spec: corev1.PodSpec{
			NodeName: node, ServiceAccountName: serviceAccount, AutomountServiceAccountToken: &no,
			Containers: []corev1.Container{{Name: "agent", Image: "metalvip/metalvip-agent"}},
		},
	}, metav1.CreateOptions{})
}

// Token returns a token of the pod's ServiceAccount for audience, bound to the pod (and so to
// its node), valid for ttl (the API server's floor is 10 minutes).
func Token(ctx context.Context, c kubernetes.Interface, pod *corev1.Pod, audience string, ttl time.Duration) (string, error) {
	secs := int64(ttl / time.Second)
	tr, err := c.CoreV1().ServiceAccounts(pod.Namespace).CreateToken(ctx, pod.Spec.ServiceAccountName, &authenticationv1.TokenRequest{
		Spec: authenticationv1.TokenRequestSpec{
			Audiences: []string{audience}, ExpirationSeconds: &secs,
			BoundObjectRef: &authenticationv1.BoundObjectReference{Kind: "Pod", APIVersion: "v1", Name: pod.Name, UID: pod.UID},
		},
	}, metav1.CreateOptions{})
	if err != nil {
		return "", fmt.Errorf("token for pod %s/%s: %w", pod.Namespace, pod.Name, err)
	}
	return tr.Status.Token, nil
}

// Expired re-signs token with the API server's service-account signing key (an RSA PEM
// file) as if it had been issued an hour ago and expired a minute ago: the API server's
// TokenRequest will not make a token shorter than 10 minutes, and a test cannot wait that long.
func Expired(token, signingKeyFile string) (string, error) {
	parts := strings.Split(token, ".")
	if len(parts) != 3 {
		return "", errors.New("not a JWT")
	}
	payload, err := base64.RawURLEncoding.DecodeString(parts[1])
	if err != nil {
		return "", err
	}
	var claims map[string]any
	if err := json.Unmarshal(payload, &claims); err != nil {
		return "", err
	}
	now := time.Now()
	claims["iat"], claims["nbf"], claims["exp"] = now.Add(-time.Hour).Unix(), now.Add(-time.Hour).Unix(), now.Add(-time.Minute).Unix()
	payload, err = json.Marshal(claims)
	if err != nil {
		return "", err
	}
	pemData, err := os.ReadFile(signingKeyFile)
	if err != nil {
		return "", err
	}
	block, _ := pem.Decode(pemData)
	if block == nil {
		return "", fmt.Errorf("%s holds no PEM key", signingKeyFile)
	}
	key, err := x509.ParsePKCS1PrivateKey(block.Bytes)
	if err != nil {
		return "", err
	}
	signed := parts[0] + "." + base64.RawURLEncoding.EncodeToString(payload)
	sum := sha256.Sum256([]byte(signed))
	sig, err := rsa.SignPKCS1v15(rand.Reader, key, crypto.SHA256, sum[:])
	if err != nil {
		return "", err
	}
	return signed + "." + base64.RawURLEncoding.EncodeToString(sig), nil
}

// Unbound returns a token of namespace/serviceAccount for audience bound to no object.
func Unbound(ctx context.Context, c kubernetes.Interface, namespace, serviceAccount, audience string, ttl time.Duration) (string, error) {
	secs := int64(ttl / time.Second)
	tr, err := c.CoreV1().ServiceAccounts(namespace).CreateToken(ctx, serviceAccount, &authenticationv1.TokenRequest{
		Spec: authenticationv1.TokenRequestSpec{Audiences: []string{audience}, ExpirationSeconds: &secs},
	}, metav1.CreateOptions{})
	if err != nil {
		return "", err
	}
	return tr.Status.Token, nil
}
