// Command benche2e is `make bench-e2e`: the end-to-end benchmark of the
// payout pipeline (package harness/benche2e). For each round, backend and
// mode it starts a fresh local stack, creates the payouts, waits until
// they have settled, and measures payouts/s, latency percentiles,
// deliveries per executor and CPU per payout of each process; every run's
// records must pass the integrity checks. It writes OUT/bench-e2e.json and
// OUT/bench-e2e.md and exits 1 when a run fails or breaks a check.
//
// Usage:
//
//	benche2e [-backend postgres,etcd] [-payouts 2000] [-accounts 200] [-creators 16]
//	         [-hot-payouts 300] [-modes spread,hot] [-runs 3] [-seed N] [-profile 10] [-statements]
//	         [-before main [-before-go-maxprocs]] [-break-double-pay] [-out harness/out]
package main

import (
	"bytes"
	"context"
	"flag"
	"fmt"
	"log/slog"
	"maps"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"slices"
	"strings"
	"syscall"

	"github.com/distributed-lock-lab/distributed-lock-lab/harness/benche2e"
	"github.com/distributed-lock-lab/distributed-lock-lab/harness/soak"
	"github.com/distributed-lock-lab/distributed-lock-lab/local/stack"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "benche2e:", err)
		os.Exit(1)
	}
}

func run() error {
	d := benche2e.DefaultConfig()
	backends := flag.String("backend", strings.Join(d.Backends, ","), "lock backends, comma-separated: postgres, etcd")
	modes := flag.String("modes", strings.Join(d.Modes, ","), "spread (payouts over accounts) and/or hot (every payout on one account)")
	out := flag.String("out", "harness/out", "folder for bench-e2e.json, bench-e2e.md and the runs' folders (runs/bench-e2e)")
	flag.IntVar(&d.Payouts, "payouts", d.Payouts, "payouts per spread run")
	flag.IntVar(&d.Accounts, "accounts", d.Accounts, "accounts of a spread run")
	flag.IntVar(&d.Creators, "creators", d.Creators, "concurrent payout creators")
	flag.IntVar(&d.HotPayouts, "hot-payouts", d.HotPayouts, "payouts of a hot run (one account)")
	flag.IntVar(&d.Executors, "executors", d.Executors, "executor processes")
	flag.IntVar(&d.Runs, "runs", d.Runs, "runs of each backend, mode and variant")
	flag.Uint64Var(&d.Seed, "seed", 0, "seed of the payout plan (0: drawn and printed)")
	flag.BoolVar(&d.Statements, "statements", false, "count the statements every database serves during each run (pg_stat_statements) and, with the etcd backend, etcd's requests, proposals and disk flushes (its own metrics), and report them per payout")
	flag.IntVar(&d.ProfileSeconds, "profile", 0, "take a CPU profile of every service process for this many seconds from the start of each run's load (0: none)")
	flag.DurationVar(&d.LeaseTTL, "lease-ttl", d.LeaseTTL, "the executors' lease TTL")
	before := flag.String("before", "", "a git revision (e.g. main): its stack is built and run as variant \"before\" beside this tree's, \"after\", in every round")
	beforeGoProcs := flag.Bool("before-go-maxprocs", false, "run the \"before\" variant's services at Go's default GOMAXPROCS, as stacks before stack.ServiceMaxProcs did, instead of this tree's setting")
	doublePay := flag.Bool("break-double-pay", false, "after each run, pay one posted payout a second time at the rail (to see the integrity check fail)")
	flag.Parse()
	if flag.NArg() > 0 {
		return fmt.Errorf("unexpected arguments %q", flag.Args())
	}
	d.Backends = splitList(*backends)
	d.Modes = splitList(*modes)
	if *before != "" {
		dir, err := buildRevision(*before, filepath.Join(*out, "bin-bench-e2e-before"))
		if err != nil {
			return err
		}
		defer os.RemoveAll(filepath.Dir(dir))
		b := benche2e.Variant{Name: "before", BinDir: dir}
		if *beforeGoProcs {
			b.Apply = func(c *soak.Config) { c.MaxProcs = stack.GoDefaultMaxProcs }
		}
		d.Variants = []benche2e.Variant{b, {Name: "after"}}
	}
	if *doublePay {
		d.Break = doublePayOne
	}
	if d.Seed == 0 {
		d.Seed = soak.NewSeed()
	}
	fmt.Fprintf(os.Stderr, "benche2e: seed %d (rerun with -seed %d)\n", d.Seed, d.Seed)
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	d.Log = slog.New(slog.NewTextHandler(os.Stderr, nil))
	d.Dir = filepath.Join(*out, "runs", "bench-e2e")
	if err := os.RemoveAll(d.Dir); err != nil {
		return err
	}
	bin := filepath.Join(*out, "bin-bench-e2e")
	if err := stack.Build(ctx, bin); err != nil {
		return err
	}
	defer os.RemoveAll(bin)
	d.BinDir = bin
	res, runErr := benche2e.Run(ctx, d)
	if res == nil {
		return runErr
	}
	var md bytes.Buffer
	if err := benche2e.WriteMarkdown(&md, res); err != nil {
		return err
	}
	var js bytes.Buffer
	if err := benche2e.WriteJSON(&js, res); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(*out, "bench-e2e.json"), js.Bytes(), 0o644); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(*out, "bench-e2e.md"), md.Bytes(), 0o644); err != nil {
		return err
	}
	os.Stdout.Write(md.Bytes())
	for _, r := range res.Runs {
		for _, f := range r.Failures {
			fmt.Printf("FAILED %s %s %s round %d: %s\n", r.Backend, r.Mode, r.Variant, r.Round, f)
		}
	}
	fmt.Println("wrote", filepath.Join(*out, "bench-e2e.json"), "and", filepath.Join(*out, "bench-e2e.md"))
	return runErr
}

// buildRevision builds the stack's binaries of git revision rev into
// dir/bin, from a checkout of rev in dir/src (git worktree, removed
// again), and returns dir/bin.
func buildRevision(rev, dir string) (string, error) {
	if err := os.RemoveAll(dir); err != nil {
		return "", err
	}
	src, err := filepath.Abs(filepath.Join(dir, "src"))
	if err != nil {
		return "", err
	}
	if out, err := exec.Command("git", "worktree", "add", "--detach", src, rev).CombinedOutput(); err != nil {
		return "", fmt.Errorf("git worktree add %s: %v\n%s", rev, err, out)
	}
	defer exec.Command("git", "worktree", "remove", "--force", src).Run()
	bin, err := filepath.Abs(filepath.Join(dir, "bin"))
	if err != nil {
		return "", err
	}
	args := []string{"build", "-o", bin + string(filepath.Separator)}
	for _, name := range slices.Sorted(maps.Keys(stack.Binaries)) {
		args = append(args, stack.Binaries[name])
	}
	cmd := exec.Command("go", args...)
	cmd.Dir = src
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("build %s: %v\n%s", rev, err, out)
	}
	return bin, nil
}

func splitList(s string) []string {
	var out []string
	for _, p := range strings.Split(s, ",") {
		if p = strings.TrimSpace(p); p != "" {
			out = append(out, p)
		}
	}
	return out
}

// doublePayOne is soak.PayAgainAtRail as a Config.Break.
func doublePayOne(ctx context.Context, st *stack.Stack) error {
	_, err := soak.PayAgainAtRail(ctx, st)
	return err
}
