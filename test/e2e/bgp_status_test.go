package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/metalvip/metalvip/api/v1alpha1"
	"github.com/metalvip/metalvip/test/cluster"
	"github.com/metalvip/metalvip/test/harness"
	"github.com/metalvip/metalvip/test/kubeapi"
)

// peerTable returns the BGPPeer as `kubectl get bgppeers NAME` prints it: the API server's
// Table of the CRD's printer columns, as header -> cell.
func peerTable(t *testing.T, c *cluster.Cluster, name string) map[string]string {
	t.Helper()
	const accept = "application/json;as=Table;v=v1;g=meta.k8s.io"
	raw, err := c.Srv.Client.CoreV1().RESTClient().Get().AbsPath("/apis", v1alpha1.GroupVersion.Group, v1alpha1.GroupVersion.Version, "bgppeers", name).
		SetHeader("Accept", accept).DoRaw(context.Background())
	if err != nil {
		t.Fatalf("get bgppeer %s as a table: %v", name, err)
	}
	var tab metav1.Table
	if err := json.Unmarshal(raw, &tab); err != nil {
		t.Fatalf("table: %v\n%s", err, raw)
	}
	if len(tab.Rows) != 1 {
		t.Fatalf("table has %d rows: %s", len(tab.Rows), raw)
	}
	out := map[string]string{}
	for i, col := range tab.ColumnDefinitions {
		out[col.Name] = fmt.Sprint(tab.Rows[0].Cells[i])
	}
	return out
}

func peerStatus(t *testing.T, c *cluster.Cluster, name string) v1alpha1.BGPPeerStatus {
	t.Helper()
	u, err := c.Dyn.Resource(v1alpha1.BGPPeerResource).Get(context.Background(), name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var p v1alpha1.BGPPeer
	raw, _ := json.Marshal(u.Object)
	if err := json.Unmarshal(raw, &p); err != nil {
		t.Fatal(err)
	}
	return p.Status
}

// TestBGPPeerStatus: `kubectl get bgppeers` shows the session state per node, from the
// agents' reports, and follows a node whose agent goes away.
func TestBGPPeerStatus(t *testing.T) {
	c := cluster.New(t, kubeapi.Get(t), cluster.Options{CCMBinary: ccmBinary, AgentBinary: agentBinary})
	peer := "router-" + c.NS

	t.Run("every node's session is Established and the table says 3/3", func(t *testing.T) {
		c.T = t
		took := harness.Eventually(t, 60*time.Second, "the peer's status shows 3 established sessions", func() bool {
			return peerStatus(t, c, peer).Sessions == "Established 3/3"
		})
		// BFD starts once a session is up; the agents report it at their next probe.
		harness.Eventually(t, 60*time.Second, "every node's BFD is Up", func() bool {
			for _, n := range peerStatus(t, c, peer).Nodes {
				if n.BFDState != "Up" {
					return false
				}
			}
			return true
		})
		row := peerTable(t, c, peer)
		if row["Sessions"] != "Established 3/3" {
			t.Errorf("kubectl get bgppeers shows %v", row)
		}
		t.Logf("Established 3/3 %s after the CCM started; kubectl get bgppeers: %v", took.Round(time.Millisecond), row)
		for _, n := range peerStatus(t, c, peer).Nodes {
			if n.State != "Established" || n.BFDState != "Up" || n.Since == nil {
				t.Errorf("node %s: %+v", n.Node, n)
			}
		}
	})

	t.Run("a BGP VIP shows as a route advertised by every node", func(t *testing.T) {
		c.T = t
		c.Service("everywhere", cluster.InPool("bgp-"+c.NS))
		harness.Eventually(t, 60*time.Second, "each node advertises one route", func() bool {
			st := peerStatus(t, c, peer)
			n := 0
			for _, s := range st.Nodes {
				if s.RoutesAdvertised == 1 {
					n++
				}
			}
			return n == 3
		})
	})

	t.Run("a node whose agent dies is no longer counted", func(t *testing.T) {
		c.T = t
		c.Kill("node3")
		took := harness.Eventually(t, 60*time.Second, "the table says 2/3 and node3 is not Established", func() bool {
			st := peerStatus(t, c, peer)
			for _, n := range st.Nodes {
				if n.Node == "node3" && n.State == "Established" {
					return false
				}
			}
			return st.Sessions == "Established 2/3" && peerTable(t, c, peer)["Sessions"] == "Established 2/3"
		})
		st := peerStatus(t, c, peer)
		var node3 string
		for _, n := range st.Nodes {
			if n.Node == "node3" {
				node3 = fmt.Sprintf("%s %q", n.State, n.LastError)
			}
		}
		t.Logf("node3 killed: %s after %s (node3: %s)", st.Sessions, took.Round(time.Millisecond), node3)
		c.Revive("node3")
		harness.Eventually(t, 90*time.Second, "node3 is Established again", func() bool {
			return strings.HasPrefix(peerStatus(t, c, peer).Sessions, "Established 3/3")
		})
	})
}
