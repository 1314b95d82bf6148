package kubeapi

import (
	"context"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

func TestMain(m *testing.M) { Main(m) }

func TestServerStoresObjects(t *testing.T) {
	srv := Get(t)
	ns := srv.Namespace(t)
	ctx := context.Background()
	cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "probe"}, Data: map[string]string{"k": "v"}}
	if _, err := srv.Client.CoreV1().ConfigMaps(ns).Create(ctx, cm, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create: %v", err)
	}
	got, err := srv.Client.CoreV1().ConfigMaps(ns).Get(ctx, "probe", metav1.GetOptions{})
	if err != nil || got.Data["k"] != "v" {
		t.Fatalf("get = %v, %v; want the stored ConfigMap", got, err)
	}
	v, err := srv.Client.Discovery().ServerVersion()
	if err != nil {
		t.Fatalf("version: %v", err)
	}
	if v.Major != "1" || v.Minor != "37" {
		t.Errorf("server version = %s.%s, want 1.37", v.Major, v.Minor)
	}
}
