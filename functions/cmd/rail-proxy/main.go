// Command rail-proxy is fence point two as a process (package
// functions/railproxy), configured from the environment
// (docs/configuration.md). One operator subcommand, after raildb was
// restored from a backup (docs/runbooks/raildb-restore.md):
//
//	RAILDB_URL='postgres://...' rail-proxy recover-restore --past N --rail-journal FILE [--attempt-ids-past M]
//
// runs railproxy.RecoverRestore and prints its result as JSON. Exit status
// 0 on success, 2 on bad arguments or input (nothing changed), 1 when
// raildb failed.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/distributed-lock-lab/distributed-lock-lab/functions/catalog/railproxyfn"
	"github.com/distributed-lock-lab/distributed-lock-lab/functions/rail"
	"github.com/distributed-lock-lab/distributed-lock-lab/functions/railproxy"
	railapi "github.com/distributed-lock-lab/distributed-lock-lab/functions/railproxy/api"
	"github.com/distributed-lock-lab/distributed-lock-lab/functions/serve"
	"github.com/distributed-lock-lab/distributed-lock-lab/internal/pgpool"
)

// cmdRecover is the name of the recovery subcommand.
const cmdRecover = "recover-restore"

func main() {
	if len(os.Args) > 1 && os.Args[1] == cmdRecover {
		ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
		code := recoverRestore(ctx, os.Args[2:], os.Getenv, os.Stdout, os.Stderr)
		stop()
		os.Exit(code)
	}
	f := railproxyfn.Function
	serve.Main(f.Name, f.EnvNames(), f.Build, f.Collectors()...)
}

// recoverRestore runs "rail-proxy recover-restore" with args (after the
// subcommand's name) and returns the exit status: 0 done, 2 bad arguments
// or input (nothing changed), 1 raildb failed.
func recoverRestore(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("rail-proxy "+cmdRecover, flag.ContinueOnError)
	fs.SetOutput(stderr)
	past := fs.Int64("past", 0, "N: at least every fencing token issued before the restore (required, 1..2^53-1); the token floor")
	journal := fs.String("rail-journal", "", "file with the rail's journal, the JSON of the rail's GET "+rail.PathJournal+" (required)")
	idsPast := fs.Int64("attempt-ids-past", 0, "optional: the largest attempt id handed out before the restore (rail-proxy's logs)")
	timeout := fs.Duration("timeout", time.Minute, "bound of the whole recovery")
	fs.Usage = func() {
		fmt.Fprintf(stderr, "usage: %s=... rail-proxy %s --past N --rail-journal FILE [--attempt-ids-past M]\n", railapi.EnvDatabaseURL, cmdRecover)
		fs.PrintDefaults()
	}
	bad := func(err error) int {
		fmt.Fprintf(stderr, "rail-proxy %s: %v (nothing changed)\n", cmdRecover, err)
		return 2
	}
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if fs.NArg() > 0 {
		return bad(fmt.Errorf("unexpected arguments %q", fs.Args()))
	}
	if *past <= 0 || *past > railproxy.MaxRecoverPast {
		return bad(fmt.Errorf("--past %d: want the largest fencing token ever issued, 1..%d", *past, int64(railproxy.MaxRecoverPast)))
	}
	if *journal == "" {
		return bad(errors.New("--rail-journal is required (the rail's own record of every submission)"))
	}
	if *timeout <= 0 {
		return bad(fmt.Errorf("--timeout %v must be positive", *timeout))
	}
	db := pgpool.Config{
		DSN:              strings.TrimSpace(getenv(railapi.EnvDatabaseURL)),
		CloudSQLInstance: strings.TrimSpace(getenv(railapi.EnvDatabaseInstance)),
	}
	if db.DSN == "" {
		return bad(fmt.Errorf("%s is required (a PostgreSQL DSN of raildb)", railapi.EnvDatabaseURL))
	}
	if err := db.Validate(); err != nil {
		return bad(fmt.Errorf("%s: %v", railapi.EnvDatabaseURL, err))
	}
	f, err := os.Open(*journal)
	if err != nil {
		return bad(fmt.Errorf("--rail-journal: %v", err))
	}
	records, err := railproxy.ReadRailJournal(f)
	f.Close()
	if err != nil {
		return bad(fmt.Errorf("--rail-journal %s: %v", *journal, err))
	}
	ctx, cancel := context.WithTimeout(ctx, *timeout)
	defer cancel()
	log := slog.New(slog.NewJSONHandler(stderr, nil)).With("service", "rail-proxy")
	out, err := railproxy.RecoverRestore(ctx, db, railproxy.RestoreRecovery{Past: *past, AttemptIDsPast: *idsPast, Journal: records}, log)
	if errors.Is(err, railproxy.ErrInvalidRecovery) {
		return bad(err)
	}
	if err != nil {
		fmt.Fprintf(stderr, "rail-proxy %s: %v\n", cmdRecover, err)
		return 1
	}
	enc := json.NewEncoder(stdout)
	enc.SetIndent("", "  ")
	if err := enc.Encode(out); err != nil {
		fmt.Fprintf(stderr, "rail-proxy %s: %v\n", cmdRecover, err)
		return 1
	}
	return 0
}
