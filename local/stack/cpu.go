package stack

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"
)

// clockTick is the unit of the CPU times of /proc/PID/stat (USER_HZ): 100
// per second on every Linux architecture Go supports.
const clockTick = 10 * time.Millisecond

// ErrNoProcess: the process whose CPU time was asked for does not exist.
var ErrNoProcess = errors.New("stack: no such process")

// procTimes reads /proc/PID/stat: the CPU time (user + system) of the
// process itself, that of its children it has waited for (cutime +
// cstime), and its parent's pid. ErrNoProcess when it is gone.
func procTimes(pid int) (self, waited time.Duration, ppid int, err error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, 0, 0, fmt.Errorf("%w: %d: %v", ErrNoProcess, pid, err)
	}
	// The fields after the command name (in parentheses, may contain
	// anything): state(3) ppid(4) ... utime(14) stime(15) cutime(16)
	// cstime(17), numbered as in proc(5).
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return 0, 0, 0, fmt.Errorf("stack: /proc/%d/stat: no command name", pid)
	}
	f := strings.Fields(string(b[i+1:]))
	if len(f) < 15 {
		return 0, 0, 0, fmt.Errorf("stack: /proc/%d/stat: %d fields", pid, len(f))
	}
	var t [4]int64
	for k := range t {
		if t[k], err = strconv.ParseInt(f[11+k], 10, 64); err != nil {
			return 0, 0, 0, fmt.Errorf("stack: /proc/%d/stat field %d: %v", pid, 14+k, err)
		}
	}
	ppid, _ = strconv.Atoi(f[1])
	return time.Duration(t[0]+t[1]) * clockTick, time.Duration(t[2]+t[3]) * clockTick, ppid, nil
}

// treeCPU returns the CPU time of process pid, of the children it has
// waited for, and of its live children (one level: PostgreSQL's backends
// are the postmaster's children).
func treeCPU(pid int) (time.Duration, error) {
	self, waited, _, err := procTimes(pid)
	if err != nil {
		return 0, err
	}
	total := self + waited
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return 0, err
	}
	for _, e := range entries {
		n, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if cs, cw, ppid, err := procTimes(n); err == nil && ppid == pid {
			total += cs + cw
		}
	}
	return total, nil
}

// CPU returns the CPU time (user + system) the process has used so far:
// from /proc while it runs, from its exit status once it has exited (so a
// process killed during a measurement still counts).
func (p *Process) CPU() (time.Duration, error) {
	select {
	case <-p.done:
		if ps := p.cmd.ProcessState; ps != nil {
			return ps.UserTime() + ps.SystemTime(), nil
		}
		return 0, fmt.Errorf("%w: %s exited without a status", ErrNoProcess, p.name)
	default:
	}
	self, waited, _, err := procTimes(p.PID())
	return self + waited, err
}

// ClusterCPU returns, by cluster name (ClusterPaydb, ClusterLockdb), the CPU
// time of each running PostgreSQL cluster so far: the postmaster, the
// backends that have exited, and the live backends. A cluster that is
// stopped is left out. The figures only grow while a cluster runs; after a
// restart they start again from zero.
func (s *Stack) ClusterCPU() map[string]time.Duration {
	s.mu.Lock()
	clusters := append([]namedCluster(nil), s.clusters...)
	s.mu.Unlock()
	out := map[string]time.Duration{}
	for _, c := range clusters {
		pid := c.PID()
		if pid == 0 {
			continue
		}
		if d, err := treeCPU(pid); err == nil {
			out["postgres-"+c.name] = d
		}
	}
	return out
}
