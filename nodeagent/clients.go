package nodeagent

import (
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"time"

	"k8s.io/klog/v2"

	"github.com/metalvip/metalvip/nodeagent/l2"
)

// clientsFile keeps the clients of per-client VIPs across restarts: clients refresh their
// cache entry by unicast to the node they use, so a restarted node would otherwise not know
// them, and could not tell them when it takes them over.
const clientsFile = "clients.json"

// clientsSaveInterval is how often changed clients are written.
const clientsSaveInterval = 2 * time.Second

// ClientMemory is what an L2 speaker that spreads VIPs per client offers to keep its clients
// across restarts.
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

func saveClients(dir string, cs []l2.Client) error {
	out := make([]savedClient, 0, len(cs))
	for _, c := range cs {
		out = append(out, savedClient{VIP: c.VIP, IP: c.IP, MAC: c.MAC.String(), Interface: c.Interface})
	}
	data, err := json.Marshal(out)
	if err != nil {
		return err
	}
	return writeAtomic(dir, clientsFile, data)
}

// loadClients reads the saved clients; none when there is no file.
func loadClients(dir string) ([]l2.Client, error) {
	data, err := os.ReadFile(filepath.Join(dir, clientsFile))
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var saved []savedClient
	if err := json.Unmarshal(data, &saved); err != nil {
		return nil, fmt.Errorf("%s: %w", filepath.Join(dir, clientsFile), err)
	}
	out := make([]l2.Client, 0, len(saved))
	for _, c := range saved {
		mac, err := net.ParseMAC(c.MAC)
		if err != nil {
			continue
		}
		out = append(out, l2.Client{VIP: c.VIP, IP: c.IP, MAC: mac, Interface: c.Interface})
	}
	return out, nil
}

// rememberClients gives the speaker the clients saved before a restart.
func (a *Agent) rememberClients() {
	mem, ok := a.opts.L2.(ClientMemory)
	if !ok || a.opts.StateDir == "" {
		return
	}
	cs, err := loadClients(a.opts.StateDir)
	if err != nil {
		klog.ErrorS(err, "Ignoring the saved clients of per-client VIPs")
		return
	}
	if len(cs) > 0 {
		mem.Remember(cs)
		klog.InfoS("Remembered the clients of per-client VIPs", "clients", len(cs))
	}
}

// saveClientsIfChanged writes the speaker's clients if their version is not saved, and
// returns the version saved now.
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
