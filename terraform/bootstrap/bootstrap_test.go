package bootstrap_test

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/distributed-lock-lab/distributed-lock-lab/terraform/bootstrap"
)

// services is a Services whose APIs are on when listed in on.
type services struct{ on map[string]bool }

func (s *services) Enabled(_ context.Context, svc string) (bool, error) { return s.on[svc], nil }
func (s *services) Enable(_ context.Context, svc string) error {
	s.on[svc] = true
	return nil
}

func disabled(svc string) error {
	st, _ := status.New(codes.PermissionDenied, "disabled").WithDetails(&errdetails.ErrorInfo{Reason: "SERVICE_DISABLED", Metadata: map[string]string{"service": svc}})
	return st.Err()
}

func TestServiceDisabledIsReadFromTheErrorInfo(t *testing.T) {
	if svc, ok := bootstrap.ServiceDisabled(disabled("run.googleapis.com")); !ok || svc != "run.googleapis.com" {
		t.Errorf("ServiceDisabled(gRPC SERVICE_DISABLED) = %q, %v; want run.googleapis.com, true", svc, ok)
	}
	if _, ok := bootstrap.ServiceDisabled(status.Error(codes.PermissionDenied, "denied")); ok {
		t.Error("ServiceDisabled(a plain permission denied) = true, want false")
	}
}

// TestEnsureWaitsOutPropagationAndGivesUpWithAMessage: an API that is off
// is enabled and probed until it answers; one that never answers ends in
// one line after the timeout, without a real second of waiting.
func TestEnsureWaitsOutPropagationAndGivesUpWithAMessage(t *testing.T) {
	var waited time.Duration
	w := bootstrap.Wait{Interval: 10 * time.Second, Timeout: time.Minute, Sleep: func(_ context.Context, d time.Duration) error {
		waited += d
		return nil
	}}
	svcs := &services{on: map[string]bool{}}
	probes := 0
	apis := []bootstrap.API{
		{Service: "a.googleapis.com", Why: "a", Probe: func(context.Context) error {
			if probes++; probes < 3 {
				return disabled("a.googleapis.com")
			}
			return errors.New("404: the API answers")
		}},
		{Service: "b.googleapis.com", Why: "b", Probe: func(context.Context) error { return disabled("b.googleapis.com") }},
	}
	err := bootstrap.Ensure(context.Background(), "lab-1", svcs, apis, w, slog.New(slog.DiscardHandler))
	if !svcs.on["a.googleapis.com"] || !svcs.on["b.googleapis.com"] {
		t.Errorf("enabled %v, want both", svcs.on)
	}
	if !errors.Is(err, bootstrap.ErrNotReady) || strings.Contains(err.Error(), "a.googleapis.com") ||
		!strings.Contains(err.Error(), "b.googleapis.com (b) is enabled but still answers SERVICE_DISABLED after 1m0s") {
		t.Errorf("Ensure = %v; want ErrNotReady naming b alone", err)
	}
	if want := 20*time.Second + time.Minute; waited != want {
		t.Errorf("waited %s, want %s (two probes of a, then b's timeout)", waited, want)
	}
}
