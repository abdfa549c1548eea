package harness_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	run "cloud.google.com/go/run/apiv2"

	"github.com/distributed-lock-lab/distributed-lock-lab/functions/paymentresource/api"
	"github.com/distributed-lock-lab/distributed-lock-lab/functions/rail"
	"github.com/distributed-lock-lab/distributed-lock-lab/harness"
	"github.com/distributed-lock-lab/distributed-lock-lab/terraform/leftovers"
	"github.com/distributed-lock-lab/distributed-lock-lab/terraform/tfdriver"
)

// The cloud game day (docs/cloud.md). Without -cloud nothing of it runs;
// with -cloud only TestCloudGameDay runs (cloudMain narrows -run), and
// without credentials it is skipped with one line naming what is missing.
var (
	cloudFlag     = flag.Bool("cloud", false, "run the fencing experiment on Google Cloud: apply, deploy, the four cells through real Pub/Sub push, destroy, zero-billable check (docs/cloud.md)")
	cloudDeployed = flag.Bool("cloud-deployed", false, "with -cloud: the environment is already deployed with the game day on (make deploy with TF_VAR_game_day); skip the apply and deploy, still destroy at the end")
)

// Game day settings given to Terraform (var.game_day) and to the cells.
const (
	gameDayPause  = 150 * time.Second
	gameDayPrefix = "gameday-"
)

// cloudSkipLine is the one line of a -cloud run without credentials.
func cloudSkipLine(err error) string {
	return "harness -cloud: skipped: " + err.Error()
}

// cloudMain is TestMain's part for -cloud, called after flag.Parse: it
// narrows the run to TestCloudGameDay and, when the credentials are
// missing and go test is not verbose (where the skip message would not be
// shown), prints the skip line itself.
func cloudMain() {
	if !*cloudFlag {
		return
	}
	_ = flag.Set("test.run", "^TestCloudGameDay$")
	if _, err := tfdriver.Preflight(os.Getenv, tfdriver.FileExists); err != nil && !testing.Verbose() {
		fmt.Println(cloudSkipLine(err))
	}
}

// TestCloudGameDay is the live game day: labenv deploy with the game day
// on (unless -cloud-deployed), the four fencing cells against the
// deployed services, then labenv destroy and its zero-billable check,
// which run even when a step before failed.
func TestCloudGameDay(t *testing.T) {
	if !*cloudFlag {
		t.Skip("not asked for: go test ./harness -cloud")
	}
	vars, err := tfdriver.Preflight(os.Getenv, tfdriver.FileExists)
	if err != nil {
		t.Skip(cloudSkipLine(err))
	}
	if vars.Region == "" {
		vars.Region = "europe-west1"
	}
	ctx, cancel := context.WithTimeout(t.Context(), 90*time.Minute)
	defer cancel()
	repo, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	operator, err := operatorMember()
	if err != nil {
		t.Fatal(err)
	}
	env := append(os.Environ(), fmt.Sprintf(`TF_VAR_game_day={pause_ms=%d,payout_prefix=%q,operator=%q}`, gameDayPause.Milliseconds(), gameDayPrefix, operator))
	labenv := func(ctx context.Context, step string) error {
		cmd := exec.CommandContext(ctx, "go", "run", "./terraform/cmd/labenv", step)
		cmd.Dir, cmd.Env = repo, env
		var out bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &out
		t.Logf("labenv %s ...", step)
		err := cmd.Run()
		t.Logf("labenv %s: %v\n%s", step, err, out.String())
		return err
	}
	// Registered first: destroy and the zero-billable check run whatever
	// happens below, a failed deploy included.
	t.Cleanup(func() {
		if err := labenv(context.WithoutCancel(ctx), "destroy"); err != nil {
			t.Errorf("labenv destroy (terraform destroy, then the zero-billable check) failed: %v; see its output above", err)
		}
	})
	if !*cloudDeployed {
		if err := labenv(ctx, "deploy"); err != nil {
			t.Fatalf("labenv deploy: %v", err)
		}
	}

	runClient, err := run.NewServicesClient(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer runClient.Close()
	scope := leftovers.Scope{Project: vars.Project, Region: vars.Region, Labels: map[string]string{"app": "distributed-lock-lab"}}
	var svcs map[string]leftovers.ServiceStatus
	for deadline := time.Now().Add(10 * time.Minute); ; {
		if svcs, err = leftovers.Services(ctx, scope, runClient); err == nil && svcs["payment-resource"].Ready && svcs["rail-stub"].Ready && svcs["executor"].Ready && svcs["rail-proxy"].Ready {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("services not ready after 10 minutes: %v (%v)", svcs, err)
		}
		time.Sleep(15 * time.Second) // an external system's rollout: nothing to await but its state
	}
	client, err := harness.IDTokenClient(ctx, svcs["payment-resource"].URI, svcs["rail-stub"].URI)
	if err != nil {
		t.Fatal(err)
	}
	cfg := harness.CloudConfig{
		Backend:            "cloud",
		PaymentResourceURL: svcs["payment-resource"].URI,
		RailStubURL:        svcs["rail-stub"].URI,
		HTTP:               client,
		Fences:             harness.CloudRunFences{Client: runClient, Project: vars.Project, Region: vars.Region},
		PayoutPrefix:       gameDayPrefix,
		Pause:              gameDayPause,
		Nonce:              time.Now().UTC().Format("20060102t150405"),
	}
	var runs []*harness.Run
	for _, cell := range harness.Cells {
		r, err := harness.RunCloudCell(ctx, cfg, cell)
		if err != nil {
			t.Errorf("%s: %v", cell.Name(), err)
			continue
		}
		runs = append(runs, r)
		checkCell(t, r)
	}
	t.Logf("cloud game day:\n%s", harness.Table(runs))
}

// cloudWant is the outcome of each cell, the same as the local matrix's
// (TestStaleHolderMatrixOnRealProcesses).
var cloudWant = map[string]struct {
	rail, debits int
	balanced     bool
}{
	"both-on":      {1, 1, true},
	"payment-only": {2, 1, false},
	"rail-only":    {1, 1, true},
	"both-off":     {2, 2, false},
}

func checkCell(t *testing.T, r *harness.Run) {
	t.Helper()
	got, w := r.Summary, cloudWant[r.Cell.Name()]
	if got.RailSubmissions != w.rail || got.Debits != w.debits || got.LedgerBalanced != w.balanced {
		t.Errorf("%s: railSubmissions %d, debits %d, ledgerBalanced %v; want %d, %d, %v",
			r.Cell.Name(), got.RailSubmissions, got.Debits, got.LedgerBalanced, w.rail, w.debits, w.balanced)
	}
}

// operatorMember is the IAM member of the tester: GAME_DAY_OPERATOR, or
// gcloud's active account.
func operatorMember() (string, error) {
	if m := os.Getenv("GAME_DAY_OPERATOR"); m != "" {
		return m, nil
	}
	out, err := exec.Command("gcloud", "config", "get-value", "account").Output()
	acct := strings.TrimSpace(string(out))
	if err != nil || acct == "" {
		return "", fmt.Errorf("no operator: set GAME_DAY_OPERATOR (user:you@example.com) or log in with gcloud: %v", err)
	}
	if strings.HasSuffix(acct, ".gserviceaccount.com") {
		return "serviceAccount:" + acct, nil
	}
	return "user:" + acct, nil
}

// fakeRecords plays payment-resource and the rail-stub for RunCloudCell:
// the payout's history holds the claims given, the audit's debit count
// grows by debits between its two reads, and the rail's journal holds one
// ACK per rail submission of the payout plus one of another payout.
type fakeRecords struct {
	mu       sync.Mutex
	claims   []int64
	rail     int
	debits   int
	audits   int
	payoutID string
}

func (f *fakeRecords) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	f.mu.Lock()
	defer f.mu.Unlock()
	w.Header().Set("Content-Type", "application/json")
	switch {
	case r.Method == http.MethodGet && r.URL.Path == api.PathAudit:
		d := 10
		if f.audits > 0 {
			d += f.debits
		}
		f.audits++
		_ = json.NewEncoder(w).Encode(api.AuditReport{Balanced: true, Debits: d})
	case r.Method == http.MethodPost && r.URL.Path == api.PathAccounts:
		_ = json.NewEncoder(w).Encode(api.Account{AccountID: "a"})
	case r.Method == http.MethodPost && r.URL.Path == api.PathPayouts:
		var req api.PayoutRequest
		_ = json.NewDecoder(r.Body).Decode(&req)
		f.payoutID = req.PayoutID
		w.WriteHeader(http.StatusCreated)
		_ = json.NewEncoder(w).Encode(api.Payout{PayoutID: req.PayoutID, State: api.StatePending})
	case r.Method == http.MethodGet && f.payoutID != "" && r.URL.Path == api.PayoutPath(f.payoutID):
		p := api.Payout{PayoutID: f.payoutID, State: api.StatePosted, History: []api.Transition{{To: api.StatePending}}}
		for i, tok := range f.claims {
			from := api.StatePending
			if i > 0 {
				from = api.StateClaimed
			}
			p.History = append(p.History, api.Transition{From: from, To: api.StateClaimed, Token: tok})
			p.Fence = tok
		}
		_ = json.NewEncoder(w).Encode(p)
	case r.Method == http.MethodGet && r.URL.Path == rail.PathJournal:
		list := rail.SubmissionList{Submissions: []rail.Submission{{Seq: 1, Request: rail.SubmitRequest{PayoutID: "someone-else"}, Answer: rail.SubmitAnswer{Status: rail.StatusAck}}}}
		for i := range f.rail {
			list.Submissions = append(list.Submissions, rail.Submission{Seq: int64(i + 2), Request: rail.SubmitRequest{PayoutID: f.payoutID}, Answer: rail.SubmitAnswer{Status: rail.StatusAck}})
		}
		_ = json.NewEncoder(w).Encode(list)
	default:
		http.NotFound(w, r)
	}
}

type fakeFences struct{ set []harness.Cell }

func (f *fakeFences) SetFencing(_ context.Context, c harness.Cell) error {
	f.set = append(f.set, c)
	return nil
}

// TestRunCloudCellAgainstFakes runs the cloud cell's steps against fakes
// of payment-resource and the rail-stub: the fences are set first, the
// payout id carries the game day's prefix, and the Summary comes from the
// records only (tokens from the payout's claims, the rail's submissions
// of that payout, the debits between the two audits). A payout claimed
// once is no stale-holder run: ErrNoTakeover.
func TestRunCloudCellAgainstFakes(t *testing.T) {
	for _, tc := range []struct {
		name         string
		rec          *fakeRecords
		cell         harness.Cell
		want         harness.Summary
		wantTakeover bool
	}{
		{"payment-only: the rail paid twice", &fakeRecords{claims: []int64{5, 7}, rail: 2, debits: 1}, harness.Cell{PaymentFencing: true},
			harness.Summary{TokenA: 5, TokenB: 7, RailSubmissions: 2, Debits: 1, LedgerBalanced: false}, true},
		{"both-on", &fakeRecords{claims: []int64{5, 7}, rail: 1, debits: 1}, harness.Cell{PaymentFencing: true, RailFencing: true},
			harness.Summary{TokenA: 5, TokenB: 7, RailSubmissions: 1, Debits: 1, LedgerBalanced: true}, true},
		{"no redelivery during the pause", &fakeRecords{claims: []int64{5}, rail: 1, debits: 1}, harness.Cell{PaymentFencing: true, RailFencing: true},
			harness.Summary{TokenA: 5, RailSubmissions: 1, Debits: 1, LedgerBalanced: true}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv := httptest.NewServer(tc.rec)
			defer srv.Close()
			fences := &fakeFences{}
			r, err := harness.RunCloudCell(t.Context(), harness.CloudConfig{
				Backend: "cloud", PaymentResourceURL: srv.URL, RailStubURL: srv.URL, HTTP: srv.Client(), Fences: fences,
				PayoutPrefix: gameDayPrefix, Pause: time.Millisecond, Settle: time.Millisecond, Poll: time.Millisecond, Nonce: "n1",
			}, tc.cell)
			if tc.wantTakeover && err != nil {
				t.Fatalf("RunCloudCell: %v", err)
			}
			if !tc.wantTakeover && !errors.Is(err, harness.ErrNoTakeover) {
				t.Fatalf("RunCloudCell error %v; want ErrNoTakeover", err)
			}
			if len(fences.set) != 1 || fences.set[0] != tc.cell {
				t.Errorf("fences set %v; want once, %v", fences.set, tc.cell)
			}
			if !strings.HasPrefix(tc.rec.payoutID, gameDayPrefix) {
				t.Errorf("payout id %q does not start with the game day's prefix %q: the pause fault would not select it", tc.rec.payoutID, gameDayPrefix)
			}
			got := r.Summary
			tc.want.Backend, tc.want.PaymentFencing, tc.want.RailFencing, tc.want.PayoutID = "cloud", tc.cell.PaymentFencing, tc.cell.RailFencing, tc.rec.payoutID
			tc.want.FencedOut = []harness.FencedOut{}
			gj, _ := json.Marshal(got)
			wj, _ := json.Marshal(tc.want)
			if !bytes.Equal(gj, wj) {
				t.Errorf("summary\n got %s\nwant %s", gj, wj)
			}
		})
	}
}

// TestMissingCredentialsSkipTheCloudGameDay runs this test binary with
// -cloud and no credentials: it must pass (never fail), run no local
// experiment, and skip with exactly one line naming each missing piece.
func TestMissingCredentialsSkipTheCloudGameDay(t *testing.T) {
	if *cloudFlag {
		t.Skip("checks the binary without credentials")
	}
	cmd := exec.CommandContext(t.Context(), os.Args[0], "-test.v", "-cloud")
	for _, kv := range os.Environ() {
		k, _, _ := strings.Cut(kv, "=")
		switch k {
		case tfdriver.EnvProject, tfdriver.EnvBillingAccount, "TF_VAR_billing_account", "GOOGLE_APPLICATION_CREDENTIALS", "CLOUDSDK_CONFIG", "HOME":
			continue
		}
		cmd.Env = append(cmd.Env, kv)
	}
	cmd.Env = append(cmd.Env, "HOME="+t.TempDir())
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("-cloud without credentials failed: %v\n%s", err, out)
	}
	var lines []string
	for _, l := range strings.Split(string(out), "\n") {
		if strings.Contains(l, "harness -cloud: skipped:") {
			lines = append(lines, l)
		}
	}
	if len(lines) != 1 {
		t.Fatalf("want exactly one skip line, got %d:\n%s", len(lines), out)
	}
	for _, want := range []string{tfdriver.EnvProject, tfdriver.EnvBillingAccount, "gcloud auth application-default login"} {
		if !strings.Contains(lines[0], want) {
			t.Errorf("skip line %q does not name %s", lines[0], want)
		}
	}
	if !strings.Contains(string(out), "--- SKIP: TestCloudGameDay") || strings.Contains(string(out), "=== RUN   TestStaleHolder") {
		t.Errorf("-cloud ran other tests than TestCloudGameDay, or did not skip it:\n%s", out)
	}
}
