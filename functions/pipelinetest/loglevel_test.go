package pipelinetest_test

import (
	"bytes"
	"encoding/json"
	"log/slog"
	"maps"
	"strings"
	"testing"
	"time"

	"github.com/distributed-lock-lab/distributed-lock-lab/functions/executor"
	"github.com/distributed-lock-lab/distributed-lock-lab/functions/paymentresource/api"
	"github.com/distributed-lock-lab/distributed-lock-lab/functions/payoutevent"
	"github.com/distributed-lock-lab/distributed-lock-lab/functions/pipelinetest"
	railapi "github.com/distributed-lock-lab/distributed-lock-lab/functions/railproxy/api"
	"github.com/distributed-lock-lab/distributed-lock-lab/internal/logjson"
	"github.com/distributed-lock-lab/distributed-lock-lab/lockserver"
)

// TestAPostedPayoutLogsOneInfoLinePerDecision: a payout that goes through
// leaves, at INFO, one line per decision about it (docs/log-events.md,
// "What is INFO"): payment-resource's creation and posting, lock-server's
// grant, rail-proxy's rail answer and the executor's outcome. The lines
// that restate them are still written at DEBUG.
func TestAPostedPayoutLogsOneInfoLinePerDecision(t *testing.T) {
	msgs := make(capture, 4)
	var logs lockedBuffer
	log := logjson.New(&logs, slog.LevelDebug, false)
	p := pipelinetest.Start(t, pipelinetest.Options{Publisher: msgs, Log: log})
	ev := payoutevent.Event{PayoutID: "p-quiet", AccountID: "acct-quiet", AmountMinor: 2500, Currency: "EUR"}
	opening := int64(1_000_000)
	if _, err := p.Pay.CreateAccount(t.Context(), api.AccountRequest{AccountID: ev.AccountID, Currency: ev.Currency, OpeningBalanceMinor: &opening}); err != nil {
		t.Fatal(err)
	}
	if _, err := p.Pay.CreatePayout(t.Context(), api.PayoutRequest{PayoutID: ev.PayoutID, AccountID: ev.AccountID, AmountMinor: ev.AmountMinor, Currency: ev.Currency}); err != nil {
		t.Fatal(err)
	}
	msg := msgs.next(t)
	cfg := executor.DefaultConfig()
	cfg.LockServerURL, cfg.PaymentResourceURL, cfg.RailProxyURL = p.LockURL, p.PayURL, p.ProxyURL
	cfg.Owner, cfg.LeaseTTL = "A", 10*time.Minute
	x, err := executor.New(cfg, log.With("service", "executor"))
	if err != nil {
		t.Fatal(err)
	}
	pushPosted(t, x, msg) // the release follows the answer; this waits for it

	info := map[string][]string{} // service -> events at INFO
	debug := map[string]int{}     // service -> lines at DEBUG
	for _, line := range bytes.Split(logs.Bytes(), []byte("\n")) {
		var l map[string]any
		if json.Unmarshal(line, &l) != nil || (l["key"] != ev.LockKey() && l["payoutId"] != ev.PayoutID) {
			continue
		}
		svc, _ := l["service"].(string)
		event, _ := l["event"].(string)
		switch l["level"] {
		case "INFO":
			info[svc] = append(info[svc], event)
		case "DEBUG":
			debug[svc]++
		}
	}
	want := map[string][]string{
		"payment-resource": {api.EventPayoutCreated, api.EventPayoutPosted},
		"lock-server":      {lockserver.EventLockGranted},
		"rail-proxy":       {railapi.EventSubmissionAcked},
		"executor":         {executor.EventPayoutPosted},
	}
	if !maps.EqualFunc(info, want, func(a, b []string) bool { return strings.Join(a, ",") == strings.Join(b, ",") }) {
		t.Errorf("INFO lines about the payout by service: %v; want %v", info, want)
	}
	// The step lines are there at DEBUG: the INFO count above is not
	// blind to them.
	if debug["executor"] == 0 || debug["lock-server"] == 0 || debug["rail-proxy"] == 0 {
		t.Errorf("DEBUG lines about the payout by service: %v; want the step lines of the executor, lock-server and rail-proxy", debug)
	}
}
