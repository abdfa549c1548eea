// Command month runs the simulated month (package harness/month) on one
// lock backend or both, one after the other, and writes, per backend,
// OUT/month-BACKEND.json (the report), OUT/month-BACKEND.md (its tables)
// and OUT/month-BACKEND.svg (budget remaining over the month). It exits 1
// when a run could not be carried out. Run it from the repository root
// (make month).
//
// Usage:
//
//	month [-backend postgres,etcd] [-seed 1] [-out harness/out]
package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/distributed-lock-lab/distributed-lock-lab/harness/month"
)

func main() {
	if err := run(os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "month:", err)
		os.Exit(1)
	}
}

// run parses args (the command line without the program name) and runs a
// month per backend. Arguments left after the flags are refused.
func run(args []string) error {
	d := month.DefaultConfig()
	fs := flag.NewFlagSet("month", flag.ContinueOnError)
	backends := fs.String("backend", "postgres,etcd", "lock backends, one month each in this order: postgres, etcd, or both comma-separated")
	out := fs.String("out", "harness/out", "folder for month-BACKEND.{json,md,svg} and the runs' files (runs/month-BACKEND)")
	fs.Uint64Var(&d.Seed, "seed", d.Seed, "seed of the month's schedule")
	fs.DurationVar(&d.Healthy, "healthy", d.Healthy, "healthy lead-in before the first fault")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	repo, err := os.Getwd()
	if err != nil {
		return err
	}
	d.Repo = repo
	d.Log = slog.New(slog.NewTextHandler(os.Stderr, nil))
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	var errs []error
	for _, b := range strings.Split(*backends, ",") {
		cfg := d
		cfg.Backend = strings.TrimSpace(b)
		if cfg.Dir, err = filepath.Abs(filepath.Join(*out, "runs", "month-"+cfg.Backend)); err != nil {
			return err
		}
		_ = os.RemoveAll(cfg.Dir)
		began := time.Now()
		rep, err := month.Run(ctx, cfg)
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", cfg.Backend, err))
			continue
		}
		if err := write(*out, &rep); err != nil {
			return err
		}
		fmt.Print(rep.Markdown())
		fmt.Printf("\n%s: %s in all (stack start included)\n\n", cfg.Backend, time.Since(began).Round(time.Second))
	}
	return errors.Join(errs...)
}

// write writes rep's JSON, Markdown and chart into dir.
func write(dir string, rep *month.Report) error {
	base := filepath.Join(dir, "month-"+rep.Backend)
	b, err := json.MarshalIndent(rep, "", "  ")
	if err != nil {
		return err
	}
	if err := os.WriteFile(base+".json", append(b, '\n'), 0o644); err != nil {
		return err
	}
	if err := os.WriteFile(base+".md", []byte(rep.Markdown()), 0o644); err != nil {
		return err
	}
	var svg bytes.Buffer
	if err := rep.Chart(&svg); err != nil {
		return err
	}
	return os.WriteFile(base+".svg", svg.Bytes(), 0o644)
}
