package serve_test

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/GoogleCloudPlatform/functions-framework-go/funcframework"

	_ "github.com/distributed-lock-lab/distributed-lock-lab" // registers the functions with the framework
	"github.com/distributed-lock-lab/distributed-lock-lab/functions/catalog"
	"github.com/distributed-lock-lab/distributed-lock-lab/functions/catalog/executorfn"
	"github.com/distributed-lock-lab/distributed-lock-lab/functions/catalog/railstubfn"
	"github.com/distributed-lock-lab/distributed-lock-lab/functions/executor"
	"github.com/distributed-lock-lab/distributed-lock-lab/functions/rail"
	"github.com/distributed-lock-lab/distributed-lock-lab/functions/serve"
	"github.com/distributed-lock-lab/distributed-lock-lab/internal/jsonhandler"
	lockapi "github.com/distributed-lock-lab/distributed-lock-lab/lockserver/api"
)

// reply is what a client sees of one answer.
type reply struct {
	status      int
	contentType string
	body        string
}

// send sends one request and reads its reply, redirects not followed.
func send(t *testing.T, req *http.Request) reply {
	t.Helper()
	client := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	resp, err := client.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", req.Method, req.URL, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("%s %s: %v", req.Method, req.URL, err)
	}
	return reply{resp.StatusCode, resp.Header.Get("Content-Type"), string(body)}
}

// serveLikeTheImages serves f as its functions/cmd main does (serve.Main's
// run, the hardened server) on a loopback port the OS picks, with the
// process's environment, until the test ends; it returns the base URL.
func serveLikeTheImages(t *testing.T, f catalog.Function) string {
	t.Helper()
	getenv := func(k string) string {
		switch k {
		case "HOST":
			return "127.0.0.1"
		case "PORT":
			return "0"
		}
		return os.Getenv(k)
	}
	ctx, cancel := context.WithCancel(context.Background())
	ready := make(chan net.Addr, 1)
	done := make(chan error, 1)
	go func() {
		done <- serve.Run(ctx, f.Name, f.EnvNames(), os.Environ(), getenv, f.Build, slog.New(slog.DiscardHandler), f.Collectors(), ready)
	}()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("serve %s: %v", f.Name, err)
		}
	})
	select {
	case addr := <-ready:
		return "http://" + addr.String()
	case err := <-done:
		t.Fatalf("serve %s: %v", f.Name, err)
		return ""
	}
}

// serveThroughTheFramework serves the function registered as target the
// way FUNCTION_TARGET=target go run ./functions/cmd/framework does
// (funcframework.StartHostPort, which cannot be stopped: the server lives
// until the test binary ends) and returns its base URL. The framework
// takes a port number, not a listener: the port comes from the OS and is
// freed just before the framework binds it; should another process take it
// in between, the next port is tried.
func serveThroughTheFramework(t *testing.T, target string) string {
	t.Helper()
	t.Setenv("FUNCTION_TARGET", target)
	for range 5 {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		addr := ln.Addr().String()
		ln.Close()
		_, port, _ := net.SplitHostPort(addr)
		failed := make(chan error, 1)
		go func() { failed <- funcframework.StartHostPort("127.0.0.1", port) }()
		if err := awaitListening(addr, failed); err == nil {
			return "http://" + addr
		} else if !errors.Is(err, syscall.EADDRINUSE) {
			t.Fatalf("framework serving %s: %v", target, err)
		}
	}
	t.Fatalf("framework serving %s: no free port in 5 tries", target)
	return ""
}

// awaitListening returns nil once addr accepts a connection, or the
// server's error if it stops first.
func awaitListening(addr string, failed <-chan error) error {
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	deadline := time.After(10 * time.Second)
	for {
		if c, err := net.Dial("tcp", addr); err == nil {
			c.Close()
			return nil
		}
		select {
		case err := <-failed:
			return err
		case <-deadline:
			return errors.New("not listening after 10s")
		case <-tick.C:
		}
	}
}

// TestFrameworkServesAnHTTPFunctionAsServeDoes: rail-stub registered with
// functions-framework-go and served under FUNCTION_TARGET answers as the
// image's process (serve) does: same status, content type and body, the
// metrics at serve.PathMetrics included. The one difference is the path
// check: the framework's ServeMux redirects a non-canonical path with a
// 307 before the function sees it, where serve refuses it with 400.
func TestFrameworkServesAnHTTPFunctionAsServeDoes(t *testing.T) {
	t.Setenv("RAIL_STUB_DECLINE_OVER_MINOR", "500")
	images := serveLikeTheImages(t, railstubfn.Function)
	framework := serveThroughTheFramework(t, railstubfn.Function.Name)
	for _, tc := range []struct{ method, path, body string }{
		{"GET", rail.PathJournal, ""},
		{"GET", "/admin/faults", ""},
		{"POST", rail.PathSubmit, `{"payoutId":"p1"}`},
		{"POST", rail.PathSubmit, `not json`},
		{"GET", "/nowhere", ""},
		{"DELETE", rail.PathJournal, ""},
	} {
		var got [2]reply
		for i, base := range []string{images, framework} {
			req, err := http.NewRequest(tc.method, base+tc.path, strings.NewReader(tc.body))
			if err != nil {
				t.Fatal(err)
			}
			req.Header.Set("Content-Type", "application/json")
			got[i] = send(t, req)
		}
		if got[0] != got[1] {
			t.Errorf("%s %s %s:\nserve     %+v\nframework %+v", tc.method, tc.path, tc.body, got[0], got[1])
		}
	}
	var got [2]reply
	for i, base := range []string{images, framework} {
		req, _ := http.NewRequest("GET", base+serve.PathMetrics, nil)
		got[i] = send(t, req)
		if !strings.Contains(got[i].body, "function_requests_total") {
			t.Errorf("GET %s%s: body has no function_requests_total", base, serve.PathMetrics)
		}
	}
	if got[0].status != got[1].status || got[0].contentType != got[1].contentType {
		t.Errorf("GET %s: serve %d %q, framework %d %q", serve.PathMetrics, got[0].status, got[0].contentType, got[1].status, got[1].contentType)
	}
	for i, want := range []int{http.StatusBadRequest, http.StatusTemporaryRedirect} {
		req, _ := http.NewRequest("POST", []string{images, framework}[i]+"/x/.."+rail.PathSubmit, strings.NewReader("{}"))
		if r := send(t, req); r.status != want {
			t.Errorf("POST /x/.."+rail.PathSubmit+" via %s = %d; want %d", []string{"serve", "framework"}[i], r.status, want)
		}
	}
}

// pubsubCloudEvent returns a Pub/Sub message with data as the CloudEvent a
// Pub/Sub trigger delivers (google.cloud.pubsub.topic.v1.messagePublished),
// in structured or binary mode.
func pubsubCloudEvent(t *testing.T, base string, structured bool, data []byte) *http.Request {
	t.Helper()
	msg, err := json.Marshal(map[string]any{
		"message": map[string]any{
			"data":        base64.StdEncoding.EncodeToString(data),
			"attributes":  map[string]string{"payoutId": "po-1", "accountId": "acct-1"},
			"messageId":   "17",
			"publishTime": "2026-12-05T10:00:00Z",
		},
		"subscription": "projects/p/subscriptions/payouts-executor",
	})
	if err != nil {
		t.Fatal(err)
	}
	return rawCloudEvent(t, base, structured, msg)
}

// rawCloudEvent returns a messagePublished CloudEvent whose data is msg,
// JSON, in structured or binary mode.
func rawCloudEvent(t *testing.T, base string, structured bool, msg []byte) *http.Request {
	t.Helper()
	ce := map[string]string{
		"specversion": "1.0",
		"id":          "17",
		"source":      "//pubsub.googleapis.com/projects/p/topics/payouts",
		"type":        "google.cloud.pubsub.topic.v1.messagePublished",
		"time":        "2026-12-05T10:00:00Z",
	}
	var req *http.Request
	if structured {
		env := map[string]any{"datacontenttype": "application/json", "data": json.RawMessage(msg)}
		for k, v := range ce {
			env[k] = v
		}
		body, _ := json.Marshal(env)
		req, _ = http.NewRequest("POST", base+"/", bytes.NewReader(body))
		req.Header.Set("Content-Type", "application/cloudevents+json")
		return req
	}
	req, _ = http.NewRequest("POST", base+"/", bytes.NewReader(msg))
	req.Header.Set("Content-Type", "application/json")
	for k, v := range ce {
		req.Header.Set("Ce-"+k, v)
	}
	return req
}

// TestFrameworkDeliversAPubSubCloudEventAsThePushEndpointDoes: the
// executor registered as a CloudEvent function decides every Pub/Sub
// message as its push endpoint (serve, the images) does, in structured
// and binary mode: a redelivery (5xx, 409) with the same status and the
// same envelope as its body, an acknowledgement (2xx) as one. What the
// framework cannot carry over: the envelope's content type (its answer
// to an error is text), and the body and exact status of a 2xx (it
// answers 200 with no body).
func TestFrameworkDeliversAPubSubCloudEventAsThePushEndpointDoes(t *testing.T) {
	// Nothing listens at down: every dependency call is refused at once.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	down := "http://" + ln.Addr().String()
	ln.Close()
	t.Setenv(lockapi.EnvServerURL, down)
	t.Setenv(executor.EnvPaymentResourceURL, down)
	t.Setenv(executor.EnvRailProxyURL, down)
	t.Setenv(executor.EnvReportAttempts, "1")
	// The lock is never granted (lock-server is down too): each delivery
	// answers 503 once this wait ends, 15 s by default.
	t.Setenv(executor.EnvAcquireWaitMs, "300")
	images := serveLikeTheImages(t, executorfn.Function)
	framework := serveThroughTheFramework(t, executorfn.Function.Name)

	payout := []byte(`{"payoutId":"po-1","accountId":"acct-1","amountMinor":250,"currency":"EUR"}`)
	for _, structured := range []bool{true, false} {
		mode := map[bool]string{true: "structured", false: "binary"}[structured]
		// A payout whose payment-resource is down: redelivered.
		want := send(t, pubsubCloudEvent(t, images, structured, payout))
		got := send(t, pubsubCloudEvent(t, framework, structured, payout))
		var env jsonhandler.Envelope
		if want.status != http.StatusServiceUnavailable || json.Unmarshal([]byte(want.body), &env) != nil || env.Error.Code == "" {
			t.Fatalf("%s: push endpoint answered %+v; want 503 with the envelope", mode, want)
		}
		if got.status != want.status || got.body != want.body || !strings.HasPrefix(got.contentType, "text/plain") {
			t.Errorf("%s, payment-resource down:\npush endpoint %+v\nframework     %+v", mode, want, got)
		}
		// Data that is not a Pub/Sub message at all: refused 400 (Pub/Sub
		// would deliver it again, as for any 4xx).
		want = send(t, rawCloudEvent(t, images, structured, []byte(`[1]`)))
		got = send(t, rawCloudEvent(t, framework, structured, []byte(`[1]`)))
		if want.status != http.StatusBadRequest || got.status != want.status || got.body != want.body {
			t.Errorf("%s, not a Pub/Sub message:\npush endpoint %+v\nframework     %+v", mode, want, got)
		}
		// A message that will never decode: acknowledged, not redelivered.
		want = send(t, pubsubCloudEvent(t, images, structured, []byte("not a payout")))
		got = send(t, pubsubCloudEvent(t, framework, structured, []byte("not a payout")))
		if want.status/100 != 2 || got.status/100 != 2 {
			t.Errorf("%s, undecodable payout: push endpoint %d, framework %d; want both 2xx (acknowledged)", mode, want.status, got.status)
		}
	}
}
