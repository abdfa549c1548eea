// Command pubsub-fake runs the in-memory Pub/Sub fake
// (cloud.google.com/go/pubsub/v2/pstest) as a process of its own, for the
// local stack; clients reach it through PUBSUB_EMULATOR_HOST.
//
//	pubsub-fake [-port 0]
//
// Once it listens it prints {"addr":"127.0.0.1:PORT","pid":PID} on stdout.
// SIGINT or SIGTERM stops it and exits 0; everything is in memory and ends
// with the process.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"net"
	"os"
	"os/signal"
	"strconv"
	"syscall"

	"cloud.google.com/go/pubsub/v2/pstest"
)

type ready struct {
	Addr string `json:"addr"`
	PID  int    `json:"pid"`
}

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "pubsub-fake:", err)
		os.Exit(1)
	}
}

func run() error {
	port := flag.Int("port", 0, "TCP port on 127.0.0.1 (default: one chosen by the operating system)")
	flag.Parse()
	if flag.NArg() > 0 {
		return fmt.Errorf("unexpected arguments %q", flag.Args())
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	srv := pstest.NewServerWithAddress(net.JoinHostPort("127.0.0.1", strconv.Itoa(*port)))
	defer srv.Close()
	line, err := json.Marshal(ready{Addr: srv.Addr, PID: os.Getpid()})
	if err != nil {
		return err
	}
	if _, err := fmt.Fprintf(os.Stdout, "%s\n", line); err != nil {
		return fmt.Errorf("write ready line: %w", err)
	}
	<-ctx.Done()
	return nil
}
