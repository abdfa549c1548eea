// Package bootstrap makes a project ready for labenv before Terraform
// runs: each API labenv itself calls (and the providers need before they
// can enable the rest) is enabled through Service Usage, then probed
// until it stops answering SERVICE_DISABLED, which Google documents as
// lasting a few minutes after enablement. Ensure does it; Check only
// reports. docs/cloud.md has the order and the reasons.
package bootstrap

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/googleapis/gax-go/v2/apierror"
)

var (
	// ErrNotReady: something a first run needs is missing; the message
	// has one line per missing thing, each saying what to do.
	ErrNotReady = errors.New("bootstrap: the project is not ready")
	// ErrServiceDisabled marks an answer 403 SERVICE_DISABLED: the API is
	// off in the project (or was enabled moments ago).
	ErrServiceDisabled = errors.New("bootstrap: service disabled")
)

// API is one Google API that must answer before Terraform runs.
type API struct {
	// Service is its name, "secretmanager.googleapis.com".
	Service string
	// Why says who needs it, for the messages.
	Why string
	// Probe is a cheap read of the API; once it returns anything but
	// SERVICE_DISABLED the API is usable. Nil: the state Service Usage
	// reports is taken as is.
	Probe func(ctx context.Context) error
}

// Services reads and changes which APIs are enabled in the project.
// NewServiceUsage returns the Service Usage one.
type Services interface {
	// Enabled reports whether service is enabled.
	Enabled(ctx context.Context, service string) (bool, error)
	// Enable enables service and returns once Service Usage's operation is
	// done (which is before every caller sees it: see API.Probe).
	Enable(ctx context.Context, service string) error
}

// Wait is how readiness is awaited.
type Wait struct {
	// Interval between two probes. Default 10 s.
	Interval time.Duration
	// Timeout for one API to become usable after enablement. Default 5
	// min: Google documents "a few minutes" of propagation.
	Timeout time.Duration
	// Sleep waits d or until ctx ends. Default a timer; tests pass one
	// that advances a fake clock.
	Sleep func(ctx context.Context, d time.Duration) error
}

func (w Wait) withDefaults() Wait {
	if w.Interval <= 0 {
		w.Interval = 10 * time.Second
	}
	if w.Timeout <= 0 {
		w.Timeout = 5 * time.Minute
	}
	if w.Sleep == nil {
		w.Sleep = Sleep
	}
	return w
}

// Sleep waits d, or returns ctx's error when ctx ends first.
func Sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// ServiceDisabled reports whether err is Google's 403 SERVICE_DISABLED
// (gRPC or REST), and names the service when the answer does.
func ServiceDisabled(err error) (service string, ok bool) {
	if errors.Is(err, ErrServiceDisabled) {
		return "", true
	}
	var ae *apierror.APIError
	if !errors.As(err, &ae) {
		if ae, ok = apierror.FromError(err); !ok {
			return "", false
		}
	}
	if ae.Reason() != "SERVICE_DISABLED" {
		return "", false
	}
	return ae.Metadata()["service"], true
}

// Ensure enables each API that is off, in order, and waits until each
// answers. It goes on past an API it cannot make ready, so that the error
// (wrapping ErrNotReady) names every one, one line each.
func Ensure(ctx context.Context, project string, svcs Services, apis []API, w Wait, log *slog.Logger) error {
	w = w.withDefaults()
	var missing []string
	for _, a := range apis {
		on, err := svcs.Enabled(ctx, a.Service)
		if err != nil {
			missing = append(missing, stateProblem(project, a, err))
			if _, off := ServiceDisabled(err); off {
				break // Service Usage itself is off: nothing else can be read
			}
			continue
		}
		if !on {
			log.InfoContext(ctx, "enabling an API", "event", EventEnabling, "service", a.Service, "why", a.Why)
			if err := svcs.Enable(ctx, a.Service); err != nil {
				missing = append(missing, fmt.Sprintf("%s (%s) could not be enabled: %v; run: gcloud services enable %s --project %s", a.Service, a.Why, err, a.Service, project))
				continue
			}
		}
		if err := awaitProbe(ctx, a, w); err != nil {
			missing = append(missing, err.Error())
			continue
		}
		log.InfoContext(ctx, "API ready", "event", EventReady, "service", a.Service, "enabled_now", !on)
	}
	return notReady(missing)
}

// Check reports, without changing anything, each API that is off; plan
// and destroy print it and go on.
func Check(ctx context.Context, project string, svcs Services, apis []API) error {
	var missing []string
	for _, a := range apis {
		on, err := svcs.Enabled(ctx, a.Service)
		switch {
		case err != nil:
			missing = append(missing, stateProblem(project, a, err))
			if _, off := ServiceDisabled(err); off {
				return notReady(missing)
			}
		case !on:
			missing = append(missing, fmt.Sprintf("%s (%s) is not enabled: labenv deploy enables it", a.Service, a.Why))
		}
	}
	return notReady(missing)
}

func notReady(missing []string) error {
	if len(missing) == 0 {
		return nil
	}
	errs := []error{ErrNotReady}
	for _, m := range missing {
		errs = append(errs, errors.New(m))
	}
	return errors.Join(errs...)
}

func stateProblem(project string, a API, err error) string {
	if _, off := ServiceDisabled(err); off {
		return fmt.Sprintf("the Service Usage API is off in %s, the quota project of labenv's calls: run: gcloud services enable serviceusage.googleapis.com --project %s", project, project)
	}
	return fmt.Sprintf("cannot read whether %s (%s) is enabled in %s: %v (you need serviceusage.services.get and .use there, e.g. roles/serviceusage.serviceUsageAdmin)", a.Service, a.Why, project, err)
}

// awaitProbe probes a until it answers with anything but
// SERVICE_DISABLED, for at most w.Timeout of w.Sleep.
func awaitProbe(ctx context.Context, a API, w Wait) error {
	if a.Probe == nil {
		return nil
	}
	var waited time.Duration
	for {
		err := a.Probe(ctx)
		if _, off := ServiceDisabled(err); !off {
			return nil
		}
		if waited >= w.Timeout {
			return fmt.Errorf("%s (%s) is enabled but still answers SERVICE_DISABLED after %s: run labenv again in a few minutes", a.Service, a.Why, waited)
		}
		if err := w.Sleep(ctx, w.Interval); err != nil {
			return fmt.Errorf("%s: waiting for it to answer: %w", a.Service, err)
		}
		waited += w.Interval
	}
}

// Log events of the bootstrap (docs/log-events.md, section terraform).
const (
	// EventEnabling (INFO): an API was off and is being enabled: service, why.
	EventEnabling = "bootstrap_enabling"
	// EventReady (INFO): an API answers: service, enabled_now.
	EventReady = "bootstrap_api_ready"
)
