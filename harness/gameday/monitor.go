package gameday

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	promapi "github.com/prometheus/client_golang/api"
	promv1 "github.com/prometheus/client_golang/api/prometheus/v1"
	"github.com/prometheus/common/model"
)

// Binaries of the Debian packages prometheus and prometheus-alertmanager.
const (
	BinPrometheus   = "prometheus"
	BinAlertmanager = "prometheus-alertmanager"
)

// receiver is the Alertmanager webhook receiver: it notes when each
// alert name was first received firing (the receipt time is the
// detection time).
type receiver struct {
	srv *http.Server
	url string

	mu     sync.Mutex
	firing map[string]time.Time // alertname -> first receipt since the last reset
	// resolved: alertname/severity -> last receipt of its resolution.
	resolved map[string]time.Time
	notify   chan struct{}
}

func startReceiver() (*receiver, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	r := &receiver{firing: map[string]time.Time{}, resolved: map[string]time.Time{}, notify: make(chan struct{}, 1)}
	r.srv = &http.Server{Handler: http.HandlerFunc(r.serve), ReadHeaderTimeout: 5 * time.Second}
	r.url = "http://" + ln.Addr().String() + "/alerts"
	go func() { _ = r.srv.Serve(ln) }() // ends at close (Shutdown)
	return r, nil
}

// webhook is the part of Alertmanager's webhook body (version 4) read here.
type webhook struct {
	Alerts []struct {
		Status string            `json:"status"`
		Labels map[string]string `json:"labels"`
	} `json:"alerts"`
}

func (r *receiver) serve(w http.ResponseWriter, req *http.Request) {
	now := time.Now()
	var body webhook
	if err := json.NewDecoder(io.LimitReader(req.Body, 1<<20)).Decode(&body); err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	r.mu.Lock()
	for _, a := range body.Alerts {
		if a.Status == "resolved" {
			r.resolved[a.Labels["alertname"]+"/"+a.Labels["severity"]] = now
		}
		if name := a.Labels["alertname"]; a.Status == "firing" && name != "" {
			// By name, and by name and severity (Fault.Severity).
			for _, k := range []string{name, name + "/" + a.Labels["severity"]} {
				if _, ok := r.firing[k]; !ok {
					r.firing[k] = now
				}
			}
		}
	}
	r.mu.Unlock()
	select {
	case r.notify <- struct{}{}:
	default:
	}
	w.WriteHeader(http.StatusOK)
}

// reset forgets what was received (before a fault is injected).
func (r *receiver) reset() {
	r.mu.Lock()
	r.firing = map[string]time.Time{}
	r.mu.Unlock()
}

// received returns the alert names received firing since the last reset,
// each also as name/severity.
func (r *receiver) received() map[string]time.Time {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make(map[string]time.Time, len(r.firing))
	for k, v := range r.firing {
		out[k] = v
	}
	return out
}

// await waits until alert is received firing, or ctx ends.
func (r *receiver) await(ctx context.Context, alert string) (time.Time, error) {
	for {
		if at, ok := r.received()[alert]; ok {
			return at, nil
		}
		select {
		case <-ctx.Done():
			return time.Time{}, ctx.Err()
		case <-r.notify:
		case <-time.After(200 * time.Millisecond):
		}
	}
}

func (r *receiver) close() {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	_ = r.srv.Shutdown(ctx)
}

// freePort asks the OS for a free loopback port.
func freePort() (int, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port, nil
}

// daemon is Prometheus or Alertmanager, run in a process group of its own.
type daemon struct {
	name string
	cmd  *exec.Cmd
	done chan struct{}
}

func startDaemon(name, bin, logPath string, args ...string) (*daemon, error) {
	path, err := exec.LookPath(bin)
	if err != nil {
		return nil, fmt.Errorf("%w: %s is not on PATH (Debian package %s): %v", ErrPrerequisite, bin, debianPackage(bin), err)
	}
	logf, err := os.Create(logPath)
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(path, args...)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		logf.Close()
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	d := &daemon{name: name, cmd: cmd, done: make(chan struct{})}
	go func() { _ = cmd.Wait(); logf.Close(); close(d.done) }() // ends when the process exits
	return d, nil
}

func debianPackage(bin string) string {
	if bin == BinAlertmanager {
		return "prometheus-alertmanager"
	}
	return "prometheus"
}

// stop sends SIGTERM to the group, then SIGKILL after 5 s, and waits.
func (d *daemon) stop() {
	if d == nil {
		return
	}
	_ = syscall.Kill(-d.cmd.Process.Pid, syscall.SIGTERM)
	select {
	case <-d.done:
	case <-time.After(5 * time.Second):
		_ = syscall.Kill(-d.cmd.Process.Pid, syscall.SIGKILL)
		<-d.done
	}
}

// awaitReady polls url until it answers 200 or ctx ends or d exits.
func awaitReady(ctx context.Context, d *daemon, u string) error {
	for {
		resp, err := http.Get(u)
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%s not ready at %s: %w", d.name, u, ctx.Err())
		case <-d.done:
			return fmt.Errorf("%s exited during start (see its log)", d.name)
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// Target is one scrape job of the game day's Prometheus.
type Target struct {
	Job, Addr string // host:port, metrics at /metrics
	// Interval, when not zero, replaces the global 1 s scrape interval
	// for this job; the scrape timeout is then Interval - 100 ms. A
	// target whose /metrics may take longer than 900 ms on purpose needs
	// it (payment-resource waits up to 2 s for paydb's ages).
	Interval time.Duration
}

// writeAlertmanagerConfig: one route to the webhook, one group per alert
// name and severity, sent at once (group_wait 0s), never repeated within
// the run. Resolutions are sent too (the receiver ignores them): without
// them Alertmanager's notification log keeps an alert that ended as still
// notified, and when the same alert fires again (a burn that fired by
// itself, went quiet, and is then fired by its fault) the group looks
// unchanged and nothing is sent until repeat_interval, an hour
// (TestAnAlertThatFiresAgainIsReceivedAgain).
func writeAlertmanagerConfig(path, webhookURL string) error {
	cfg := fmt.Sprintf(`route:
  receiver: gameday
  group_by: [alertname, severity]
  group_wait: 0s
  group_interval: 1s
  repeat_interval: 1h
receivers:
  - name: gameday
    webhook_configs:
      - url: %q
        send_resolved: true
`, webhookURL)
	return os.WriteFile(path, []byte(cfg), 0o644)
}

// writePrometheusConfig: scrape and evaluate every second, the game-day
// rules (ops/prometheus/gameday/rules.yml), one Alertmanager.
func writePrometheusConfig(path, rules, alertmanager string, targets []Target) error {
	var b strings.Builder
	fmt.Fprintf(&b, `global:
  scrape_interval: 1s
  scrape_timeout: 900ms
  evaluation_interval: 1s
rule_files:
  - %q
alerting:
  alertmanagers:
    - static_configs:
        - targets: [%q]
scrape_configs:
`, rules, alertmanager)
	// One job per name (Prometheus refuses a name twice), with every
	// target of that name; the job's interval is its first target's.
	var jobs []string
	byJob := map[string][]Target{}
	for _, t := range targets {
		if _, ok := byJob[t.Job]; !ok {
			jobs = append(jobs, t.Job)
		}
		byJob[t.Job] = append(byJob[t.Job], t)
	}
	for _, job := range jobs {
		ts := byJob[job]
		fmt.Fprintf(&b, "  - job_name: %q\n", job)
		if iv := ts[0].Interval; iv > 0 {
			fmt.Fprintf(&b, "    scrape_interval: %dms\n    scrape_timeout: %dms\n", iv.Milliseconds(), (iv - 100*time.Millisecond).Milliseconds())
		}
		addrs := make([]string, len(ts))
		for i, t := range ts {
			addrs[i] = strconv.Quote(t.Addr)
		}
		fmt.Fprintf(&b, "    static_configs:\n      - targets: [%s]\n", strings.Join(addrs, ", "))
	}
	return os.WriteFile(path, []byte(b.String()), 0o644)
}

// monitor is the game day's Prometheus, Alertmanager and receiver.
type monitor struct {
	recv     *receiver
	prom, am *daemon
	promAPI  promv1.API // Prometheus' HTTP API
	// promCfg is Prometheus' configuration file, amAddr Alertmanager's
	// host:port (retarget rewrites the one with the other).
	promCfg, amAddr string
}

// retarget points Prometheus at new scrape targets (the stack of the next
// phase): it rewrites the configuration and sends SIGHUP, which makes
// Prometheus reload it. Series of the old targets go stale.
func (m *monitor) retarget(rules string, targets []Target) error {
	if err := writePrometheusConfig(m.promCfg, rules, m.amAddr, targets); err != nil {
		return err
	}
	return m.prom.cmd.Process.Signal(syscall.SIGHUP)
}

func startMonitor(ctx context.Context, dir, rules string, targets []Target) (m *monitor, err error) {
	m = &monitor{}
	defer func() {
		if err != nil {
			m.stop()
		}
	}()
	if m.recv, err = startReceiver(); err != nil {
		return m, err
	}
	amPort, err := freePort()
	if err != nil {
		return m, err
	}
	amClusterPort, err := freePort()
	if err != nil {
		return m, err
	}
	amCfg := filepath.Join(dir, "alertmanager.yml")
	if err := writeAlertmanagerConfig(amCfg, m.recv.url); err != nil {
		return m, err
	}
	amAddr := fmt.Sprintf("127.0.0.1:%d", amPort)
	if m.am, err = startDaemon("alertmanager", BinAlertmanager, filepath.Join(dir, "alertmanager.log"),
		"--config.file="+amCfg, "--storage.path="+filepath.Join(dir, "alertmanager-data"),
		"--web.listen-address="+amAddr, fmt.Sprintf("--cluster.listen-address=127.0.0.1:%d", amClusterPort)); err != nil {
		return m, err
	}
	if err := awaitReady(ctx, m.am, "http://"+amAddr+"/-/ready"); err != nil {
		return m, err
	}
	promPort, err := freePort()
	if err != nil {
		return m, err
	}
	promCfg := filepath.Join(dir, "prometheus.yml")
	m.promCfg, m.amAddr = promCfg, amAddr
	if err := writePrometheusConfig(promCfg, rules, amAddr, targets); err != nil {
		return m, err
	}
	promAddr := fmt.Sprintf("127.0.0.1:%d", promPort)
	if m.prom, err = startDaemon("prometheus", BinPrometheus, filepath.Join(dir, "prometheus.log"),
		"--config.file="+promCfg, "--storage.tsdb.path="+filepath.Join(dir, "prometheus-data"),
		"--web.listen-address="+promAddr); err != nil {
		return m, err
	}
	promURL := "http://" + promAddr
	if err := awaitReady(ctx, m.prom, promURL+"/-/ready"); err != nil {
		return m, err
	}
	c, err := promapi.NewClient(promapi.Config{Address: promURL})
	if err != nil {
		return m, err
	}
	m.promAPI = promv1.NewAPI(c)
	return m, nil
}

// query evaluates the instant query expr at time at (now when at is
// zero) and returns its samples.
func (m *monitor) query(ctx context.Context, expr string, at time.Time) (model.Vector, error) {
	// Prometheus reads the time in milliseconds.
	v, _, _, err := m.promAPI.Query(ctx, expr, at.Truncate(time.Millisecond))
	if err != nil {
		return nil, fmt.Errorf("prometheus: %s: %w", expr, err)
	}
	vec, ok := v.(model.Vector)
	if !ok {
		return nil, fmt.Errorf("prometheus: %s: %T, not an instant vector", expr, v)
	}
	return vec, nil
}

// awaitQuery polls q until it returns at least one series.
func (m *monitor) awaitQuery(ctx context.Context, q string) error {
	for {
		v, err := m.query(ctx, q, time.Time{})
		if err == nil && len(v) > 0 {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("prometheus: %q never true: %w (last error %v)", q, ctx.Err(), err)
		case <-time.After(250 * time.Millisecond):
		}
	}
}

func (m *monitor) stop() {
	if m == nil {
		return
	}
	m.prom.stop()
	m.am.stop()
	if m.recv != nil {
		m.recv.close()
	}
}
