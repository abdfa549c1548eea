package bootstrap

import (
	"context"
	"errors"
	"fmt"

	"google.golang.org/api/option"
	serviceusage "google.golang.org/api/serviceusage/v1"
)

// serviceUsage is Services over the Service Usage API.
type serviceUsage struct {
	s       *serviceusage.Service
	project string
	w       Wait
}

// NewServiceUsage returns the project's Services through the Service
// Usage API; w paces the polling of its operations.
func NewServiceUsage(ctx context.Context, project string, w Wait, opts ...option.ClientOption) (Services, error) {
	s, err := serviceusage.NewService(ctx, opts...)
	if err != nil {
		return nil, fmt.Errorf("bootstrap: Service Usage client: %w", err)
	}
	return serviceUsage{s: s, project: project, w: w.withDefaults()}, nil
}

func (u serviceUsage) name(service string) string {
	return "projects/" + u.project + "/services/" + service
}

func (u serviceUsage) Enabled(ctx context.Context, service string) (bool, error) {
	s, err := u.s.Services.Get(u.name(service)).Context(ctx).Do()
	if err != nil {
		return false, err
	}
	return s.State == "ENABLED", nil
}

func (u serviceUsage) Enable(ctx context.Context, service string) error {
	op, err := u.s.Services.Enable(u.name(service), &serviceusage.EnableServiceRequest{}).Context(ctx).Do()
	for waited := 0 * u.w.Interval; err == nil && !op.Done; waited += u.w.Interval {
		if waited >= u.w.Timeout {
			return fmt.Errorf("operation %s not done after %s", op.Name, waited)
		}
		if err = u.w.Sleep(ctx, u.w.Interval); err == nil {
			op, err = u.s.Operations.Get(op.Name).Context(ctx).Do()
		}
	}
	if err != nil {
		return err
	}
	if op.Error != nil {
		return errors.New(op.Error.Message)
	}
	return nil
}
