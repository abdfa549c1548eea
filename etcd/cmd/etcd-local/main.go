// Command etcd-local runs an embedded etcd cluster (package etcd/embedded)
// as a process of its own, so that an experiment can pause, kill or stop it
// like a real etcd.
//
//	etcd-local [-members 1] [-dir DIR] [-ready-file FILE]
//	etcd-local -members 3 -dir DIR -prepare   # record the layout in DIR
//	etcd-local -members 3 -dir DIR -member I  # run member I of it
//	etcd-local -hosts IP,IP,IP -dir DIR -prepare  # one address per member (network namespaces)
//
// Once its members are ready it prints one JSON line on stdout (and writes
// it atomically to -ready-file): {"endpoints":[...],"members":[...],
// "dir":DIR,"pid":PID}. With -dir, a later run serves the same data on the
// same URLs; without it a temporary directory is removed on exit. SIGINT or
// SIGTERM stops every member and exits 0; a failure to start exits 1.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/distributed-lock-lab/distributed-lock-lab/etcd/embedded"
)

type readyMember struct {
	Name      string `json:"name"`
	ClientURL string `json:"clientURL"`
	PeerURL   string `json:"peerURL"`
	Dir       string `json:"dir"`
}

type ready struct {
	Endpoints []string      `json:"endpoints"`
	Members   []readyMember `json:"members"`
	Dir       string        `json:"dir"`
	PID       int           `json:"pid"`
}

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "etcd-local:", err)
		os.Exit(1)
	}
}

func run() error {
	members := flag.Int("members", embedded.DefaultMembers, "number of etcd members (1..7; 3 for failover experiments)")
	dir := flag.String("dir", "", "parent of the members' data directories; kept on exit and reused by a later run (default: a temporary directory removed on exit)")
	readyFile := flag.String("ready-file", "", "also write the ready JSON line to this file once every member is ready")
	startTimeout := flag.Duration("start-timeout", time.Minute, "give up if the cluster is not ready within this time")
	member := flag.Int("member", -1, "run only this member (0..members-1) of the cluster prepared in -dir (default: every member)")
	prepare := flag.Bool("prepare", false, "record a new cluster's layout in -dir for one process per member (-member), then exit")
	hosts := flag.String("hosts", "", "with -prepare: comma-separated IP addresses, one per member, each serving on etcd's ports 2379 and 2380 (default: loopback, free ports)")
	flag.Parse()
	if flag.NArg() > 0 {
		return fmt.Errorf("unexpected arguments %q", flag.Args())
	}
	if *prepare {
		if *dir == "" {
			return errors.New("-prepare needs -dir")
		}
		if *hosts != "" {
			return embedded.PrepareDirHosts(*dir, strings.Split(*hosts, ","))
		}
		return embedded.PrepareDir(*dir, *members)
	}
	var only []int
	if *member >= 0 {
		only = []int{*member}
	}

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()

	startCtx, cancel := context.WithTimeout(ctx, *startTimeout)
	c, err := embedded.Start(startCtx, embedded.Config{Members: *members, Dir: *dir, Only: only})
	cancel()
	if err != nil {
		return err
	}
	defer c.Close()

	r := ready{Endpoints: c.Endpoints(), Dir: c.Dir(), PID: os.Getpid()}
	for i := 0; i < c.Size(); i++ {
		m, err := c.Member(i)
		if err != nil {
			return err
		}
		if !m.Running {
			continue
		}
		r.Members = append(r.Members, readyMember{Name: m.Name, ClientURL: m.ClientURL, PeerURL: m.PeerURL, Dir: m.Dir})
	}
	line, err := json.Marshal(r)
	if err != nil {
		return err
	}
	line = append(line, '\n')
	if *readyFile != "" {
		if err := writeAtomic(*readyFile, line); err != nil {
			return err
		}
		defer os.Remove(*readyFile)
	}
	if _, err := os.Stdout.Write(line); err != nil {
		return fmt.Errorf("write ready line: %w", err)
	}

	<-ctx.Done()
	return c.Close()
}

// writeAtomic writes b to a temporary file beside path and renames it.
func writeAtomic(path string, b []byte) error {
	tmp, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".*")
	if err != nil {
		return fmt.Errorf("ready file: %w", err)
	}
	_, werr := tmp.Write(b)
	cerr := tmp.Close()
	if err := errors.Join(werr, cerr); err != nil {
		_ = os.Remove(tmp.Name())
		return fmt.Errorf("ready file: %w", err)
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		_ = os.Remove(tmp.Name())
		return fmt.Errorf("ready file: %w", err)
	}
	return nil
}
