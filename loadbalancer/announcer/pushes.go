package announcer

import (
	"google.golang.org/protobuf/proto"

	agentv1 "github.com/metalvip/metalvip/proto/metalvip/agent/v1"
)

// pushes owns what each node was last pushed, so that a node whose state was rebuilt for a
// change that did not reach it (its peers' keys, another node's part) is not pushed again.
// Only the loop calls it.
type pushes map[string]pushed

// pushed is what a node was last pushed: its head, and the version of its announcements.
type pushed struct {
	head    *agentv1.DesiredState
	version uint64
}

// due reports whether a node's rebuilt state (head, and its announcements at version) differs
// from what it was last pushed; if so it records it as pushed.
func (p pushes) due(node string, head *agentv1.DesiredState, version uint64) bool {
	if last, ok := p[node]; ok && last.version == version && proto.Equal(last.head, head) {
		return false
	}
	p[node] = pushed{head, version}
	return true
}

// forget drops the nodes that are gone, and returns them.
func (p pushes) forget(present func(node string) bool) []string {
	var gone []string
	for node := range p {
		if !present(node) {
			delete(p, node)
			gone = append(gone, node)
		}
	}
	return gone
}
