// Package pgcluster starts and stops a throwaway PostgreSQL cluster from
// the locally installed server binaries, for tests and for the local
// stack, and (standby.go) a streaming-replication standby of one. A
// Cluster listens on 127.0.0.1 only, with trust authentication for the
// superuser: it must never hold real data. See Start for how the server
// runs (as the postgres user under root, fsync on, stopped with its
// caller).
package pgcluster

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net"
	"net/url"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
)

// OwnerFile is the file, in every temporary directory Start creates
// (Config.Dir empty), that holds the pid of the process that created it,
// written before anything else. Close removes the directory; when the
// process dies first (SIGKILL, a test binary killed at its timeout), the
// directory stays, and local/stack's RemoveLeftovers, which reads the
// same file in the folders of a local stack, removes it once that process
// is gone. The name is the local stack's ("dll-owner.pid"): one mark for
// every large temporary folder of the project.
const OwnerFile = "dll-owner.pid"

// DefaultBinDir is where Debian and Ubuntu install the PostgreSQL 15 server
// binaries; used when Config.BinDir and $PG_BIN are both empty.
const DefaultBinDir = "/usr/lib/postgresql/15/bin"

// EnvBinDir names the environment variable that overrides DefaultBinDir
// (Config.BinDir still wins over it).
const EnvBinDir = "PG_BIN"

// Superuser is the role initdb creates; every DSN of a Cluster connects as it.
const Superuser = "postgres"

// Defaults and bounds of Start.
const (
	// DefaultMaxConnections is the server's max_connections unless
	// Config.Settings sets it: a test binary shares one cluster among many
	// stores, each with a pool of its own, so PostgreSQL's default of 100 is
	// tight.
	DefaultMaxConnections = 200
	// portAttempts bounds how many free ports Start tries when postgres
	// cannot bind the one the OS offered (another process took it between
	// the probe and the server's bind).
	portAttempts = 5
	// pollInterval is the pause between readiness probes.
	pollInterval = 20 * time.Millisecond
	// closeTimeout bounds the fast shutdown that Close performs before it
	// falls back to SIGKILL.
	closeTimeout = 30 * time.Second
	// killWait bounds each wait of Kill on a process changing state.
	killWait = 10 * time.Second
	// maxSocketPath is the longest unix socket path Linux accepts
	// (sizeof(sun_path) - 1).
	maxSocketPath = 107
)

// Errors of this package; test them with errors.Is.
var (
	// ErrBinariesMissing: initdb or postgres is not an executable file in
	// the configured binary directory.
	ErrBinariesMissing = errors.New("pgcluster: postgresql binaries missing")
	// ErrInvalidConfig: a Config field is out of range.
	ErrInvalidConfig = errors.New("pgcluster: invalid config")
	// ErrRunning: Start was called while the server runs.
	ErrRunning = errors.New("pgcluster: server already running")
	// ErrNotRunning: Kill was called while no server runs.
	ErrNotRunning = errors.New("pgcluster: server not running")
	// ErrClosed: the Cluster was closed; it cannot be started again.
	ErrClosed = errors.New("pgcluster: cluster closed")
	// ErrExited: the server exited before it accepted connections; the
	// error message carries the tail of its log.
	ErrExited = errors.New("pgcluster: server exited during startup")
)

// Config describes a cluster. The zero value is usable: a fresh temporary
// directory, a free port, the default binaries.
type Config struct {
	// BinDir holds initdb and postgres. Default: $PG_BIN when set, else
	// DefaultBinDir.
	BinDir string

	// Dir holds the cluster (Dir/data and Dir/postgres.log). Default: a new
	// directory under os.TempDir() ("pgcluster-*"), removed by Close, that
	// holds OwnerFile from its creation on. A Dir given here is
	// created if missing, reused as is when it already holds a cluster
	// (initdb is skipped), and never removed by Close. When running as root,
	// Dir and its parents must be searchable by the "postgres" user.
	Dir string

	// LogPath is the server's log file (the output of initdb and of every
	// server start). Default: Dir/postgres.log, which goes with the
	// directory. A path outside Dir is never removed by Close, so the log
	// outlives the cluster, and a crash of this process that leaves Close
	// unrun (SIGKILL) and its directory to the leftover cleanup. Its
	// folder must exist.
	LogPath string

	// Port is the TCP port on 127.0.0.1, 1..65535. Default 0: a free port
	// from the operating system, replaced by another (up to 5 tries) when
	// the server cannot bind it. The cluster keeps its port across Stop and
	// Start; a restart fails if another process took it meanwhile.
	Port int

	// Settings are extra server parameters, passed as "-c name=value" (for
	// example "log_statement": "all"). They override DefaultMaxConnections;
	// port, listen_addresses, unix_socket_directories and data_directory are
	// decided by the Cluster and may not be set here.
	Settings map[string]string

	// Logger receives Debug events (started, stopped). Default: discard.
	Logger *slog.Logger
}

// reserved are the settings the Cluster decides itself.
var reserved = []string{"port", "listen_addresses", "unix_socket_directories", "data_directory"}

var settingName = regexp.MustCompile(`^[a-z_][a-z0-9_.]*$`)

// withDefaults returns a copy of c with defaults filled in; c is not changed.
func (c Config) withDefaults() Config {
	if c.BinDir == "" {
		c.BinDir = os.Getenv(EnvBinDir)
	}
	if c.BinDir == "" {
		c.BinDir = DefaultBinDir
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	settings := map[string]string{"max_connections": strconv.Itoa(DefaultMaxConnections)}
	maps.Copy(settings, c.Settings)
	c.Settings = settings
	return c
}

// Validate reports whether Start could use c, after defaults are applied. It
// returns an error wrapping ErrBinariesMissing when initdb or postgres is
// not executable in the binary directory, and ErrInvalidConfig for a port
// out of range, a reserved or malformed setting, or a Dir so long that the
// server's unix socket path would exceed 107 bytes.
//
// Every problem is reported, one error each, joined (errors.Join).
func (c Config) Validate() error {
	c = c.withDefaults()
	var errs []error
	for _, name := range []string{"initdb", "postgres"} {
		p := filepath.Join(c.BinDir, name)
		fi, err := os.Stat(p)
		if err != nil {
			errs = append(errs, fmt.Errorf("%w: %s not found; install the PostgreSQL 15 server (Debian: apt-get install postgresql-15) or point $%s at the folder holding initdb and postgres: %w",
				ErrBinariesMissing, p, EnvBinDir, err))
			break
		}
		if fi.IsDir() || fi.Mode()&0o111 == 0 {
			errs = append(errs, fmt.Errorf("%w: %s is not an executable file", ErrBinariesMissing, p))
		}
	}
	if c.Port < 0 || c.Port > 65535 {
		errs = append(errs, fmt.Errorf("%w: port %d is outside 0..65535", ErrInvalidConfig, c.Port))
	}
	for _, name := range slices.Sorted(maps.Keys(c.Settings)) {
		if !settingName.MatchString(name) {
			errs = append(errs, fmt.Errorf("%w: setting name %q is not a lower-case parameter name", ErrInvalidConfig, name))
		} else if slices.Contains(reserved, name) {
			errs = append(errs, fmt.Errorf("%w: setting %q is decided by the cluster", ErrInvalidConfig, name))
		}
	}
	if c.Dir != "" {
		if err := checkSocketPath(dataDir(c.Dir)); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

func dataDir(dir string) string { return filepath.Join(dir, "data") }

func checkSocketPath(data string) error {
	if n := len(data) + len("/.s.PGSQL.65535"); n > maxSocketPath {
		return fmt.Errorf("%w: unix socket path under %s would be %d bytes, longer than %d; use a shorter Dir or TMPDIR", ErrInvalidConfig, data, n, maxSocketPath)
	}
	return nil
}

// Cluster is one PostgreSQL cluster and, while it runs, its server process.
// Its methods are safe for concurrent use; they run one at a time, so Kill
// waits for a Start in progress to finish.
type Cluster struct {
	cfg     Config
	dir     string
	dataDir string
	logPath string
	ownsDir bool
	cred    *syscall.Credential // nil: run as the caller
	log     *slog.Logger

	mu     sync.Mutex
	port   int      // fixed by the first successful start
	proc   *process // nil while stopped
	closed bool
	frozen []int // pids stopped by Freeze, postmaster first; nil when not frozen
}

// process is one running postmaster. Its waiter goroutine exits when the
// postmaster exits, after closing done.
type process struct {
	cmd  *exec.Cmd
	done chan struct{}
	err  error // exit status, valid after done is closed
}

// Start creates the cluster (unless Config.Dir already holds one: a copy
// of initdb's output, made once per server version and kept in the user's
// cache folder, with a system identifier of its own), starts the server
// and returns once it accepts connections. ctx bounds the whole start;
// on failure nothing is left running and a directory Start created is
// removed. Errors wrap ErrBinariesMissing or
// ErrInvalidConfig for a bad Config, ErrExited when the server gave up
// during startup (with its log tail), or the context's error.
//
// The cluster lives in one directory: Dir/data is the data directory (it
// also holds the unix socket) and Dir/postgres.log receives the server's
// output. The server listens on 127.0.0.1, on a port asked from the
// operating system, with fsync on, so what a committed transaction wrote
// survives Kill and Restart. When the caller is root, initdb and postgres
// run as the "postgres" user (PostgreSQL refuses root), which gets the
// directory. The server runs in a process group of its own with a
// parent-death signal (SIGQUIT, PostgreSQL's immediate shutdown), sent
// when the OS thread that started it exits: a test binary that dies
// without Close leaves no server behind.
func Start(ctx context.Context, cfg Config) (*Cluster, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg = cfg.withDefaults()
	c := &Cluster{cfg: cfg, log: cfg.Logger, port: cfg.Port}

	if os.Geteuid() == 0 {
		cred, err := postgresCredential()
		if err != nil {
			return nil, err
		}
		c.cred = cred
	}
	if err := c.prepareDir(); err != nil {
		return nil, err
	}
	fail := func(err error) (*Cluster, error) {
		if c.ownsDir {
			_ = os.RemoveAll(c.dir)
		}
		return nil, err
	}
	if err := c.initdb(ctx); err != nil {
		return fail(err)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if err := c.startLocked(ctx); err != nil {
		return fail(err)
	}
	return c, nil
}

func postgresCredential() (*syscall.Credential, error) {
	u, err := user.Lookup(Superuser)
	if err != nil {
		return nil, fmt.Errorf("pgcluster: running as root, and PostgreSQL refuses to: no %q user to run it as: %w", Superuser, err)
	}
	uid, err := strconv.ParseUint(u.Uid, 10, 32)
	if err != nil {
		return nil, fmt.Errorf("pgcluster: uid of user %q: %w", Superuser, err)
	}
	gid, err := strconv.ParseUint(u.Gid, 10, 32)
	if err != nil {
		return nil, fmt.Errorf("pgcluster: gid of user %q: %w", Superuser, err)
	}
	return &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}, nil
}

// prepareDir creates the cluster directory and the (possibly empty) data
// directory, owned by the user the server runs as.
func (c *Cluster) prepareDir() error {
	if c.cfg.Dir == "" {
		dir, err := os.MkdirTemp("", "pgcluster-")
		if err != nil {
			return fmt.Errorf("pgcluster: create temp dir: %w", err)
		}
		c.dir, c.ownsDir = dir, true
		// Written before anything else goes in, so that no temporary
		// cluster folder is ever without its owner (see OwnerFile).
		if err := os.WriteFile(filepath.Join(dir, OwnerFile), []byte(strconv.Itoa(os.Getpid())+"\n"), 0o644); err != nil {
			_ = os.RemoveAll(dir)
			return fmt.Errorf("pgcluster: mark %s: %w", dir, err)
		}
	} else {
		dir, err := filepath.Abs(c.cfg.Dir)
		if err != nil {
			return fmt.Errorf("pgcluster: dir %q: %w", c.cfg.Dir, err)
		}
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return fmt.Errorf("pgcluster: create dir: %w", err)
		}
		c.dir = dir
	}
	c.dataDir = dataDir(c.dir)
	c.logPath = filepath.Join(c.dir, "postgres.log")
	if c.cfg.LogPath != "" {
		p, err := filepath.Abs(c.cfg.LogPath)
		if err != nil {
			return fmt.Errorf("pgcluster: log path %q: %w", c.cfg.LogPath, err)
		}
		c.logPath = p
	}
	err := checkSocketPath(c.dataDir)
	if err == nil {
		err = os.MkdirAll(c.dataDir, 0o700)
	}
	if err == nil && c.ownsDir {
		err = c.chown(c.dir)
	}
	if err == nil {
		err = c.chown(c.dataDir)
	}
	if err != nil {
		if c.ownsDir {
			_ = os.RemoveAll(c.dir)
		}
		return fmt.Errorf("pgcluster: prepare %s: %w", c.dir, err)
	}
	return nil
}

func (c *Cluster) chown(path string) error {
	if c.cred == nil {
		return nil
	}
	return os.Chown(path, int(c.cred.Uid), int(c.cred.Gid))
}

// command builds an exec.Cmd for one of the server binaries, running as the
// server's user, in a process group of its own, killed by sig if this
// process dies.
func (c *Cluster) command(name string, sig syscall.Signal, args ...string) *exec.Cmd {
	cmd := exec.Command(filepath.Join(c.cfg.BinDir, name), args...)
	cmd.Dir = "/" // the caller's working directory may be closed to the server's user
	env := []string{"LC_ALL=C"}
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "PG") && !strings.HasPrefix(kv, "LC_ALL=") {
			env = append(env, kv)
		}
	}
	cmd.Env = env
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: sig, Credential: c.cred}
	return cmd
}

// initdb creates the cluster (initdb's output, copied from the template
// when there is one: fromTemplate) unless the data directory already
// holds one.
func (c *Cluster) initdb(ctx context.Context) error {
	if _, err := os.Stat(filepath.Join(c.dataDir, "PG_VERSION")); err == nil {
		c.log.Debug("pgcluster reusing cluster", "dir", c.dir)
		return nil
	}
	if err := c.fromTemplate(ctx); err != nil {
		return err
	}
	// fsync on in the configuration file rather than on the command line,
	// which would outrank ALTER SYSTEM: a test can turn it off by a reload,
	// as an operator could.
	f, err := os.OpenFile(filepath.Join(c.dataDir, "postgresql.conf"), os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		return fmt.Errorf("pgcluster: %w", err)
	}
	_, err = f.WriteString("fsync = on\n")
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("pgcluster: write fsync = on: %w", err)
	}
	c.log.Debug("pgcluster initdb done", "dir", c.dir)
	return nil
}

// runTool runs one of PostgreSQL's programs (initdb, pg_basebackup) to
// its end, its output appended to the cluster's log; when ctx ends first
// the program's process group is killed. The error names the program and,
// when it failed, ends with the tail of its output.
func (c *Cluster) runTool(ctx context.Context, name string, args ...string) error {
	logFile, err := c.openLog()
	if err != nil {
		return err
	}
	defer logFile.Close()
	var out bytes.Buffer
	cmd := c.command(name, syscall.SIGKILL, args...)
	cmd.Stdout = io.MultiWriter(logFile, &out)
	cmd.Stderr = cmd.Stdout
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("pgcluster: start %s: %w", name, err)
	}
	waitErr := make(chan error, 1)
	go func() { waitErr <- cmd.Wait() }()
	select {
	case err = <-waitErr:
	case <-ctx.Done():
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		<-waitErr
		return fmt.Errorf("pgcluster: %s: %w", name, ctx.Err())
	}
	if err != nil {
		return fmt.Errorf("pgcluster: %s: %w\n%s", name, err, tail(out.Bytes()))
	}
	return nil
}

func (c *Cluster) openLog() (*os.File, error) {
	f, err := os.OpenFile(c.logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o640)
	if err != nil {
		return nil, fmt.Errorf("pgcluster: open log: %w", err)
	}
	if err := c.chown(c.logPath); err != nil {
		f.Close()
		return nil, fmt.Errorf("pgcluster: chown log: %w", err)
	}
	return f, nil
}

// startLocked starts the server and waits for it to accept connections.
// With an OS-chosen port that was never used, a failure to bind is retried
// on another port. c.mu is held.
func (c *Cluster) startLocked(ctx context.Context) error {
	if c.closed {
		return ErrClosed
	}
	if c.proc != nil {
		return ErrRunning
	}
	chosen := c.port == 0
	for attempt := 1; ; attempt++ {
		if chosen {
			p, err := freePort()
			if err != nil {
				return err
			}
			c.port = p
		}
		err := c.spawnAndWait(ctx)
		if err == nil {
			return nil
		}
		if chosen && errors.Is(err, errBind) && attempt < portAttempts {
			c.log.Debug("pgcluster port taken, retrying", "port", c.port)
			continue
		}
		if chosen {
			c.port = 0
		}
		return err
	}
}

// errBind marks a startup failure caused by a port in use.
var errBind = errors.New("address already in use")

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("pgcluster: find a free port: %w", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

func (c *Cluster) spawnAndWait(ctx context.Context) error {
	logFile, err := c.openLog()
	if err != nil {
		return err
	}
	offset, err := logFile.Seek(0, io.SeekEnd)
	if err != nil {
		logFile.Close()
		return fmt.Errorf("pgcluster: log offset: %w", err)
	}
	args := []string{
		"-D", c.dataDir,
		"-p", strconv.Itoa(c.port),
		"-c", "listen_addresses=127.0.0.1",
		"-c", "unix_socket_directories=" + c.dataDir,
	}
	for _, name := range slices.Sorted(maps.Keys(c.cfg.Settings)) {
		args = append(args, "-c", name+"="+c.cfg.Settings[name])
	}
	cmd := c.command("postgres", syscall.SIGQUIT, args...)
	cmd.Stdout, cmd.Stderr = logFile, logFile
	if err := cmd.Start(); err != nil {
		logFile.Close()
		return fmt.Errorf("pgcluster: start postgres: %w", err)
	}
	p := &process{cmd: cmd, done: make(chan struct{})}
	go func() {
		p.err = cmd.Wait()
		logFile.Close()
		close(p.done)
	}()
	c.proc = p

	if err := c.awaitReady(ctx, p); err != nil {
		c.killLocked()
		if logged := c.logSince(offset); bytes.Contains(logged, []byte("Address already in use")) {
			err = fmt.Errorf("%w: port %d: %w", ErrExited, c.port, errBind)
		} else if errors.Is(err, ErrExited) {
			err = fmt.Errorf("%w\n%s", err, tail(logged))
		}
		return err
	}
	c.log.Debug("pgcluster started", "port", c.port, "dir", c.dir, "pid", cmd.Process.Pid)
	return nil
}

// awaitReady polls with a real connection until the server accepts one, it
// exits, or ctx ends.
func (c *Cluster) awaitReady(ctx context.Context, p *process) error {
	tick := time.NewTicker(pollInterval)
	defer tick.Stop()
	var last error
	for {
		conn, err := pgx.Connect(ctx, dsn(c.port, "postgres")+"&connect_timeout=2")
		if err == nil {
			_ = conn.Close(context.WithoutCancel(ctx))
			return nil
		}
		last = err
		select {
		case <-p.done:
			return fmt.Errorf("%w: %v", ErrExited, p.err)
		case <-ctx.Done():
			return fmt.Errorf("pgcluster: server on port %d not ready (last attempt: %v): %w", c.port, last, ctx.Err())
		case <-tick.C:
		}
	}
}

func (c *Cluster) logSince(offset int64) []byte {
	f, err := os.Open(c.logPath)
	if err != nil {
		return nil
	}
	defer f.Close()
	b, _ := io.ReadAll(io.NewSectionReader(f, offset, 1<<20))
	return b
}

// tail returns the last few KiB of b, for error messages.
func tail(b []byte) string {
	const max = 4096
	if len(b) > max {
		b = b[len(b)-max:]
	}
	return strings.TrimSpace(string(b))
}

// killLocked kills the postmaster and every backend at once and waits for
// them to be gone. PostgreSQL backends call setsid, so they are not in the
// postmaster's process group: the postmaster is stopped first (it cannot
// fork while stopped), its children are listed from /proc, and all get
// SIGKILL. c.mu is held.
func (c *Cluster) killLocked() {
	c.thawLocked() // a stopped postmaster would pass for the one killLocked stops itself
	p := c.proc
	if p == nil {
		return
	}
	pid := p.cmd.Process.Pid
	var children []int
	if syscall.Kill(pid, syscall.SIGSTOP) == nil {
		awaitProc(pid, func(state byte) bool { return state == 'T' || state == 'Z' || state == 0 })
		children = childrenOf(pid)
	}
	for _, child := range children {
		_ = syscall.Kill(child, syscall.SIGKILL)
	}
	_ = syscall.Kill(-pid, syscall.SIGKILL)
	<-p.done
	c.proc = nil
	// Backends that have not finished dying still hold the shared memory,
	// and the next start would refuse to run beside them.
	for _, child := range children {
		awaitProc(child, func(state byte) bool { return state == 'Z' || state == 0 })
	}
}

// awaitProc polls the state of process pid (as in /proc/pid/stat; 0 once
// the process is gone) until done reports true or killWait has passed.
func awaitProc(pid int, done func(state byte) bool) {
	deadline := time.Now().Add(killWait)
	for {
		state, _ := procStat(pid)
		if done(state) || time.Now().After(deadline) {
			return
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// procStat returns the state letter and parent pid of process pid, or
// (0, 0) when it does not exist.
func procStat(pid int) (state byte, ppid int) {
	stat, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, 0
	}
	// The fields after the command name, which is in parentheses and may
	// contain anything: state ppid ...
	i := bytes.LastIndexByte(stat, ')')
	if i < 0 {
		return 0, 0
	}
	f := strings.Fields(string(stat[i+1:]))
	if len(f) < 2 || len(f[0]) != 1 {
		return 0, 0
	}
	ppid, _ = strconv.Atoi(f[1])
	return f[0][0], ppid
}

// childrenOf lists the live children of pid from /proc.
func childrenOf(pid int) []int {
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return nil
	}
	var out []int
	for _, e := range entries {
		n, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if state, ppid := procStat(n); ppid == pid && state != 'Z' && state != 0 {
			out = append(out, n)
		}
	}
	return out
}

// Freeze stops the server and every one of its backends with SIGSTOP, and
// returns once each is stopped: a database that accepts TCP connections
// (the kernel completes the handshake) and then never answers, the way a
// hung host or a paused VM looks to its clients. The postmaster is stopped
// first, so that it forks no backend while the others are stopped. Thaw
// resumes them; Stop, Kill and Close thaw first. It returns ErrNotRunning
// when no server runs, nil when it is already frozen.
func (c *Cluster) Freeze() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.proc == nil {
		return ErrNotRunning
	}
	if c.frozen != nil {
		return nil
	}
	pid := c.proc.cmd.Process.Pid
	if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
		return fmt.Errorf("pgcluster: freeze postmaster %d: %w", pid, err)
	}
	stopped := func(state byte) bool { return state == 'T' || state == 'Z' || state == 0 }
	awaitProc(pid, stopped)
	c.frozen = []int{pid}
	for _, child := range childrenOf(pid) {
		if syscall.Kill(child, syscall.SIGSTOP) == nil {
			c.frozen = append(c.frozen, child)
		}
	}
	for _, child := range c.frozen[1:] {
		awaitProc(child, stopped)
	}
	c.log.Debug("pgcluster frozen", "port", c.port, "processes", len(c.frozen))
	return nil
}

// Thaw resumes the processes Freeze stopped, backends first. It returns
// nil when the server is not frozen.
func (c *Cluster) Thaw() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.thawLocked()
	return nil
}

// thawLocked sends SIGCONT to the frozen processes, the postmaster last.
// c.mu is held.
func (c *Cluster) thawLocked() {
	for i := len(c.frozen) - 1; i >= 0; i-- {
		_ = syscall.Kill(c.frozen[i], syscall.SIGCONT)
	}
	if c.frozen != nil {
		c.log.Debug("pgcluster thawed", "port", c.port)
	}
	c.frozen = nil
}

// Start starts the server of a stopped cluster on its port, with its data,
// and returns once it accepts connections. ErrRunning if it runs, ErrClosed
// after Close, ErrExited (with the log tail) if the server gave up, or the
// error of ctx, which bounds the wait; on failure the server is not left
// running.
func (c *Cluster) Start(ctx context.Context) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.startLocked(ctx)
}

// Stop shuts the server down in PostgreSQL's fast mode (SIGINT: roll back
// open transactions, write a checkpoint, exit) and waits for it, keeping the
// data. It returns nil when the server is not running. If ctx ends first,
// the server's processes are killed and ctx's error is returned, wrapped.
func (c *Cluster) Stop(ctx context.Context) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.stopLocked(ctx)
}

func (c *Cluster) stopLocked(ctx context.Context) error {
	return c.signalStopLocked(ctx, syscall.SIGINT)
}

// signalStopLocked sends sig to the postmaster (SIGINT: fast shutdown,
// SIGQUIT: immediate) and waits for it to exit; when ctx ends first it
// kills the server's processes and returns ctx's error, wrapped.
func (c *Cluster) signalStopLocked(ctx context.Context, sig syscall.Signal) error {
	c.thawLocked()
	p := c.proc
	if p == nil {
		return nil
	}
	_ = p.cmd.Process.Signal(sig)
	select {
	case <-p.done:
		c.proc = nil
		c.log.Debug("pgcluster stopped", "port", c.port, "signal", sig.String())
		return nil
	case <-ctx.Done():
		c.killLocked()
		return fmt.Errorf("pgcluster: shutdown (%s) did not finish, server killed: %w", sig, ctx.Err())
	}
}

// Restart is Stop then Start: same port, same data. Errors are those of
// Stop and Start.
func (c *Cluster) Restart(ctx context.Context) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if err := c.stopLocked(ctx); err != nil {
		return err
	}
	return c.startLocked(ctx)
}

// Kill sends SIGKILL to the server and all its backends at once, like a
// machine losing power as far as the server's processes are concerned
// (the operating system still holds written data), and waits for the
// postmaster to exit. Start brings it back through crash recovery. It
// returns ErrNotRunning when no server runs.
func (c *Cluster) Kill() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.proc == nil {
		return ErrNotRunning
	}
	c.killLocked()
	c.log.Debug("pgcluster killed", "port", c.port)
	return nil
}

// Close stops the server and removes the cluster directory if Start
// created it; a Config.Dir is kept. A kept directory gets a fast shutdown
// (its checkpoint makes the data clean), SIGKILL after 30 seconds, which
// is then the error. A temporary one, whose data is thrown away, gets an
// immediate shutdown (SIGQUIT: no checkpoint, shared memory released),
// SIGKILL after 30 seconds, and no error for it: under heavy load a fast
// shutdown's checkpoint of a shared test cluster took longer than 30 s,
// and failed packages whose tests had all passed. Closing twice returns
// nil. Other errors are those of removing the directory.
func (c *Cluster) Close() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return nil
	}
	c.closed = true
	ctx, cancel := context.WithTimeout(context.Background(), closeTimeout)
	defer cancel()
	if !c.ownsDir {
		return c.stopLocked(ctx)
	}
	if err := c.signalStopLocked(ctx, syscall.SIGQUIT); err != nil {
		c.log.Warn("pgcluster: immediate shutdown did not finish; server killed", "port", c.port, "error", err.Error())
	}
	if err := os.RemoveAll(c.dir); err != nil {
		return fmt.Errorf("pgcluster: remove %s: %w", c.dir, err)
	}
	return nil
}

// Port returns the TCP port the server listens on at 127.0.0.1; it stays the
// same across Stop and Start.
func (c *Cluster) Port() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.port
}

// Dir returns the cluster directory (data directory and log inside).
func (c *Cluster) Dir() string { return c.dir }

// LogPath returns the path of the server's log file, which collects the
// output of initdb and of every server start.
func (c *Cluster) LogPath() string { return c.logPath }

// AdminDSN returns a URL connecting as the superuser to the "postgres"
// database over TCP, without TLS, e.g.
// "postgres://postgres@127.0.0.1:54321/postgres?sslmode=disable".
func (c *Cluster) AdminDSN() string { return c.DSN("postgres") }

// DSN returns a URL connecting as the superuser to database dbname over TCP,
// without TLS. It does not check that the database exists.
func (c *Cluster) DSN(dbname string) string { return dsn(c.Port(), dbname) }

func dsn(port int, dbname string) string {
	u := url.URL{
		Scheme:   "postgres",
		User:     url.User(Superuser),
		Host:     net.JoinHostPort("127.0.0.1", strconv.Itoa(port)),
		Path:     "/" + dbname,
		RawQuery: "sslmode=disable",
	}
	return u.String()
}

// CreateDatabase creates an empty database named name (1..63 bytes, any
// characters; it is quoted) on the running server. It returns the server's
// error, for example when the database exists or the server is down.
//
// The database is made with STRATEGY FILE_COPY: template1's files are
// copied at a checkpoint rather than written, block by block, to the WAL
// (PostgreSQL 15's default), which costs a few times more CPU on a small
// cluster that makes databases often, as tests do.
func (c *Cluster) CreateDatabase(ctx context.Context, name string) error {
	if name == "" || len(name) > 63 {
		return fmt.Errorf("pgcluster: database name %q must be 1..63 bytes", name)
	}
	conn, err := pgx.Connect(ctx, c.AdminDSN())
	if err != nil {
		return fmt.Errorf("pgcluster: connect: %w", err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	if _, err := conn.Exec(ctx, "CREATE DATABASE "+pgx.Identifier{name}.Sanitize()+" STRATEGY FILE_COPY"); err != nil {
		return fmt.Errorf("pgcluster: create database %q: %w", name, err)
	}
	return nil
}

// PID returns the process id of the running postmaster, or 0 while the
// server is stopped. Its backends are its children (for per-process
// accounting, e.g. the end-to-end benchmark's CPU per process).
func (c *Cluster) PID() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.proc == nil {
		return 0
	}
	return c.proc.cmd.Process.Pid
}
