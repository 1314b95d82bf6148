package main

import (
	"encoding/json"
	"fmt"
	"io"
	"slices"
	"strings"

	"github.com/spf13/cobra"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/cli-runtime/pkg/genericclioptions"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/yaml"
)

// kubeFlags gives a command kubectl's flags for reaching a cluster (k8s.io/cli-runtime):
// --kubeconfig (else $KUBECONFIG, else ~/.kube/config), --context, --cluster, --user,
// --server, --token, --as, --namespace/-n, --request-timeout and the others, meaning what
// they mean to kubectl.
func kubeFlags(cmd *cobra.Command) *genericclioptions.ConfigFlags {
	f := genericclioptions.NewConfigFlags(false)
	f.AddFlags(cmd.Flags())
	return f
}

// kubeClients are the clients of the cluster the flags name.
func kubeClients(f *genericclioptions.ConfigFlags) (kubernetes.Interface, dynamic.Interface, *rest.Config, error) {
	cfg, err := f.ToRESTConfig()
	if err != nil {
		return nil, nil, nil, fmt.Errorf("kubeconfig: %w", err)
	}
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, nil, nil, err
	}
	dyn, err := dynamic.NewForConfig(cfg)
	if err != nil {
		return nil, nil, nil, err
	}
	return client, dyn, cfg, nil
}

// namespaceFlag returns --namespace when given, else "".
func namespaceFlag(cmd *cobra.Command, f *genericclioptions.ConfigFlags) string {
	if cmd.Flags().Changed("namespace") && f.Namespace != nil {
		return *f.Namespace
	}
	return ""
}

// printFlags is -o as kubectl takes it: the command's own table (and its wide form), json,
// yaml, and cli-runtime's jsonpath and go-template printers over the same fields.
type printFlags struct {
	output    string
	templates *genericclioptions.KubeTemplatePrintFlags
}

func addPrintFlags(cmd *cobra.Command) *printFlags {
	p := &printFlags{templates: genericclioptions.NewKubeTemplatePrintFlags()}
	cmd.Flags().StringVarP(&p.output, "output", "o", "", "output format: one of "+strings.Join(p.formats(), ", ")+" (default: a table)")
	p.templates.AddFlags(cmd)
	return p
}

func (p *printFlags) formats() []string {
	return append([]string{"wide", "json", "yaml"}, p.templates.AllowedFormats()...)
}

// check refuses an output format no printer takes, before anything is read.
func (p *printFlags) check() error {
	switch p.output {
	case "", "table", "wide", "json", "yaml":
		return nil
	}
	if _, err := p.templates.ToPrinter(p.output); err != nil {
		if genericclioptions.IsNoCompatiblePrinterError(err) {
			return fmt.Errorf("-o %q: give one of %s", p.output, strings.Join(p.formats(), ", "))
		}
		return fmt.Errorf("-o %s: %w", p.output, err)
	}
	return nil
}

// print writes v in the output format; table writes the table forms (wide: the wide one).
func (p *printFlags) print(w io.Writer, v any, table func(w io.Writer, wide bool)) error {
	switch p.output {
	case "", "table", "wide":
		table(w, p.output == "wide")
		return nil
	case "json":
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		return enc.Encode(v)
	case "yaml":
		b, err := yaml.Marshal(v)
		if err != nil {
			return err
		}
		_, err = w.Write(b)
		return err
	}
	printer, err := p.templates.ToPrinter(p.output)
	if err != nil {
		return err
	}
	// The templates read the fields as -o json names them.
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	obj := map[string]any{}
	if err := json.Unmarshal(b, &obj); err != nil {
		return err
	}
	return printer.PrintObj(&unstructured.Unstructured{Object: obj}, w)
}

// joinUniq joins the distinct strings, in their first order.
func joinUniq(ss []string) string {
	var out []string
	for _, s := range ss {
		if s != "" && !slices.Contains(out, s) {
			out = append(out, s)
		}
	}
	return strings.Join(out, ",")
}
