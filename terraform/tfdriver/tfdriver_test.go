package tfdriver_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/distributed-lock-lab/distributed-lock-lab/terraform/tfdriver"
)

// fixtureResources is every resource of testdata/graph, in no order.
var fixtureResources = []string{
	"terraform_data.apis", "terraform_data.budget", "terraform_data.cloudsql", "terraform_data.executor",
	"terraform_data.gke", "terraform_data.iam", "terraform_data.network", "terraform_data.payment_resource",
	"terraform_data.pubsub", "terraform_data.rail_proxy", "terraform_data.rail_stub", "terraform_data.registry",
}

// lockedBuffer collects the driver's log lines and terraform's output,
// which terraform-exec writes from its own goroutines.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// newDriver copies the fixture module into a temporary directory (so that
// .terraform/ and the state stay out of the tree) and returns a driver on
// it, the trace file the fixture appends to, and the log.
func newDriver(t *testing.T, failAt string) (*tfdriver.Driver, string, *lockedBuffer) {
	t.Helper()
	if _, err := tfdriver.FindTerraform(""); err != nil {
		t.Skipf("skipping: the lifecycle test needs a terraform binary (1.9 or later) on PATH: %v", err)
	}
	dir := t.TempDir()
	src, err := os.ReadFile(filepath.Join("testdata", "graph", "main.tf"))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "main.tf"), src, 0o644); err != nil {
		t.Fatal(err)
	}
	trace := filepath.Join(dir, "trace")
	logs := &lockedBuffer{}
	log := slog.New(slog.NewTextHandler(io.MultiWriter(logs, t.Output()), nil))
	d, err := tfdriver.New(tfdriver.Config{
		Dir:    dir,
		Vars:   map[string]string{"trace": trace, "fail_at": failAt},
		Output: logs,
	}, log)
	if err != nil {
		t.Fatal(err)
	}
	return d, trace, logs
}

// quietLog is a logger that writes to w only.
func quietLog(w io.Writer) *slog.Logger { return slog.New(slog.NewTextHandler(w, nil)) }

func readTrace(t *testing.T, path string) []string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return strings.Fields(string(b))
}

func TestLifecycleCreatesBudgetFirstAndDestroysEverything(t *testing.T) {
	d, trace, logs := newDriver(t, "")
	var sawOutputs map[string]json.RawMessage
	res, err := d.Run(context.Background(), func(ctx context.Context, out map[string]json.RawMessage) error {
		sawOutputs = out
		// Between apply and destroy, everything exists.
		got, err := d.StateResources(ctx)
		if err != nil {
			return err
		}
		if !slices.Equal(got, fixtureResources) {
			t.Errorf("state after apply = %v, want %v", got, fixtureResources)
		}
		return nil
	})
	if err != nil {
		t.Fatalf("Run: %v\n%s", err, logs)
	}
	if want := (tfdriver.PlanSummary{File: res.Plan.File, Create: len(fixtureResources)}); res.Plan != want {
		t.Errorf("plan = %+v, want %+v", res.Plan, want)
	}
	if len(res.Left) != 0 {
		t.Errorf("left after destroy: %v, want nothing", res.Left)
	}
	if got, err := d.StateResources(context.Background()); err != nil || len(got) != 0 {
		t.Errorf("state after destroy = %v (err %v), want empty", got, err)
	}

	var urls map[string]string
	if err := json.Unmarshal(sawOutputs["service_urls"], &urls); err != nil {
		t.Fatalf("output service_urls: %v (%s)", err, sawOutputs["service_urls"])
	}
	if urls["executor"] != "https://executor.example" || len(urls) != 4 {
		t.Errorf("service_urls = %v, want the four services", urls)
	}
	var lockURL string
	if err := json.Unmarshal(sawOutputs["executor_lock_server_url"], &lockURL); err != nil || lockURL != "http://10.10.15.10" {
		t.Errorf("executor_lock_server_url = %q (err %v), want http://10.10.15.10", lockURL, err)
	}

	order := readTrace(t, trace)
	if len(order) != len(fixtureResources) || order[0] != "budget" || order[1] != "apis" {
		t.Errorf("creation order = %v, want budget, then apis, then the rest", order)
	}

	// The counts are logged before apply starts, and every step logs a
	// duration.
	log := logs.String()
	counts := strings.Index(log, `msg="plan: 12 to create, 0 to update, 0 to replace, 0 to delete, 0 unchanged"`)
	apply := strings.Index(log, "step=apply")
	if counts < 0 || apply < 0 || counts > apply {
		t.Errorf("plan counts line at %d, apply step at %d: want the counts logged before apply\n%s", counts, apply, log)
	}
	for _, step := range []string{"init", "plan", "apply", "output", "destroy", "state"} {
		if !strings.Contains(log, "event=tf_step_done step="+step+" duration_ms=") {
			t.Errorf("no done line with a duration for step %s", step)
		}
	}
}

func TestDestroyAfterApplyFailedMidwayLeavesNothing(t *testing.T) {
	ctx := context.Background()
	d, trace, logs := newDriver(t, "cloudsql")
	if err := d.Init(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := d.Plan(ctx); err != nil {
		t.Fatal(err)
	}
	err := d.Apply(ctx)
	if !errors.Is(err, tfdriver.ErrStep) || !strings.Contains(err.Error(), "apply") {
		t.Fatalf("Apply = %v, want an apply step error", err)
	}
	// Midway: the budget and the resources beside cloudsql exist, what
	// needs the database was never created.
	mid, err := d.StateResources(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(mid, "terraform_data.budget") || !slices.Contains(mid, "terraform_data.gke") {
		t.Errorf("state after the failed apply = %v, want the budget and gke in it", mid)
	}
	for _, never := range []string{"terraform_data.rail_proxy", "terraform_data.payment_resource", "terraform_data.executor", "terraform_data.pubsub"} {
		if slices.Contains(mid, never) {
			t.Errorf("state after the failed apply has %s, which depends on the failed cloudsql", never)
		}
	}
	if err := d.Destroy(ctx); err != nil {
		t.Fatalf("Destroy: %v\n%s", err, logs)
	}
	if got, err := d.StateResources(ctx); err != nil || len(got) != 0 {
		t.Errorf("state after destroy = %v (err %v), want empty", got, err)
	}
	if order := readTrace(t, trace); order[0] != "budget" {
		t.Errorf("creation order = %v, want the budget first", order)
	}
}

func TestRunDestroysWhenApplyFails(t *testing.T) {
	d, _, logs := newDriver(t, "gke")
	called := false
	res, err := d.Run(context.Background(), func(context.Context, map[string]json.RawMessage) error {
		called = true
		return nil
	})
	if !errors.Is(err, tfdriver.ErrStep) || !strings.Contains(err.Error(), "apply") {
		t.Fatalf("Run = %v, want the apply step's error", err)
	}
	if called {
		t.Error("the game day ran although apply failed")
	}
	if len(res.Left) != 0 {
		t.Errorf("left after destroy: %v, want nothing", res.Left)
	}
	if !strings.Contains(logs.String(), "event=tf_step_done step=destroy") {
		t.Errorf("destroy did not run after the failed apply:\n%s", logs)
	}
}

func TestRunDestroysWhenTheGameDayFails(t *testing.T) {
	d, _, _ := newDriver(t, "")
	boom := errors.New("game day failed")
	res, err := d.Run(context.Background(), func(context.Context, map[string]json.RawMessage) error { return boom })
	if !errors.Is(err, boom) {
		t.Fatalf("Run = %v, want the game day's error", err)
	}
	if len(res.Left) != 0 {
		t.Errorf("left after destroy: %v, want nothing", res.Left)
	}
}

func TestNewRefusesAMissingBinaryAndABadDir(t *testing.T) {
	log := slog.New(slog.DiscardHandler)
	_, err := tfdriver.New(tfdriver.Config{Dir: t.TempDir(), ExecPath: filepath.Join(t.TempDir(), "terraform")}, log)
	if !errors.Is(err, tfdriver.ErrNoTerraform) {
		t.Errorf("New with a missing binary = %v, want ErrNoTerraform", err)
	}
	_, err = tfdriver.New(tfdriver.Config{Dir: filepath.Join(t.TempDir(), "nope")}, log)
	if !errors.Is(err, tfdriver.ErrInvalidConfig) {
		t.Errorf("New with a missing dir = %v, want ErrInvalidConfig", err)
	}
}
