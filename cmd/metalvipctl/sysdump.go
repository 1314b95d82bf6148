package main

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"fmt"
	"io"
	"os"
	"path"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/spf13/cobra"
	"google.golang.org/grpc/credentials"
	"google.golang.org/protobuf/encoding/protojson"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/kubernetes"
	"sigs.k8s.io/yaml"

	"github.com/metalvip/metalvip/api/v1alpha1"
	"github.com/metalvip/metalvip/internal/version"
)

// podsSelector picks metalvip's pods (the CCM's and the agents'), wherever installed.
const podsSelector = "app.kubernetes.io/name in (metalvip-cloud-controller-manager,metalvip-agent)"

// sysdump is a support bundle being written: one gzipped tar, and what could not be
// collected (errors.txt) beside what could.
type sysdump struct {
	tw   *tar.Writer
	at   time.Time
	mu   sync.Mutex
	errs []string
}

func (s *sysdump) add(name string, data []byte) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.tw.WriteHeader(&tar.Header{Name: "metalvip-sysdump/" + name, Mode: 0o600, Size: int64(len(data)), ModTime: s.at, Typeflag: tar.TypeReg}); err != nil {
		s.errs = append(s.errs, fmt.Sprintf("%s: %v", name, err))
		return
	}
	if _, err := s.tw.Write(data); err != nil {
		s.errs = append(s.errs, fmt.Sprintf("%s: %v", name, err))
	}
}

func (s *sysdump) failed(what string, err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.errs = append(s.errs, fmt.Sprintf("%s: %v", what, err))
}

// addYAML adds v as YAML.
func (s *sysdump) addYAML(name string, v any) {
	b, err := yaml.Marshal(v)
	if err != nil {
		s.failed(name, err)
		return
	}
	s.add(name, b)
}

func sysdumpCommand() *cobra.Command {
	var (
		d        agentDialer
		output   string
		logLines int64
	)
	cmd := &cobra.Command{
		Use:   "sysdump",
		Short: "Write a support bundle: metalvip's objects, Services, Nodes, Events, pod logs and every agent's state",
		Long: `sysdump collects what a maintainer needs to see what metalvip did, into one gzipped tar
(--output, default metalvip-sysdump-<time>.tar.gz): the versions (as metalvipctl version), the
IPPools, BGPPeers and ServiceAnnouncements, the Services of type LoadBalancer, the Nodes, the
Events of Services and Nodes, metalvip's cloud-config ConfigMaps, the logs of the CCM's and the
agents' pods (the last --log-lines lines of each container, and of the previous one after a
restart), every agent's state (its GetState, which blanks BGP passwords), and a snapshot of the
CCM's and every agent's /metrics (read at the pod's address with a token of the ServiceAccount
metalvip-metrics-reader that expires in 10 minutes).

It reads no Secret and strips managed fields and kubectl's last-applied copies; what it could not
read is listed in errors.txt and the rest is written all the same. Read the bundle before you
send it: pod logs and Services name your addresses and namespaces.

` + agentDialHelp,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := d.check(); err != nil {
				return err
			}
			if logLines < 1 {
				return fmt.Errorf("--log-lines %d: give at least 1", logLines)
			}
			at := time.Now().UTC()
			if output == "" {
				output = "metalvip-sysdump-" + at.Format("20060102-150405") + ".tar.gz"
			}
			client, dyn, _, err := kubeClients(d.kube)
			if err != nil {
				return err
			}
			f, err := os.OpenFile(output, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
			if err != nil {
				return fmt.Errorf("--output: %w", err)
			}
			zw := gzip.NewWriter(f)
			s := &sysdump{tw: tar.NewWriter(zw), at: at}
			ctx, cancel := context.WithTimeout(cmd.Context(), 5*time.Minute)
			defer cancel()

			me := version.Get()
			rep := versionReport{Client: build{Version: me.Version, Commit: me.Commit}}
			if err := d.agentVersions(ctx, cmd, client, &rep, func(node string, st []byte) { s.add("agents/"+node+".json", st) }); err != nil {
				s.failed("the agents", err)
			}
			s.addYAML("versions.yaml", rep)
			for _, r := range []struct {
				file string
				res  schema.GroupVersionResource
			}{
				{"ippools.yaml", v1alpha1.IPPoolResource},
				{"bgppeers.yaml", v1alpha1.BGPPeerResource},
				{"serviceannouncements.yaml", v1alpha1.ServiceAnnouncementResource},
			} {
				list, err := dyn.Resource(r.res).List(ctx, metav1.ListOptions{})
				if err != nil {
					s.failed(r.file, err)
					continue
				}
				for i := range list.Items {
					trimObject(&list.Items[i])
				}
				s.addYAML(r.file, list.Items)
			}
			collectCluster(ctx, client, s)
			collectLogs(ctx, client, s, logLines)
			collectMetrics(ctx, client, s)

			if len(s.errs) > 0 {
				s.add("errors.txt", []byte(strings.Join(s.errs, "\n")+"\n"))
			}
			err = s.tw.Close()
			if zerr := zw.Close(); err == nil {
				err = zerr
			}
			if ferr := f.Close(); err == nil {
				err = ferr
			}
			if err != nil {
				return fmt.Errorf("writing %s: %w", output, err)
			}
			fmt.Fprintf(cmd.OutOrStdout(), "wrote %s (%d agents asked, %d parts not collected: see errors.txt in it)\n", output, len(rep.Agents), len(s.errs))
			return nil
		},
	}
	d.addFlags(cmd)
	cmd.Flags().StringVar(&output, "output", "", "the bundle to write (a new file; default metalvip-sysdump-<UTC time>.tar.gz here)")
	cmd.Flags().Int64Var(&logLines, "log-lines", 2000, "the last lines of each metalvip container's log to keep")
	return cmd
}

// eachAgent asks every node's agent (agentsAtOnce at a time) for its state: its versions are
// returned, in the nodes' order by name, and each state that came is given to keep as JSON.
func (d *agentDialer) eachAgent(ctx context.Context, creds func(string) (credentials.TransportCredentials, error), nodes []corev1.Node, keep func(node string, state []byte)) []agentVersion {
	out := make([]agentVersion, len(nodes))
	var wg sync.WaitGroup
	sem := make(chan struct{}, agentsAtOnce)
	for i := range nodes {
		wg.Add(1)
		go func() {
			defer wg.Done()
			sem <- struct{}{}
			defer func() { <-sem }()
			v, st := d.agentVersion(ctx, creds, &nodes[i])
			out[i] = v
			if st != nil && keep != nil {
				if b, err := (protojson.MarshalOptions{Multiline: true, Indent: "  "}).Marshal(st); err == nil {
					keep(nodes[i].Name, b)
				}
			}
		}()
	}
	wg.Wait()
	sort.Slice(out, func(i, j int) bool { return out[i].Node < out[j].Node })
	return out
}

// collectCluster adds the Services of type LoadBalancer, the Nodes, the Events of Services and
// Nodes, and metalvip's cloud-config ConfigMaps.
func collectCluster(ctx context.Context, client kubernetes.Interface, s *sysdump) {
	if svcs, err := client.CoreV1().Services("").List(ctx, metav1.ListOptions{}); err != nil {
		s.failed("services.yaml", err)
	} else {
		var lb []corev1.Service
		for _, svc := range svcs.Items {
			if svc.Spec.Type == corev1.ServiceTypeLoadBalancer || len(svc.Spec.ExternalIPs) > 0 {
				trimMeta(&svc.ObjectMeta)
				lb = append(lb, svc)
			}
		}
		s.addYAML("services.yaml", lb)
	}
	if nodes, err := client.CoreV1().Nodes().List(ctx, metav1.ListOptions{}); err != nil {
		s.failed("nodes.yaml", err)
	} else {
		for i := range nodes.Items {
			trimMeta(&nodes.Items[i].ObjectMeta)
			nodes.Items[i].Status.Images = nil // long, and nothing of metalvip's
		}
		s.addYAML("nodes.yaml", nodes.Items)
	}
	for _, kind := range []string{"Service", "Node"} {
		evs, err := client.CoreV1().Events("").List(ctx, metav1.ListOptions{FieldSelector: "involvedObject.kind=" + kind})
		if err != nil {
			s.failed("events", err)
			continue
		}
		for i := range evs.Items {
			trimMeta(&evs.Items[i].ObjectMeta)
		}
		s.addYAML("events-"+strings.ToLower(kind)+"s.yaml", evs.Items)
	}
	cms, err := client.CoreV1().ConfigMaps("").List(ctx, metav1.ListOptions{FieldSelector: "metadata.name=metalvip-cloud-config"})
	if err != nil {
		s.failed("cloud-config", err)
		return
	}
	for i := range cms.Items {
		trimMeta(&cms.Items[i].ObjectMeta)
		s.addYAML("cloud-config/"+cms.Items[i].Namespace+".yaml", cms.Items[i])
	}
}

// collectLogs adds the last lines of every container of metalvip's pods, and of the container
// before it where one restarted.
func collectLogs(ctx context.Context, client kubernetes.Interface, s *sysdump, lines int64) {
	pods, err := client.CoreV1().Pods("").List(ctx, metav1.ListOptions{LabelSelector: podsSelector})
	if err != nil {
		s.failed("pods", err)
		return
	}
	for _, p := range pods.Items {
		status := map[string]int32{}
		for _, cs := range p.Status.ContainerStatuses {
			status[cs.Name] = cs.RestartCount
		}
		for _, c := range p.Spec.Containers {
			for _, previous := range []bool{false, true} {
				if previous && status[c.Name] == 0 {
					continue
				}
				name := path.Join("logs", p.Namespace, p.Name, c.Name+".log")
				if previous {
					name = path.Join("logs", p.Namespace, p.Name, c.Name+".previous.log")
				}
				rc, err := client.CoreV1().Pods(p.Namespace).GetLogs(p.Name, &corev1.PodLogOptions{Container: c.Name, TailLines: &lines, Previous: previous}).Stream(ctx)
				if err != nil {
					s.failed(name, err)
					continue
				}
				var b bytes.Buffer
				_, err = io.Copy(&b, io.LimitReader(rc, 64<<20))
				_ = rc.Close()
				if err != nil {
					s.failed(name, err)
				}
				s.add(name, b.Bytes())
			}
		}
	}
}

// trimMeta drops what says nothing of metalvip's doing and may be long: managed fields and
// kubectl's last-applied copy.
func trimMeta(m *metav1.ObjectMeta) {
	m.ManagedFields = nil
	delete(m.Annotations, corev1.LastAppliedConfigAnnotation)
}

func trimObject(u *unstructured.Unstructured) {
	u.SetManagedFields(nil)
	if a := u.GetAnnotations(); a != nil {
		delete(a, corev1.LastAppliedConfigAnnotation)
		u.SetAnnotations(a)
	}
}
