package certs

import (
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

// writeSource writes p and the CA to files and reads them back as a Source.
func writeSource(t *testing.T, ca, p Pair) Source {
	t.Helper()
	dir := t.TempDir()
	f := Files{CA: filepath.Join(dir, "ca.crt"), Cert: filepath.Join(dir, "tls.crt"), Key: filepath.Join(dir, "tls.key")}
	for path, data := range map[string][]byte{f.CA: ca.Cert, f.Cert: p.Cert, f.Key: p.Key} {
		if err := os.WriteFile(path, data, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	src, err := FileSource(f)
	if err != nil {
		t.Fatal(err)
	}
	return src
}

func leafOf(t *testing.T, p Pair) *x509.Certificate {
	t.Helper()
	b, _ := pem.Decode(p.Cert)
	c, err := x509.ParseCertificate(b.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// handshake runs the CCM's TLS (ClientConfigFrom, dialling node) against an agent serving
// served with the agent's TLS (ServerConfigFrom, the CCM's identity allowed), and returns
// the CCM's error.
func handshake(t *testing.T, ca, served Pair, node string) error {
	t.Helper()
	ccm, err := Issue(ca, CCMName, Client, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	srvCfg, err := ServerConfigFrom(writeSource(t, ca, served), CCMName)
	if err != nil {
		t.Fatal(err)
	}
	cliCfg := ClientConfigFrom(writeSource(t, ca, ccm), node)
	// TCP, not net.Pipe: a refusal's alert must not wait for a reader.
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer lis.Close()
	srvErr := make(chan error, 1)
	go func() {
		s, err := lis.Accept()
		if err != nil {
			srvErr <- err
			return
		}
		_ = s.SetDeadline(time.Now().Add(10 * time.Second))
		srv := tls.Server(s, srvCfg)
		err = srv.Handshake()
		if err == nil {
			// TLS 1.3: the client's certificate is checked after the client's handshake
			// returns; read, so that the client learns a refusal.
			_, err = srv.Read(make([]byte, 1))
		}
		srvErr <- err
		s.Close()
	}()
	c, err := net.Dial("tcp", lis.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	cli := tls.Client(c, cliCfg)
	if err := cli.Handshake(); err != nil {
		return err
	}
	if _, err := cli.Write([]byte{1}); err != nil {
		return err
	}
	if err := <-srvErr; err != nil {
		t.Fatalf("the agent refused the CCM: %v", err)
	}
	return nil
}

// TestANodeNamedByAnIPAddressGetsAnIPSAN: a node named by an IPv4 or IPv6 address is issued
// a certificate holding it as an IP SAN (a DNS SAN holding an address never verifies), and
// the CCM's TLS dialling that node accepts it; a node named by a DNS name keeps its DNS SAN.
func TestANodeNamedByAnIPAddressGetsAnIPSAN(t *testing.T) {
	ca, err := NewCA("test-ca", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name, node string
		dns        []string
		ip         string
	}{
		{"a node named by an IPv4 address gets an IP SAN", "198.51.100.20", nil, "198.51.100.20"},
		{"a node named by an IPv6 address gets an IP SAN", "2001:db8::20", nil, "2001:db8::20"},
		{"a node named by a DNS name gets a DNS SAN", "node-1.example", []string{"node-1.example"}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p, err := Issue(ca, tc.node, Server, time.Hour)
			if err != nil {
				t.Fatal(err)
			}
			leaf := leafOf(t, p)
			var ips []string
			for _, ip := range leaf.IPAddresses {
				a, _ := netip.AddrFromSlice(ip)
				ips = append(ips, a.Unmap().String())
			}
			if leaf.Subject.CommonName != tc.node || !slices.Equal(leaf.DNSNames, tc.dns) || (tc.ip == "") != (len(ips) == 0) || tc.ip != "" && !slices.Equal(ips, []string{tc.ip}) {
				t.Errorf("certificate names CN %q, DNS %q, IPs %q; want CN %s, DNS %q, IPs %q", leaf.Subject.CommonName, leaf.DNSNames, ips, tc.node, tc.dns, tc.ip)
			}
			if err := handshake(t, ca, p, tc.node); err != nil {
				t.Errorf("the CCM dialling %s refuses its certificate: %v", tc.node, err)
			}
		})
	}
}

// TestAnIPNamedNodesCertificateSpeaksForNoOtherNode: the certificate of the node named by one
// address is refused for another address, for the DNS name written the same, and for the
// same address written otherwise.
func TestAnIPNamedNodesCertificateSpeaksForNoOtherNode(t *testing.T) {
	ca, err := NewCA("test-ca", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	v4, err := Issue(ca, "198.51.100.20", Server, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	v6, err := Issue(ca, "2001:db8::20", Server, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name   string
		served Pair
		dialed string
	}{
		{"another IPv4 address", v4, "198.51.100.21"},
		{"the IPv4-mapped form of the address", v4, "::ffff:198.51.100.20"},
		{"another IPv6 address", v6, "2001:db8::21"},
		{"the IPv6 address written with a leading zero", v6, "2001:0db8::20"},
		{"the IPv6 address with a zone", v6, "2001:db8::20%eth0"},
	} {
		t.Run("it is refused for "+tc.name, func(t *testing.T) {
			if err := handshake(t, ca, tc.served, tc.dialed); err == nil {
				t.Errorf("the CCM dialling %s accepts %s's certificate", tc.dialed, leafOf(t, tc.served).Subject.CommonName)
			}
		})
	}
}

// TestAnAddressWrittenOtherwiseIsNoCertificateName: a name that is an IP address not written
// canonically would hold the same IP SAN as another name; it is refused, and the error names
// the canonical form.
func TestAnAddressWrittenOtherwiseIsNoCertificateName(t *testing.T) {
	ca, err := NewCA("test-ca", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	for name, canonical := range map[string]string{
		"::ffff:198.51.100.20": "198.51.100.20",
		"2001:0db8::20":        "2001:db8::20",
		"2001:DB8::20":         "2001:db8::20",
		"fe80::1%eth0":         "fe80::1",
	} {
		t.Run(name+" is refused, naming "+canonical, func(t *testing.T) {
			_, err := Issue(ca, name, Server, time.Hour)
			if !errors.Is(err, ErrName) || !strings.Contains(err.Error(), "name the node "+canonical) {
				t.Errorf("Issue(%q) = %v; want ErrName naming %s", name, err, canonical)
			}
		})
	}
}

// TestIdentityReadsAnIPSAN: a certificate naming an address as its IP SAN alone (its common
// name another) is that address's, and no other's.
func TestIdentityReadsAnIPSAN(t *testing.T) {
	leaf := &x509.Certificate{IPAddresses: []net.IP{net.ParseIP("198.51.100.20")}}
	cs := tls.ConnectionState{PeerCertificates: []*x509.Certificate{leaf}}
	if got, err := Identity(cs, "198.51.100.21", "198.51.100.20"); err != nil || got != "198.51.100.20" {
		t.Errorf("Identity = %q, %v; want 198.51.100.20", got, err)
	}
	if got, err := Identity(cs, "198.51.100.21", "::ffff:198.51.100.20"); err == nil {
		t.Errorf("Identity = %q; want none of another address or another form", got)
	}
}
