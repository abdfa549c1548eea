// Command soak runs the crash soak of the payout pipeline (package
// harness/soak) on one backend or both, one after the other, and writes
// OUT/soak.json (every run's report) and OUT/soak-BACKEND.svg (its
// throughput over time with the kills marked). It exits 1 when a run could
// not be carried out or broke a rule (the failures are printed and are in
// soak.json).
//
// Usage:
//
//	soak [-backend postgres,etcd] [-payouts 10000] [-seed N] [-out harness/out] ...
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"

	"github.com/distributed-lock-lab/distributed-lock-lab/harness/soak"
	"github.com/distributed-lock-lab/distributed-lock-lab/local/stack"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "soak:", err)
		os.Exit(1)
	}
}

func run() error {
	d := soak.DefaultConfig()
	backends := flag.String("backend", "postgres,etcd", "lock backends to soak, one run each in this order: postgres, etcd, or both comma-separated")
	out := flag.String("out", "harness/out", "folder for soak.json, the SVGs and the runs' logs (runs/soak-BACKEND)")
	flag.IntVar(&d.Payouts, "payouts", d.Payouts, "payouts per run")
	flag.IntVar(&d.Accounts, "accounts", d.Accounts, "accounts the payouts are spread over")
	flag.IntVar(&d.Executors, "executors", d.Executors, "executor processes")
	flag.IntVar(&d.CreateWorkers, "create-workers", d.CreateWorkers, "concurrent payout creations")
	flag.Float64Var(&d.Rate, "rate", d.Rate, "payouts created per second (0: as fast as the creations go)")
	flag.Float64Var(&d.DuplicateRatio, "duplicates", d.DuplicateRatio, "share of payouts whose event is published twice")
	flag.Uint64Var(&d.Seed, "seed", 0, "seed of the plan and the chaos (0: drawn and printed)")
	flag.DurationVar(&d.KillGap, "kill-gap", d.KillGap, "mean gap between kills")
	flag.DurationVar(&d.DownTime, "down-time", d.DownTime, "longest time a killed part stays down before its restart")
	flag.IntVar(&d.Rounds, "rounds", d.Rounds, "minimum rounds of kills (each kills every kind of part once)")
	flag.BoolVar(&d.NoChaos, "no-chaos", false, "no kills (a baseline)")
	flag.DurationVar(&d.LeaseTTL, "lease-ttl", d.LeaseTTL, "the executors' lease TTL")
	flag.DurationVar(&d.SettleTimeout, "settle-timeout", d.SettleTimeout, "bound on the drain and reconciliation after the load")
	flag.DurationVar(&d.Bucket, "bucket", d.Bucket, "width of a throughput bucket")
	faults := flag.String("faults", soak.FaultsKill, "kinds of fault, comma-separated: kill (SIGKILL and restart), net (network faults on links between the processes)")
	flag.DurationVar(&d.NetHold, "net-hold", d.NetHold, "mean time a network fault stays on its link")
	fencing := flag.Bool("fencing", true, "both fence points on (false only to see the checks fail)")
	flag.Parse()
	if flag.NArg() > 0 {
		return fmt.Errorf("unexpected arguments %q", flag.Args())
	}
	d.PaymentFencing, d.RailFencing = *fencing, *fencing
	var err error
	if d.Faults, err = soak.ParseFaults(*faults); err != nil {
		return err
	}
	if d.Seed == 0 {
		d.Seed = soak.NewSeed()
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	log := slog.New(slog.NewTextHandler(os.Stderr, nil))
	fmt.Fprintf(os.Stderr, "soak: seed %d (rerun with -seed %d)\n", d.Seed, d.Seed)

	bin := filepath.Join(*out, "bin")
	if err := stack.Build(ctx, bin); err != nil {
		return err
	}
	defer os.RemoveAll(bin)
	var (
		reports []*soak.Report
		errs    []error
	)
	for _, b := range strings.Split(*backends, ",") {
		cfg := d
		cfg.Backend = strings.TrimSpace(b)
		cfg.BinDir = bin
		cfg.Log = log
		cfg.Dir = filepath.Join(*out, "runs", "soak-"+cfg.Backend)
		if err := os.RemoveAll(cfg.Dir); err != nil {
			return err
		}
		rep, err := soak.Run(ctx, cfg)
		if err != nil {
			errs = append(errs, err)
		}
		if rep == nil {
			continue
		}
		reports = append(reports, rep)
		if len(rep.Failures) > 0 {
			errs = append(errs, fmt.Errorf("%s (seed %d): %d broken rules, first: %s", cfg.Backend, rep.Seed, len(rep.Failures), rep.Failures[0]))
		}
		if err := writeSVG(filepath.Join(*out, "soak-"+cfg.Backend+".svg"), rep); err != nil {
			return err
		}
		fmt.Printf("%-8s seed %d: %d payouts in %.0f s (%.1f/s), outcomes %v, kills %d, network faults %d, rail submissions %d, acks %d, debits %d, balanced %v, failures %d\n",
			rep.Backend, rep.Seed, rep.Payouts, rep.LoadEnd.Sub(rep.Start).Seconds(), rep.PayoutsPerSecond, rep.Outcomes, len(rep.Kills), len(rep.NetFaults),
			rep.RailSubmissions, rep.RailAcks, rep.Debits, rep.Audit.Balanced, len(rep.Failures))
		for _, k := range rep.Kills {
			next := "none"
			if k.NextPostedMs != nil {
				next = fmt.Sprintf("%d ms", *k.NextPostedMs)
			}
			fmt.Printf("  kill %-18s at %6.1f s: ready again after %5d ms, next payout posted after %s\n", k.Process, k.AtS, k.ReadyMs, next)
		}
		for _, f := range rep.NetFaults {
			next := "none"
			if f.NextPostedMs != nil {
				next = fmt.Sprintf("%d ms", *f.NextPostedMs)
			}
			fmt.Printf("  net  %-34s at %6.1f s: %s for %d ms, next payout posted after %s\n", f.Link, f.AtS, f.Fault, f.HoldMs, next)
		}
		for _, f := range rep.Failures {
			fmt.Println("  FAILED", f)
		}
	}
	f, err := os.Create(filepath.Join(*out, "soak.json"))
	if err != nil {
		return err
	}
	if err := soak.WriteJSON(f, reports); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	fmt.Println("wrote", filepath.Join(*out, "soak.json"))
	return errors.Join(errs...)
}

func writeSVG(path string, rep *soak.Report) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if err := rep.WriteSVG(f); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}
