package metallb

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
)

// ReadFiles adds MetalLB's objects from files, folders (their .yaml, .yml and .json files) or
// standard input ("-"). Namespace objects among them let MetalLB's namespace selectors be
// resolved. It returns what it skipped, one line each.
func (c *Config) ReadFiles(paths []string, stdin io.Reader) ([]string, error) {
	var skipped []string
	others := map[string]int{}
	for _, path := range paths {
		var names []string
		var readers []func() (io.ReadCloser, error)
		switch st, err := os.Stat(path); {
		case path == "-":
			names = append(names, "standard input")
			readers = append(readers, func() (io.ReadCloser, error) { return io.NopCloser(stdin), nil })
		case err != nil:
			return nil, err
		case st.IsDir():
			entries, err := os.ReadDir(path)
			if err != nil {
				return nil, err
			}
			for _, e := range entries {
				ext := filepath.Ext(e.Name())
				if e.IsDir() || (ext != ".yaml" && ext != ".yml" && ext != ".json") {
					continue
				}
				p := filepath.Join(path, e.Name())
				names = append(names, p)
				readers = append(readers, func() (io.ReadCloser, error) { return os.Open(p) })
			}
		default:
			names = append(names, path)
			readers = append(readers, func() (io.ReadCloser, error) { return os.Open(path) })
		}
		for i, open := range readers {
			r, err := open()
			if err != nil {
				return nil, err
			}
			objs, err := decodeObjects(r)
			r.Close()
			if err != nil {
				return nil, fmt.Errorf("%s: %w", names[i], err)
			}
			for _, u := range objs {
				s, err := c.take(u)
				if err != nil {
					return nil, fmt.Errorf("%s: %w", names[i], err)
				}
				switch {
				case s == "":
				case strings.HasPrefix(s, "other:"):
					others[strings.TrimPrefix(s, "other:")]++
				default:
					skipped = append(skipped, s)
				}
			}
		}
	}
	for _, kind := range sortedKeys(others) {
		skipped = append(skipped, fmt.Sprintf("%d %s objects: not MetalLB's configuration", others[kind], kind))
	}
	return skipped, nil
}

// decodeObjects reads every object of a stream of YAML or JSON documents; a List gives its
// items.
func decodeObjects(r io.Reader) ([]*unstructured.Unstructured, error) {
	dec := utilyaml.NewYAMLOrJSONDecoder(bufio.NewReader(r), 4096)
	var out []*unstructured.Unstructured
	for {
		var m map[string]any
		if err := dec.Decode(&m); err != nil {
			if errors.Is(err, io.EOF) {
				return out, nil
			}
			return nil, err
		}
		if m == nil {
			continue // an empty document
		}
		u := &unstructured.Unstructured{Object: m}
		if u.IsList() {
			l, err := u.ToList()
			if err != nil {
				return nil, err
			}
			for i := range l.Items {
				out = append(out, &l.Items[i])
			}
			continue
		}
		out = append(out, u)
	}
}

// take adds one object read from a file. It returns why it skipped the object, "other:KIND"
// for objects that are no MetalLB configuration at all (counted, not listed).
func (c *Config) take(u *unstructured.Unstructured) (string, error) {
	gv, err := schema.ParseGroupVersion(u.GetAPIVersion())
	if err != nil {
		return "", fmt.Errorf("%s %s: apiVersion %q: %w", u.GetKind(), u.GetName(), u.GetAPIVersion(), err)
	}
	kind := u.GetKind()
	if gv.Group == "" && kind == "Namespace" {
		c.namespaces = append(c.namespaces, kubeNamespace{Name: u.GetName(), Labels: u.GetLabels()})
		return "", nil
	}
	if gv.Group == "" && kind == "ConfigMap" && legacyConfig(u) {
		return "", fmt.Errorf("ConfigMap %s/%s is MetalLB's configuration before v0.13 (data.config), which this converter does not read: convert it to MetalLB's custom resources first with MetalLB's own configmaptocrs, then convert those", u.GetNamespace(), u.GetName())
	}
	if gv.Group != metalLBGroup {
		if gv.Group == "apps" && (kind == "Deployment" || kind == "DaemonSet") && u.GetNamespace() == c.Namespace {
			c.noteClass(u)
		}
		return "other:" + kind, nil
	}
	if _, ok := metalLBKinds[kind]; !ok {
		return fmt.Sprintf("%s %s/%s: MetalLB's own status, nothing to convert", kind, u.GetNamespace(), u.GetName()), nil
	}
	if ns := u.GetNamespace(); ns != "" && ns != c.Namespace {
		return fmt.Sprintf("%s %s/%s: not in namespace %s, the one MetalLB reads (give --namespace %s to convert that one)", kind, ns, u.GetName(), c.Namespace, ns), nil
	}
	return "", c.Add(u)
}

// ReadCluster adds MetalLB's objects listed in its namespace, and the cluster's Namespaces.
// It only lists. It returns what it skipped, one line each.
func (c *Config) ReadCluster(ctx context.Context, cfg *rest.Config) ([]string, error) {
	dyn, err := dynamic.NewForConfig(cfg)
	if err != nil {
		return nil, err
	}
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	var skipped []string
	for _, kind := range sortedKeys(metalLBKinds) {
		resource := metalLBKinds[kind].resource
		versions := []string{metalLBKinds[kind].version}
		if kind == "BGPPeer" {
			versions = append(versions, "v1beta1") // MetalLB before v0.14 served only this one
		}
		var list *unstructured.UnstructuredList
		for _, v := range versions {
			list, err = dyn.Resource(schema.GroupVersionResource{Group: metalLBGroup, Version: v, Resource: resource}).Namespace(c.Namespace).List(ctx, metav1.ListOptions{})
			if !apierrors.IsNotFound(err) {
				break
			}
		}
		switch {
		case apierrors.IsNotFound(err) && kind == "IPAddressPool":
			return nil, fmt.Errorf("the cluster serves no %s.%s: MetalLB's CRDs are not installed (a MetalLB configured by ConfigMap must first be converted to its CRs with MetalLB's own configmaptocrs)", resource, metalLBGroup)
		case apierrors.IsNotFound(err):
			skipped = append(skipped, fmt.Sprintf("%s: the cluster serves no %s.%s (an older MetalLB); none converted", kind, resource, metalLBGroup))
			continue
		case err != nil:
			return nil, fmt.Errorf("list %s.%s in %s: %w", resource, metalLBGroup, c.Namespace, err)
		}
		for i := range list.Items {
			u := &list.Items[i]
			u.SetKind(kind) // list items carry it; set it for those that do not
			if err := c.Add(u); err != nil {
				return nil, err
			}
		}
	}
	// MetalLB's workloads say whether it served one loadBalancerClass alone.
	for _, res := range []string{"deployments", "daemonsets"} {
		list, err := dyn.Resource(schema.GroupVersionResource{Group: "apps", Version: "v1", Resource: res}).Namespace(c.Namespace).List(ctx, metav1.ListOptions{})
		if err != nil {
			skipped = append(skipped, fmt.Sprintf("%s in %s: %v; whether MetalLB served one loadBalancerClass alone (--lb-class) is not known", res, c.Namespace, err))
			continue
		}
		for i := range list.Items {
			c.noteClass(&list.Items[i])
		}
	}
	nss, err := client.CoreV1().Namespaces().List(ctx, metav1.ListOptions{})
	if err != nil {
		skipped = append(skipped, fmt.Sprintf("namespaces: %v; pools whose namespaceSelectors need resolving keep the first selector", err))
	} else {
		c.namespaces = []kubeNamespace{}
		for _, ns := range nss.Items {
			c.namespaces = append(c.namespaces, kubeNamespace{Name: ns.Name, Labels: ns.Labels})
		}
	}
	return skipped, nil
}

// legacyConfig reports whether a ConfigMap is MetalLB's configuration of before v0.13: a
// data.config with one of its top-level keys (a part of it may hold only peers, BFD profiles
// or communities).
func legacyConfig(u *unstructured.Unstructured) bool {
	cfg, _, _ := unstructured.NestedString(u.Object, "data", "config")
	for l := range strings.SplitSeq(cfg, "\n") {
		for _, key := range []string{"address-pools:", "peers:", "bgp-communities:", "bfd-profiles:"} {
			if strings.HasPrefix(l, key) {
				return true
			}
		}
	}
	return false
}

// noteClass notes the loadBalancerClass a MetalLB workload (its controller or speaker) was
// started with (--lb-class): MetalLB then served only Services of that class.
func (c *Config) noteClass(u *unstructured.Unstructured) {
	containers, _, _ := unstructured.NestedSlice(u.Object, "spec", "template", "spec", "containers")
	for _, ct := range containers {
		m, ok := ct.(map[string]any)
		if !ok {
			continue
		}
		args, _, _ := unstructured.NestedStringSlice(m, "args")
		for i, a := range args {
			switch {
			case strings.HasPrefix(a, "--lb-class="):
				c.lbClass = strings.TrimPrefix(a, "--lb-class=")
			case a == "--lb-class" && i+1 < len(args):
				c.lbClass = args[i+1]
			}
		}
	}
}
