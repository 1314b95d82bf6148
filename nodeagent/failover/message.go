package failover

import (
	"crypto/ecdh"
	"crypto/hkdf"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"hash"
)

// A heartbeat is one fixed-size datagram from one node to one peer:
//
//	version      1 byte, 2
//	from, to     4 bytes each: the sender's key and the receiver's key it is made with
//	boot, seq    8 bytes each: the sender's boot counter and its sequence in that boot, which
//	             only grow: the receiver takes each (boot, seq) once per key, in order. The
//	             sequence starts at the boot's wall-clock time in nanoseconds, so that a boot
//	             whose counter could not be saved still sends after the one before
//	nonce        8 bytes: random, new in every heartbeat
//	echo         8 bytes: the nonce of the latest heartbeat the sender verified from the
//	             receiver, zero when it has none recent; the receiver counts the sender alive
//	             only on an echo of a nonce it sent that very peer recently, which no capture
//	             can fake and no third node sees
//	flags        1 byte: bit 0, the sender counts the receiver alive; bits 1-7, how many
//	             times (modulo 128) the sender stopped counting the receiver alive: a lapse too
//	             short for any heartbeat to show it (the sender may have answered the
//	             receiver's VIPs meanwhile) still changes it. Older agents send 0 and read
//	             only bit 0
//	restart      2 bytes (version 3 on): 0, or the sender is about to restart (a planned
//	             exit: a rolling update) and will be back within this many milliseconds; the
//	             receiver keeps counting it alive that long (MaxRestartGrace at most) unless it
//	             comes back sooner: version 2 agents do not read it
//	mac          32 bytes: HMAC-SHA256 of the above with the key of the pair and direction
//
// The MAC key of a direction is HKDF-SHA256 of the X25519 shared secret of the two nodes'
// keys, bound to the two names in order: a node holding only its own key can make the keys
// of its own pairs, never those between two other nodes.
//
// Compatibility, so that agents of two versions side by side (a rolling update) never count
// each other dead: a later version keeps every field above at its place and meaning, puts new
// fields between flags and mac (the mac covers them), keeps the key derivation, and writes its
// number in version. A receiver takes a heartbeat of version 2 (the first that kept this
// contract), of its own version or of a later one, reads the fields it knows, and checks the mac
// over the whole body; a heartbeat of version 2 is exactly frameSizeV2 long, one of this version
// frameSize, a later one at most maxFrameSize.
const (
	version      = 3
	minVersion   = 2
	macSize      = sha256.Size
	bodySizeV2   = 1 + 4 + 4 + 8 + 8 + 8 + 8 + 1
	bodySize     = bodySizeV2 + 2
	frameSizeV2  = bodySizeV2 + macSize
	frameSize    = bodySize + macSize
	maxFrameSize = 512
)

const (
	flagAlive   = 1
	lapseShift  = 1    // the lapse count's place in flags
	lapseModulo = 0x80 // and its range
)

type seqKey struct{ boot, seq uint64 }

func (a seqKey) after(b seqKey) bool {
	return a.boot > b.boot || a.boot == b.boot && a.seq > b.seq
}

type frame struct {
	from, to keyID
	at       seqKey // the sender's boot and sequence
	nonce    uint64
	echo     uint64
	flags    byte
	restart  uint16 // milliseconds, version 3 on
}

type macKey [32]byte

// appendFrame appends the frame, signed with mac (an HMAC-SHA256 of the pair's key), to b.
func appendFrame(b []byte, f frame, mac hash.Hash) []byte {
	start := len(b)
	b = appendBody(b, version, f)
	mac.Reset()
	mac.Write(b[start:])
	return mac.Sum(b)
}

// appendBody appends the fields of heartbeat version v to b: those of version 2, and from
// version 3 on the restart field.
func appendBody(b []byte, v byte, f frame) []byte {
	b = append(b, v)
	b = append(b, f.from[:]...)
	b = append(b, f.to[:]...)
	b = binary.BigEndian.AppendUint64(b, f.at.boot)
	b = binary.BigEndian.AppendUint64(b, f.at.seq)
	b = binary.BigEndian.AppendUint64(b, f.nonce)
	b = binary.BigEndian.AppendUint64(b, f.echo)
	b = append(b, f.flags)
	if v >= 3 {
		b = binary.BigEndian.AppendUint16(b, f.restart)
	}
	return b
}

var errFormat = errors.New("malformed heartbeat")

// sizeOK reports whether b is as long as a heartbeat of its version may be.
func sizeOK(b []byte) bool {
	switch {
	case len(b) == 0:
		return false
	case b[0] == minVersion:
		return len(b) == frameSizeV2
	case b[0] > version:
		return len(b) >= frameSize && len(b) <= maxFrameSize
	default: // this version, or an earlier one than parseFrame takes
		return len(b) == frameSize
	}
}

// parseFrame reads the fields this version knows of a frame of version 2 or later, without
// checking its MAC; sizeOK(b) holds.
func parseFrame(b []byte) (frame, error) {
	if !sizeOK(b) || b[0] < minVersion {
		return frame{}, errFormat
	}
	var f frame
	copy(f.from[:], b[1:5])
	copy(f.to[:], b[5:9])
	f.at = seqKey{binary.BigEndian.Uint64(b[9:17]), binary.BigEndian.Uint64(b[17:25])}
	f.nonce = binary.BigEndian.Uint64(b[25:33])
	f.echo = binary.BigEndian.Uint64(b[33:41])
	f.flags = b[41]
	if b[0] >= 3 {
		f.restart = binary.BigEndian.Uint16(b[42:44])
	}
	return f, nil
}

// macOK checks a frame's MAC, over its whole body, in constant time; mac is an HMAC-SHA256 of
// the pair's key, scratch room for the sum (so that a flood allocates nothing).
func macOK(b []byte, mac hash.Hash, scratch []byte) bool {
	body := len(b) - macSize
	mac.Reset()
	mac.Write(b[:body])
	return hmac.Equal(mac.Sum(scratch[:0]), b[body:])
}

func newMAC(k macKey) hash.Hash { return hmac.New(sha256.New, k[:]) }

// pairKeys derives the MAC keys of the pair (me, them) made with these keys: send signs what
// me sends to them, recv what them sends to me.
func pairKeys(mine *ecdh.PrivateKey, theirs *ecdh.PublicKey, me, them string) (send, recv macKey, err error) {
	secret, err := mine.ECDH(theirs)
	if err != nil {
		return send, recv, err
	}
	derive := func(from, to string) (macKey, error) {
		var k macKey
		out, err := hkdf.Key(sha256.New, secret, nil, directionInfo(from, to), len(k))
		copy(k[:], out)
		return k, err
	}
	if send, err = derive(me, them); err != nil {
		return send, recv, err
	}
	recv, err = derive(them, me)
	return send, recv, err
}

func directionInfo(from, to string) string {
	b := []byte("metalvip heartbeat v2")
	for _, s := range []string{from, to} {
		b = binary.BigEndian.AppendUint16(b, uint16(len(s)))
		b = append(b, s...)
	}
	return string(b)
}
