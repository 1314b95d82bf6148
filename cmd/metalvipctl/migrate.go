package main

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

	"github.com/spf13/cobra"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/metalvip/metalvip/provider/config"
)

func migrateCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "migrate",
		Short: "Convert another load balancer's configuration to metalvip's",
	}
	cmd.AddCommand(migrateMetalLBCommand())
	return cmd
}

func migrateMetalLBCommand() *cobra.Command {
	var kubeconfig, namespace, passwordNamespace string
	var files []string
	cmd := &cobra.Command{
		Use:   "metallb",
		Short: "Print IPPools and BGPPeers made from MetalLB's configuration",
		Long: `metallb reads MetalLB's configuration (IPAddressPools, L2Advertisements, BGPAdvertisements,
BGPPeers, Communities and BFDProfiles in MetalLB's namespace) from the cluster (like kubectl:
--kubeconfig, else $KUBECONFIG, else ~/.kube/config) or from YAML files (-f), and prints the
IPPools and BGPPeers that do the same in metalvip, ready for kubectl apply. Each IPPool is named
as its MetalLB pool, so Services annotated metallb.io/address-pool keep finding it. A comment
starting CHECK: marks every place where metalvip will not do exactly what MetalLB did.
Nothing in the cluster is changed. See docs/migrating-from-metallb.md.`,
		Example: `  metalvipctl migrate metallb > metalvip-config.yaml
  metalvipctl migrate metallb -f metallb-config.yaml -f more/ > metalvip-config.yaml`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			in := metalLBConfig{Namespace: namespace}
			var skipped []string
			var err error
			if len(files) > 0 {
				skipped, err = readMetalLBFiles(&in, files, cmd.InOrStdin())
			} else {
				skipped, err = readMetalLBCluster(cmd.Context(), &in, kubeconfig)
			}
			if err != nil {
				return err
			}
			for _, s := range skipped {
				fmt.Fprintf(cmd.ErrOrStderr(), "skipped %s\n", s)
			}
			conv := convertMetalLB(in, passwordNamespace)
			if err := renderConversion(cmd.OutOrStdout(), conv); err != nil {
				return err
			}
			pools, peers := 0, 0
			for _, o := range conv.Objects {
				if o.Kind == "IPPool" {
					pools++
				} else {
					peers++
				}
			}
			fmt.Fprintf(cmd.ErrOrStderr(), "converted %d IPPools and %d BGPPeers from MetalLB's namespace %s; %d places to check (comments starting CHECK:)\n", pools, peers, namespace, conv.checks())
			return nil
		},
	}
	cmd.Flags().StringVar(&kubeconfig, "kubeconfig", "", "path of the kubeconfig (default: $KUBECONFIG, else ~/.kube/config)")
	cmd.Flags().StringVarP(&namespace, "namespace", "n", "metallb-system", "MetalLB's namespace: it reads its configuration there only")
	cmd.Flags().StringArrayVarP(&files, "filename", "f", nil, "read MetalLB's objects from this YAML file, folder (its .yaml, .yml and .json files) or - (standard input) instead of the cluster; repeatable")
	cmd.Flags().StringVar(&passwordNamespace, "password-namespace", config.DefaultPasswordNamespace, "the namespace the CCM reads BGP passwords from (cloud-config bgp.passwordSecretNamespace)")
	return cmd
}

// readMetalLBFiles reads MetalLB's objects from files, folders or standard input ("-").
// Namespace objects among them let MetalLB's namespace selectors be resolved. It returns what
// it skipped, one line each.
func readMetalLBFiles(in *metalLBConfig, paths []string, stdin io.Reader) ([]string, error) {
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
				s, err := in.take(u)
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
func (c *metalLBConfig) take(u *unstructured.Unstructured) (string, error) {
	gv, err := schema.ParseGroupVersion(u.GetAPIVersion())
	if err != nil {
		return "", fmt.Errorf("%s %s: apiVersion %q: %w", u.GetKind(), u.GetName(), u.GetAPIVersion(), err)
	}
	kind := u.GetKind()
	if gv.Group == "" && kind == "Namespace" {
		c.KubeNamespaces = append(c.KubeNamespaces, kubeNamespace{Name: u.GetName(), Labels: u.GetLabels()})
		return "", nil
	}
	if gv.Group != metalLBGroup {
		return "other:" + kind, nil
	}
	if _, ok := metalLBKinds[kind]; !ok {
		return fmt.Sprintf("%s %s/%s: MetalLB's own status, nothing to convert", kind, u.GetNamespace(), u.GetName()), nil
	}
	if ns := u.GetNamespace(); ns != "" && ns != c.Namespace {
		return fmt.Sprintf("%s %s/%s: not in namespace %s, the one MetalLB reads (give --namespace %s to convert that one)", kind, ns, u.GetName(), c.Namespace, ns), nil
	}
	return "", c.add(u)
}

// readMetalLBCluster lists MetalLB's objects in its namespace.
func readMetalLBCluster(ctx context.Context, in *metalLBConfig, kubeconfig string) ([]string, error) {
	rules := clientcmd.NewDefaultClientConfigLoadingRules()
	rules.ExplicitPath = kubeconfig
	cfg, err := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(rules, &clientcmd.ConfigOverrides{}).ClientConfig()
	if err != nil {
		return nil, fmt.Errorf("kubeconfig: %w", err)
	}
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
			list, err = dyn.Resource(schema.GroupVersionResource{Group: metalLBGroup, Version: v, Resource: resource}).Namespace(in.Namespace).List(ctx, metav1.ListOptions{})
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
			return nil, fmt.Errorf("list %s.%s in %s: %w", resource, metalLBGroup, in.Namespace, err)
		}
		for i := range list.Items {
			u := &list.Items[i]
			u.SetKind(kind) // list items carry it; set it for those that do not
			if err := in.add(u); err != nil {
				return nil, err
			}
		}
	}
	nss, err := client.CoreV1().Namespaces().List(ctx, metav1.ListOptions{})
	if err != nil {
		skipped = append(skipped, fmt.Sprintf("namespaces: %v; pools whose namespaceSelectors need resolving keep the first selector", err))
	} else {
		in.KubeNamespaces = []kubeNamespace{}
		for _, ns := range nss.Items {
			in.KubeNamespaces = append(in.KubeNamespaces, kubeNamespace{Name: ns.Name, Labels: ns.Labels})
		}
	}
	return skipped, nil
}
