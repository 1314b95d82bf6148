package config

import (
	"fmt"
	"reflect"
	"sort"
	"strconv"
	"strings"

	"go.yaml.in/yaml/v3"
	"k8s.io/apimachinery/pkg/util/validation"
)

// checkFields walks the YAML tree beside the Go type it decodes into and refuses any mapping
// key the type does not have, naming the line, the field's path and the closest known name.
// yaml.v3's own KnownFields check reports Go type names, which mean nothing to an operator.
func checkFields(n *yaml.Node, v any, path string) error {
	return checkNode(n, reflect.TypeOf(v), path)
}

var unmarshalerType = reflect.TypeFor[yaml.Unmarshaler]()

func checkNode(n *yaml.Node, t reflect.Type, path string) error {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	if reflect.PointerTo(t).Implements(unmarshalerType) {
		return nil
	}
	switch t.Kind() {
	case reflect.Struct:
		if n.Kind != yaml.MappingNode {
			if n.Kind == yaml.ScalarNode && n.Tag == "!!null" {
				return nil
			}
			return &FieldError{Line: n.Line, Field: path, Msg: fmt.Sprintf("expected a mapping of fields, found %s", describe(n))}
		}
		fields := yamlFields(t)
		for i := 0; i+1 < len(n.Content); i += 2 {
			k, val := n.Content[i], n.Content[i+1]
			ft, ok := fields[k.Value]
			if !ok {
				return &FieldError{Line: k.Line, Field: join(path, k.Value), Msg: unknownFieldMsg(k.Value, path, fields)}
			}
			if err := checkNode(val, ft, join(path, k.Value)); err != nil {
				return err
			}
		}
	case reflect.Slice:
		if n.Kind != yaml.SequenceNode {
			if n.Kind == yaml.ScalarNode && n.Tag == "!!null" {
				return nil
			}
			return &FieldError{Line: n.Line, Field: path, Msg: fmt.Sprintf("expected a list, found %s", describe(n))}
		}
		for i, item := range n.Content {
			if err := checkNode(item, t.Elem(), fmt.Sprintf("%s[%d]", path, i)); err != nil {
				return err
			}
		}
	default:
		if n.Kind != yaml.ScalarNode {
			return &FieldError{Line: n.Line, Field: path, Msg: fmt.Sprintf("expected a single value (%s), found %s", t.Kind(), describe(n))}
		}
		if n.Tag == "!!null" {
			return nil
		}
		switch t.Kind() {
		case reflect.Bool:
			if n.Tag != "!!bool" {
				return &FieldError{Line: n.Line, Field: path, Msg: fmt.Sprintf("%q is not a boolean; write true or false", n.Value)}
			}
		case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
			reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
			if n.Tag != "!!int" {
				return &FieldError{Line: n.Line, Field: path, Msg: fmt.Sprintf("%q is not a whole number", n.Value)}
			}
		case reflect.String:
			if n.Tag != "!!str" {
				return &FieldError{Line: n.Line, Field: path, Msg: fmt.Sprintf("%s is not text; quote it (\"%s\") if it is meant as text", n.Value, n.Value)}
			}
		}
	}
	return nil
}

func describe(n *yaml.Node) string {
	switch n.Kind {
	case yaml.MappingNode:
		return "a mapping"
	case yaml.SequenceNode:
		return "a list"
	default:
		return strconv.Quote(n.Value)
	}
}

func join(path, name string) string {
	if path == "" {
		return name
	}
	return path + "." + name
}

func yamlFields(t reflect.Type) map[string]reflect.Type {
	m := map[string]reflect.Type{}
	for f := range t.Fields() {
		if !f.IsExported() {
			continue
		}
		name, _, _ := strings.Cut(f.Tag.Get("yaml"), ",")
		if name == "-" {
			continue
		}
		if name == "" {
			name = strings.ToLower(f.Name)
		}
		m[name] = f.Type
	}
	return m
}

func unknownFieldMsg(name, path string, fields map[string]reflect.Type) string {
	known := make([]string, 0, len(fields))
	for k := range fields {
		known = append(known, k)
	}
	sort.Strings(known)
	where := "at the top level"
	if path != "" {
		where = "in " + path
	}
	msg := fmt.Sprintf("unknown field %q %s", name, where)
	if best, d := closest(name, known); d <= max(2, len(name)/3) {
		msg += fmt.Sprintf("; did you mean %q?", best)
	} else {
		msg += fmt.Sprintf("; the fields here are %s", strings.Join(known, ", "))
	}
	return msg
}

// closest returns the known name with the smallest case-insensitive edit distance to s.
func closest(s string, known []string) (string, int) {
	best, bestD := "", 1<<30
	for _, k := range known {
		if d := editDistance(strings.ToLower(s), strings.ToLower(k)); d < bestD {
			best, bestD = k, d
		}
	}
	return best, bestD
}

func editDistance(a, b string) int {
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev, cur = cur, prev
	}
	return prev[len(b)]
}

// lineOf finds the line of a dotted path ("topology.subnets[1].cidr") in the tree, or the line
// of its nearest present ancestor.
func lineOf(root *yaml.Node, path string) int {
	n, line := root, root.Line
	for part := range strings.SplitSeq(path, ".") {
		name, idx := part, -1
		if i := strings.IndexByte(part, '['); i >= 0 {
			name = part[:i]
			idx, _ = strconv.Atoi(strings.TrimSuffix(part[i+1:], "]"))
		}
		next := mappingValue(n, name)
		if next == nil {
			return line
		}
		n, line = next, next.Line
		if idx >= 0 {
			if n.Kind != yaml.SequenceNode || idx >= len(n.Content) {
				return line
			}
			n, line = n.Content[idx], n.Content[idx].Line
		}
	}
	return line
}

func mappingValue(n *yaml.Node, key string) *yaml.Node {
	if n.Kind != yaml.MappingNode {
		return nil
	}
	for i := 0; i+1 < len(n.Content); i += 2 {
		if n.Content[i].Value == key {
			return n.Content[i+1]
		}
	}
	return nil
}

func validLabelKey(s string) bool   { return len(validation.IsQualifiedName(s)) == 0 }
func validLabelValue(s string) bool { return len(validation.IsValidLabelValue(s)) == 0 }
