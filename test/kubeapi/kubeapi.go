// Package kubeapi gives tests a real kube-apiserver on a real etcd: one pair per test binary,
// started on first use and stopped by Main. The kube-apiserver binary is built by
// hack/kube.sh (make test runs it); etcd comes from Debian's etcd-server.
//
//	func TestMain(m *testing.M) { kubeapi.Main(m) }
//
//	func TestSomething(t *testing.T) {
//		srv := kubeapi.Get(t)
//		ns := srv.Namespace(t)
//		srv.Client.CoreV1().Services(ns).Create(...)
//	}
package kubeapi

import (
	"context"
	"crypto/rand"
	"crypto/rsa"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"

	"github.com/metalvip/metalvip/test/harness/pki"
	"github.com/metalvip/metalvip/test/testenv"
)

// APIServerEnv overrides where the kube-apiserver binary is found.
const APIServerEnv = "METALVIP_KUBE_APISERVER"

// Server is a running etcd and kube-apiserver.
type Server struct {
	// Config is an admin (system:masters) client configuration.
	Config *rest.Config
	// Client is an admin clientset.
	Client kubernetes.Interface
	// URL is the API server's https address.
	URL string
	// Dir holds the server's files: certificates, keys, logs.
	Dir string

	etcd, apiserver *process
	saKey           *rsa.PrivateKey

	crdOnce sync.Once
	crdErr  error
}

type process struct {
	cmd  *exec.Cmd
	done chan struct{} // closed when the process has exited
}

func (p *process) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

var (
	mu      sync.Mutex
	shared  *Server
	initErr error
)

// Main runs the package's tests, stops the shared server afterwards if one was started, runs
// cleanups and exits.
func Main(m *testing.M, cleanups ...func()) {
	code := m.Run()
	mu.Lock()
	if shared != nil {
		shared.Stop()
	}
	mu.Unlock()
	for _, c := range cleanups {
		c()
	}
	os.Exit(code)
}

// Get returns the package's shared server, starting it on first use. Without the binaries it
// skips the test (fails it under METALVIP_REQUIRE_LAB=1).
func Get(t testenv.TB) *Server {
	t.Helper()
	if testing.Testing() && testing.Short() {
		t.Skip("needs a kube-apiserver; not run with -short")
	}
	mu.Lock()
	defer mu.Unlock()
	if shared == nil && initErr == nil {
		shared, initErr = Start()
	}
	if initErr != nil {
		if errors.Is(initErr, errMissingBinary) {
			testenv.Skip(t, "%v", initErr)
		}
		t.Fatalf("start kube-apiserver: %v", initErr)
	}
	return shared
}

var errMissingBinary = errors.New("missing binary")

// Binaries returns the paths of kube-apiserver and etcd.
func Binaries() (apiserver, etcd string, err error) {
	apiserver = os.Getenv(APIServerEnv)
	if apiserver == "" {
		root, rerr := testenv.RepoRoot()
		if rerr != nil {
			return "", "", rerr
		}
		apiserver = filepath.Join(root, ".cache", "bin", "kube-apiserver")
	}
	if _, serr := os.Stat(apiserver); serr != nil {
		return "", "", fmt.Errorf("%w: kube-apiserver not found at %s; run hack/kube.sh kube-apiserver (make test does)", errMissingBinary, apiserver)
	}
	etcd, err = exec.LookPath("etcd")
	if err != nil {
		return "", "", fmt.Errorf("%w: etcd not found; run hack/install-deps.sh (make test does)", errMissingBinary)
	}
	return apiserver, etcd, nil
}

// Own starts a new etcd and kube-apiserver for t alone (Get's is shared), stopped when t
// ends; it fails t when they do not start.
func Own(t testenv.TB) *Server {
	t.Helper()
	s, err := Start()
	if err != nil {
		t.Fatalf("start kube-apiserver: %v", err)
	}
	t.Cleanup(s.Stop)
	return s
}

// Start starts a new etcd and kube-apiserver and waits until the API server is ready.
func Start() (*Server, error) {
	apiserverBin, etcdBin, err := Binaries()
	if err != nil {
		return nil, err
	}
	// etcd's fsyncs dominate API latency on a disk; on tmpfs they cost nothing.
	base := ""
	if st, err := os.Stat("/dev/shm"); err == nil && st.IsDir() {
		base = "/dev/shm"
	}
	dir, err := os.MkdirTemp(base, "metalvip-kubeapi-")
	if err != nil {
		return nil, err
	}
	s := &Server{Dir: dir}
	if err := s.start(apiserverBin, etcdBin); err != nil {
		s.Stop()
		return nil, err
	}
	return s, nil
}

func (s *Server) start(apiserverBin, etcdBin string) error {
	ports, err := freePorts(3)
	if err != nil {
		return err
	}
	etcdClient := fmt.Sprintf("http://127.0.0.1:%d", ports[0])
	etcdPeer := fmt.Sprintf("http://127.0.0.1:%d", ports[1])
	s.etcd, err = s.startProcess("etcd", etcdBin,
		"--name", "default",
		"--data-dir", filepath.Join(s.Dir, "etcd"),
		"--listen-client-urls", etcdClient,
		"--advertise-client-urls", etcdClient,
		"--listen-peer-urls", etcdPeer,
		"--initial-advertise-peer-urls", etcdPeer,
		"--initial-cluster", "default="+etcdPeer,
		"--quota-backend-bytes", strconv.Itoa(8<<30),
		"--log-level", "warn",
	)
	if err != nil {
		return err
	}

	if s.saKey, err = pki.ServiceAccount(s.Dir); err != nil {
		return err
	}
	token, err := pki.AdminToken(s.Dir, "metalvip-test-admin")
	if err != nil {
		return err
	}
	certDir := filepath.Join(s.Dir, "certs")
	s.apiserver, err = s.startProcess("kube-apiserver", apiserverBin,
		"--etcd-servers", etcdClient,
		"--cert-dir", certDir,
		"--bind-address", "127.0.0.1",
		"--secure-port", strconv.Itoa(ports[2]),
		"--service-account-issuer", "https://kubernetes.default.svc",
		"--service-account-key-file", filepath.Join(s.Dir, "sa.pub"),
		"--service-account-signing-key-file", filepath.Join(s.Dir, "sa.key"),
		"--token-auth-file", filepath.Join(s.Dir, "tokens.csv"),
		"--authorization-mode", "RBAC",
		"--service-cluster-ip-range", "10.96.0.0/16,fd00:10:96::/112", // dual-stack, so Services may ask for both families
		"--allow-privileged",
		"--endpoint-reconciler-type", "none",
		"--v", "1",
	)
	if err != nil {
		return err
	}
	s.URL = fmt.Sprintf("https://127.0.0.1:%d", ports[2])
	s.Config = &rest.Config{
		Host:        s.URL,
		BearerToken: token,
		QPS:         1000,
		Burst:       2000,
		// The API server made its own self-signed certificate in certDir; it is read below.
		TLSClientConfig: rest.TLSClientConfig{},
	}
	if err := s.waitReady(certDir, 90*time.Second); err != nil {
		return err
	}
	s.Client, err = kubernetes.NewForConfig(s.Config)
	return err
}

func (s *Server) startProcess(name, bin string, args ...string) (*process, error) {
	log, err := os.Create(filepath.Join(s.Dir, name+".log"))
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(bin, args...)
	cmd.Stdout, cmd.Stderr = log, log
	if err := testenv.Start(cmd); err != nil {
		log.Close()
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	p := &process{cmd: cmd, done: make(chan struct{})}
	go func() { _ = cmd.Wait(); log.Close(); close(p.done) }()
	return p, nil
}

func (s *Server) waitReady(certDir string, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	var lastErr error
	for time.Now().Before(deadline) {
		if s.apiserver.exited() || s.etcd.exited() {
			lastErr = errors.New("a process exited")
			break
		}
		if s.Config.CAData == nil {
			if ca, err := os.ReadFile(filepath.Join(certDir, "apiserver.crt")); err == nil {
				s.Config.CAData = ca
			}
		}
		if s.Config.CAData != nil {
			lastErr = s.readyz()
			if lastErr == nil {
				return nil
			}
		}
		time.Sleep(200 * time.Millisecond)
	}
	return fmt.Errorf("kube-apiserver not ready after %s (last error: %v); its log:\n%s", timeout, lastErr, s.LogTail("kube-apiserver", 30))
}

func (s *Server) readyz() error {
	rt, err := rest.TransportFor(s.Config)
	if err != nil {
		return err
	}
	c := &http.Client{Transport: rt, Timeout: 5 * time.Second}
	resp, err := c.Get(s.URL + "/readyz")
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("/readyz: %s", resp.Status)
	}
	return nil
}

// LogTail returns the last n lines of a process's log ("etcd" or "kube-apiserver").
func (s *Server) LogTail(name string, n int) string {
	data, _ := os.ReadFile(filepath.Join(s.Dir, name+".log"))
	lines := strings.Split(strings.TrimRight(string(data), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// Pause stops the kube-apiserver (SIGSTOP: connections hang, as with an API server that is
// down behind a load balancer) until Resume.
func (s *Server) Pause() error { return s.apiserver.cmd.Process.Signal(syscall.SIGSTOP) }

// Resume lets a paused kube-apiserver go on.
func (s *Server) Resume() error { return s.apiserver.cmd.Process.Signal(syscall.SIGCONT) }

// Stop stops the API server and etcd and removes their files.
func (s *Server) Stop() {
	for _, p := range []*process{s.apiserver, s.etcd} {
		if p == nil {
			continue
		}
		_ = p.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-p.done:
		case <-time.After(10 * time.Second):
			_ = p.cmd.Process.Kill()
			<-p.done
		}
	}
	_ = os.RemoveAll(s.Dir)
}

// Namespace creates a namespace for one test and deletes it when the test ends.
func (s *Server) Namespace(t testenv.TB) string {
	t.Helper()
	name := strings.ToLower(strings.NewReplacer("/", "-", "_", "-").Replace(t.Name()))
	if len(name) > 40 {
		name = name[:40]
	}
	name = strings.Trim(name, "-") + "-" + randomHex(3)
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}
	if _, err := s.Client.CoreV1().Namespaces().Create(context.Background(), ns, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create namespace %s: %v", name, err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = s.Client.CoreV1().Namespaces().Delete(ctx, name, metav1.DeleteOptions{})
	})
	return name
}

// Kubeconfig writes a kubeconfig for cfg (the admin configuration when cfg is nil) into a
// test's temporary folder and returns its path.
func (s *Server) Kubeconfig(t testenv.TB, cfg *rest.Config) string {
	t.Helper()
	if cfg == nil {
		cfg = s.Config
	}
	kc := clientcmdapi.NewConfig()
	kc.Clusters["test"] = &clientcmdapi.Cluster{Server: cfg.Host, CertificateAuthorityData: cfg.CAData}
	kc.AuthInfos["test"] = &clientcmdapi.AuthInfo{Token: cfg.BearerToken}
	kc.Contexts["test"] = &clientcmdapi.Context{Cluster: "test", AuthInfo: "test"}
	kc.CurrentContext = "test"
	path := filepath.Join(t.TempDir(), "kubeconfig")
	if err := clientcmd.WriteToFile(*kc, path); err != nil {
		t.Fatalf("write kubeconfig: %v", err)
	}
	return path
}

func freePorts(n int) ([]int, error) {
	var ls []net.Listener
	defer func() {
		for _, l := range ls {
			l.Close()
		}
	}()
	ports := make([]int, 0, n)
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, err
		}
		ls = append(ls, l)
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	return ports, nil
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}
