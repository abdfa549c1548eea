// Package embedded runs an etcd cluster inside the current process, from
// go.etcd.io/etcd/server/v3/embed: one member (tests, the local stack) or
// several (chaos), each with its own data directory and loopback URLs on
// ports the operating system chose. Start(ctx, cfg) returns a Cluster
// (Endpoints for clients); Close it when done. A member can be stopped (StopMember,
// graceful) or killed (KillMember, abrupt) and restarted on the same data
// and URLs; pausing a member needs a process of its own (etcd/cmd/etcd-local).
// The default timing (50 ms heartbeat, 500 ms election timeout) makes etcd's
// lease floor 1 s (Config.MinLeaseTTL). Unless a logger is supplied, members
// log errors to stderr, minus those of a clean shutdown.
package embedded

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"go.etcd.io/etcd/server/v3/embed"
	"go.uber.org/zap"
)

// Errors returned by this package. Callers test them with errors.Is; they
// are wrapped with the member or the cause.
var (
	// ErrInvalidConfig: a Config field is out of range (see Config.Validate).
	ErrInvalidConfig = errors.New("embedded: invalid config")
	// ErrNotReady: a member did not become ready (join the cluster and see a
	// leader) before the context ended, or stopped while starting.
	ErrNotReady = errors.New("embedded: member not ready")
	// ErrNoSuchMember: a member index outside [0, Members).
	ErrNoSuchMember = errors.New("embedded: no such member")
	// ErrMemberRunning: RestartMember of a member that is running.
	ErrMemberRunning = errors.New("embedded: member is running")
	// ErrMemberStopped: StopMember or KillMember of a member that is
	// already stopped.
	ErrMemberStopped = errors.New("embedded: member is stopped")
	// ErrNoLeader: no running member reports itself as the leader.
	ErrNoLeader = errors.New("embedded: no leader")
	// ErrClosed: the cluster has been closed.
	ErrClosed = errors.New("embedded: cluster closed")
	// ErrLayoutMismatch: Config.Dir holds a cluster of a different size.
	ErrLayoutMismatch = errors.New("embedded: existing cluster layout does not match config")
)

// Defaults applied by Start to zero Config fields.
const (
	// DefaultMembers is the cluster size when Config.Members is 0.
	DefaultMembers = 1
	// DefaultHeartbeat is etcd's heartbeat interval (--heartbeat-interval)
	// when Config.Heartbeat is 0: half of etcd's 100 ms, fine on loopback.
	DefaultHeartbeat = 50 * time.Millisecond
	// DefaultElectionTimeout is etcd's election timeout (--election-timeout)
	// when Config.ElectionTimeout is 0. With DefaultHeartbeat it makes the
	// lease floor 1 s, so tests can wait for a lease to expire quickly.
	DefaultElectionTimeout = 500 * time.Millisecond
	// DefaultStartAttempts is how many sets of free ports Start tries when
	// a port it was given by the OS is taken before etcd binds it.
	DefaultStartAttempts = 5
	// MaxMembers bounds Config.Members; etcd recommends at most 7 voters.
	MaxMembers = 7

	host       = "127.0.0.1"
	layoutFile = "cluster.json"
)

// Config describes the cluster to start. The zero value is a valid
// one-member cluster in a temporary directory. Start does not modify the
// caller's Config.
type Config struct {
	// Members is the number of voting members, 1..MaxMembers. Default 1.
	// Use an odd number: an even cluster tolerates no more failures than the
	// odd one below it.
	Members int

	// Dir is the parent of the members' data directories (Dir/member-N).
	// Empty (the default): a new temporary directory that Close removes.
	// Set: the caller owns it and Close leaves it in place; Start records
	// the chosen URLs in Dir/cluster.json and, when that file exists, reuses
	// them, so a cluster stopped (or killed) can be started again from the
	// same Dir with its data and its URLs.
	Dir string

	// Heartbeat is etcd's heartbeat interval, a whole number of
	// milliseconds. Default DefaultHeartbeat.
	Heartbeat time.Duration

	// ElectionTimeout is etcd's election timeout, a whole number of
	// milliseconds, at least 5 × Heartbeat and at most 50 s (etcd's rules).
	// Default DefaultElectionTimeout. A longer timeout raises the lease
	// floor (see MinLeaseTTL); a shorter one risks spurious elections on a
	// loaded machine.
	ElectionTimeout time.Duration

	// StartAttempts bounds how many times Start picks new ports after a bind
	// failure (another process took a port between the OS handing it out
	// and etcd binding it). Default DefaultStartAttempts.
	StartAttempts int

	// Logger receives etcd's logs. Nil: JSON at error level to stderr,
	// without the lines etcd logs at error level for a clean shutdown.
	Logger *zap.Logger

	// Only, when not empty, lists the indices (0..Members-1) of the members
	// this Cluster runs; the others belong to other processes (one etcd
	// process per member, so that a chaos experiment can kill one with
	// SIGKILL). It needs a Dir whose layout already exists (PrepareDir),
	// so that every process agrees on the URLs, and the processes of a new
	// cluster must be started together: a member is ready only once a
	// majority has joined. Default: every member.
	Only []int
}

func (c Config) withDefaults() Config {
	if c.Members == 0 {
		c.Members = DefaultMembers
	}
	if c.Heartbeat == 0 {
		c.Heartbeat = DefaultHeartbeat
	}
	if c.ElectionTimeout == 0 {
		c.ElectionTimeout = DefaultElectionTimeout
	}
	if c.StartAttempts == 0 {
		c.StartAttempts = DefaultStartAttempts
	}
	return c
}

// Validate returns nil or one error per field out of range after
// defaults are applied, joined (errors.Join), each wrapping
// ErrInvalidConfig.
func (c Config) Validate() error {
	c = c.withDefaults()
	var errs []error
	bad := func(format string, a ...any) {
		errs = append(errs, fmt.Errorf("%w: "+format, append([]any{ErrInvalidConfig}, a...)...))
	}
	if c.Members < 1 || c.Members > MaxMembers {
		bad("members is %d; want 1..%d", c.Members, MaxMembers)
	}
	if c.Heartbeat < time.Millisecond || c.Heartbeat%time.Millisecond != 0 {
		bad("heartbeat %v is not a positive whole number of milliseconds", c.Heartbeat)
	}
	switch {
	case c.ElectionTimeout%time.Millisecond != 0:
		bad("election timeout %v is not a whole number of milliseconds", c.ElectionTimeout)
	case c.ElectionTimeout < 5*c.Heartbeat:
		bad("election timeout %v is shorter than 5 heartbeats (%v)", c.ElectionTimeout, 5*c.Heartbeat)
	case c.ElectionTimeout > 50*time.Second:
		bad("election timeout %v is longer than 50s", c.ElectionTimeout)
	}
	if c.StartAttempts < 1 {
		bad("start attempts is %d; want >= 1", c.StartAttempts)
	}
	if len(c.Only) > 0 && c.Dir == "" {
		bad("only %v needs a Dir prepared by PrepareDir", c.Only)
	}
	for _, i := range c.Only {
		if i < 0 || i >= c.Members {
			bad("only names member %d; want 0..%d", i, c.Members-1)
		}
	}
	return errors.Join(errs...)
}

// MinLeaseTTL is the shortest lease the cluster grants: etcd raises any
// shorter TTL to it. It follows etcd's formula (etcdserver.NewServer):
// ceil((3 × electionTicks / 2) × heartbeat) in whole seconds, where
// electionTicks = ElectionTimeout / Heartbeat and both divisions are
// integer. 1 s with the defaults.
func (c Config) MinLeaseTTL() time.Duration {
	c = c.withDefaults()
	ticks := int64(c.ElectionTimeout / c.Heartbeat)
	floor := time.Duration((3*ticks)/2) * c.Heartbeat
	return time.Duration(math.Ceil(floor.Seconds())) * time.Second
}

// Member describes one member of a Cluster.
type Member struct {
	// Name is the etcd member name ("member-0", ...).
	Name string
	// Dir is the member's data directory.
	Dir string
	// ClientURL is where clients connect ("http://127.0.0.1:port").
	ClientURL string
	// PeerURL is where the other members connect.
	PeerURL string
	// Running is false between StopMember (or KillMember) and RestartMember.
	Running bool
}

// Cluster is a running embedded etcd cluster. Its methods are safe for
// concurrent use; StopMember, KillMember, RestartMember and Close are
// serialised, and a RestartMember waiting for its member to become ready
// holds the others back until it returns.
//
// The package starts goroutines only inside Start, RestartMember and Close
// (one per member being started or stopped, each ending when
// embed.StartEtcd or the member's stop returns; all are waited for before
// the call returns). Everything that runs afterwards belongs to etcd and
// ends when the member is stopped.
type Cluster struct {
	cfg     Config
	dir     string
	ownDir  bool
	token   string
	members []*member // fixed at Start; URLs and dirs never change

	mu     sync.Mutex
	closed bool
}

type member struct {
	name      string
	dir       string
	clientURL url.URL
	peerURL   url.URL
	etcd      *embed.Etcd // nil while stopped; guarded by Cluster.mu
}

// layout is what Dir/cluster.json records so a cluster can be started again
// from the same directory.
type layout struct {
	Token   string         `json:"token"`
	Members []layoutMember `json:"members"`
}

type layoutMember struct {
	Name      string `json:"name"`
	ClientURL string `json:"clientURL"`
	PeerURL   string `json:"peerURL"`
}

// Start starts the cluster described by cfg and returns once every member
// is ready (has joined the cluster and knows a leader), or fails when ctx
// ends first (ErrNotReady wrapping the context's error). On failure every
// member started is stopped and a temporary directory is removed.
//
// Ports are asked from the OS (listen on 127.0.0.1:0, close, use); if a
// port is taken before etcd binds it, Start tries new ports up to
// cfg.StartAttempts times. Ports recorded in an existing Dir/cluster.json
// are reused as they are: a bind failure is retried on the same ports
// until ctx ends.
func Start(ctx context.Context, cfg Config) (*Cluster, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg = cfg.withDefaults()
	c := &Cluster{cfg: cfg}
	if cfg.Dir == "" {
		dir, err := os.MkdirTemp("", "etcd-embedded-")
		if err != nil {
			return nil, fmt.Errorf("embedded: temp dir: %w", err)
		}
		c.dir, c.ownDir = dir, true
	} else {
		if err := os.MkdirAll(cfg.Dir, 0o700); err != nil {
			return nil, fmt.Errorf("embedded: data dir: %w", err)
		}
		c.dir = cfg.Dir
	}
	lay, reused, err := c.readLayout()
	if err != nil {
		c.removeOwnDir()
		return nil, err
	}
	if len(cfg.Only) > 0 && !reused {
		return nil, fmt.Errorf("%w: %s has no %s (run PrepareDir first)", ErrLayoutMismatch, c.dir, layoutFile)
	}
	for attempt := 1; ; attempt++ {
		if !reused {
			if lay, err = newLayout(cfg.Members); err != nil {
				c.removeOwnDir()
				return nil, err
			}
			if err := c.writeLayout(lay); err != nil {
				c.removeOwnDir()
				return nil, err
			}
		}
		if err := c.useLayout(lay); err != nil {
			c.removeOwnDir()
			return nil, err
		}
		err = c.startMembers(ctx, c.running())
		if err == nil {
			return c, nil
		}
		if !isAddrInUse(err) || ctx.Err() != nil || (!reused && attempt >= cfg.StartAttempts) {
			c.removeOwnDir()
			return nil, err
		}
		if !reused {
			// The failed attempt may have initialised data directories
			// with the old peer URLs; a fresh attempt starts clean.
			for _, m := range c.members {
				_ = os.RemoveAll(m.dir)
			}
			continue
		}
		if err := sleepCtx(ctx, 100*time.Millisecond); err != nil {
			c.removeOwnDir()
			return nil, fmt.Errorf("%w: %w", ErrNotReady, err)
		}
	}
}

// running returns the members this Cluster runs (Config.Only, or all).
func (c *Cluster) running() []*member {
	if len(c.cfg.Only) == 0 {
		return c.members
	}
	out := make([]*member, 0, len(c.cfg.Only))
	for _, i := range c.cfg.Only {
		out = append(out, c.members[i])
	}
	return out
}

// PrepareDir records in dir (created if missing) the layout of a new
// cluster of members members (names, free client and peer ports, cluster
// token), for processes that each run some of its members (Config.Only).
// It returns ErrLayoutMismatch when dir already holds a layout.
func PrepareDir(dir string, members int) error {
	if members < 1 || members > MaxMembers {
		return fmt.Errorf("%w: members is %d; want 1..%d", ErrInvalidConfig, members, MaxMembers)
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("embedded: data dir: %w", err)
	}
	if _, err := os.Stat(filepath.Join(dir, layoutFile)); err == nil {
		return fmt.Errorf("%w: %s already holds a cluster", ErrLayoutMismatch, dir)
	}
	lay, err := newLayout(members)
	if err != nil {
		return err
	}
	return (&Cluster{dir: dir}).writeLayout(lay)
}

// PrepareDirHosts is PrepareDir for members that each listen on an
// address of their own (a network namespace per member): member i serves
// clients on hosts[i]:ClientPort and peers on hosts[i]:PeerPort. The
// addresses need not exist in this process; the processes that run the
// members (Config.Only) bind them.
func PrepareDirHosts(dir string, hosts []string) error {
	if len(hosts) < 1 || len(hosts) > MaxMembers {
		return fmt.Errorf("%w: %d hosts; want 1..%d", ErrInvalidConfig, len(hosts), MaxMembers)
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("embedded: data dir: %w", err)
	}
	if _, err := os.Stat(filepath.Join(dir, layoutFile)); err == nil {
		return fmt.Errorf("%w: %s already holds a cluster", ErrLayoutMismatch, dir)
	}
	lay, err := newLayout(0)
	if err != nil {
		return err
	}
	for i, h := range hosts {
		if net.ParseIP(h) == nil {
			return fmt.Errorf("%w: host %q is not an IP address", ErrInvalidConfig, h)
		}
		lay.Members = append(lay.Members, layoutMember{
			Name:      fmt.Sprintf("member-%d", i),
			ClientURL: "http://" + net.JoinHostPort(h, strconv.Itoa(ClientPort)),
			PeerURL:   "http://" + net.JoinHostPort(h, strconv.Itoa(PeerPort)),
		})
	}
	return (&Cluster{dir: dir}).writeLayout(lay)
}

// ClientPort and PeerPort are etcd's registered ports, used by
// PrepareDirHosts, where every member has an address of its own.
const (
	ClientPort = 2379
	PeerPort   = 2380
)

// Endpoints returns the client URLs of every member, running or not, in
// member order. They never change for the life of the cluster, so a
// client given all of them fails over by itself.
func (c *Cluster) Endpoints() []string {
	out := make([]string, len(c.members))
	for i, m := range c.members {
		out[i] = m.clientURL.String()
	}
	return out
}

// Size returns the number of members.
func (c *Cluster) Size() int { return len(c.members) }

// Dir returns the parent directory of the members' data directories.
func (c *Cluster) Dir() string { return c.dir }

// MinLeaseTTL is the lease floor of this cluster; see Config.MinLeaseTTL.
func (c *Cluster) MinLeaseTTL() time.Duration { return c.cfg.MinLeaseTTL() }

// Member describes member i. ErrNoSuchMember if i is out of range.
func (c *Cluster) Member(i int) (Member, error) {
	if i < 0 || i >= len(c.members) {
		return Member{}, fmt.Errorf("%w: %d of %d", ErrNoSuchMember, i, len(c.members))
	}
	m := c.members[i]
	c.mu.Lock()
	running := m.etcd != nil
	c.mu.Unlock()
	return Member{Name: m.name, Dir: m.dir, ClientURL: m.clientURL.String(), PeerURL: m.peerURL.String(), Running: running}, nil
}

// Leader returns the index of the running member that reports itself as
// the raft leader at this instant, or ErrNoLeader (for instance during an
// election, or when a majority is stopped).
func (c *Cluster) Leader() (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return -1, ErrClosed
	}
	for i, m := range c.members {
		if m.etcd == nil {
			continue
		}
		if s := m.etcd.Server; s.Leader() == s.MemberID() {
			return i, nil
		}
	}
	return -1, ErrNoLeader
}

// StopMember stops member i gracefully (a leader hands over leadership
// first) and keeps its data directory. ErrNoSuchMember, ErrMemberStopped,
// ErrClosed.
func (c *Cluster) StopMember(i int) error {
	if i < 0 || i >= len(c.members) {
		return fmt.Errorf("%w: %d of %d", ErrNoSuchMember, i, len(c.members))
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return ErrClosed
	}
	m := c.members[i]
	if m.etcd == nil {
		return fmt.Errorf("%w: %s", ErrMemberStopped, m.name)
	}
	m.stop()
	return nil
}

// KillMember stops member i abruptly: its raft loop stops without handing
// over leadership and its connections close, so the other members notice
// only through missed heartbeats and, if it led, elect a new leader after
// an election timeout, as after a crash. Acknowledged writes are on disk
// (etcd syncs its WAL before acknowledging), so RestartMember finds them.
// ErrNoSuchMember, ErrMemberStopped, ErrClosed.
func (c *Cluster) KillMember(i int) error {
	if i < 0 || i >= len(c.members) {
		return fmt.Errorf("%w: %d of %d", ErrNoSuchMember, i, len(c.members))
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return ErrClosed
	}
	m := c.members[i]
	if m.etcd == nil {
		return fmt.Errorf("%w: %s", ErrMemberStopped, m.name)
	}
	m.hardStop()
	return nil
}

// RestartMember starts member i again on its data directory and URLs and
// waits until it is ready, bounded by ctx (ErrNotReady wrapping the
// context's error; the member is then stopped again). A port taken in the
// meantime is retried until ctx ends. ErrNoSuchMember, ErrMemberRunning,
// ErrClosed.
func (c *Cluster) RestartMember(ctx context.Context, i int) error {
	if i < 0 || i >= len(c.members) {
		return fmt.Errorf("%w: %d of %d", ErrNoSuchMember, i, len(c.members))
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return ErrClosed
	}
	m := c.members[i]
	if m.etcd != nil {
		return fmt.Errorf("%w: %s", ErrMemberRunning, m.name)
	}
	for {
		err := c.startMembersLocked(ctx, []*member{m})
		if err == nil || !isAddrInUse(err) {
			return err
		}
		if err := sleepCtx(ctx, 100*time.Millisecond); err != nil {
			return fmt.Errorf("%w: %s: %w", ErrNotReady, m.name, err)
		}
	}
}

// Close stops every running member at once, without leadership hand-over
// (the whole cluster is going away), and, when Start created the
// directory, removes it with all data. Data written before Close is on disk
// (etcd syncs its WAL before acknowledging). Calling it again returns nil.
func (c *Cluster) Close() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return nil
	}
	c.closed = true
	c.stopAllLocked()
	if c.ownDir {
		if err := os.RemoveAll(c.dir); err != nil {
			return fmt.Errorf("embedded: remove %s: %w", c.dir, err)
		}
	}
	return nil
}

func (c *Cluster) startMembers(ctx context.Context, ms []*member) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.startMembersLocked(ctx, ms)
}

// startMembersLocked starts ms concurrently (members of a new cluster look
// for each other while bootstrapping, so starting them one by one would
// make each wait for a timeout), then waits for each to be ready. On error
// every member of ms is stopped again.
func (c *Cluster) startMembersLocked(ctx context.Context, ms []*member) error {
	errs := make([]error, len(ms))
	var wg sync.WaitGroup
	for j, m := range ms {
		wg.Add(1)
		// Exits when embed.StartEtcd returns (it binds the listeners and
		// starts the server, without waiting for the cluster).
		go func() {
			defer wg.Done()
			e, err := embed.StartEtcd(c.embedConfig(m))
			if err != nil {
				errs[j] = fmt.Errorf("embedded: start %s: %w", m.name, err)
				return
			}
			m.etcd = e
		}()
	}
	wg.Wait()
	err := errors.Join(errs...)
	if err == nil {
		for _, m := range ms {
			if err = m.awaitReady(ctx); err != nil {
				break
			}
		}
	}
	if err != nil {
		stopMembers(ms, true)
	}
	return err
}

func (c *Cluster) stopAllLocked() { stopMembers(c.members, true) }

// stopMembers stops ms concurrently (embed's Close waits up to a second for
// idle peer connections, per member). One goroutine per member, each
// ending when that member has stopped; all are waited for.
func stopMembers(ms []*member, hard bool) {
	var wg sync.WaitGroup
	for _, m := range ms {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if hard {
				m.hardStop()
			} else {
				m.stop()
			}
		}()
	}
	wg.Wait()
}

func (c *Cluster) removeOwnDir() {
	if c.ownDir {
		_ = os.RemoveAll(c.dir)
	}
}

func (m *member) awaitReady(ctx context.Context) error {
	select {
	case <-m.etcd.Server.ReadyNotify():
		return m.awaitServing(ctx)
	case err := <-m.etcd.Err():
		return fmt.Errorf("%w: %s: %w", ErrNotReady, m.name, err)
	case <-m.etcd.Server.StopNotify():
		return fmt.Errorf("%w: %s stopped while starting", ErrNotReady, m.name)
	case <-ctx.Done():
		return fmt.Errorf("%w: %s: %w", ErrNotReady, m.name, ctx.Err())
	}
}

// awaitServing returns once the member answers HTTP on its client URL.
// Ready is raft's; embed sets the client handlers up on goroutines of its
// own, which also read process globals (a logger made from os.Stderr,
// which go test -json replaces once tests start): after an answer, that
// setup is over.
func (m *member) awaitServing(ctx context.Context) error {
	u := m.clientURL
	u.Path = "/version"
	wait := time.Millisecond
	for {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, u.String(), nil)
		if err != nil {
			return err
		}
		resp, err := http.DefaultClient.Do(req)
		if err == nil {
			resp.Body.Close()
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%w: %s: client URL not answering: %w", ErrNotReady, m.name, err)
		case <-time.After(wait):
			wait = min(2*wait, 100*time.Millisecond)
		}
	}
}

// stop closes the member if it runs; embed's Close returns once the
// server and its listeners are down. A leader first hands leadership to
// the best-connected follower (etcd's graceful stop).
func (m *member) stop() {
	if m.etcd == nil {
		return
	}
	m.etcd.Close()
	m.etcd = nil
}

// hardStop stops the member's raft loop without handing over leadership,
// then closes it. Used when every member is going away at once: a graceful
// leader would wait a whole request timeout (5 s + 2 elections) for a
// transfer to a follower that is itself stopping.
func (m *member) hardStop() {
	if m.etcd == nil {
		return
	}
	m.etcd.Server.HardStop()
	m.stop()
}

func (c *Cluster) embedConfig(m *member) *embed.Config {
	ec := embed.NewConfig()
	ec.Name = m.name
	ec.Dir = m.dir
	ec.TickMs = uint(c.cfg.Heartbeat / time.Millisecond)
	ec.ElectionMs = uint(c.cfg.ElectionTimeout / time.Millisecond)
	ec.ListenClientUrls = []url.URL{m.clientURL}
	ec.AdvertiseClientUrls = []url.URL{m.clientURL}
	ec.ListenPeerUrls = []url.URL{m.peerURL}
	ec.AdvertisePeerUrls = []url.URL{m.peerURL}
	peers := make([]string, len(c.members))
	for i, p := range c.members {
		peers[i] = p.name + "=" + p.peerURL.String()
	}
	ec.InitialCluster = strings.Join(peers, ",")
	ec.InitialClusterToken = c.token
	ec.ClusterState = embed.ClusterStateFlagNew // ignored once the member has data
	ec.SocketOpts.ReuseAddress = true
	lg := c.cfg.Logger
	if lg == nil {
		lg = defaultLogger()
	}
	ec.ZapLoggerBuilder = embed.NewZapLoggerBuilder(lg.Named(m.name))
	return ec
}

func (c *Cluster) readLayout() (layout, bool, error) {
	if c.ownDir {
		return layout{}, false, nil
	}
	b, err := os.ReadFile(filepath.Join(c.dir, layoutFile))
	if errors.Is(err, os.ErrNotExist) {
		return layout{}, false, nil
	}
	if err != nil {
		return layout{}, false, fmt.Errorf("embedded: read layout: %w", err)
	}
	var lay layout
	if err := json.Unmarshal(b, &lay); err != nil {
		return layout{}, false, fmt.Errorf("embedded: parse %s: %w", layoutFile, err)
	}
	if len(lay.Members) != c.cfg.Members {
		return layout{}, false, fmt.Errorf("%w: %s has %d members, config asks for %d", ErrLayoutMismatch, filepath.Join(c.dir, layoutFile), len(lay.Members), c.cfg.Members)
	}
	return lay, true, nil
}

// writeLayout records lay in Dir/cluster.json (write then rename), only
// when the caller owns Dir.
func (c *Cluster) writeLayout(lay layout) error {
	if c.ownDir {
		return nil
	}
	b, err := json.MarshalIndent(lay, "", "  ")
	if err != nil {
		return fmt.Errorf("embedded: encode layout: %w", err)
	}
	tmp := filepath.Join(c.dir, layoutFile+".tmp")
	if err := os.WriteFile(tmp, append(b, '\n'), 0o600); err != nil {
		return fmt.Errorf("embedded: write layout: %w", err)
	}
	if err := os.Rename(tmp, filepath.Join(c.dir, layoutFile)); err != nil {
		return fmt.Errorf("embedded: write layout: %w", err)
	}
	return nil
}

func (c *Cluster) useLayout(lay layout) error {
	c.token = lay.Token
	c.members = make([]*member, len(lay.Members))
	for i, lm := range lay.Members {
		cu, err := url.Parse(lm.ClientURL)
		if err != nil {
			return fmt.Errorf("%w: client url of %s: %v", ErrLayoutMismatch, lm.Name, err)
		}
		pu, err := url.Parse(lm.PeerURL)
		if err != nil {
			return fmt.Errorf("%w: peer url of %s: %v", ErrLayoutMismatch, lm.Name, err)
		}
		c.members[i] = &member{name: lm.Name, dir: filepath.Join(c.dir, lm.Name), clientURL: *cu, peerURL: *pu}
	}
	return nil
}

// newLayout names n members and gives each a client and a peer port that
// the OS reported free, and the cluster a random token so that clusters in
// one process never mistake each other's members for their own.
func newLayout(n int) (layout, error) {
	var raw [8]byte
	if _, err := rand.Read(raw[:]); err != nil {
		return layout{}, fmt.Errorf("embedded: cluster token: %w", err)
	}
	ports, err := freePorts(2 * n)
	if err != nil {
		return layout{}, err
	}
	lay := layout{Token: "embedded-" + hex.EncodeToString(raw[:])}
	for i := 0; i < n; i++ {
		lay.Members = append(lay.Members, layoutMember{
			Name:      fmt.Sprintf("member-%d", i),
			ClientURL: fmt.Sprintf("http://%s:%d", host, ports[2*i]),
			PeerURL:   fmt.Sprintf("http://%s:%d", host, ports[2*i+1]),
		})
	}
	return lay, nil
}

// freePorts asks the OS for n distinct free TCP ports on host: it holds
// all n listeners open at once (so no port is handed out twice), then
// closes them. Another process may take a port before etcd binds it; Start
// retries on that.
func freePorts(n int) ([]int, error) {
	ls := make([]net.Listener, 0, n)
	defer func() {
		for _, l := range ls {
			_ = l.Close()
		}
	}()
	ports := make([]int, 0, n)
	for i := 0; i < n; i++ {
		l, err := net.Listen("tcp", net.JoinHostPort(host, "0"))
		if err != nil {
			return nil, fmt.Errorf("embedded: free port: %w", err)
		}
		ls = append(ls, l)
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	return ports, nil
}

func isAddrInUse(err error) bool {
	return errors.Is(err, syscall.EADDRINUSE) || strings.Contains(err.Error(), "address already in use")
}

func sleepCtx(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
