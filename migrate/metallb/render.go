package metallb

import (
	"bytes"
	"fmt"
	"io"
	"slices"
	"strings"

	"go.yaml.in/yaml/v3"
	sigsyaml "sigs.k8s.io/yaml"

	"github.com/metalvip/metalvip/api/v1alpha1"
)

// printedObject is what is printed of a converted object: no status, no server fields.
type printedObject struct {
	APIVersion string      `json:"apiVersion"`
	Kind       string      `json:"kind"`
	Metadata   printedMeta `json:"metadata"`
	Spec       any         `json:"spec"`
}

type printedMeta struct {
	Name   string            `json:"name"`
	Labels map[string]string `json:"labels"`
}

// commentWidth is where comments are wrapped.
const commentWidth = 96

// Render writes a conversion as YAML documents ready for `kubectl apply`, each note
// a comment above the field it concerns.
func Render(w io.Writer, c Conversion) error {
	var b bytes.Buffer
	fmt.Fprintf(&b, "# IPPools and BGPPeers converted from MetalLB's configuration in namespace %s\n", c.Namespace)
	fmt.Fprintf(&b, "# by metalvipctl migrate metallb. Apply once metalvip's CRDs are installed:\n")
	fmt.Fprintf(&b, "#   kubectl apply --server-side -f FILE\n")
	fmt.Fprintf(&b, "# Comments starting CHECK: mark where metalvip will not do what MetalLB did (%d here);\n", c.Checks())
	fmt.Fprintf(&b, "# docs/migrating-from-metallb.md says how each is mapped.\n")
	for _, g := range c.General {
		b.WriteString(comment(g, ""))
	}
	for _, o := range c.Objects {
		doc, err := objectNode(o)
		if err != nil {
			return fmt.Errorf("%s %s: %w", o.Kind, o.Name, err)
		}
		b.WriteString("---\n")
		enc := yaml.NewEncoder(&b)
		enc.SetIndent(2)
		if err := enc.Encode(doc); err != nil {
			return fmt.Errorf("%s %s: %w", o.Kind, o.Name, err)
		}
		if err := enc.Close(); err != nil {
			return err
		}
	}
	_, err := w.Write(b.Bytes())
	return err
}

// objectNode turns a converted object into a YAML document with its notes attached.
func objectNode(o Object) (*yaml.Node, error) {
	// sigs.k8s.io/yaml writes the API's JSON field names and omits what the types omit.
	text, err := sigsyaml.Marshal(printedObject{
		APIVersion: v1alpha1.GroupVersion.String(),
		Kind:       o.Kind,
		Metadata:   printedMeta{Name: o.Name, Labels: map[string]string{convertedLabel: "metallb"}},
		Spec:       o.Spec,
	})
	if err != nil {
		return nil, err
	}
	var doc yaml.Node
	if err := yaml.Unmarshal(text, &doc); err != nil {
		return nil, err
	}
	if doc.Kind != yaml.DocumentNode || len(doc.Content) != 1 {
		return nil, fmt.Errorf("unexpected YAML shape")
	}
	root := doc.Content[0]
	if meta := valueNode(root, "metadata"); meta != nil && meta.Kind == yaml.MappingNode {
		// The name first, as people write it; the rest stays sorted.
		for i := 0; i+1 < len(meta.Content); i += 2 {
			if meta.Content[i].Value == "name" {
				pair := slices.Clone(meta.Content[i : i+2])
				meta.Content = append(pair, slices.Delete(meta.Content, i, i+2)...)
				break
			}
		}
	}
	heads := map[*yaml.Node][]string{}
	order := []*yaml.Node{}
	attach := func(n *yaml.Node, text string) {
		if _, ok := heads[n]; !ok {
			order = append(order, n)
		}
		heads[n] = append(heads[n], text)
	}
	attach(root, "From "+o.From+".")
	for _, nt := range o.Notes {
		attach(keyNode(root, nt.Path), nt.Text)
	}
	for _, n := range order {
		var c strings.Builder
		for _, t := range heads[n] {
			c.WriteString(comment(t, ""))
		}
		n.HeadComment = strings.TrimSuffix(c.String(), "\n")
	}
	return &doc, nil
}

// valueNode returns the value of key in a mapping, or nil.
func valueNode(m *yaml.Node, key string) *yaml.Node {
	for i := 0; i+1 < len(m.Content); i += 2 {
		if m.Content[i].Value == key {
			return m.Content[i+1]
		}
	}
	return nil
}

// keyNode finds the key node of a dotted path in a mapping, or the deepest key that exists on
// the way; the root when not even the first exists.
func keyNode(root *yaml.Node, path string) *yaml.Node {
	best, cur := root, root
	if path == "" {
		return root
	}
	for seg := range strings.SplitSeq(path, ".") {
		if cur.Kind != yaml.MappingNode {
			return best
		}
		found := false
		for i := 0; i+1 < len(cur.Content); i += 2 {
			if cur.Content[i].Value == seg {
				best, cur, found = cur.Content[i], cur.Content[i+1], true
				break
			}
		}
		if !found {
			return best
		}
	}
	return best
}

// comment writes text as comment lines of at most commentWidth, each paragraph (a line of
// text) wrapped on its own; command lines are never wrapped so they can be copied.
func comment(text, indent string) string {
	var b strings.Builder
	for para := range strings.SplitSeq(text, "\n") {
		if strings.HasPrefix(para, "kubectl ") {
			fmt.Fprintf(&b, "%s#   %s\n", indent, para)
			continue
		}
		line := ""
		for _, word := range strings.Fields(para) {
			if line != "" && len(indent)+2+len(line)+1+len(word) > commentWidth {
				fmt.Fprintf(&b, "%s# %s\n", indent, line)
				line = "  " + word // continuation lines are indented, so each note stands out
				continue
			}
			if line != "" {
				line += " "
			}
			line += word
		}
		if line != "" {
			fmt.Fprintf(&b, "%s# %s\n", indent, line)
		}
	}
	return b.String()
}
