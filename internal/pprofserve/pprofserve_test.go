package pprofserve_test

import (
	"bytes"
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"testing"

	"github.com/distributed-lock-lab/distributed-lock-lab/internal/pprofserve"
)

func TestOffByDefault(t *testing.T) {
	cfg, err := pprofserve.LoadConfig(func(string) string { return "" })
	if err != nil || cfg.Enabled() {
		t.Fatalf("LoadConfig(empty env) = %+v, %v; want off, nil", cfg, err)
	}
	var logs bytes.Buffer
	addr, wait, err := pprofserve.Start(t.Context(), cfg, nil, slog.New(slog.NewJSONHandler(&logs, nil)))
	wait()
	if addr != "" || err != nil || logs.Len() != 0 {
		t.Errorf("Start(off) = %q, %v, logged %q; want nothing served, nothing logged", addr, err, logs.String())
	}
}

func TestValidateRefusesNonLoopbackAndBadPorts(t *testing.T) {
	for _, addr := range []string{"0.0.0.0:6060", ":6060", "10.1.2.3:6060", "example.com:6060", "127.0.0.1", "127.0.0.1:x", "127.0.0.1:70000"} {
		err := pprofserve.Config{Addr: addr}.Validate()
		if !errors.Is(err, pprofserve.ErrInvalidConfig) || !strings.Contains(err.Error(), pprofserve.EnvAddr) {
			t.Errorf("Validate(%q) = %v; want ErrInvalidConfig naming %s", addr, err, pprofserve.EnvAddr)
		}
	}
	for _, addr := range []string{"127.0.0.1:6060", "[::1]:0", "localhost:6061", ""} {
		if err := (pprofserve.Config{Addr: addr}).Validate(); err != nil {
			t.Errorf("Validate(%q) = %v; want nil", addr, err)
		}
	}
}

func TestRefusesThePublicListenersAddress(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	_, wait, err := pprofserve.Start(t.Context(), pprofserve.Config{Addr: ln.Addr().String()}, ln.Addr(), slog.New(slog.DiscardHandler))
	wait()
	if !errors.Is(err, pprofserve.ErrInvalidConfig) {
		t.Errorf("Start on the public address = %v; want ErrInvalidConfig", err)
	}
}

func TestServesTheProfilerOnItsOwnAddress(t *testing.T) {
	ctx, cancel := context.WithCancel(t.Context())
	var logs bytes.Buffer
	addr, wait, err := pprofserve.Start(ctx, pprofserve.Config{Addr: "127.0.0.1:0"}, nil, slog.New(slog.NewJSONHandler(&logs, nil)))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { cancel(); wait() }()
	if !strings.Contains(logs.String(), `"event":"`+pprofserve.EventServing+`"`) || !strings.Contains(logs.String(), addr) {
		t.Errorf("logs %q; want one %s line with %s", logs.String(), pprofserve.EventServing, addr)
	}
	resp, err := http.Get("http://" + addr + "/debug/pprof/goroutine?debug=1")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || !bytes.Contains(body, []byte("goroutine profile:")) {
		t.Errorf("GET goroutine profile: %s %.80q; want 200 and a goroutine profile", resp.Status, body)
	}
}
