package nodeagent

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"os"
	"path/filepath"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	"github.com/metalvip/metalvip/internal/atomicfile"
	agentv1 "github.com/metalvip/metalvip/proto/metalvip/agent/v1"
)

// The state file holds the last applied state: a header (stateMagic, the payload's length and
// its CRC-32C, 12 bytes) and the state in protobuf's binary form. Binary because the agent
// saves its whole state at every Apply: as protojson, saving was half of an Apply of 5,000 VIPs
// (BenchmarkApplyOneMoreVIP). The header makes a truncated or damaged file an error, not a
// shorter state (the binary form parses up to any field boundary).
const (
	stateFile = "state.pb"
	// legacyStateFile is the state as agents before saved it (protojson). It is read when
	// there is no stateFile, and removed once a stateFile is saved.
	legacyStateFile = "state.json"
	stateMagic      = "MVS1"
	stateHeader     = len(stateMagic) + 8
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// errUnusable marks a saved state whose content cannot be used (as opposed to a file that
// cannot be read): it is moved aside.
var errUnusable = errors.New("unusable")

// probeFile is written and removed at start to learn whether the state directory can be written.
const probeFile = ".write-probe"

// writable says why dir cannot be written (a read-only or full disk); nil when it can. A
// variable: tests stand in for a disk gone bad.
var writable = func(dir string) error {
	if dir == "" {
		return nil
	}
	if err := atomicfile.Write(dir, probeFile, []byte("metalvip\n")); err != nil {
		return err
	}
	return os.Remove(filepath.Join(dir, probeFile))
}

// saveState writes the state atomically: a reader (the agent after a crash) sees the old file
// or the new one, never a mix. The file may hold BGP passwords: it is readable by root only.
func saveState(dir string, st *agentv1.DesiredState) error {
	if dir == "" {
		return nil
	}
	data, err := encodeState(st)
	if err != nil {
		return err
	}
	if err := atomicfile.Write(dir, stateFile, data); err != nil {
		return err
	}
	// The old format would be read by nobody; a human would take it for the current state.
	if err := os.Remove(filepath.Join(dir, legacyStateFile)); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("remove the state saved in the old format: %w", err)
	}
	return nil
}

func encodeState(st *agentv1.DesiredState) ([]byte, error) {
	size := proto.Size(st)
	out := make([]byte, stateHeader, stateHeader+size)
	copy(out, stateMagic)
	out, err := proto.MarshalOptions{}.MarshalAppend(out, st)
	if err != nil {
		return nil, err
	}
	payload := out[stateHeader:]
	binary.BigEndian.PutUint32(out[len(stateMagic):], uint32(len(payload)))
	binary.BigEndian.PutUint32(out[len(stateMagic)+4:], crc32.Checksum(payload, castagnoli))
	return out, nil
}

func decodeState(data []byte) (*agentv1.DesiredState, error) {
	if len(data) == 0 {
		return nil, fmt.Errorf("%w: empty", errUnusable)
	}
	if len(data) < stateHeader || string(data[:len(stateMagic)]) != stateMagic {
		return nil, fmt.Errorf("%w: does not parse: not a state file (no %q header)", errUnusable, stateMagic)
	}
	payload := data[stateHeader:]
	if n := binary.BigEndian.Uint32(data[len(stateMagic):]); uint64(n) != uint64(len(payload)) {
		return nil, fmt.Errorf("%w: does not parse: truncated or extended (%d bytes of state, the header says %d)", errUnusable, len(payload), n)
	}
	if sum := binary.BigEndian.Uint32(data[len(stateMagic)+4:]); sum != crc32.Checksum(payload, castagnoli) {
		return nil, fmt.Errorf("%w: does not parse: damaged (checksum mismatch)", errUnusable)
	}
	st := &agentv1.DesiredState{}
	if err := proto.Unmarshal(payload, st); err != nil {
		return nil, fmt.Errorf("%w: does not parse: %v", errUnusable, err)
	}
	return st, nil
}

// moveStateAside keeps a state file the agent cannot use for a human to look at.
func moveStateAside(dir, name string) (string, error) {
	if dir == "" {
		return "", errors.New("no state directory")
	}
	return atomicfile.MoveAside(dir, name)
}

// loadState reads the saved state, and says from which file; nil when there is none.
func loadState(dir string) (*agentv1.DesiredState, string, error) {
	if dir == "" {
		return nil, "", nil
	}
	data, err := os.ReadFile(filepath.Join(dir, stateFile))
	if err == nil {
		st, err := decodeState(data)
		return st, stateFile, err
	}
	if !errors.Is(err, os.ErrNotExist) {
		return nil, stateFile, fmt.Errorf("read saved state: %w", err)
	}
	data, err = os.ReadFile(filepath.Join(dir, legacyStateFile))
	if errors.Is(err, os.ErrNotExist) {
		return nil, "", nil
	}
	if err != nil {
		return nil, legacyStateFile, fmt.Errorf("read saved state: %w", err)
	}
	if len(data) == 0 {
		return nil, legacyStateFile, fmt.Errorf("%w: empty", errUnusable)
	}
	st := &agentv1.DesiredState{}
	if err := protojson.Unmarshal(data, st); err != nil {
		return nil, legacyStateFile, fmt.Errorf("%w: does not parse: %v", errUnusable, err)
	}
	return st, legacyStateFile, nil
}
