package main

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/spf13/cobra"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation"
	"sigs.k8s.io/yaml"

	"github.com/metalvip/metalvip/internal/certs"
)

func certsCommand() *cobra.Command {
	var (
		nodes     []string
		out       string
		caCert    string
		caKey     string
		validity  time.Duration
		namespace string
		manifests bool
	)
	cmd := &cobra.Command{
		Use:   "certs --nodes NODE[,NODE...] [--out DIR | --manifests]",
		Short: "Create the CA and the certificates for the CCM and the agents",
		Long: `certs creates (or reuses, with --ca-cert and --ca-key) the CA of metalvip's mutual TLS, the
CCM's client certificate (named metalvip-cloud-controller-manager), a viewer's client certificate
(named metalvip-viewer: it may read an agent's state with "metalvipctl agent" but never change
it) and one server certificate per node (named after the node). With --out it writes PEM files;
with --manifests it prints three Secrets to apply: metalvip-ccm-tls for the CCM,
metalvip-viewer-tls for operators, and metalvip-agent-tls for the agents. Run it
again with the same CA when nodes join. See docs/agent-tls.md.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if len(nodes) == 0 {
				return errors.New("--nodes is required: the names of the nodes, as their Node objects have them")
			}
			for _, n := range nodes {
				if errs := validation.IsDNS1123Subdomain(n); len(errs) > 0 {
					return fmt.Errorf("--nodes: %q is not a node name: %s", n, strings.Join(errs, "; "))
				}
			}
			if out == "" && !manifests {
				return errors.New("give --out DIR, --manifests, or both")
			}
			if (caCert == "") != (caKey == "") {
				return errors.New("--ca-cert and --ca-key go together")
			}
			if manifests && out == "" && caKey == "" {
				return errors.New("a new CA's key is not part of the Secrets: give --out DIR too, to keep ca.key for adding nodes later, or sign with an existing CA (--ca-cert, --ca-key)")
			}
			set, err := issueAll(nodes, caCert, caKey, validity)
			if err != nil {
				return err
			}
			if out != "" {
				if err := writeFiles(out, set); err != nil {
					return err
				}
			}
			if manifests {
				return writeManifests(cmd.OutOrStdout(), set, namespace)
			}
			return nil
		},
	}
	cmd.Flags().StringSliceVar(&nodes, "nodes", nil, "names of the nodes to create agent certificates for")
	cmd.Flags().StringVar(&out, "out", "", "folder to write PEM files to")
	cmd.Flags().BoolVar(&manifests, "manifests", false, "print Kubernetes Secrets instead of writing files")
	cmd.Flags().StringVar(&caCert, "ca-cert", "", "an existing CA certificate to sign with (PEM)")
	cmd.Flags().StringVar(&caKey, "ca-key", "", "the existing CA's key (PEM)")
	cmd.Flags().DurationVar(&validity, "validity", 365*24*time.Hour, "how long the new certificates are valid")
	cmd.Flags().StringVar(&namespace, "namespace", "kube-system", "namespace of the Secrets (with --manifests)")
	return cmd
}

type certSet struct {
	ca     certs.Pair
	ccm    certs.Pair
	viewer certs.Pair // metalvipctl agent's: reads state, may not Apply
	agents map[string]certs.Pair
}

func issueAll(nodes []string, caCert, caKey string, validity time.Duration) (*certSet, error) {
	set := &certSet{agents: map[string]certs.Pair{}}
	var err error
	if caCert != "" {
		if set.ca.Cert, err = os.ReadFile(caCert); err != nil {
			return nil, err
		}
		if set.ca.Key, err = os.ReadFile(caKey); err != nil {
			return nil, err
		}
	} else if set.ca, err = certs.NewCA("metalvip-ca", 10*validity); err != nil {
		return nil, err
	}
	if set.ccm, err = certs.Issue(set.ca, certs.CCMName, certs.Client, validity); err != nil {
		return nil, fmt.Errorf("CCM certificate: %w", err)
	}
	if set.viewer, err = certs.Issue(set.ca, certs.ViewerName, certs.Client, validity); err != nil {
		return nil, fmt.Errorf("viewer certificate: %w", err)
	}
	for _, n := range nodes {
		if set.agents[n], err = certs.Issue(set.ca, n, certs.Server, validity); err != nil {
			return nil, fmt.Errorf("certificate of %s: %w", n, err)
		}
	}
	return set, nil
}

func writeFiles(dir string, set *certSet) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	files := map[string][]byte{
		"ca.crt": set.ca.Cert, "ca.key": set.ca.Key,
		"ccm.crt": set.ccm.Cert, "ccm.key": set.ccm.Key,
		"viewer.crt": set.viewer.Cert, "viewer.key": set.viewer.Key,
	}
	for n, p := range set.agents {
		files[n+".crt"], files[n+".key"] = p.Cert, p.Key
	}
	for name, data := range files {
		if err := os.WriteFile(filepath.Join(dir, name), data, 0o600); err != nil {
			return err
		}
	}
	return nil
}

// writeManifests prints the three Secrets. The CA's key is in none: keep ca.key safe (write
// it with --out) to add nodes later.
func writeManifests(w io.Writer, set *certSet, namespace string) error {
	secret := func(name string, data map[string][]byte) *corev1.Secret {
		return &corev1.Secret{
			TypeMeta:   metav1.TypeMeta{APIVersion: "v1", Kind: "Secret"},
			ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: namespace},
			Type:       corev1.SecretTypeOpaque,
			Data:       data,
		}
	}
	agents := map[string][]byte{"ca.crt": set.ca.Cert}
	for n, p := range set.agents {
		agents[n+".crt"], agents[n+".key"] = p.Cert, p.Key
	}
	return writeDocuments(w,
		secret("metalvip-ccm-tls", map[string][]byte{"ca.crt": set.ca.Cert, "tls.crt": set.ccm.Cert, "tls.key": set.ccm.Key}),
		secret("metalvip-viewer-tls", map[string][]byte{"ca.crt": set.ca.Cert, "tls.crt": set.viewer.Cert, "tls.key": set.viewer.Key}),
		secret("metalvip-agent-tls", agents),
	)
}

// writeDocuments writes objects as one multi-document YAML stream, as kubectl apply -f takes.
func writeDocuments(w io.Writer, objs ...any) error {
	var b bytes.Buffer
	for i, o := range objs {
		doc, err := yaml.Marshal(o)
		if err != nil {
			return err
		}
		if i > 0 {
			b.WriteString("---\n")
		}
		b.Write(doc)
	}
	_, err := w.Write(b.Bytes())
	return err
}
