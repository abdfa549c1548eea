package harness

// The fencing experiment on Google Cloud (go test ./harness -cloud,
// docs/cloud.md). The local run stops executor A with SIGSTOP and plays the
// push subscription itself; on Cloud Run neither is possible, so a cloud
// cell leans on the real system instead:
//
//  1. the fence kill switches of the cell are set on the payment-resource
//     and rail-proxy services through the Cloud Run Admin API (a new
//     revision each; the harness waits for it to serve);
//  2. an account and a payout are created at payment-resource, the payout
//     id starting with the game day's prefix (terraform var.game_day), so
//     that the executor's pause fault (EXECUTOR_FAULT_PAUSE_*) selects it;
//  3. payment-resource publishes the payout event; Pub/Sub pushes it to the
//     executor (delivery 1), which takes the lease, claims, confirms its
//     lease and pauses past its TTL without renewing;
//  4. the push is not answered within the ack deadline, so Pub/Sub
//     delivers the message again (delivery 2, not paused), which takes the
//     lease with a newer token and completes the payout;
//  5. delivery 1 wakes and carries on with its stale token; the fences
//     that are on refuse it.
//
// The outcome is measured, as locally, only from the records: the
// rail-stub's journal (GET /submissions) and payment-resource's payout and
// audit (GET /v1/payouts/{id}, GET /v1/audit), read over HTTPS with an ID
// token of the operator. The tokens of A and B come from the payout's
// history (the first claim's token, and the highest token written). The
// fenced_out events live in Cloud Logging and are not collected: a cloud
// Summary's FencedOut stays empty.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"os/exec"
	"strconv"
	"strings"
	"time"

	run "cloud.google.com/go/run/apiv2"
	"cloud.google.com/go/run/apiv2/runpb"
	"golang.org/x/oauth2"
	"google.golang.org/api/idtoken"

	"github.com/distributed-lock-lab/distributed-lock-lab/functions/paymentresource/api"
	payclient "github.com/distributed-lock-lab/distributed-lock-lab/functions/paymentresource/client"
	"github.com/distributed-lock-lab/distributed-lock-lab/functions/rail"
	railapi "github.com/distributed-lock-lab/distributed-lock-lab/functions/railproxy/api"
	"github.com/distributed-lock-lab/distributed-lock-lab/internal/idtokens"
)

// ErrNoTakeover: the payout of a cloud cell was claimed only once, so no
// redelivery took over while delivery 1 was paused (the pause was shorter
// than the ack deadline plus the backoff, or the pause fault was not
// armed): the run does not show a stale holder and proves nothing.
var ErrNoTakeover = errors.New("harness: no second holder took over during the pause")

// EventCloudPayoutCreated (INFO) is the harness's log event when a cloud
// cell has created its payout and waits out the pause (cell, payoutId,
// until).
const EventCloudPayoutCreated = "cloud_payout_created"

// FenceSwitch sets the two fencing kill switches of a cell on the
// deployed services and returns once both serve with them.
type FenceSwitch interface {
	SetFencing(ctx context.Context, cell Cell) error
}

// CloudConfig configures RunCloudCell.
type CloudConfig struct {
	// Backend names lock-server's LOCK_STORE on GKE, for the Summary.
	Backend string
	// PaymentResourceURL and RailStubURL are the services' https URLs.
	PaymentResourceURL, RailStubURL string
	// HTTP reaches both with an ID token of the operator (IDTokenClient).
	HTTP *http.Client
	// Fences sets the kill switches (CloudRunFences).
	Fences FenceSwitch
	// PayoutPrefix is the game day's payout prefix (game_day.payout_prefix).
	PayoutPrefix string
	// Pause is the executor's pause (game_day.pause_ms).
	Pause time.Duration
	// Settle is how long after the pause the harness waits for the stale
	// delivery's writes before it reads the records. Default 45 s.
	Settle time.Duration
	// Poll is the interval of the payout reads while waiting. Default 5 s.
	Poll time.Duration
	// Nonce makes this game day's ids unique (accounts and payouts are
	// never deleted).
	Nonce string
	// Log receives progress lines. Default: discard.
	Log *slog.Logger
}

// RunCloudCell runs one fencing cell against the deployed services and
// returns the Run, of the same shape as a local one (Events, Dir and the
// process times stay empty; AnswerA and AnswerB are not seen: Pub/Sub
// received them). It returns ErrNoTakeover when the run shows no stale
// holder, or the error of a step.
func RunCloudCell(ctx context.Context, cfg CloudConfig, cell Cell) (*Run, error) {
	t0 := time.Now()
	if cfg.Settle == 0 {
		cfg.Settle = 45 * time.Second
	}
	if cfg.Poll == 0 {
		cfg.Poll = 5 * time.Second
	}
	log := cfg.Log
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	if cfg.HTTP == nil || cfg.Fences == nil || cfg.PayoutPrefix == "" || cfg.Pause <= 0 {
		return nil, errors.New("harness: CloudConfig needs HTTP, Fences, PayoutPrefix and Pause")
	}
	pay, err := payclient.New(cfg.PaymentResourceURL, payclient.WithHTTPClient(cfg.HTTP))
	if err != nil {
		return nil, err
	}
	if err := cfg.Fences.SetFencing(ctx, cell); err != nil {
		return nil, fmt.Errorf("%s: setting the fences: %w", cell.Name(), err)
	}
	before, err := pay.Audit(ctx)
	if err != nil {
		return nil, fmt.Errorf("%s: audit before: %w", cell.Name(), err)
	}
	accountID := "gd-" + cell.Name() + "-" + cfg.Nonce
	payoutID := cfg.PayoutPrefix + cell.Name() + "-" + cfg.Nonce
	opening := int64(OpeningBalanceMinor)
	if _, err := pay.CreateAccount(ctx, api.AccountRequest{AccountID: accountID, Currency: Currency, OpeningBalanceMinor: &opening}); err != nil {
		return nil, fmt.Errorf("%s: create account: %w", cell.Name(), err)
	}
	created := time.Now()
	if _, err := pay.CreatePayout(ctx, api.PayoutRequest{PayoutID: payoutID, AccountID: accountID, AmountMinor: AmountMinor, Currency: Currency}); err != nil {
		return nil, fmt.Errorf("%s: create payout: %w", cell.Name(), err)
	}
	log.Info("payout created; waiting out the pause and the stale delivery", "event", EventCloudPayoutCreated, "cell", cell.Name(),
		"payoutId", payoutID, "until", created.Add(cfg.Pause+cfg.Settle).UTC())
	// The stale delivery leaves no record when a fence refuses it: the only
	// sign that it is over is the time its pause ends, plus its bounded calls.
	until := created.Add(cfg.Pause + cfg.Settle)
	var p api.Payout
	for {
		if p, err = pay.PayoutWithHistory(ctx, payoutID); err != nil {
			return nil, fmt.Errorf("%s: read payout: %w", cell.Name(), err)
		}
		if !time.Now().Before(until) {
			break
		}
		t := time.NewTimer(min(cfg.Poll, time.Until(until)))
		select {
		case <-ctx.Done():
			t.Stop()
			return nil, ctx.Err()
		case <-t.C:
		}
	}
	var subs rail.SubmissionList
	if err := getJSONWith(ctx, cfg.HTTP, strings.TrimSuffix(cfg.RailStubURL, "/")+rail.PathJournal, &subs); err != nil {
		return nil, fmt.Errorf("%s: rail-stub submissions: %w", cell.Name(), err)
	}
	after, err := pay.Audit(ctx)
	if err != nil {
		return nil, fmt.Errorf("%s: audit after: %w", cell.Name(), err)
	}
	r := &Run{Cell: cell, Summary: CloudSummary(cfg.Backend, cell, p, subs.Submissions, before, after)}
	if r.Audit, err = json.Marshal(after); err != nil {
		return nil, err
	}
	r.Took = time.Since(t0)
	if r.Summary.TokenA == 0 || r.Summary.TokenB <= r.Summary.TokenA {
		return r, fmt.Errorf("%s: payout %s: tokens A %d, B %d: %w", cell.Name(), payoutID, r.Summary.TokenA, r.Summary.TokenB, ErrNoTakeover)
	}
	return r, nil
}

// CloudSummary measures a cloud cell from the records: p is the payout at
// the end, subs the rail-stub's journal, before and after payment-resource's
// audits around the cell (their debit counts differ by the cell's debits:
// cells run one after another on the same database). TokenA is the token
// of the payout's first claim, TokenB the highest token written to it
// (the payout's fence) when higher. LedgerBalanced needs the audit to
// hold, the rail to have received the payout at most once, and every rail
// acknowledgement of it to have its debit.
func CloudSummary(backend string, cell Cell, p api.Payout, subs []rail.Submission, before, after api.AuditReport) Summary {
	s := Summary{Backend: backend, PaymentFencing: cell.PaymentFencing, RailFencing: cell.RailFencing, PayoutID: p.PayoutID, FencedOut: []FencedOut{}}
	for _, t := range p.History {
		if t.To != api.StateClaimed || t.Token == 0 {
			continue
		}
		if s.TokenA == 0 {
			s.TokenA = t.Token
		}
		if t.Token > s.TokenB {
			s.TokenB = t.Token
		}
	}
	if p.Fence > s.TokenB {
		s.TokenB = p.Fence
	}
	if s.TokenB == s.TokenA {
		s.TokenB = 0 // one holder only
	}
	acks := 0
	for _, sub := range subs {
		if sub.Request.PayoutID != p.PayoutID {
			continue
		}
		s.RailSubmissions++
		if sub.Answer.Status == rail.StatusAck {
			acks++
		}
	}
	s.Debits = after.Debits - before.Debits
	s.LedgerBalanced = after.Balanced && s.RailSubmissions <= 1 && acks <= s.Debits
	return s
}

// CloudRunFences sets the kill switches through the Cloud Run Admin API:
// PAYMENT_FENCING_ENABLED on payment-resource and
// RAIL_PROXY_FENCING_ENABLED on rail-proxy, each a new revision, waited
// for. Terraform's state does not know these values; destroy does not
// care.
type CloudRunFences struct {
	// Client is a Cloud Run Admin API v2 client.
	Client *run.ServicesClient
	// Project and Region locate the services.
	Project, Region string
}

// SetFencing updates both services (only when a value changes).
func (f CloudRunFences) SetFencing(ctx context.Context, cell Cell) error {
	for _, s := range []struct {
		service, env string
		on           bool
	}{{"payment-resource", api.EnvFencingEnabled, cell.PaymentFencing}, {"rail-proxy", railapi.EnvFencingEnabled, cell.RailFencing}} {
		name := "projects/" + f.Project + "/locations/" + f.Region + "/services/" + s.service
		svc, err := f.Client.GetService(ctx, &runpb.GetServiceRequest{Name: name})
		if err != nil {
			return fmt.Errorf("get %s: %w", s.service, err)
		}
		if !setEnv(svc, s.env, strconv.FormatBool(s.on)) {
			continue
		}
		op, err := f.Client.UpdateService(ctx, &runpb.UpdateServiceRequest{Service: svc})
		if err != nil {
			return fmt.Errorf("update %s: %w", s.service, err)
		}
		if _, err := op.Wait(ctx); err != nil {
			return fmt.Errorf("update %s: %w", s.service, err)
		}
	}
	return nil
}

// setEnv sets key=value on the first container of svc's template and
// reports whether anything changed.
func setEnv(svc *runpb.Service, key, value string) bool {
	cs := svc.GetTemplate().GetContainers()
	if len(cs) == 0 {
		return false
	}
	for _, e := range cs[0].Env {
		if e.GetName() == key {
			if e.GetValue() == value {
				return false
			}
			e.Values = &runpb.EnvVar_Value{Value: value}
			return true
		}
	}
	cs[0].Env = append(cs[0].Env, &runpb.EnvVar{Name: key, Values: &runpb.EnvVar_Value{Value: value}})
	return true
}

// IDTokenClient returns an HTTP client that adds an ID token of the
// operator to every request to the audiences (the services' URLs), and to
// no other origin. Service-account credentials (ADC, or impersonation)
// mint tokens through google.golang.org/api/idtoken; a user's
// credentials cannot, so for them the token is `gcloud auth
// print-identity-token`, which Cloud Run accepts from a user holding
// run.invoker.
func IDTokenClient(ctx context.Context, audiences ...string) (*http.Client, error) {
	tr, err := idtokens.New(ctx, nil, func(ctx context.Context, aud string) (oauth2.TokenSource, error) {
		if ts, err := idtoken.NewTokenSource(ctx, aud); err == nil {
			return ts, nil
		}
		return oauth2.ReuseTokenSource(nil, gcloudIDToken{}), nil
	}, audiences...)
	if err != nil {
		return nil, err
	}
	return &http.Client{Transport: tr, Timeout: 30 * time.Second}, nil
}

// gcloudIDToken is the user's ID token from gcloud, valid about an hour
// (reused for 50 minutes).
type gcloudIDToken struct{}

// Token runs gcloud auth print-identity-token.
func (gcloudIDToken) Token() (*oauth2.Token, error) {
	out, err := exec.Command("gcloud", "auth", "print-identity-token").Output()
	if err != nil {
		return nil, fmt.Errorf("gcloud auth print-identity-token: %w", err)
	}
	return &oauth2.Token{AccessToken: strings.TrimSpace(string(out)), TokenType: "Bearer", Expiry: time.Now().Add(50 * time.Minute)}, nil
}

// getJSONWith is getJSON through c.
func getJSONWith(ctx context.Context, c *http.Client, u string, v any) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return err
	}
	resp, err := c.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("GET %s: %s", u, resp.Status)
	}
	return json.NewDecoder(resp.Body).Decode(v)
}
