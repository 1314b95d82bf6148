package nodeagent

import (
	"bytes"
	"flag"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"k8s.io/klog/v2"

	"github.com/metalvip/metalvip/nodeagent/l2"
)

func someClients(n int) []l2.Client {
	out := make([]l2.Client, n)
	for i := range out {
		out[i] = l2.Client{
			VIP:       netip.MustParseAddr("203.0.113.10"),
			IP:        netip.AddrFrom4([4]byte{198, 18 + byte(i>>16&1), byte(i >> 8), byte(i)}),
			MAC:       net.HardwareAddr{0x02, 0, 0, byte(i >> 16), byte(i >> 8), byte(i)},
			Interface: "eth0",
		}
	}
	return out
}

func sameClients(a, b []l2.Client) bool {
	return slices.EqualFunc(a, b, func(x, y l2.Client) bool {
		return x.VIP == y.VIP && x.IP == y.IP && x.MAC.String() == y.MAC.String() && x.Interface == y.Interface
	})
}

func TestSavedClientsAreCappedKeepTheirOrderAndLoadBack(t *testing.T) {
	for _, n := range []int{0, 3, maxSavedClients + 500} {
		t.Run(fmt.Sprintf("%d clients", n), func(t *testing.T) {
			dir := t.TempDir()
			cs := someClients(n)
			if err := saveClients(dir, cs); err != nil {
				t.Fatal(err)
			}
			fi, err := os.Stat(filepath.Join(dir, clientsFile))
			if err != nil {
				t.Fatal(err)
			}
			if fi.Size() > maxClientsFileBytes {
				t.Errorf("file of %d bytes; the cap is %d", fi.Size(), maxClientsFileBytes)
			}
			got, skipped, err := loadClients(dir)
			if err != nil || skipped != 0 {
				t.Fatalf("load: %v, %d skipped", err, skipped)
			}
			want := cs[:min(n, maxSavedClients)]
			if !sameClients(got, want) {
				t.Errorf("loaded %d clients; want the first %d saved, in order", len(got), len(want))
			}
			t.Logf("%d clients: %d saved in %d bytes", n, len(got), fi.Size())
			entries, _ := os.ReadDir(dir)
			if len(entries) != 1 {
				t.Errorf("the state directory holds %d files after a save; want only %s (no temporary left)", len(entries), clientsFile)
			}
		})
	}
}

func TestUnusableClientFilesAreRefusedWhole(t *testing.T) {
	big := bytes.Repeat([]byte(" "), maxClientsFileBytes+1)
	big[0], big[len(big)-1] = '[', ']'
	var many bytes.Buffer
	many.WriteByte('[')
	for i := range maxSavedClients + 1 {
		if i > 0 {
			many.WriteByte(',')
		}
		fmt.Fprintf(&many, `{"vip":"203.0.113.10","ip":"198.18.%d.%d","mac":"02:00:00:00:00:01","interface":"eth0"}`, i>>8&255, i&255)
	}
	many.WriteByte(']')
	for _, tc := range []struct {
		name, want string
		data       []byte
	}{
		{"a file larger than the cap", "more than the 4194304 a client table takes", big},
		{"more clients than the table keeps", "16385 clients, more than the 16384", many.Bytes()},
		{"a truncated file", "unexpected end of JSON input", []byte("[{\"vip\": \"203.0.113.10\",")},
		{"a file that is not JSON", "invalid character", []byte("\x00garbage")},
		{"a file of another shape", "cannot unmarshal object", []byte(`{"clients": []}`)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			if err := os.WriteFile(filepath.Join(dir, clientsFile), tc.data, 0o600); err != nil {
				t.Fatal(err)
			}
			cs, _, err := loadClients(dir)
			if err == nil || !strings.Contains(err.Error(), tc.want) || len(cs) != 0 {
				t.Errorf("load = %d clients, %v; want it refused: %q", len(cs), err, tc.want)
			}
		})
	}
}

func TestSavedClientsThatDoNotValidateAreSkippedAlone(t *testing.T) {
	dir := t.TempDir()
	data := `[
	 {"vip":"203.0.113.10","ip":"198.51.100.51","mac":"02:00:00:00:00:51","interface":"eth0"},
	 {"vip":"203.0.113.10","ip":"198.51.100.52","mac":"not a mac","interface":"eth0"},
	 {"vip":"203.0.113.10","ip":"2001:db8::1","mac":"02:00:00:00:00:53","interface":"eth0"},
	 {"vip":"203.0.113.10","ip":"198.51.100.54","mac":"02:00:00:00:00:54","interface":""},
	 {"vip":"203.0.113.10","ip":"198.51.100.55","mac":"02:00:00:00:00:00:00:55","interface":"eth0"},
	 {"vip":"203.0.113.10","ip":"198.51.100.56","mac":"02:00:00:00:00:56","interface":"a-name-too-long-for-linux"},
	 {"vip":"203.0.113.10","ip":"198.51.100.57","mac":"02:00:00:00:00:57","interface":"eth1"}
	]`
	if err := os.WriteFile(filepath.Join(dir, clientsFile), []byte(data), 0o600); err != nil {
		t.Fatal(err)
	}
	cs, skipped, err := loadClients(dir)
	if err != nil {
		t.Fatal(err)
	}
	var ips []string
	for _, c := range cs {
		ips = append(ips, c.IP.String())
	}
	if !slices.Equal(ips, []string{"198.51.100.51", "198.51.100.57"}) || skipped != 5 {
		t.Errorf("loaded %v, %d skipped; want the two sane ones and 5 skipped", ips, skipped)
	}
}

// A corrupt file is logged and ignored: the speaker learns its clients anew, nothing fails.
func TestAgentIgnoresACorruptClientFileWithALogLine(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, clientsFile), []byte("\x00garbage"), 0o600); err != nil {
		t.Fatal(err)
	}
	var logs bytes.Buffer
	fs := flag.NewFlagSet("klog", flag.ContinueOnError)
	klog.InitFlags(fs)
	_ = fs.Set("logtostderr", "false")
	klog.SetOutput(&logs)
	t.Cleanup(func() { _ = fs.Set("logtostderr", "true"); klog.SetOutput(os.Stderr) })

	speaker := l2.New(l2.Options{})
	defer speaker.Close()
	a := &Agent{opts: Options{StateDir: dir, L2: speaker}}
	a.rememberClients()
	klog.Flush()
	if !strings.Contains(logs.String(), "Ignoring the saved clients of per-client VIPs") {
		t.Errorf("no log line for the corrupt file; logs:\n%s", logs.String())
	}
	if cs, _ := speaker.KnownClients(); len(cs) != 0 {
		t.Errorf("the speaker remembered %d clients from a corrupt file", len(cs))
	}

	// The next save replaces the corrupt file with a good one.
	good := someClients(2)
	speaker.Remember(good)
	if ver := a.saveClientsIfChanged(0); ver == 0 {
		t.Fatal("nothing saved though the speaker's clients changed")
	}
	if got, _, err := loadClients(dir); err != nil || !sameClients(got, good) {
		t.Errorf("after the save: %d clients, %v; want the 2 remembered", len(got), err)
	}
}

func TestClientsAreSavedOnlyWhenTheirVersionMoves(t *testing.T) {
	dir := t.TempDir()
	speaker := l2.New(l2.Options{})
	defer speaker.Close()
	a := &Agent{opts: Options{StateDir: dir, L2: speaker}}
	_, ver := speaker.KnownClients()
	if got := a.saveClientsIfChanged(ver); got != ver {
		t.Errorf("saved version %d; want %d", got, ver)
	}
	if _, err := os.Stat(filepath.Join(dir, clientsFile)); !os.IsNotExist(err) {
		t.Errorf("a file was written though nothing changed: %v", err)
	}
}
