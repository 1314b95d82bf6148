package nodeagent

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"google.golang.org/protobuf/encoding/protojson"

	"github.com/metalvip/metalvip/internal/atomicfile"
	agentv1 "github.com/metalvip/metalvip/proto/metalvip/agent/v1"
)

const stateFile = "state.json"

// errUnusable marks a saved state whose content cannot be used (as opposed to a file that
// cannot be read): it is moved aside.
var errUnusable = errors.New("unusable")

// saveState writes the state atomically: a reader (the agent after a crash) sees the old file
// or the new one, never a mix. The file may hold BGP passwords: it is readable by root only.
func saveState(dir string, st *agentv1.DesiredState) error {
	if dir == "" {
		return nil
	}
	data, err := protojson.MarshalOptions{Indent: "  "}.Marshal(st)
	if err != nil {
		return err
	}
	return writeAtomic(dir, stateFile, data)
}

// writeAtomic replaces dir/name with data: a reader sees the old file or the new one.
func writeAtomic(dir, name string, data []byte) error { return atomicfile.Write(dir, name, data) }

// moveStateAside keeps a state file the agent cannot use for a human to look at.
func moveStateAside(dir string) (string, error) {
	if dir == "" {
		return "", errors.New("no state directory")
	}
	return atomicfile.MoveAside(dir, stateFile)
}

// loadState reads the saved state; nil when there is none.
func loadState(dir string) (*agentv1.DesiredState, error) {
	if dir == "" {
		return nil, nil
	}
	data, err := os.ReadFile(filepath.Join(dir, stateFile))
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read saved state: %w", err)
	}
	if len(data) == 0 {
		return nil, fmt.Errorf("%w: empty", errUnusable)
	}
	st := &agentv1.DesiredState{}
	if err := protojson.Unmarshal(data, st); err != nil {
		return nil, fmt.Errorf("%w: does not parse: %v", errUnusable, err)
	}
	return st, nil
}
