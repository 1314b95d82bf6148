package kubeapi

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"sigs.k8s.io/yaml"

	"github.com/metalvip/metalvip/test/testenv"
)

var crdResource = schema.GroupVersionResource{Group: "apiextensions.k8s.io", Version: "v1", Resource: "customresourcedefinitions"}

// InstallCRDs creates the CRDs in the repository's manifests/crds (once per server), waits
// until the API server serves them and returns an admin dynamic client.
func (s *Server) InstallCRDs(t testenv.TB) dynamic.Interface {
	t.Helper()
	s.crdOnce.Do(func() { s.crdErr = s.installCRDs() })
	if s.crdErr != nil {
		t.Fatalf("install CRDs: %v", s.crdErr)
	}
	dyn, err := dynamic.NewForConfig(s.Config)
	if err != nil {
		t.Fatalf("%v", err)
	}
	return dyn
}

func (s *Server) installCRDs() error {
	root, err := testenv.RepoRoot()
	if err != nil {
		return err
	}
	return s.CreateCRDs(filepath.Join(root, "manifests", "crds"), "metalvip.io")
}

// CreateCRDs creates the CRDs of the YAML files in dir (those that exist already are left)
// and waits until the API server serves group.
func (s *Server) CreateCRDs(dir, group string) error {
	files, err := filepath.Glob(filepath.Join(dir, "*.yaml"))
	if err != nil || len(files) == 0 {
		return fmt.Errorf("no CRDs in %s (%v)", dir, err)
	}
	dyn, err := dynamic.NewForConfig(s.Config)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	var names []string
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			return err
		}
		obj := &unstructured.Unstructured{}
		if err := yaml.Unmarshal(data, &obj.Object); err != nil {
			return fmt.Errorf("%s: %w", f, err)
		}
		if _, err := dyn.Resource(crdResource).Create(ctx, obj, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
			return fmt.Errorf("create %s: %w", f, err)
		}
		names = append(names, obj.GetName())
	}
	for _, name := range names {
		for {
			obj, err := dyn.Resource(crdResource).Get(ctx, name, metav1.GetOptions{})
			if err == nil && established(obj) {
				break
			}
			if ctx.Err() != nil {
				return fmt.Errorf("CRD %s not established: %v", name, err)
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
	// Discovery can lag behind the Established condition; wait until the resources list.
	for {
		lists, err := s.Client.Discovery().ServerPreferredResources()
		if err == nil && len(lists) > 0 && hasGroup(lists, group) {
			return nil
		}
		if ctx.Err() != nil {
			return fmt.Errorf("%s not in discovery: %v", group, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func established(obj *unstructured.Unstructured) bool {
	conds, _, _ := unstructured.NestedSlice(obj.Object, "status", "conditions")
	for _, c := range conds {
		m, _ := c.(map[string]any)
		if m["type"] == "Established" && m["status"] == "True" {
			return true
		}
	}
	return false
}

func hasGroup(lists []*metav1.APIResourceList, group string) bool {
	for _, l := range lists {
		if gv, err := schema.ParseGroupVersion(l.GroupVersion); err == nil && gv.Group == group {
			return true
		}
	}
	return false
}
