package nodeagent

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"time"

	"k8s.io/klog/v2"

	"github.com/metalvip/metalvip/internal/atomicfile"
	"github.com/metalvip/metalvip/nodeagent/l2"
)

// clientsFile keeps the clients of per-client VIPs across restarts: clients refresh their
// cache entry by unicast to the node they use, so a restarted node would otherwise not know
// them, and could not tell them when it takes them over.
const clientsFile = "clients.json"

// clientsSaveInterval is how often changed clients are written.
const clientsSaveInterval = 2 * time.Second

// Bounds of the clients file. The speaker keeps at most its protected segment (16,384 by
// default, about 100 bytes each here); a file past these was not written by this agent and is
// refused whole rather than read into memory.
const (
	maxSavedClients     = 16384
	maxClientsFileBytes = 4 << 20
)

// ClientMemory is what an L2 speaker that spreads VIPs per client offers to keep its clients
// across restarts: the clients worth keeping with a version that changes whenever they do,
// and a way to give them back.
type ClientMemory interface {
	KnownClients() ([]l2.Client, uint64)
	Remember([]l2.Client)
}

type savedClient struct {
	VIP       netip.Addr `json:"vip"`
	IP        netip.Addr `json:"ip"`
	MAC       string     `json:"mac"`
	Interface string     `json:"interface"`
}

// encodeClients returns the file for cs, a JSON array in their order (most recently seen
// first), cut where it would pass maxSavedClients or maxClientsFileBytes; and how many it
// holds.
func encodeClients(cs []l2.Client) ([]byte, int, error) {
	var buf bytes.Buffer
	buf.WriteByte('[')
	n := 0
	for _, c := range cs {
		if n == maxSavedClients {
			break
		}
		b, err := json.Marshal(savedClient{VIP: c.VIP, IP: c.IP, MAC: c.MAC.String(), Interface: c.Interface})
		if err != nil {
			return nil, 0, err
		}
		if buf.Len()+len(b)+2 > maxClientsFileBytes {
			break
		}
		if n > 0 {
			buf.WriteByte(',')
		}
		buf.Write(b)
		n++
	}
	buf.WriteByte(']')
	return buf.Bytes(), n, nil
}

func saveClients(dir string, cs []l2.Client) error {
	data, n, err := encodeClients(cs)
	if err != nil {
		return err
	}
	if n < len(cs) {
		klog.InfoS("Saving only the most recently seen clients of per-client VIPs", "saved", n, "clients", len(cs))
	}
	return atomicfile.Write(dir, clientsFile, data)
}

// loadClients reads the saved clients; none when there is no file. A file too large or that
// does not parse is refused whole; an entry that does not validate is skipped, and counted in
// skipped.
func loadClients(dir string) (cs []l2.Client, skipped int, err error) {
	path := filepath.Join(dir, clientsFile)
	f, err := os.Open(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil, 0, nil
	}
	if err != nil {
		return nil, 0, err
	}
	defer f.Close()
	if fi, err := f.Stat(); err != nil {
		return nil, 0, err
	} else if fi.Size() > maxClientsFileBytes {
		return nil, 0, fmt.Errorf("%s: %d bytes, more than the %d a client table takes", path, fi.Size(), maxClientsFileBytes)
	}
	data, err := io.ReadAll(io.LimitReader(f, maxClientsFileBytes+1))
	if err != nil {
		return nil, 0, err
	}
	if len(data) > maxClientsFileBytes {
		return nil, 0, fmt.Errorf("%s: more than the %d bytes a client table takes", path, maxClientsFileBytes)
	}
	var saved []savedClient
	if err := json.Unmarshal(data, &saved); err != nil {
		return nil, 0, fmt.Errorf("%s: %w", path, err)
	}
	if len(saved) > maxSavedClients {
		return nil, 0, fmt.Errorf("%s: %d clients, more than the %d a client table keeps", path, len(saved), maxSavedClients)
	}
	out := make([]l2.Client, 0, len(saved))
	for _, c := range saved {
		mac, err := net.ParseMAC(c.MAC)
		if err != nil || len(mac) != 6 || !c.VIP.IsValid() || !c.IP.IsValid() || c.IP.Is4() != c.VIP.Is4() ||
			c.Interface == "" || len(c.Interface) > 15 {
			skipped++
			continue
		}
		out = append(out, l2.Client{VIP: c.VIP, IP: c.IP, MAC: mac, Interface: c.Interface})
	}
	return out, skipped, nil
}

// rememberClients gives the speaker the clients saved before a restart. A file it cannot use
// is logged and ignored: the agent runs on, and learns its clients anew.
func (a *Agent) rememberClients() {
	mem, ok := a.opts.L2.(ClientMemory)
	if !ok || a.opts.StateDir == "" {
		return
	}
	cs, skipped, err := loadClients(a.opts.StateDir)
	if err != nil {
		klog.ErrorS(err, "Ignoring the saved clients of per-client VIPs")
		return
	}
	if skipped > 0 {
		klog.InfoS("Skipped saved clients of per-client VIPs that do not validate", "skipped", skipped)
	}
	if len(cs) > 0 {
		mem.Remember(cs)
		klog.InfoS("Remembered the clients of per-client VIPs", "clients", len(cs))
	}
}

// saveClientsIfChanged writes the speaker's clients if their version is not saved, and
// returns the version saved now. The speaker's version moves only when the clients worth
// keeping change, so a flood of one-shot senders writes nothing.
func (a *Agent) saveClientsIfChanged(saved uint64) uint64 {
	mem, ok := a.opts.L2.(ClientMemory)
	if !ok || a.opts.StateDir == "" {
		return saved
	}
	cs, ver := mem.KnownClients()
	if ver == saved {
		return saved
	}
	if err := saveClients(a.opts.StateDir, cs); err != nil {
		klog.ErrorS(err, "Cannot save the clients of per-client VIPs")
		return saved
	}
	return ver
}
