package failover

import (
	"crypto/ecdh"
	"crypto/rand"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/metalvip/metalvip/internal/atomicfile"
)

// IdentityFile holds a node's heartbeat keys and boot counter in its state directory, mode
// 0600. Only the public halves ever leave the node (GetState).
const IdentityFile = "heartbeat.json"

// Identity is this node's heartbeat identity: its X25519 static keys (newest first, at most
// two: the newest signs once peers know it, the previous one verifies until then) and its
// boot counter, which grows by one at every start before the first heartbeat is sent.
type Identity struct {
	dir  string
	boot uint64
	// seq is the sequence of this boot, shared by every Monitor of the process. It starts at
	// the start's wall-clock time in nanoseconds, not at 0: a start whose boot counter could
	// not be saved (a full or read-only disk) reuses the last boot's counter, and its
	// heartbeats must still come after the last boot's, which its peers remember (they would
	// refuse them as replays, count this node dead, and both answer its VIPs). Only a clock
	// set back past the last start and a disk that cannot be written together defeat it.
	seq atomic.Uint64

	mu   sync.Mutex // serializes changes of keys and their saving
	keys atomic.Pointer[[]*ownKey]
}

type ownKey struct {
	priv    *ecdh.PrivateKey
	pub     []byte
	id      keyID
	created time.Time
}

// keyID names a public key in a heartbeat: the first bytes of its SHA-256.
type keyID [4]byte

func idOf(pub []byte) keyID {
	sum := sha256.Sum256(pub)
	return keyID(sum[:4])
}

type identityJSON struct {
	Boot uint64    `json:"boot"`
	Keys []keyJSON `json:"keys"`
}

type keyJSON struct {
	Private []byte    `json:"private"`
	Created time.Time `json:"created"`
}

// LoadIdentity reads the identity kept in dir, makes one if there is none, counts this start
// in its boot counter and saves it. It always returns a usable identity; the error says what
// went wrong on the way (the caller reports it):
//   - a file that does not parse is moved aside (IdentityFile + ".corrupt") and a new key is
//     made: peers hear this node again once the CCM hands them its new public key;
//   - a file that cannot be read, or an identity that cannot be saved, leaves the identity in
//     memory only (a new key in the first case), good for this run.
//
// dir "" keeps the identity in memory.
func LoadIdentity(dir string, now time.Time) (*Identity, error) {
	id := &Identity{dir: dir}
	var problems []error
	saved, err := readIdentity(dir)
	switch {
	case err == nil && saved != nil:
		id.boot = saved.Boot + 1
		var keys []*ownKey
		for i, k := range saved.Keys {
			priv, err := ecdh.X25519().NewPrivateKey(k.Private)
			if err != nil {
				problems = append(problems, fmt.Errorf("%s: key %d: %w", IdentityFile, i, err))
				continue
			}
			keys = append(keys, newOwnKey(priv, k.Created))
		}
		if len(keys) == 0 {
			problems = append(problems, fmt.Errorf("%s holds no usable key: made a new one", IdentityFile))
			k, err := generateKey(now)
			if err != nil {
				return nil, err
			}
			keys = []*ownKey{k}
		}
		id.keys.Store(&keys)
	case errors.Is(err, errCorrupt):
		moved, merr := atomicfile.MoveAside(dir, IdentityFile)
		if merr != nil {
			problems = append(problems, fmt.Errorf("%w; moving it aside: %v", err, merr))
		} else {
			problems = append(problems, fmt.Errorf("%w; moved to %s and made a new key", err, moved))
		}
		fallthrough
	default: // none saved, or corrupt
		if err != nil && !errors.Is(err, errCorrupt) {
			// Unreadable: do not overwrite what may be fine once the disk is.
			problems = append(problems, fmt.Errorf("%w; using a new key in memory for this run", err))
			id.dir = ""
		}
		k, gerr := generateKey(now)
		if gerr != nil {
			return nil, gerr
		}
		keys := []*ownKey{k}
		id.keys.Store(&keys)
		id.boot = 1
	}
	if err := id.save(); err != nil {
		problems = append(problems, fmt.Errorf("save %s: %w; the boot counter of this start is not kept (heartbeat sequences follow the clock meanwhile)", IdentityFile, err))
	}
	id.seq.Store(uint64(max(now.UnixNano(), 0)))
	return id, errors.Join(problems...)
}

var errCorrupt = errors.New("corrupt")

func readIdentity(dir string) (*identityJSON, error) {
	if dir == "" {
		return nil, nil
	}
	path := filepath.Join(dir, IdentityFile)
	data, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", path, err)
	}
	var saved identityJSON
	if err := json.Unmarshal(data, &saved); err != nil {
		return nil, fmt.Errorf("%s is %w: %v", path, errCorrupt, err)
	}
	return &saved, nil
}

func generateKey(now time.Time) (*ownKey, error) {
	priv, err := ecdh.X25519().GenerateKey(rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("make a heartbeat key: %w", err)
	}
	return newOwnKey(priv, now), nil
}

func newOwnKey(priv *ecdh.PrivateKey, created time.Time) *ownKey {
	pub := priv.PublicKey().Bytes()
	return &ownKey{priv: priv, pub: pub, id: idOf(pub), created: created}
}

// save writes the identity; the caller holds mu or is the only user.
func (id *Identity) save() error {
	if id.dir == "" {
		return nil
	}
	out := identityJSON{Boot: id.boot}
	for _, k := range *id.keys.Load() {
		out.Keys = append(out.Keys, keyJSON{Private: k.priv.Bytes(), Created: k.created})
	}
	data, err := json.Marshal(out)
	if err != nil {
		return err
	}
	return atomicfile.Write(id.dir, IdentityFile, data)
}

// Boot is this start's boot counter.
func (id *Identity) Boot() uint64 { return id.boot }

// PublicKeys returns the public keys, newest first: what peers need to hear this node.
func (id *Identity) PublicKeys() [][]byte {
	var out [][]byte
	for _, k := range *id.keys.Load() {
		out = append(out, slices.Clone(k.pub))
	}
	return out
}

func (id *Identity) current() []*ownKey { return *id.keys.Load() }

func (id *Identity) nextSeq() uint64 { return id.seq.Add(1) }

// RotationDue reports whether the newest key is older than lifetime and no rotation is under
// way.
func (id *Identity) RotationDue(now time.Time, lifetime time.Duration) bool {
	keys := id.current()
	return len(keys) == 1 && lifetime > 0 && now.Sub(keys[0].created) >= lifetime
}

// Rotate makes a new key, published at once (PublicKeys lists it first) while the old one
// keeps signing and verifying: a Monitor signs towards each peer with the newest key that peer
// has shown it knows, and retires the old key once every peer uses the new one. It returns
// false, changing nothing, while an earlier rotation is still under way.
func (id *Identity) Rotate(now time.Time) (bool, error) {
	id.mu.Lock()
	defer id.mu.Unlock()
	keys := id.current()
	if len(keys) > 1 {
		return false, nil
	}
	k, err := generateKey(now)
	if err != nil {
		return false, err
	}
	next := append([]*ownKey{k}, keys...)
	id.keys.Store(&next)
	return true, id.save()
}

// retire drops every key but the newest: the end of a rotation.
func (id *Identity) retire(newest keyID) error {
	id.mu.Lock()
	defer id.mu.Unlock()
	keys := id.current()
	if len(keys) < 2 || keys[0].id != newest {
		return nil
	}
	next := keys[:1]
	id.keys.Store(&next)
	return id.save()
}

// Settle ends a rotation at once; for an agent that has no peer to wait for.
func (id *Identity) Settle() error {
	return id.retire(id.current()[0].id)
}

// ValidPublicKey reports whether b can be a peer's heartbeat key: 32 bytes of X25519 that give
// a usable shared secret (not a low-order point).
// Keys found valid are remembered (validKeys): every state names the same peers' keys again,
// and the check is a scalar multiplication, ~45 us, which at 200 peers of two keys made each
// Apply spend 18 ms checking them and as much again in SetPeers.
func ValidPublicKey(b []byte) error {
	pub, err := ecdh.X25519().NewPublicKey(b)
	if err != nil {
		return fmt.Errorf("not an X25519 public key: %w", err)
	}
	k := [32]byte(b) // NewPublicKey took only 32 bytes
	if validKeys.has(k) {
		return nil
	}
	if _, err := probeKey.ECDH(pub); err != nil {
		// A low-order point gives the all-zero secret with every private key.
		return fmt.Errorf("unusable X25519 public key: %w", err)
	}
	validKeys.add(k)
	return nil
}

// maxValidKeys bounds the keys remembered: two per peer of a 4,000-node cluster. Past it the
// set starts again (a check costs 45 us, a forgotten key is checked once more).
const maxValidKeys = 8192

// validKeys is the set of public keys ValidPublicKey accepted. Only accepted keys are kept, so
// a refused key costs its check every time, and a key is never taken for valid unchecked.
var validKeys keySet

type keySet struct {
	mu sync.Mutex
	m  map[[32]byte]struct{}
}

func (s *keySet) has(k [32]byte) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	_, ok := s.m[k]
	return ok
}

func (s *keySet) add(k [32]byte) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.m == nil || len(s.m) >= maxValidKeys {
		s.m = make(map[[32]byte]struct{})
	}
	s.m[k] = struct{}{}
}

var probeKey = func() *ecdh.PrivateKey {
	k, err := ecdh.X25519().GenerateKey(rand.Reader)
	if err != nil {
		panic(err) // crypto/rand does not fail on Linux
	}
	return k
}()

func usableKey(b []byte) (*ecdh.PublicKey, bool) {
	if ValidPublicKey(b) != nil {
		return nil, false
	}
	pub, _ := ecdh.X25519().NewPublicKey(b)
	return pub, true
}
