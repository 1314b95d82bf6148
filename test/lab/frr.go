package lab

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/metalvip/metalvip/test/testenv"
)

func (l *Lab) frrName() string { return "mvlab-" + l.ID }

// FRRConfig returns the router's FRR configuration, one file per daemon (FRR daemons refuse
// each other's commands). The router does weighted ECMP from the link-bandwidth extended
// community (bgp bestpath bandwidth: paths without one are left out when others have one),
// and honours GRACEFUL_SHUTDOWN (65535:0) from the nodes as RFC 8326 asks: LOCAL_PREF 0, so
// such a path is used only when no other is left.
func (l *Lab) FRRConfig() map[string]string {
	o := l.opts
	// Unnumbered peers (Options.Unnumbered): one per node link, in both families.
	var unnumbered, unnumbered4, unnumbered6 string
	if o.Unnumbered {
		unnumbered = " neighbor UNNUMBERED peer-group\n neighbor UNNUMBERED remote-as external\n neighbor UNNUMBERED bfd profile lab\n neighbor UNNUMBERED timers 3 9\n neighbor UNNUMBERED timers connect 1\n"
		for _, h := range l.Nodes {
			unnumbered += fmt.Sprintf(" neighbor %s interface peer-group UNNUMBERED\n", UnnumberedRouterLink(h))
		}
		unnumbered4 = "  neighbor UNNUMBERED activate\n"
		unnumbered6 = "  neighbor UNNUMBERED activate\n"
	}
	// Millisecond timestamps and the session and BFD events at debug level: a test that fails
	// shows the router's side of it (RouterLog).
	header := fmt.Sprintf("frr defaults traditional\nhostname router\nlog file %s/frr.log debugging\nlog timestamp precision 3\n!\n", l.Dir)
	return map[string]string{
		"zebra": header + "ip forwarding\nipv6 forwarding\n!\n",
		"bfdd": header + fmt.Sprintf(`debug bfd peer
!
bfd
 profile lab
  transmit-interval %d
  receive-interval %d
  detect-multiplier 3
!
`, o.BFDIntervalMS, o.BFDIntervalMS),
		"bgpd": header + fmt.Sprintf(`debug bgp neighbor-events
debug bgp bfd
debug bgp graceful-restart
!
router bgp %d
 bgp router-id 198.51.100.1
 no bgp ebgp-requires-policy
 no bgp default ipv4-unicast
 bgp bestpath as-path multipath-relax
 bgp bestpath bandwidth skip-missing
 neighbor NODES peer-group
 neighbor NODES remote-as %d
 neighbor NODES bfd profile lab
 neighbor NODES timers 3 9
 neighbor NODES timers connect 1
 neighbor NODES6 peer-group
 neighbor NODES6 remote-as %d
 neighbor NODES6 bfd profile lab
 neighbor NODES6 timers 3 9
 neighbor NODES6 timers connect 1
 bgp listen range %s peer-group NODES
 bgp listen range %s peer-group NODES6
%s !
 address-family ipv4 unicast
  neighbor NODES activate
  neighbor NODES route-map NODES-IN in
%s  maximum-paths 8
  maximum-paths ibgp 8
 exit-address-family
 !
 address-family ipv6 unicast
  neighbor NODES6 activate
  neighbor NODES6 route-map NODES-IN in
%s  maximum-paths 8
  maximum-paths ibgp 8
 exit-address-family
!
bgp community-list standard GSHUT seq 5 permit graceful-shutdown
!
route-map NODES-IN permit 10
 match community GSHUT
 set local-preference 0
!
route-map NODES-IN permit 20
!
`, o.RouterASN, o.NodeASN, o.NodeASN, SegmentV4, SegmentV6, unnumbered, unnumbered4, unnumbered6),
	}
}

func (l *Lab) startFRR() error {
	if err := chownFRR(l.Dir); err != nil {
		return err
	}
	confs := l.FRRConfig()
	for _, d := range []string{"zebra", "bfdd", "bgpd"} {
		conf := filepath.Join(l.Dir, d+".conf")
		if err := os.WriteFile(conf, []byte(confs[d]), 0o640); err != nil {
			return err
		}
		if err := chownFRR(conf); err != nil {
			return err
		}
		args := []string{"-N", l.frrName(), "-f", conf, "-i", filepath.Join(l.Dir, d+".pid"), "--vty_socket", l.Dir}
		p := l.Router.Start(l.t, d, "/usr/lib/frr/"+d, args...)
		// Each daemon opens its vty socket once it has read its configuration.
		if err := waitFor(15*time.Second, func() bool {
			_, err := os.Stat(filepath.Join(l.Dir, d+".vty"))
			return err == nil
		}, p); err != nil {
			return fmt.Errorf("FRR %s did not start: %v\n%s", d, err, p.Tail(20))
		}
	}
	// The daemons read their configuration just after they open their sockets.
	want := fmt.Sprintf("router bgp %d", l.opts.RouterASN)
	var last string
	deadline := time.Now().Add(15 * time.Second)
	for {
		out, err := l.Vtysh("show running-config")
		if err == nil && strings.Contains(out, want) && strings.Contains(out, "profile lab") {
			// A line FRR did not understand is a bug in FRRConfig, not something to run with.
			log, _ := os.ReadFile(filepath.Join(l.Dir, "frr.log"))
			if bytes.Contains(log, []byte("No such command")) || bytes.Contains(log, []byte("Unknown command")) {
				return fmt.Errorf("FRR refused part of its configuration:\n%s", log)
			}
			return nil
		}
		last = out
		if time.Now().After(deadline) {
			log, _ := os.ReadFile(filepath.Join(l.Dir, "frr.log"))
			return fmt.Errorf("FRR did not load its configuration within 15s; running config:\n%s\nfrr.log:\n%s", last, log)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// RestartRouter kills the router's FRR daemons (no goodbye to its peers) and starts them again
// with the same configuration, as a router reboot would.
func (l *Lab) RestartRouter() error {
	if l.opts.Router != RouterFRR {
		return fmt.Errorf("restart the router: only FRR's (the router is %s)", l.opts.Router)
	}
	var keep []*testenv.Proc
	for _, p := range l.procs {
		if strings.HasPrefix(p.Name, "router-") {
			p.Kill()
			continue
		}
		keep = append(keep, p)
	}
	l.procs = keep
	for _, d := range []string{"zebra", "bfdd", "bgpd"} {
		_ = os.Remove(filepath.Join(l.Dir, d+".vty"))
		_ = os.Remove(filepath.Join(l.Dir, d+".pid"))
	}
	// A reboot empties the kernel's table; killed FRR leaves its routes there, and the next
	// zebra cannot adopt those whose nexthop groups it does not know ("failed to find the
	// nexthop hash entry"), so it never sweeps them: a route withdrawn meanwhile stayed in the
	// kernel (the soak's seed 8: a tenant's old BGP address routed 15 s after it moved).
	// Deleting zebra's nexthop objects deletes the routes that use them (a route flush fails
	// on those); then the routes without one.
	for _, args := range [][]string{
		{"nexthop", "flush", "proto", "11"}, // zebra's (iproute2 names it only for routes)
		{"route", "flush", "proto", "bgp"},
		{"-6", "route", "flush", "proto", "bgp"},
	} {
		if out, err := l.Router.Run(context.Background(), "ip", args...); err != nil {
			return fmt.Errorf("ip %s on the router: %v: %s", strings.Join(args, " "), err, out)
		}
	}
	return l.startFRR()
}

// startGoBGP starts test/lab/gobgprouter on the router.
func (l *Lab) startGoBGP() error {
	p, err := l.startGoBGPOn(l.Router, l.opts.RouterASN, "-bfd-interval-ms", strconv.Itoa(l.opts.BFDIntervalMS))
	l.gobgp = p
	return err
}

// StartRemoteRouter starts a second router, GoBGP of AS asn, on the remote host behind the
// router: the nodes' sessions with it are multi-hop eBGP (two hops: it accepts TTL 2), without
// BFD (gobgp's is single-hop) and off the data path (it prints the routes it would install:
// "ROUTE 203.0.113.1/32 [198.51.100.11 ...]").
func (l *Lab) StartRemoteRouter(asn uint32) (*testenv.Proc, error) {
	return l.startGoBGPOn(l.Remote, asn, "-bfd-interval-ms", "0", "-multihop-ttl", "2", "-no-fib")
}

// startGoBGPOn builds test/lab/gobgprouter into the lab's folder (once) and starts it on h,
// accepting the nodes' sessions from the segment.
func (l *Lab) startGoBGPOn(h *Host, asn uint32, args ...string) (*testenv.Proc, error) {
	bin := filepath.Join(l.Dir, "gobgprouter")
	if _, err := os.Stat(bin); err != nil {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
		defer cancel()
		if out, err := exec.CommandContext(ctx, "go", "build", "-o", bin, "github.com/metalvip/metalvip/test/lab/gobgprouter").CombinedOutput(); err != nil {
			return nil, fmt.Errorf("build the GoBGP router: %v: %s", err, out)
		}
	}
	p := h.Start(l.t, "gobgp", bin, append([]string{
		"-asn", strconv.FormatUint(uint64(asn), 10),
		"-peer-asn", strconv.FormatUint(uint64(l.opts.NodeASN), 10),
		"-router-id", h.IPv4.String(),
		"-ranges", SegmentV4.String() + "," + SegmentV6.String()}, args...)...)
	if err := waitFor(15*time.Second, func() bool { return strings.Contains(p.Output(), "READY") }, p); err != nil {
		return p, fmt.Errorf("the GoBGP router on %s did not start: %v\n%s", h.Name, err, p.Tail(20))
	}
	return p, nil
}

// StartRemoteFRR starts a second FRR (zebra and bgpd) of AS asn on the remote host behind the
// router: it accepts the nodes' sessions from the segment as multi-hop eBGP (ebgp-multihop 2),
// without BFD. RemoteVtysh asks it.
func (l *Lab) StartRemoteFRR(asn uint32) error {
	dir := filepath.Join(l.Dir, "remote")
	if err := os.MkdirAll(dir, 0o750); err != nil {
		return err
	}
	if err := chownFRR(dir); err != nil {
		return err
	}
	header := fmt.Sprintf("frr defaults traditional\nhostname remote\nlog file %s/frr.log informational\n!\n", dir)
	confs := map[string]string{
		"zebra": header,
		"bgpd": header + fmt.Sprintf(`router bgp %d
 bgp router-id %s
 no bgp ebgp-requires-policy
 no bgp default ipv4-unicast
 bgp bestpath as-path multipath-relax
 neighbor NODES peer-group
 neighbor NODES remote-as %d
 neighbor NODES ebgp-multihop 2
 neighbor NODES timers 3 9
 bgp listen range %s peer-group NODES
 !
 address-family ipv4 unicast
  neighbor NODES activate
  maximum-paths 8
 exit-address-family
!
`, asn, l.Remote.IPv4, l.opts.NodeASN, SegmentV4),
	}
	var bgpd *testenv.Proc
	for _, d := range []string{"zebra", "bgpd"} {
		conf := filepath.Join(dir, d+".conf")
		if err := os.WriteFile(conf, []byte(confs[d]), 0o640); err != nil {
			return err
		}
		if err := chownFRR(conf); err != nil {
			return err
		}
		p := l.Remote.Start(l.t, d, "/usr/lib/frr/"+d, "-N", l.frrName()+"-remote", "-f", conf, "-i", filepath.Join(dir, d+".pid"), "--vty_socket", dir)
		if err := waitFor(15*time.Second, func() bool {
			_, err := os.Stat(filepath.Join(dir, d+".vty"))
			return err == nil
		}, p); err != nil {
			return fmt.Errorf("the remote FRR's %s did not start: %v\n%s", d, err, p.Tail(20))
		}
		bgpd = p
	}
	want := fmt.Sprintf("router bgp %d", asn)
	return waitFor(15*time.Second, func() bool {
		out, err := l.RemoteVtysh("show running-config")
		return err == nil && strings.Contains(out, want)
	}, bgpd)
}

// RemoteVtysh runs one vtysh command against the remote FRR (StartRemoteFRR).
func (l *Lab) RemoteVtysh(command string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, "vtysh", "--vty_socket", filepath.Join(l.Dir, "remote"), "-c", command).CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("vtysh -c %q (remote): %v: %s", command, err, out)
	}
	return string(out), nil
}

// RouterBFDUp returns the peers whose BFD session with the router is up, as the router sees
// them.
func (l *Lab) RouterBFDUp() (map[netip.Addr]bool, error) {
	up := map[netip.Addr]bool{}
	if l.gobgp != nil {
		for _, line := range strings.Split(l.gobgp.Output(), "\n") {
			var addr, state string
			if n, _ := fmt.Sscanf(line, "BFD %s %s", &addr, &state); n != 2 {
				continue
			}
			if a, err := netip.ParseAddr(addr); err == nil {
				up[a] = state == "up" // the last line of each peer counts
			}
		}
		return up, nil
	}
	out, err := l.Vtysh("show bfd peers json")
	if err != nil {
		return nil, err
	}
	var sessions []struct {
		Peer   string `json:"peer"`
		Status string `json:"status"`
	}
	if err := json.Unmarshal([]byte(out), &sessions); err != nil {
		return nil, fmt.Errorf("show bfd peers json: %w: %s", err, out)
	}
	for _, s := range sessions {
		if a, err := netip.ParseAddr(s.Peer); err == nil && s.Status == "up" {
			up[a] = true
		}
	}
	return up, nil
}

// RouterLog returns the lines of the router's FRR log stamped at since or later (FRR's local
// time, to the millisecond), at most max of them (the last ones); with RouterGoBGP, the last
// max lines of its output.
func (l *Lab) RouterLog(since time.Time, max int) string {
	if l.gobgp != nil {
		return l.gobgp.Tail(max)
	}
	b, err := os.ReadFile(filepath.Join(l.Dir, "frr.log"))
	if err != nil {
		return err.Error()
	}
	const stamp = "2006/01/02 15:04:05.000"
	var out []string
	for _, line := range strings.Split(string(b), "\n") {
		if len(line) < len(stamp) {
			continue
		}
		at, err := time.ParseInLocation(stamp, line[:len(stamp)], time.Local)
		if err != nil || at.Before(since.Truncate(time.Millisecond)) {
			continue
		}
		out = append(out, line)
	}
	if len(out) > max {
		out = out[len(out)-max:]
	}
	return strings.Join(out, "\n")
}

// Vtysh runs one vtysh command against the router's FRR.
func (l *Lab) Vtysh(command string) (string, error) {
	if l.opts.Router != RouterFRR {
		return "", fmt.Errorf("vtysh -c %q: the router is %s, not FRR", command, l.opts.Router)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, "vtysh", "--vty_socket", l.Dir, "-c", command).CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("vtysh -c %q: %v: %s", command, err, out)
	}
	return string(out), nil
}

func chownFRR(paths ...string) error {
	u, err := user.Lookup("frr")
	if err != nil {
		return fmt.Errorf("user frr: %w (is the frr package installed?)", err)
	}
	uid, _ := strconv.Atoi(u.Uid)
	gid, _ := strconv.Atoi(u.Gid)
	for _, p := range paths {
		if err := os.Chown(p, uid, gid); err != nil {
			return err
		}
	}
	return nil
}
