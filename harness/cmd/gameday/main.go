// Command gameday runs the local game day (package harness/gameday): the
// local stack, a real Prometheus and Alertmanager, every fault injected in
// turn. It writes OUT/gameday.json (the report) and OUT/gameday.md (the
// results table) and exits 1 when an alert did not fire or the run could
// not be carried out. Run it from the repository root (make gameday).
//
// Usage:
//
//	gameday [-out harness/out] [-faults lock-server-killed,forged-token,...]
//
// It takes flags only: an argument that is not a flag is refused before
// anything is started or written (as harness/cmd/soak does).
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
	"strings"
	"syscall"

	"github.com/distributed-lock-lab/distributed-lock-lab/harness/gameday"
)

func main() {
	if err := run(os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "gameday:", err)
		os.Exit(1)
	}
}

// run parses args (the command line without the program name) and runs
// the game day. Arguments left after the flags are refused with an error,
// before anything is started or written.
func run(args []string) error {
	cfg := gameday.DefaultConfig()
	fs := flag.NewFlagSet("gameday", flag.ContinueOnError)
	out := fs.String("out", "harness/out", "folder for gameday.json, gameday.md and the run's logs (runs/gameday)")
	faults := fs.String("faults", "", "comma-separated faults to inject (default: every fault)")
	fs.DurationVar(&cfg.AlertTimeout, "alert-timeout", cfg.AlertTimeout, "wait for each alert at most this long")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	if *faults != "" {
		cfg.Faults = strings.Split(*faults, ",")
	}
	repo, err := os.Getwd()
	if err != nil {
		return err
	}
	cfg.Repo = repo
	cfg.Dir = filepath.Join(*out, "runs", "gameday")
	if cfg.Dir, err = filepath.Abs(cfg.Dir); err != nil {
		return err
	}
	_ = os.RemoveAll(cfg.Dir)
	cfg.Log = slog.New(slog.NewTextHandler(os.Stderr, nil))
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	rep, runErr := gameday.Run(ctx, cfg)
	if errors.Is(runErr, gameday.ErrPrerequisite) {
		return runErr // nothing ran: no report to write or print
	}
	b, err := json.MarshalIndent(rep, "", "  ")
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(*out, "gameday.json"), append(b, '\n'), 0o644); err != nil {
		return err
	}
	table := gameday.Table(rep)
	if err := os.WriteFile(filepath.Join(*out, "gameday.md"), []byte(table), 0o644); err != nil {
		return err
	}
	fmt.Print(table)
	return runErr
}
