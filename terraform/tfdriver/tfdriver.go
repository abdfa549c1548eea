// Package tfdriver drives the terraform binary through one environment's
// lifecycle with terraform-exec: init, plan to a saved plan file (whose
// resource counts are logged before anything is applied), apply of exactly
// that plan, outputs, and destroy. Each step is logged with its duration.
//
// Run is the whole lifecycle for a game day or a test: destroy runs even
// when apply failed half-way or the work in between failed, because a
// half-applied environment still costs money. The same code drives the
// real module in terraform/ (with a Google Cloud project) and the
// provider-free fixture its tests use.
//
// The package only runs an installed terraform binary: it never downloads
// one (Terraform cannot be built from the module proxy, and this machine
// has no network).
package tfdriver

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/hashicorp/terraform-exec/tfexec"
	tfjson "github.com/hashicorp/terraform-json"
)

// DefaultPlanFile is the plan file's name inside Config.Dir when
// Config.PlanFile is empty.
const DefaultPlanFile = "lab.tfplan"

var (
	// ErrNoTerraform: no terraform binary at Config.ExecPath or on PATH.
	ErrNoTerraform = errors.New("tfdriver: terraform binary not found")
	// ErrInvalidConfig: Dir is missing or not a directory, or a variable
	// has an empty name.
	ErrInvalidConfig = errors.New("tfdriver: invalid config")
	// ErrStep wraps the error of a failed terraform step; the message names
	// the step (init, plan, apply, output, destroy, state).
	ErrStep = errors.New("tfdriver: terraform step failed")
)

// Config says which module to drive and how.
type Config struct {
	// Dir is the root module's directory (working directory of terraform).
	// Required. Init writes .terraform/ there, apply writes the local state
	// there unless the module configures a backend.
	Dir string
	// ExecPath is the terraform binary. Empty: "terraform" looked up on
	// PATH.
	ExecPath string
	// Vars are passed as -var name=value to plan and destroy, in name order.
	Vars map[string]string
	// PlanFile is where plan saves the plan and apply reads it, relative to
	// Dir unless absolute. Default DefaultPlanFile.
	PlanFile string
	// Output receives terraform's own stdout and stderr. Nil discards it
	// (the step log lines remain).
	Output io.Writer
}

// Validate returns an error wrapping ErrInvalidConfig.
func (c Config) Validate() error {
	if c.Dir == "" {
		return fmt.Errorf("%w: Dir is empty", ErrInvalidConfig)
	}
	fi, err := os.Stat(c.Dir)
	if err != nil {
		return fmt.Errorf("%w: Dir: %v", ErrInvalidConfig, err)
	}
	if !fi.IsDir() {
		return fmt.Errorf("%w: Dir %s is not a directory", ErrInvalidConfig, c.Dir)
	}
	for k := range c.Vars {
		if k == "" {
			return fmt.Errorf("%w: a variable has an empty name", ErrInvalidConfig)
		}
	}
	return nil
}

// Driver runs terraform steps in one module directory. Its methods must not
// be called concurrently (terraform itself locks the state).
type Driver struct {
	cfg Config
	tf  *tfexec.Terraform
	log *slog.Logger
	// stderr collects terraform's stderr during one step: a failed
	// step's error carries its diagnostics.
	stderr *lockedBuffer
}

// lockedBuffer is a bytes.Buffer that terraform-exec's goroutines may
// write to.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

// lockedWriter serialises writes to w.
type lockedWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

// take returns what was written and empties the buffer.
func (l *lockedBuffer) take() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	s := l.b.String()
	l.b.Reset()
	return s
}

// New checks cfg, finds the terraform binary and returns a Driver. It
// returns an error wrapping ErrInvalidConfig or ErrNoTerraform.
func New(cfg Config, log *slog.Logger) (*Driver, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	exe, err := FindTerraform(cfg.ExecPath)
	if err != nil {
		return nil, err
	}
	if cfg.PlanFile == "" {
		cfg.PlanFile = DefaultPlanFile
	}
	if !filepath.IsAbs(cfg.PlanFile) {
		cfg.PlanFile = filepath.Join(cfg.Dir, cfg.PlanFile)
	}
	tf, err := tfexec.NewTerraform(cfg.Dir, exe)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrInvalidConfig, err)
	}
	stderr := &lockedBuffer{}
	if cfg.Output != nil {
		// terraform-exec copies stdout and stderr from two goroutines.
		out := &lockedWriter{w: cfg.Output}
		tf.SetStdout(out)
		tf.SetStderr(io.MultiWriter(out, stderr))
	} else {
		tf.SetStderr(stderr)
	}
	return &Driver{cfg: cfg, tf: tf, log: log.With("module", cfg.Dir), stderr: stderr}, nil
}

// FindTerraform returns the path of the terraform binary: path itself when
// it is not empty, else "terraform" on PATH. The error wraps ErrNoTerraform
// and says where it looked.
func FindTerraform(path string) (string, error) {
	if path == "" {
		p, err := exec.LookPath("terraform")
		if err != nil {
			return "", fmt.Errorf("%w on PATH (%v): install Terraform 1.9 or later", ErrNoTerraform, err)
		}
		return p, nil
	}
	fi, err := os.Stat(path)
	if err != nil || fi.IsDir() || fi.Mode()&0o111 == 0 {
		return "", fmt.Errorf("%w at %s", ErrNoTerraform, path)
	}
	return path, nil
}

// step runs fn and logs its outcome and duration (duration_ms). A failed
// step's error ends with terraform's diagnostics (its stderr from the
// first "Error:" on), which Transient reads.
func (d *Driver) step(ctx context.Context, name string, fn func() error) error {
	start := time.Now()
	d.log.InfoContext(ctx, "terraform step started", "event", EventStepStarted, "step", name)
	d.stderr.take()
	err := fn()
	ms := time.Since(start).Milliseconds()
	if err != nil {
		d.log.ErrorContext(ctx, "terraform step failed", "event", EventStepFailed, "step", name, "duration_ms", ms, "err", err)
		if diag := d.stderr.take(); strings.Contains(diag, "Error:") && !strings.Contains(err.Error(), "Error:") {
			return fmt.Errorf("%w: %s: %w\n%s", ErrStep, name, err, strings.TrimSpace(diag[strings.Index(diag, "Error:"):]))
		}
		return fmt.Errorf("%w: %s: %w", ErrStep, name, err)
	}
	d.log.InfoContext(ctx, "terraform step done", "event", EventStepDone, "step", name, "duration_ms", ms)
	return nil
}

func (d *Driver) varOptionsPlan() []tfexec.PlanOption {
	var opts []tfexec.PlanOption
	for _, k := range sortedKeys(d.cfg.Vars) {
		opts = append(opts, tfexec.Var(k+"="+d.cfg.Vars[k]))
	}
	return opts
}

func (d *Driver) varOptionsDestroy() []tfexec.DestroyOption {
	var opts []tfexec.DestroyOption
	for _, k := range sortedKeys(d.cfg.Vars) {
		opts = append(opts, tfexec.Var(k+"="+d.cfg.Vars[k]))
	}
	return opts
}

func sortedKeys(m map[string]string) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

// Init runs terraform init (no upgrade: the lock file decides provider
// versions).
func (d *Driver) Init(ctx context.Context) error {
	return d.step(ctx, "init", func() error { return d.tf.Init(ctx, tfexec.Upgrade(false)) })
}

// PlanSummary counts the managed resources a saved plan changes. Data
// sources are not counted.
type PlanSummary struct {
	// File is the saved plan's path.
	File string
	// Create, Update, Replace, Delete and NoOp count resources by action;
	// Replace is delete-then-create or create-then-delete.
	Create, Update, Replace, Delete, NoOp int
}

// String is the one line the plan step logs, e.g.
// "plan: 12 to create, 0 to update, 0 to replace, 0 to delete, 0 unchanged".
func (s PlanSummary) String() string {
	return fmt.Sprintf("plan: %d to create, %d to update, %d to replace, %d to delete, %d unchanged",
		s.Create, s.Update, s.Replace, s.Delete, s.NoOp)
}

// Plan runs terraform plan with Config.Vars, saves the plan to
// Config.PlanFile, reads it back and logs its resource counts before
// anything is applied. With targets (resource or module addresses, as
// terraform plan -target takes them) the plan holds only those and what
// they depend on: labenv's first deploy applies the secrets alone, so
// that their versions exist before any service that reads them.
func (d *Driver) Plan(ctx context.Context, targets ...string) (PlanSummary, error) {
	sum := PlanSummary{File: d.cfg.PlanFile}
	name := "plan"
	if len(targets) > 0 {
		name = "plan -target " + strings.Join(targets, " -target ")
	}
	err := d.step(ctx, name, func() error {
		opts := append(d.varOptionsPlan(), tfexec.Out(d.cfg.PlanFile))
		for _, t := range targets {
			opts = append(opts, tfexec.Target(t))
		}
		if _, err := d.tf.Plan(ctx, opts...); err != nil {
			return err
		}
		p, err := d.tf.ShowPlanFile(ctx, d.cfg.PlanFile)
		if err != nil {
			return fmt.Errorf("reading the saved plan: %w", err)
		}
		sum = summarize(p, d.cfg.PlanFile)
		return nil
	})
	if err != nil {
		return sum, err
	}
	d.log.InfoContext(ctx, sum.String(), "event", EventPlanCounts, "create", sum.Create, "update", sum.Update,
		"replace", sum.Replace, "delete", sum.Delete, "unchanged", sum.NoOp, "planFile", sum.File)
	return sum, nil
}

func summarize(p *tfjson.Plan, file string) PlanSummary {
	s := PlanSummary{File: file}
	for _, rc := range p.ResourceChanges {
		if rc.Mode != tfjson.ManagedResourceMode || rc.Change == nil {
			continue
		}
		a := rc.Change.Actions
		switch {
		case a.Replace():
			s.Replace++
		case a.Create():
			s.Create++
		case a.Update():
			s.Update++
		case a.Delete():
			s.Delete++
		case a.NoOp():
			s.NoOp++
		}
	}
	return s
}

// Apply applies the plan saved by Plan, and nothing else: what was counted
// is what is applied.
func (d *Driver) Apply(ctx context.Context) error {
	return d.step(ctx, "apply", func() error { return d.tf.Apply(ctx, tfexec.DirOrPlan(d.cfg.PlanFile)) })
}

// Outputs returns the root module's outputs as JSON values by name.
// Sensitive outputs are returned too; the real module has none.
func (d *Driver) Outputs(ctx context.Context) (map[string]json.RawMessage, error) {
	out := map[string]json.RawMessage{}
	err := d.step(ctx, "output", func() error {
		meta, err := d.tf.Output(ctx)
		if err != nil {
			return err
		}
		for k, m := range meta {
			out[k] = m.Value
		}
		return nil
	})
	return out, err
}

// Destroy runs terraform destroy with Config.Vars (auto-approved).
func (d *Driver) Destroy(ctx context.Context) error {
	return d.step(ctx, "destroy", func() error { return d.tf.Destroy(ctx, d.varOptionsDestroy()...) })
}

// StateResources returns the addresses of the managed resources in the
// state, sorted; empty when nothing exists.
func (d *Driver) StateResources(ctx context.Context) ([]string, error) {
	var addrs []string
	err := d.step(ctx, "state", func() error {
		st, err := d.tf.Show(ctx)
		if err != nil {
			return err
		}
		if st == nil || st.Values == nil || st.Values.RootModule == nil {
			return nil
		}
		var walk func(m *tfjson.StateModule)
		walk = func(m *tfjson.StateModule) {
			for _, r := range m.Resources {
				if r.Mode == tfjson.ManagedResourceMode {
					addrs = append(addrs, r.Address)
				}
			}
			for _, c := range m.ChildModules {
				walk(c)
			}
		}
		walk(st.Values.RootModule)
		return nil
	})
	sort.Strings(addrs)
	return addrs, err
}

// Result is what Run did.
type Result struct {
	// Plan is the saved plan's counts (zero when plan failed).
	Plan PlanSummary
	// Outputs are the outputs read after apply (nil when apply failed).
	Outputs map[string]json.RawMessage
	// Left are the managed resources still in the state after destroy:
	// empty when destroy reached zero.
	Left []string
}

// Run is the whole lifecycle: init, plan, apply, outputs, then between
// (the game day; may be nil) with the outputs, then destroy and a read of
// the state. Destroy runs whenever init succeeded, even after a failed
// plan, apply, output or between: a half-applied environment still costs
// money. The error joins every failure, including resources left in the
// state after destroy.
func (d *Driver) Run(ctx context.Context, between func(ctx context.Context, outputs map[string]json.RawMessage) error) (Result, error) {
	var res Result
	if err := d.Init(ctx); err != nil {
		return res, err
	}
	var errs []error
	func() {
		sum, err := d.Plan(ctx)
		res.Plan = sum
		if err != nil {
			errs = append(errs, err)
			return
		}
		if err := d.Apply(ctx); err != nil {
			errs = append(errs, err)
			return
		}
		out, err := d.Outputs(ctx)
		if err != nil {
			errs = append(errs, err)
			return
		}
		res.Outputs = out
		if between != nil {
			if err := between(ctx, out); err != nil {
				errs = append(errs, fmt.Errorf("tfdriver: between apply and destroy: %w", err))
			}
		}
	}()
	// Tear down on a context of its own: the caller's may be what ended the
	// run, and the environment must go anyway.
	down := context.WithoutCancel(ctx)
	if err := d.Destroy(down); err != nil {
		errs = append(errs, err)
	}
	left, err := d.StateResources(down)
	if err != nil {
		errs = append(errs, err)
	}
	res.Left = left
	if len(left) > 0 {
		errs = append(errs, fmt.Errorf("tfdriver: %d resources left after destroy: %v", len(left), left))
	}
	return res, errors.Join(errs...)
}
