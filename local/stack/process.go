package stack

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	neturl "net/url"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// Process is one child process of a Stack: a service, an executor, etcd or
// the Pub/Sub fake. Its stdout and stderr go to its log file. It is safe
// for concurrent use.
type Process struct {
	name    string
	logPath string
	cmd     *exec.Cmd
	done    chan struct{}
	err     error // set before done is closed
	stopped bool  // guarded by mu
	mu      sync.Mutex
}

// Name returns the process's name in the stack ("lock-server",
// "executor-A", ...).
func (p *Process) Name() string { return p.name }

// PID returns the operating-system process id.
func (p *Process) PID() int { return p.cmd.Process.Pid }

// LogPath returns the file that holds the process's output (JSON logs on
// stderr for every service of the project).
func (p *Process) LogPath() string { return p.logPath }

// Done is closed when the process has exited.
func (p *Process) Done() <-chan struct{} { return p.done }

// Signal sends sig to the process. It returns an error once the process
// has exited.
func (p *Process) Signal(sig syscall.Signal) error {
	select {
	case <-p.done:
		return fmt.Errorf("stack: %s has exited", p.name)
	default:
	}
	return syscall.Kill(p.PID(), sig)
}

// State returns the process's state letter from /proc/PID/stat ('R', 'S',
// 'T' when stopped, ...), or 0 when it no longer exists.
func (p *Process) State() byte {
	stat, err := os.ReadFile("/proc/" + strconv.Itoa(p.PID()) + "/stat")
	if err != nil {
		return 0
	}
	i := bytes.LastIndexByte(stat, ')')
	if i < 0 || i+2 >= len(stat) {
		return 0
	}
	return stat[i+2]
}

// Log returns the whole log file.
func (p *Process) Log() ([]byte, error) { return os.ReadFile(p.logPath) }

// logTail returns the last lines of the log file, for error messages.
func (p *Process) logTail() string {
	b, err := p.Log()
	if err != nil {
		return "(no log: " + err.Error() + ")"
	}
	const max = 3000
	if len(b) > max {
		b = b[len(b)-max:]
		if i := bytes.IndexByte(b, '\n'); i >= 0 {
			b = b[i+1:]
		}
	}
	return strings.TrimSpace(string(b))
}

// exitError describes an exit during start, with the tail of the log.
func (p *Process) exitError() error {
	return fmt.Errorf("%w: %s (%v); last lines of %s:\n%s", ErrExited, p.name, p.err, p.logPath, p.logTail())
}

// stop asks the process to end (SIGTERM, and SIGCONT in case it is
// stopped), waits up to grace, then kills its process group.
func (p *Process) stop(grace time.Duration) {
	p.mu.Lock()
	already := p.stopped
	p.stopped = true
	p.mu.Unlock()
	if already {
		<-p.done
		return
	}
	select {
	case <-p.done:
		return // exited on its own: its pid may belong to another process now
	default:
	}
	// The whole process group: a process's own children (the Java server
	// behind gcloud's Pub/Sub emulator) go with it.
	_ = syscall.Kill(-p.PID(), syscall.SIGTERM)
	_ = syscall.Kill(-p.PID(), syscall.SIGCONT)
	t := time.NewTimer(grace)
	defer t.Stop()
	select {
	case <-p.done:
	case <-t.C:
		_ = syscall.Kill(-p.PID(), syscall.SIGKILL)
		<-p.done
	}
	// Whatever of the group outlived its leader.
	_ = syscall.Kill(-p.PID(), syscall.SIGKILL)
}

// spawn starts bin with args and env (added to this process's environment)
// in a process group of its own, killed by SIGKILL if this process dies,
// with stdout and stderr appended to logPath. When firstLine is not nil it
// receives the first line of stdout (the ready line of etcd-local and
// pubsub-fake); every line still reaches the log.
func spawn(name, bin, logPath string, args, env []string, firstLine chan<- string) (*Process, error) {
	logFile, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, fmt.Errorf("stack: log of %s: %w", name, err)
	}
	cmd := exec.Command(bin, args...)
	cmd.Env = append(os.Environ(), env...)
	cmd.Stderr = logFile
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	var stdout io.ReadCloser
	if firstLine != nil {
		if stdout, err = cmd.StdoutPipe(); err != nil {
			logFile.Close()
			return nil, err
		}
	} else {
		cmd.Stdout = logFile
	}
	if err := cmd.Start(); err != nil {
		logFile.Close()
		return nil, fmt.Errorf("stack: start %s: %w", name, err)
	}
	p := &Process{name: name, logPath: logPath, cmd: cmd, done: make(chan struct{})}
	var copied sync.WaitGroup
	if stdout != nil {
		// Ends at EOF, when the process exits.
		copied.Go(func() {
			sc := bufio.NewScanner(stdout)
			first := true
			for sc.Scan() {
				_, _ = fmt.Fprintln(logFile, sc.Text())
				if first {
					firstLine <- sc.Text()
					first = false
				}
			}
		})
	}
	// Ends when the process exits.
	go func() {
		copied.Wait()
		p.err = cmd.Wait()
		logFile.Close()
		close(p.done)
	}()
	return p, nil
}

// freePort asks the operating system for a free TCP port on 127.0.0.1.
// Another process may take it before the service binds it; startService
// retries on another port when that happens.
func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("stack: find a free port: %w", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// awaitHTTP polls url with GET until it answers with a status accepted by
// ok, the process exits, or ctx ends. With own, the answer counts only once
// p itself listens on url's port: a restart reuses its port, which the
// kernel may have handed to another program while p was down, and that
// program's answer is not p's readiness (p then exits, its port in use).
func awaitHTTP(ctx context.Context, p *Process, url string, ok func(status int) bool, own bool) error {
	port := 0
	if own {
		u, err := neturl.Parse(url)
		if err == nil {
			port, err = strconv.Atoi(u.Port())
		}
		if err != nil {
			return fmt.Errorf("stack: probe %q of %s: no port: %v", url, p.name, err)
		}
	}
	client := &http.Client{Timeout: time.Second}
	tick := time.NewTicker(pollInterval)
	defer tick.Stop()
	var last string
	for {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		if err != nil {
			return err
		}
		resp, err := client.Do(req)
		if err == nil {
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			switch {
			case !ok(resp.StatusCode):
				last = resp.Status
			case own && !listensOn(p.PID(), port):
				last = resp.Status + " from another process on port " + strconv.Itoa(port)
			default:
				return nil
			}
		} else {
			last = err.Error()
		}
		select {
		case <-p.done:
			return p.exitError()
		case <-ctx.Done():
			return fmt.Errorf("stack: %s not ready at %s (last answer: %s): %w", p.name, url, last, ctx.Err())
		case <-tick.C:
		}
	}
}

// listensOn reports whether process pid holds a TCP socket listening on
// port (IPv4 or IPv6), as /proc/PID/net and /proc/PID/fd show it (Linux
// only, as the rest of the package).
func listensOn(pid, port int) bool {
	sockets := map[string]bool{}
	// The process's own tables: it may be in another network namespace
	// than the reader (/proc/net is the reader's).
	proc := "/proc/" + strconv.Itoa(pid)
	for _, table := range []string{proc + "/net/tcp", proc + "/net/tcp6"} {
		b, err := os.ReadFile(table)
		if err != nil {
			continue
		}
		// sl local_address rem_address st ... inode; state 0A is LISTEN.
		for _, line := range strings.Split(string(b), "\n")[1:] {
			f := strings.Fields(line)
			if len(f) < 10 || f[3] != "0A" {
				continue
			}
			_, hexPort, _ := strings.Cut(f[1], ":")
			if n, err := strconv.ParseUint(hexPort, 16, 16); err == nil && int(n) == port {
				sockets["socket:["+f[9]+"]"] = true
			}
		}
	}
	if len(sockets) == 0 {
		return false
	}
	fdDir := proc + "/fd"
	fds, err := os.ReadDir(fdDir)
	if err != nil {
		return false
	}
	for _, fd := range fds {
		if l, err := os.Readlink(fdDir + "/" + fd.Name()); err == nil && sockets[l] {
			return true
		}
	}
	return false
}

// awaitLine waits for the first stdout line of p.
func awaitLine(ctx context.Context, p *Process, lines <-chan string) (string, error) {
	select {
	case l := <-lines:
		return l, nil
	case <-p.done:
		return "", p.exitError()
	case <-ctx.Done():
		return "", fmt.Errorf("stack: %s printed no ready line: %w", p.name, ctx.Err())
	}
}

// isBindError reports whether p exited because its port was taken.
func isBindError(p *Process) bool {
	b, _ := p.Log()
	return bytes.Contains(b, []byte("address already in use"))
}
