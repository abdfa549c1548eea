package pgcluster

// Streaming replication: a hot standby of a running cluster, and its
// promotion. This is the local stand-in for a managed database's high
// availability (Cloud SQL's regional instances keep a standby in a second
// zone): the primary streams its WAL to the standby over a replication
// connection, and, when the primary's Settings name the standby in
// synchronous_standby_names (SyncStandbyNames gives the value), a commit
// is reported to its client only once the standby has flushed it, so a
// promoted standby holds every commit a client was told of. Without that
// setting the replication is asynchronous: a commit the primary reported
// but had not yet streamed is lost when the primary dies and the standby
// is promoted.

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
)

// promoteTimeout bounds pg_promote's own wait for the end of recovery.
const promoteTimeout = time.Minute

// ErrNotStandby: Promote was called on a cluster that is not in recovery.
var ErrNotStandby = errors.New("pgcluster: not a standby")

var standbyName = regexp.MustCompile(`^[a-z][a-z0-9_]{0,62}$`)

// SyncStandbyNames returns the value of synchronous_standby_names that
// makes a primary wait, at every commit, for the one standby named name
// to flush the commit's WAL ("FIRST 1 (name)"). Put it in the primary's
// Config.Settings; it needs synchronous_commit on (PostgreSQL's default)
// or remote_apply.
func SyncStandbyNames(name string) string { return "FIRST 1 (" + name + ")" }

// StandbyConfig describes a standby started by StartStandby.
type StandbyConfig struct {
	// Name is the standby's application_name towards the primary (what
	// synchronous_standby_names and pg_stat_replication name it by) and
	// the name of the physical replication slot created for it on the
	// primary: a lower-case letter, then lower-case letters, digits or
	// '_', at most 63 bytes. Required.
	Name string
	// Cluster configures the standby's own cluster (directory, port,
	// binaries, settings, logger) as for Start. Its Dir, when given, must
	// not hold a cluster yet. primary_conninfo, primary_slot_name and
	// hot_standby are decided by StartStandby.
	Cluster Config
}

// Validate returns nil or every problem of c, joined, each wrapping
// ErrInvalidConfig (or ErrBinariesMissing, from the cluster's Config).
func (c StandbyConfig) Validate() error {
	var errs []error
	if !standbyName.MatchString(c.Name) {
		errs = append(errs, fmt.Errorf("%w: standby name %q: want a lower-case letter, then lower-case letters, digits or '_', at most 63 bytes", ErrInvalidConfig, c.Name))
	}
	for _, k := range []string{"primary_conninfo", "primary_slot_name", "hot_standby"} {
		if _, ok := c.Cluster.Settings[k]; ok {
			errs = append(errs, fmt.Errorf("%w: setting %q is decided by the standby", ErrInvalidConfig, k))
		}
	}
	errs = append(errs, c.Cluster.Validate())
	return errors.Join(errs...)
}

// StartStandby creates a hot standby of the running cluster c: it copies
// c with pg_basebackup (from the same binary directory, WAL streamed
// during the copy, a physical replication slot named cfg.Name created on
// c so that c keeps the WAL the standby has not received yet), then
// starts the copy in standby mode, streaming from c as application_name
// cfg.Name. It returns once the standby accepts (read-only) connections
// and the primary reports it streaming.
// The standby is a Cluster of its own: Kill, Stop, Close and the DSNs
// work on it as on any other; Promote turns it into a primary. On failure
// nothing is left running and a directory it created is removed. Errors
// wrap ErrInvalidConfig, ErrBinariesMissing, ErrNotRunning (c is not
// running), ErrExited, or the context's or pg_basebackup's error.
func (c *Cluster) StartStandby(ctx context.Context, cfg StandbyConfig) (*Cluster, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if _, err := os.Stat(filepath.Join(cfg.Cluster.withDefaults().BinDir, "pg_basebackup")); err != nil {
		return nil, fmt.Errorf("%w: pg_basebackup: %w", ErrBinariesMissing, err)
	}
	c.mu.Lock()
	running, port := c.proc != nil, c.port
	c.mu.Unlock()
	if !running {
		return nil, ErrNotRunning
	}
	sc := cfg.Cluster.withDefaults()
	sc.Settings["primary_conninfo"] = fmt.Sprintf("host=127.0.0.1 port=%d user=%s application_name=%s", port, Superuser, cfg.Name)
	sc.Settings["primary_slot_name"] = cfg.Name
	sc.Settings["hot_standby"] = "on"
	s := &Cluster{cfg: sc, log: sc.Logger, port: sc.Port}
	if os.Geteuid() == 0 {
		cred, err := postgresCredential()
		if err != nil {
			return nil, err
		}
		s.cred = cred
	}
	if err := s.prepareDir(); err != nil {
		return nil, err
	}
	fail := func(err error) (*Cluster, error) {
		if s.ownsDir {
			_ = os.RemoveAll(s.dir)
		} else {
			_ = os.RemoveAll(s.dataDir)
		}
		return nil, err
	}
	if _, err := os.Stat(filepath.Join(s.dataDir, "PG_VERSION")); err == nil {
		return fail(fmt.Errorf("%w: %s already holds a cluster", ErrInvalidConfig, s.dataDir))
	}
	if err := s.baseBackup(ctx, port, cfg.Name); err != nil {
		return fail(err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.startLocked(ctx); err != nil {
		return fail(err)
	}
	if err := awaitStreaming(ctx, port, cfg.Name); err != nil {
		s.killLocked()
		return fail(err)
	}
	s.log.Debug("pgcluster standby started", "port", s.port, "primary_port", port, "name", cfg.Name)
	return s, nil
}

// awaitStreaming polls the primary on port until it reports the standby
// name streaming (pg_stat_replication), or ctx ends.
func awaitStreaming(ctx context.Context, port int, name string) error {
	tick := time.NewTicker(pollInterval)
	defer tick.Stop()
	var last error
	for {
		conn, err := pgx.Connect(ctx, dsn(port, "postgres"))
		if err == nil {
			var n int
			err = conn.QueryRow(ctx, `SELECT count(*) FROM pg_stat_replication WHERE application_name = $1 AND state = 'streaming'`, name).Scan(&n)
			_ = conn.Close(context.WithoutCancel(ctx))
			if err == nil && n > 0 {
				return nil
			}
		}
		last = err
		select {
		case <-ctx.Done():
			return fmt.Errorf("pgcluster: standby %q not streaming from port %d (last error: %v): %w", name, port, last, ctx.Err())
		case <-tick.C:
		}
	}
}

// baseBackup copies the primary on port into s's (empty) data directory
// and marks it a standby (standby.signal).
func (s *Cluster) baseBackup(ctx context.Context, port int, slot string) error {
	if err := s.runTool(ctx, "pg_basebackup",
		"-D", s.dataDir, "-h", "127.0.0.1", "-p", strconv.Itoa(port), "-U", Superuser,
		"-X", "stream", "-C", "-S", slot, "-c", "fast", "--no-sync", "-w"); err != nil {
		return err
	}
	signal := filepath.Join(s.dataDir, "standby.signal")
	if err := os.WriteFile(signal, nil, 0o600); err != nil {
		return fmt.Errorf("pgcluster: write standby.signal: %w", err)
	}
	if err := s.chown(signal); err != nil {
		return fmt.Errorf("pgcluster: chown standby.signal: %w", err)
	}
	return nil
}

// InRecovery reports whether the server is a standby (pg_is_in_recovery()).
// Errors are the driver's (the server is down, say).
func (c *Cluster) InRecovery(ctx context.Context) (bool, error) {
	conn, err := pgx.Connect(ctx, c.AdminDSN())
	if err != nil {
		return false, fmt.Errorf("pgcluster: connect: %w", err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	var in bool
	if err := conn.QueryRow(ctx, `SELECT pg_is_in_recovery()`).Scan(&in); err != nil {
		return false, fmt.Errorf("pgcluster: pg_is_in_recovery: %w", err)
	}
	return in, nil
}

// Promote ends the recovery of a standby (pg_promote, waiting up to a
// minute): it stops streaming, switches to a new timeline and accepts
// writes. It returns once the server accepts writes, ErrNotStandby when
// it was not in recovery, or the driver's error.
func (c *Cluster) Promote(ctx context.Context) error {
	conn, err := pgx.Connect(ctx, c.AdminDSN())
	if err != nil {
		return fmt.Errorf("pgcluster: connect: %w", err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	var in bool
	if err := conn.QueryRow(ctx, `SELECT pg_is_in_recovery()`).Scan(&in); err != nil {
		return fmt.Errorf("pgcluster: pg_is_in_recovery: %w", err)
	}
	if !in {
		return ErrNotStandby
	}
	var ok bool
	if err := conn.QueryRow(ctx, `SELECT pg_promote(true, $1)`, int(promoteTimeout/time.Second)).Scan(&ok); err != nil {
		return fmt.Errorf("pgcluster: pg_promote: %w", err)
	}
	if !ok {
		return fmt.Errorf("pgcluster: pg_promote: recovery did not end within %v", promoteTimeout)
	}
	c.log.Debug("pgcluster promoted", "port", c.Port())
	return nil
}

// MultiHostDSN returns a URL that lists the clusters' addresses in order
// and asks for the one that accepts writes
// (target_session_attrs=read-write): a client library that supports it
// (pgx, libpq) tries each host in turn and keeps the first that is not in
// recovery, so a pool built on it finds a promoted standby by itself, e.g.
// "postgres://postgres@127.0.0.1:5432,127.0.0.1:5433/lockdb?sslmode=disable&target_session_attrs=read-write".
func MultiHostDSN(dbname string, clusters ...*Cluster) string {
	hosts := make([]string, len(clusters))
	for i, c := range clusters {
		hosts[i] = net.JoinHostPort("127.0.0.1", strconv.Itoa(c.Port()))
	}
	u := url.URL{
		Scheme:   "postgres",
		User:     url.User(Superuser),
		Host:     strings.Join(hosts, ","),
		Path:     "/" + dbname,
		RawQuery: "sslmode=disable&target_session_attrs=read-write",
	}
	return u.String()
}

// SetSynchronousStandby makes the running cluster's commits wait for the
// standby named name (synchronous_standby_names = SyncStandbyNames(name),
// by ALTER SYSTEM, so it survives restarts, and a configuration reload),
// and returns once the cluster reports that standby as synchronous. An
// empty name makes replication asynchronous again (returns after the
// reload). Until the named standby streams, every commit waits: attach it
// first (StartStandby). Errors are the driver's or ctx's.
func (c *Cluster) SetSynchronousStandby(ctx context.Context, name string) error {
	value := ""
	if name != "" {
		if !standbyName.MatchString(name) {
			return fmt.Errorf("%w: standby name %q", ErrInvalidConfig, name)
		}
		value = SyncStandbyNames(name)
	}
	conn, err := pgx.Connect(ctx, c.AdminDSN())
	if err != nil {
		return fmt.Errorf("pgcluster: connect: %w", err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	if _, err := conn.Exec(ctx, `ALTER SYSTEM SET synchronous_standby_names = `+quoteLiteral(value)); err != nil {
		return fmt.Errorf("pgcluster: set synchronous_standby_names: %w", err)
	}
	if _, err := conn.Exec(ctx, `SELECT pg_reload_conf()`); err != nil {
		return fmt.Errorf("pgcluster: reload: %w", err)
	}
	tick := time.NewTicker(pollInterval)
	defer tick.Stop()
	for {
		var n int
		if err := conn.QueryRow(ctx, `SELECT count(*) FROM pg_stat_replication WHERE $1 = '' OR (application_name = $1 AND sync_state = 'sync')`, name).Scan(&n); err != nil {
			return fmt.Errorf("pgcluster: read pg_stat_replication: %w", err)
		}
		var cur string
		if err := conn.QueryRow(ctx, `SHOW synchronous_standby_names`).Scan(&cur); err != nil {
			return fmt.Errorf("pgcluster: show synchronous_standby_names: %w", err)
		}
		if cur == value && (name == "" || n > 0) {
			c.log.Debug("pgcluster synchronous standby set", "port", c.Port(), "name", name)
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("pgcluster: standby %q not synchronous: %w", name, ctx.Err())
		case <-tick.C:
		}
	}
}

// quoteLiteral quotes s as an SQL string literal.
func quoteLiteral(s string) string { return "'" + strings.ReplaceAll(s, "'", "''") + "'" }

// PauseWALSenders stops (SIGSTOP) the server's WAL sender processes, and
// returns how many it stopped: the standbys stop receiving WAL while the
// server goes on, as across a congested link between zones. A commit that
// waits for a synchronous standby waits until they resume; an
// asynchronous primary goes on committing what no standby has. Kill ends
// them with the rest (SIGKILL reaches a stopped process); ResumeWALSenders
// resumes them. ErrNotRunning when the server is not running.
func (c *Cluster) PauseWALSenders() (int, error) {
	return c.signalWALSenders(syscall.SIGSTOP)
}

// ResumeWALSenders resumes (SIGCONT) the WAL senders PauseWALSenders
// stopped, and returns how many it signalled.
func (c *Cluster) ResumeWALSenders() (int, error) {
	return c.signalWALSenders(syscall.SIGCONT)
}

func (c *Cluster) signalWALSenders(sig syscall.Signal) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.proc == nil {
		return 0, ErrNotRunning
	}
	n := 0
	for _, pid := range childrenOf(c.proc.cmd.Process.Pid) {
		cmdline, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/cmdline")
		if err != nil || !bytes.HasPrefix(cmdline, []byte("postgres: walsender")) {
			continue
		}
		if syscall.Kill(pid, sig) == nil {
			n++
		}
	}
	return n, nil
}
