// Command experiment runs the fencing experiment (package harness) for
// every lock backend and every fencing cell, each on a fresh stack of real
// processes, and prints a transcript per run and the table of the matrix.
//
//	go run ./harness/cmd/experiment [-backend postgres|etcd] [-cell both-on|payment-only|rail-only|both-off]
//	                                [-json] [-out harness/out] [-lease-ttl 1500ms]
//
// With -json the JSON summary (one object per run) is printed on stdout
// instead of the transcripts and the table. With -out the summary is also
// written to OUT/summary.json, an SVG timeline per run to
// OUT/timeline-BACKEND-CELL.svg, and each run's process logs stay in
// OUT/runs/BACKEND-CELL (without -out they go to a temporary directory
// removed at exit). It exits 1 if a run fails to complete.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"
	"time"

	"github.com/distributed-lock-lab/distributed-lock-lab/harness"
	"github.com/distributed-lock-lab/distributed-lock-lab/local/stack"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "experiment:", err)
		os.Exit(1)
	}
}

func run() error {
	backend := flag.String("backend", "", "run only this backend (postgres or etcd); default both")
	cell := flag.String("cell", "", "run only this cell (both-on, payment-only, rail-only, both-off); default all four")
	asJSON := flag.Bool("json", false, "print the JSON summary instead of the transcripts and the table")
	out := flag.String("out", "", "write summary.json, the SVG timelines and the run folders here")
	ttl := flag.Duration("lease-ttl", harness.DefaultLeaseTTL, "the executors' lease TTL")
	verbose := flag.Bool("v", false, "log the stack's progress on stderr")
	pubsubServer := flag.String("pubsub", "fake", "Pub/Sub server: fake (pstest in its own process) or emulator (gcloud's Pub/Sub emulator)")
	flag.Parse()

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	t0 := time.Now()
	work := *out
	if work == "" {
		d, err := os.MkdirTemp("", "dll-experiment-")
		if err != nil {
			return err
		}
		defer os.RemoveAll(d)
		work = d
	}
	// Built once per state of the sources and shared with make up and the
	// tests (the user's cache folder), so a second demo links nothing.
	bin, err := stack.CachedBinaries(ctx)
	if err != nil {
		return err
	}
	logOut := io.Discard
	if *verbose {
		logOut = os.Stderr
	}
	opt := harness.Options{BinDir: bin, OutDir: work, LeaseTTL: *ttl, PubSub: *pubsubServer, Log: slog.New(slog.NewTextHandler(logOut, nil))}
	var runs []*harness.Run
	for _, b := range harness.Backends {
		if *backend != "" && b != *backend {
			continue
		}
		for _, c := range harness.Cells {
			if *cell != "" && c.Name() != *cell {
				continue
			}
			r, err := harness.RunCell(ctx, b, c, opt)
			if err != nil {
				return err
			}
			runs = append(runs, r)
			if !*asJSON {
				fmt.Println(harness.Transcript(r))
			}
			if *out != "" {
				svg := filepath.Join(*out, "timeline-"+b+"-"+c.Name()+".svg")
				if err := os.WriteFile(svg, harness.Timeline(r), 0o644); err != nil {
					return err
				}
			}
		}
	}
	if len(runs) == 0 {
		return fmt.Errorf("no run matches -backend %q -cell %q", *backend, *cell)
	}
	sum := make([]harness.Summary, len(runs))
	for i, r := range runs {
		sum[i] = r.Summary
	}
	js, err := json.MarshalIndent(sum, "", "  ")
	if err != nil {
		return err
	}
	js = append(js, '\n')
	if *out != "" {
		if err := os.WriteFile(filepath.Join(*out, "summary.json"), js, 0o644); err != nil {
			return err
		}
	}
	if *asJSON {
		_, err := os.Stdout.Write(js)
		return err
	}
	fmt.Println(harness.Table(runs))
	fmt.Printf("%d runs in %v", len(runs), time.Since(t0).Round(100*time.Millisecond))
	if *out != "" {
		fmt.Printf("; summary in %s, timelines and logs beside it", filepath.Join(*out, "summary.json"))
	}
	fmt.Println()
	return nil
}
