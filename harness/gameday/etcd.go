package gameday

import (
	"bufio"
	"context"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/distributed-lock-lab/distributed-lock-lab/local/stack"
)

// etcdGauge reads one unlabelled gauge (etcd_server_is_leader, ...) from
// the metrics of the etcd member at endpoint (its client URL), within 2 s.
func etcdGauge(ctx context.Context, endpoint, name string) (float64, error) {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, endpoint+"/metrics", nil)
	if err != nil {
		return 0, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), name+" "); ok {
			return strconv.ParseFloat(strings.TrimSpace(v), 64)
		}
	}
	return 0, fmt.Errorf("gameday: %s has no %s", endpoint, name)
}

// etcdLeader returns the index of the member that reports itself leader
// (local/stack names it etcd-<index>; its endpoints are in member
// order), other than not (-1: any), polling until ctx ends.
func etcdLeader(ctx context.Context, endpoints []string, not int) (int, error) {
	for {
		for i, ep := range endpoints {
			if i == not {
				continue
			}
			if v, err := etcdGauge(ctx, ep, "etcd_server_is_leader"); err == nil && v == 1 {
				return i, nil
			}
		}
		select {
		case <-ctx.Done():
			return -1, fmt.Errorf("gameday: no etcd leader: %w", ctx.Err())
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// churnEtcdLeader kills the etcd leader, waits until another member is
// elected, and restarts the killed one, rounds times.
func churnEtcdLeader(ctx context.Context, st *stack.Stack, rounds int) error {
	eps := st.EtcdEndpoints()
	for range rounds {
		lctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		leader, err := etcdLeader(lctx, eps, -1)
		if err == nil {
			name := "etcd-" + strconv.Itoa(leader)
			if err = st.Kill(name); err == nil {
				if _, err = etcdLeader(lctx, eps, leader); err == nil {
					err = st.Restart(lctx, name)
				}
			}
		}
		cancel()
		if err != nil {
			return err
		}
	}
	return nil
}
