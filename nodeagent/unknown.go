package nodeagent

import (
	"fmt"
	"slices"
	"strings"

	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/reflect/protoreflect"
)

// maxUnknownFields bounds what unknownFields reports: a state full of fields from a far newer
// CCM is said in a few lines, not thousands.
const maxUnknownFields = 20

// unknownFields lists the fields of m this build does not know, by path and number
// ("announcements[0].bgp: field 12"), sorted, at most maxUnknownFields (the last line then says
// how many more). A newer CCM sends them during a rolling update; the agent applies the rest as
// if they were unset and says so in its answers (agent.proto's unknown_fields).
func unknownFields(m protoreflect.Message) []string {
	var out []string
	walkUnknown(m, "", &out)
	slices.Sort(out)
	if len(out) > maxUnknownFields {
		more := len(out) - maxUnknownFields + 1
		out = append(out[:maxUnknownFields-1], fmt.Sprintf("and %d more", more))
	}
	return out
}

func walkUnknown(m protoreflect.Message, path string, out *[]string) {
	if !m.IsValid() {
		return
	}
	for raw := m.GetUnknown(); len(raw) > 0; {
		num, typ, n := protowire.ConsumeTag(raw)
		if n < 0 {
			*out = append(*out, fmt.Sprintf("%s: unreadable unknown bytes", orRoot(path)))
			break
		}
		raw = raw[n:]
		if m := protowire.ConsumeFieldValue(num, typ, raw); m >= 0 {
			raw = raw[m:]
		} else {
			raw = nil
		}
		if line := fmt.Sprintf("%s: field %d", orRoot(path), num); !slices.Contains(*out, line) {
			*out = append(*out, line)
		}
	}
	m.Range(func(fd protoreflect.FieldDescriptor, v protoreflect.Value) bool {
		if fd.Kind() != protoreflect.MessageKind && fd.Kind() != protoreflect.GroupKind {
			return true
		}
		name := string(fd.Name())
		if path != "" {
			name = path + "." + name
		}
		switch {
		case fd.IsList():
			l := v.List()
			for i := range l.Len() {
				walkUnknown(l.Get(i).Message(), fmt.Sprintf("%s[%d]", name, i), out)
			}
		case fd.IsMap():
			if fd.MapValue().Kind() == protoreflect.MessageKind {
				v.Map().Range(func(k protoreflect.MapKey, mv protoreflect.Value) bool {
					walkUnknown(mv.Message(), fmt.Sprintf("%s[%s]", name, k.String()), out)
					return true
				})
			}
		default:
			walkUnknown(v.Message(), name, out)
		}
		return true
	})
}

func orRoot(path string) string {
	if path == "" {
		return "state"
	}
	return strings.TrimPrefix(path, ".")
}
