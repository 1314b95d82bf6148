package controlplane

import (
	"context"
	"encoding/pem"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"go.uber.org/goleak"
	"pgregory.net/rapid"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// TestReadinessChangesOnlyAfterEnoughResultsInARow: whatever the results, the readiness
// flips exactly when the last Rise (to ready) or Fall (to not ready) results agree and
// disagree with it, and never otherwise.
func TestReadinessChangesOnlyAfterEnoughResultsInARow(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		rise, fall := rapid.IntRange(1, 5).Draw(t, "rise"), rapid.IntRange(1, 5).Draw(t, "fall")
		results := rapid.SliceOfN(rapid.Bool(), 0, 60).Draw(t, "results")
		h := Hysteresis{Rise: rise, Fall: fall}
		ready, since := false, 0 // the model: the state, and results in a row against it
		for i, ok := range results {
			got, changed := h.Observe(ok)
			if ok != ready {
				since++
			} else {
				since = 0
			}
			need := rise
			if ready {
				need = fall
			}
			want := false
			if since >= need {
				ready, since, want = !ready, 0, true
			}
			if got != ready || changed != want {
				t.Fatalf("after result %d (%v): ready %v changed %v, want %v %v", i, ok, got, changed, ready, want)
			}
		}
	})
}

func TestHysteresisStartsNotReady(t *testing.T) {
	h := Hysteresis{Rise: 3, Fall: 2}
	for i, want := range []bool{false, false, true, true, true, true, false} {
		ok := i < 3 || i == 4
		if got, _ := h.Observe(ok); got != want {
			t.Errorf("result %d: ready %v, want %v", i, got, want)
		}
	}
}

func TestReadyzChecksTheServerWithTheCAFile(t *testing.T) {
	var status int
	var body string
	srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/readyz" {
			http.NotFound(w, r)
			return
		}
		w.WriteHeader(status)
		_, _ = w.Write([]byte(body))
	}))
	defer srv.Close()
	dir := t.TempDir()
	ca := filepath.Join(dir, "ca.crt")
	check := ReadyzChecker(Health{URL: srv.URL + "/readyz", CAFile: ca})
	ctx := context.Background()
	defer srv.Client().CloseIdleConnections()

	t.Run("without its CA file it is not ready", func(t *testing.T) {
		status = 200
		if err := check(ctx); err == nil || !strings.Contains(err.Error(), "CA file") {
			t.Errorf("check = %v", err)
		}
	})
	t.Run("with a CA file that holds no certificate it is not ready", func(t *testing.T) {
		if err := os.WriteFile(ca, []byte("not pem"), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := check(ctx); err == nil || !strings.Contains(err.Error(), "no PEM certificate") {
			t.Errorf("check = %v", err)
		}
	})
	if err := os.WriteFile(ca, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srv.Certificate().Raw}), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Run("a 200 is ready", func(t *testing.T) {
		status, body = 200, "ok"
		if err := check(ctx); err != nil {
			t.Errorf("check = %v", err)
		}
	})
	t.Run("a failing check says which check failed", func(t *testing.T) {
		status, body = 500, "[+]ping ok\n[-]etcd failed: reason withheld\nreadyz check failed\n"
		if err := check(ctx); err == nil || !strings.Contains(err.Error(), "[-]etcd failed") || strings.Contains(err.Error(), "[+]ping") {
			t.Errorf("check = %v", err)
		}
	})
	t.Run("a server that is gone is not ready", func(t *testing.T) {
		srv.Close()
		if err := check(ctx); err == nil {
			t.Error("check passed with the server closed")
		}
	})
}
