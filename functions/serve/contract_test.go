package serve_test

import (
	"bufio"
	"bytes"
	"crypto/rand"
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
	"testing"
	"time"

	"cloud.google.com/go/pubsub/v2/pstest"

	"github.com/distributed-lock-lab/distributed-lock-lab/functions/executor"
	"github.com/distributed-lock-lab/distributed-lock-lab/functions/fencing/fencewire"
	payapi "github.com/distributed-lock-lab/distributed-lock-lab/functions/paymentresource/api"
	"github.com/distributed-lock-lab/distributed-lock-lab/functions/payoutevent"
	"github.com/distributed-lock-lab/distributed-lock-lab/functions/rail"
	railapi "github.com/distributed-lock-lab/distributed-lock-lab/functions/railproxy/api"
	"github.com/distributed-lock-lab/distributed-lock-lab/internal/jsonhandler"
	"github.com/distributed-lock-lab/distributed-lock-lab/internal/logjson"
	"github.com/distributed-lock-lab/distributed-lock-lab/internal/pgtest"
	"github.com/distributed-lock-lab/distributed-lock-lab/local/stack"
	lockapi "github.com/distributed-lock-lab/distributed-lock-lab/lockserver/api"
	"github.com/distributed-lock-lab/distributed-lock-lab/lockserver/fenceproof"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// cloudRunGrace is the time Cloud Run leaves a container between SIGTERM
// and SIGKILL.
const cloudRunGrace = 10 * time.Second

// contractCase is one function binary (its name in stack.Binaries) and a
// request that its handler answers only after reading the whole body.
type contractCase struct {
	name   string
	env    func(t *testing.T) []string
	method string
	path   string
	header http.Header
	body   string
	want   int // the handler's answer to body
}

// TestCloudRunContract checks Cloud Run's contract on each function
// binary: it serves on $PORT (and refuses a non-canonical spelling of
// its route with 400 and the envelope); SIGTERM with a request in flight (its
// body half sent) lets that request finish and be answered, then the
// process exits 0 within Cloud Run's 10 s; and with K_SERVICE set every
// log line carries Cloud Logging's "severity" and "message".
//
// The request is in flight for sure: it carries "Expect: 100-continue",
// which net/http answers only once the handler reads the body; the rest of
// the body is sent after the process has logged function_stopping, so it
// arrives during the drain.
func TestCloudRunContract(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the stack's binaries and starts PostgreSQL")
	}
	// The fence points refuse to start without lock-server's public proof
	// keys and rail-proxy's receipt keys.
	proofKey, err := fenceproof.GenerateSigningKey("contract-lock", rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	receiptKey, err := fenceproof.GenerateSigningKey("contract-rail", rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	// And payment-resource's payout-terms key, which rail-proxy requires.
	termsKey, err := fenceproof.GenerateSigningKey("contract-pay", rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	cases := []contractCase{
		{
			name:   "rail-stub",
			env:    func(*testing.T) []string { return nil },
			method: "POST", path: rail.PathSubmit,
			body: `{"payoutId":"p-1","accountId":"acct-1","amountMinor":5,"currency":"EUR","reference":"p-1"}`,
			want: http.StatusOK, // a real submission, acknowledged
		},
		{
			name: "rail-proxy",
			env: func(t *testing.T) []string {
				return []string{railapi.EnvDatabaseURL + "=" + pgtest.NewDatabase(t), railapi.EnvRailURL + "=http://127.0.0.1:1",
					railapi.EnvProofKeys + "=" + proofKey.VerifyKey().String(), railapi.EnvReceiptSigningKey + "=" + receiptKey.String(),
					railapi.EnvTermsKeys + "=" + termsKey.VerifyKey().String()}
			},
			method: "POST", path: railapi.PathSubmissions, header: http.Header{fencewire.HeaderToken: {"1"}},
			body: `{"payoutId":"p-1","accountId":"acct-1","amountMinor":5,"currency":"ZZZ"}`,
			want: http.StatusBadRequest, // no such currency
		},
		{
			name: "payment-resource",
			env: func(t *testing.T) []string {
				ps := pstest.NewServer()
				t.Cleanup(func() { ps.Close() })
				return []string{payapi.EnvDatabaseURL + "=" + pgtest.NewDatabase(t), "PUBSUB_EMULATOR_HOST=" + ps.Addr,
					"PUBSUB_PROJECT=contract", "PUBSUB_TOPIC=payouts",
					payapi.EnvProofKeys + "=" + proofKey.VerifyKey().String(), payapi.EnvReceiptKeys + "=" + receiptKey.VerifyKey().String(),
					payapi.EnvTermsSigningKey + "=" + termsKey.String()}
			},
			method: "POST", path: payapi.PathPayouts,
			body: `{"payoutId":"p-1","accountId":"acct-nobody","amountMinor":5,"currency":"EUR"}`,
			want: http.StatusNotFound, // no such account
		},
		{
			name: "executor",
			env: func(*testing.T) []string {
				return []string{lockapi.EnvServerURL + "=http://127.0.0.1:1", executor.EnvPaymentResourceURL + "=http://127.0.0.1:1",
					executor.EnvRailProxyURL + "=http://127.0.0.1:1", executor.EnvOwner + "=contract"}
			},
			method: "POST", path: "/",
			body: func() string {
				b, err := payoutevent.EncodeRaw([]byte(`{"payoutId":"p-1","accountId":"acct-1","amountMinor":0,"currency":"EUR"}`), nil, "m-1", "acct-1", 1)
				if err != nil {
					t.Fatal(err)
				}
				return string(b)
			}(),
			want: http.StatusNoContent, // a malformed event, acknowledged and dropped
		},
	}
	// The binaries the local stack runs, built once for the whole test run.
	bin, err := stack.CachedBinaries(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			checkContract(t, filepath.Join(bin, c.name), c)
		})
	}
}

func checkContract(t *testing.T, bin string, c contractCase) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := strconv.Itoa(ln.Addr().(*net.TCPAddr).Port)
	ln.Close()
	cmd := exec.Command(bin)
	cmd.Env = append([]string{"PATH=" + os.Getenv("PATH"), "HOST=127.0.0.1", "PORT=" + port, logjson.EnvCloudRun + "=" + c.name}, c.env(t)...)
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	events := make(chan string, 64)
	var (
		mu    sync.Mutex
		lines []string
	)
	// Ends at EOF, when the process exits.
	go func() {
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			mu.Lock()
			lines = append(lines, sc.Text())
			mu.Unlock()
			var l struct {
				Event string `json:"event"`
			}
			if json.Unmarshal(sc.Bytes(), &l) == nil && l.Event != "" {
				select {
				case events <- l.Event:
				default:
				}
			}
		}
		exited <- cmd.Wait()
	}()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		if t.Failed() {
			mu.Lock()
			t.Logf("%s log:\n%s", c.name, bytes.Join(toBytes(lines), []byte("\n")))
			mu.Unlock()
		}
	})
	safety := time.NewTimer(time.Minute) // a broken binary fails instead of hanging
	defer safety.Stop()
	awaitEvent := func(want string) {
		t.Helper()
		for {
			select {
			case ev := <-events:
				if ev == want {
					return
				}
			case err := <-exited:
				t.Fatalf("exited (%v) before logging %s", err, want)
			case <-safety.C:
				t.Fatalf("no %s line within a minute", want)
			}
		}
	}
	awaitEvent("function_started")

	// The real routes, behind httpserve: a non-canonical spelling of the
	// route is refused with the envelope, never redirected to it.
	noRedirect := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	nc := "/x/.." + c.path
	if resp, err := noRedirect.Post("http://127.0.0.1:"+port+nc, "application/json", strings.NewReader(c.body)); err != nil {
		t.Fatalf("not serving on $PORT %s: %v", port, err)
	} else {
		var env jsonhandler.Envelope
		derr := json.NewDecoder(resp.Body).Decode(&env)
		resp.Body.Close()
		if resp.StatusCode != http.StatusBadRequest || derr != nil || env.Error.Code != jsonhandler.CodeInvalidRequest {
			t.Errorf("POST %s = %d (%+v, %v); want 400 with the envelope and %s", nc, resp.StatusCode, env, derr, jsonhandler.CodeInvalidRequest)
		}
	}

	conn, err := net.Dial("tcp", "127.0.0.1:"+port)
	if err != nil {
		t.Fatalf("not serving on $PORT %s: %v", port, err)
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(time.Minute))
	var head bytes.Buffer
	fmt.Fprintf(&head, "%s %s HTTP/1.1\r\nHost: %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\nExpect: 100-continue\r\n", c.method, c.path, c.name, len(c.body))
	_ = c.header.Write(&head)
	head.WriteString("\r\n")
	if _, err := conn.Write(head.Bytes()); err != nil {
		t.Fatal(err)
	}
	r := bufio.NewReader(conn)
	if resp, err := http.ReadResponse(r, nil); err != nil || resp.StatusCode != http.StatusContinue {
		t.Fatalf("want 100 Continue (the handler reading the body), got %v, %v", resp, err)
	}
	half := len(c.body) / 2
	if _, err := io.WriteString(conn, c.body[:half]); err != nil {
		t.Fatal(err)
	}
	termAt := time.Now()
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	awaitEvent("function_stopping")
	if _, err := io.WriteString(conn, c.body[half:]); err != nil {
		t.Fatalf("rest of the body after SIGTERM: %v", err)
	}
	resp, err := http.ReadResponse(r, nil)
	if err != nil {
		t.Fatalf("the request in flight at SIGTERM got no answer: %v", err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != c.want {
		t.Errorf("the request in flight at SIGTERM: %d %s; want %d", resp.StatusCode, body, c.want)
	}
	grace := time.NewTimer(cloudRunGrace - time.Since(termAt))
	defer grace.Stop()
	select {
	case err := <-exited:
		if err != nil {
			t.Errorf("exit after SIGTERM: %v; want status 0", err)
		}
	case <-grace.C:
		t.Fatalf("still running %v after SIGTERM (Cloud Run would SIGKILL it)", cloudRunGrace)
	}

	mu.Lock()
	defer mu.Unlock()
	if len(lines) < 3 {
		t.Errorf("%d log lines; want at least function_started, function_stopping and function_stopped", len(lines))
	}
	for _, l := range lines {
		var m map[string]any
		if err := json.Unmarshal([]byte(l), &m); err != nil {
			t.Errorf("log line is not JSON: %s", l)
			continue
		}
		_, sev := m["severity"].(string)
		_, msg := m["message"].(string)
		_, level := m["level"]
		_, slogMsg := m["msg"]
		if !sev || !msg || level || slogMsg {
			t.Errorf("log line without Cloud Logging's severity and message (or with slog's level/msg): %s", l)
		}
	}
}

func toBytes(lines []string) [][]byte {
	out := make([][]byte, len(lines))
	for i, l := range lines {
		out[i] = []byte(l)
	}
	return out
}
