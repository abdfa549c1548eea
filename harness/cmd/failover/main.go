// Command failover runs the lockdb failover experiment (package
// harness/failover) once per mode and seed, prints one JSON line per
// event on stderr, and writes the reports to OUT/failover.json.
//
//	go run ./harness/cmd/failover -mode sync,async -seeds 1,2,3 -out harness/out
//
// It exits 1 when a synchronous run finds a safety violation (an
// asynchronous run's findings are the lesson, reported, not a failure).
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"

	"github.com/distributed-lock-lab/distributed-lock-lab/harness/failover"
)

func main() {
	os.Exit(run())
}

func run() int {
	def := failover.DefaultConfig()
	modes := flag.String("mode", failover.ModeSync+","+failover.ModeAsync, "replication modes to run, comma-separated: sync, async")
	seeds := flag.String("seeds", "1", "seeds, comma-separated; one run per mode and seed")
	clients := flag.Int("clients", def.Clients, "SDK clients")
	keys := flag.Int("keys", def.Keys, "lock keys shared by the clients")
	before := flag.Duration("before", def.Before, "load before the kill")
	delay := flag.Duration("promote-delay", def.PromoteDelay, "from the kill to the promotion")
	after := flag.Duration("after", def.After, "load after the promotion")
	stall := flag.Duration("standby-stall", 0, "freeze the standby this long before the kill (a lagging standby); 0: none")
	out := flag.String("out", "harness/out", "folder of failover.json")
	flag.Parse()

	logger := slog.New(slog.NewJSONHandler(os.Stderr, nil))
	// lock-server's and pgstore's own events (backend_stalled,
	// backend_recovered, lockdb_promotion_accepted, ...) beside the
	// experiment's, without the per-request INFO lines.
	serverLog := slog.New(slog.NewJSONHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn})).With("component", "lock-server")
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	var reports []failover.Report
	code := 0
	for _, mode := range strings.Split(*modes, ",") {
		for _, s := range strings.Split(*seeds, ",") {
			seed, err := strconv.ParseUint(strings.TrimSpace(s), 10, 64)
			if err != nil {
				fmt.Fprintf(os.Stderr, "failover: seed %q: %v\n", s, err)
				return 2
			}
			cfg := def
			cfg.Mode, cfg.Seed, cfg.Clients, cfg.Keys = strings.TrimSpace(mode), seed, *clients, *keys
			cfg.Before, cfg.PromoteDelay, cfg.After, cfg.Log = *before, *delay, *after, logger
			cfg.StandbyStall, cfg.ServerLog = *stall, serverLog
			rep, err := failover.Run(ctx, cfg)
			switch {
			case errors.Is(err, failover.ErrUnsafe) && cfg.Mode == failover.ModeAsync:
				logger.Warn("asynchronous run found what synchronous replication prevents", "mode", cfg.Mode, "seed", seed, "error", err.Error())
			case err != nil:
				fmt.Fprintf(os.Stderr, "failover: mode %s seed %d: %v\n", cfg.Mode, seed, err)
				code = 1
				if !errors.Is(err, failover.ErrUnsafe) {
					continue
				}
			}
			reports = append(reports, rep)
		}
	}
	if err := os.MkdirAll(*out, 0o755); err != nil {
		fmt.Fprintf(os.Stderr, "failover: %v\n", err)
		return 1
	}
	b, _ := json.MarshalIndent(reports, "", "  ")
	path := filepath.Join(*out, "failover.json")
	if err := os.WriteFile(path, append(b, '\n'), 0o644); err != nil {
		fmt.Fprintf(os.Stderr, "failover: %v\n", err)
		return 1
	}
	for _, r := range reports {
		fmt.Printf("%-5s stall %d ms seed %d: %d acquires, %d grants; dip: first failure +%d ms, last +%d ms, recovered +%d ms, slowest acquire %d ms, %d of %d failed (%.1f%%; unavailable %d, restored %d); promoted +%d ms; readyz down +%d ms, up +%d ms; highest token before kill %d, lowest after promotion %d, promoted sequence %d (%d tokens it would repeat); paydb untouched %v; violations %d\n",
			r.Mode, r.StandbyStallMs, r.Seed, r.Attempts, r.Grants, r.Dip.FirstFailureMs, r.Dip.LastFailureMs, r.Dip.RecoveredMs, r.Dip.SlowestMs, r.Dip.Failed, r.Dip.Attempts, r.Dip.FailedPct,
			r.Dip.Unavailable, r.Dip.Restored, r.PromotedMs-r.KillMs, r.ReadyzDownMs, r.ReadyzUpMs, r.HighestBeforeKill, r.LowestAfterPromotion, r.SequenceAfterPromotion, r.RepeatableTokens,
			r.PaydbBefore == r.PaydbAfter, len(r.Violations))
		for _, v := range r.Violations {
			fmt.Printf("      %s\n", v)
		}
	}
	fmt.Println("wrote", path)
	return code
}
