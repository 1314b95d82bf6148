package nodeagent

import (
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strings"

	"google.golang.org/protobuf/encoding/protojson"

	"github.com/metalvip/metalvip/nodeagent/bgp"
	agentv1 "github.com/metalvip/metalvip/proto/metalvip/agent/v1"
)

const stateFile = "state.json"

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
func writeAtomic(dir, name string, data []byte) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	tmp, err := os.CreateTemp(dir, name+".*")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	if _, err := tmp.Write(data); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Sync(); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	if err := os.Rename(tmp.Name(), filepath.Join(dir, name)); err != nil {
		return err
	}
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
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
	st := &agentv1.DesiredState{}
	if err := protojson.Unmarshal(data, st); err != nil {
		return nil, fmt.Errorf("saved state %s: %w", filepath.Join(dir, stateFile), err)
	}
	return st, nil
}

// validate checks a state before anything of it is applied, and says what is wrong.
func validate(st *agentv1.DesiredState, node string) error {
	var errs []error
	add := func(format string, args ...any) { errs = append(errs, fmt.Errorf(format, args...)) }
	if st.GetNode() != node {
		add("node: the state is for %q; this agent is %q", st.GetNode(), node)
	}
	seen := map[netip.Addr]int{}
	for i, an := range st.GetAnnouncements() {
		at := fmt.Sprintf("announcements[%d]", i)
		vip, err := netip.ParseAddr(an.GetVip())
		if err != nil || vip.Zone() != "" || vip.Is4In6() {
			add("%s.vip: %q is not an IP address", at, an.GetVip())
			continue
		}
		if j, dup := seen[vip]; dup {
			add("%s.vip: %s is also announcements[%d]", at, vip, j)
		}
		seen[vip] = i
		switch an.GetMode() {
		case agentv1.Mode_MODE_L2:
			if len(an.GetL2().GetCandidates()) == 0 {
				add("%s.l2.candidates: an L2 VIP needs at least one candidate", at)
			}
			for k, c := range an.GetL2().GetCandidates() {
				if c.GetNode() == "" {
					add("%s.l2.candidates[%d].node: empty", at, k)
				}
				if c.GetAddress() != "" {
					if _, err := netip.ParseAddr(c.GetAddress()); err != nil {
						add("%s.l2.candidates[%d].address: %q is not an IP address", at, k, c.GetAddress())
					}
				}
			}
		case agentv1.Mode_MODE_BGP:
			for _, c := range an.GetBgp().GetCommunities() {
				if _, err := bgp.ParseCommunity(c); err != nil {
					add("%s.bgp.communities: %v", at, err)
				}
			}
		default:
			add("%s.mode: %v; give MODE_L2 or MODE_BGP", at, an.GetMode())
		}
	}
	for i, p := range st.GetBgpPeers() {
		at := fmt.Sprintf("bgp_peers[%d]", i)
		if _, err := netip.ParseAddr(p.GetAddress()); err != nil {
			add("%s.address: %q is not an IP address", at, p.GetAddress())
		}
		if p.GetPeerAsn() == 0 {
			add("%s.peer_asn: missing", at)
		}
		if p.GetLocalAsn() == 0 && st.GetBgp().GetAsn() == 0 {
			add("%s.local_asn: missing, and bgp.asn gives no default", at)
		}
		if p.GetPort() > 65535 || p.GetEbgpMultihopTtl() > 255 {
			add("%s: port or ebgp_multihop_ttl out of range", at)
		}
	}
	if id := st.GetBgp().GetRouterId(); id != "" {
		if a, err := netip.ParseAddr(id); err != nil || !a.Is4() {
			add("bgp.router_id: %q is not an IPv4 address", id)
		}
	}
	if len(errs) == 0 {
		return nil
	}
	msgs := make([]string, len(errs))
	for i, e := range errs {
		msgs[i] = e.Error()
	}
	return errors.New(strings.Join(msgs, "; "))
}
