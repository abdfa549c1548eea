package executor_test

import (
	"errors"
	"go/ast"
	"go/parser"
	"go/token"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/distributed-lock-lab/distributed-lock-lab/functions/executor"
	"github.com/distributed-lock-lab/distributed-lock-lab/functions/paymentresource/api"
	"github.com/distributed-lock-lab/distributed-lock-lab/functions/payoutevent"
	railapi "github.com/distributed-lock-lab/distributed-lock-lab/functions/railproxy/api"
	lockapi "github.com/distributed-lock-lab/distributed-lock-lab/lockserver/api"
)

// lockCodes returns every constant of type Code declared in
// lockserver/api (the package has no list), read from its source so that
// a code added there is classified or fails TestEveryCodeIsClassified.
func lockCodes(t *testing.T) []string {
	t.Helper()
	dir := filepath.Join("..", "..", "lockserver", "api")
	names, err := filepath.Glob(filepath.Join(dir, "*.go"))
	if err != nil {
		t.Fatal(err)
	}
	var codes []string
	for _, name := range names {
		if strings.HasSuffix(name, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(token.NewFileSet(), name, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		for _, d := range f.Decls {
			gd, ok := d.(*ast.GenDecl)
			if !ok || gd.Tok != token.CONST {
				continue
			}
			for _, spec := range gd.Specs {
				vs := spec.(*ast.ValueSpec)
				if id, ok := vs.Type.(*ast.Ident); !ok || id.Name != "Code" {
					continue
				}
				for _, v := range vs.Values {
					if lit, ok := v.(*ast.BasicLit); ok && lit.Kind == token.STRING {
						c, err := strconv.Unquote(lit.Value)
						if err != nil {
							t.Fatal(err)
						}
						codes = append(codes, c)
					}
				}
			}
		}
	}
	if !slices.Contains(codes, string(lockapi.CodeLockHeld)) || len(codes) < 10 {
		t.Fatalf("read %d codes from %s (%v): the parse is broken", len(codes), dir, codes)
	}
	return codes
}

// TestEveryCodeIsClassified: each code of the three api packages has a
// verdict in the table, none of them the default's, and each permanent
// one names a reason payment-resource accepts.
func TestEveryCodeIsClassified(t *testing.T) {
	check := func(svc executor.Service, code string) {
		// With a 4xx status a code outside the table is "unclassified".
		v := executor.Classify(svc, code, http.StatusConflict)
		if v.Class == "" || v.Reason == api.ReasonUnclassified {
			t.Errorf("%s %s: not in the table", svc, code)
		}
		if v.Class == executor.ClassPermanent || v.Class == executor.ClassFenced {
			if err := (api.AttentionRequest{Reason: v.Reason}).Validate(); err != nil {
				t.Errorf("%s %s: reason %q: %v", svc, code, v.Reason, err)
			}
		}
		if v.Class == executor.ClassDone && v.Outcome == "" {
			t.Errorf("%s %s: done without an outcome", svc, code)
		}
		if (v.Class == executor.ClassTransient || v.Class == executor.ClassFenced) && v.Err == nil {
			t.Errorf("%s %s: %s without a sentinel", svc, code, v.Class)
		}
	}
	for _, c := range lockCodes(t) {
		check(executor.ServiceLockServer, c)
	}
	for _, c := range api.Codes {
		check(executor.ServicePaymentResource, string(c))
	}
	for _, c := range railapi.Codes {
		check(executor.ServiceRailProxy, string(c))
	}
}

// TestClassesOfTheAnswers pins one answer of each class (and the refusals
// a probe found looping) to its verdict.
func TestClassesOfTheAnswers(t *testing.T) {
	for _, c := range []struct {
		svc    executor.Service
		code   string
		status int
		class  executor.Class
		reason api.AttentionReason
		err    error
	}{
		{executor.ServicePaymentResource, string(api.CodePayoutFinished), 409, executor.ClassDone, "", nil},
		{executor.ServicePaymentResource, string(api.CodePayoutNotFound), 404, executor.ClassDone, "", nil},
		{executor.ServicePaymentResource, string(api.CodeRailRefConflict), 409, executor.ClassPermanent, api.ReasonRailRefConflict, nil},
		{executor.ServicePaymentResource, string(api.CodePayoutNotClaimed), 409, executor.ClassPermanent, api.ReasonPayoutNotClaimed, nil},
		{executor.ServicePaymentResource, string(api.CodeFencedOut), 409, executor.ClassFenced, api.ReasonPaymentFenceAhead, executor.ErrFencedOut},
		{executor.ServiceRailProxy, string(railapi.CodeFencedOut), 409, executor.ClassFenced, api.ReasonRailFenceAhead, executor.ErrFencedOut},
		{executor.ServiceRailProxy, string(railapi.CodeInvalidRequest), 400, executor.ClassPermanent, api.ReasonRailRequestRefused, nil},
		// Terms: a known key's signature over other terms is this payout's
		// (permanent); an unknown key or no signature is the deployment's.
		{executor.ServiceRailProxy, string(railapi.CodeInvalidTerms), 403, executor.ClassPermanent, api.ReasonRailRequestRefused, nil},
		{executor.ServiceRailProxy, string(railapi.CodeTermsKeyUnknown), 403, executor.ClassTransient, "", executor.ErrDependency},
		{executor.ServiceRailProxy, string(railapi.CodeTermsUnsigned), 403, executor.ClassTransient, "", executor.ErrDependency},
		{executor.ServicePaymentResource, string(api.CodeUnavailable), 503, executor.ClassTransient, "", executor.ErrDependency},
		{executor.ServiceLockServer, string(lockapi.CodeLockHeld), 409, executor.ClassTransient, "", executor.ErrLockBusy},
		{executor.ServiceLockServer, string(lockapi.CodeStaleToken), 409, executor.ClassTransient, "", executor.ErrNoLongerHolder},
		{executor.ServiceRailProxy, "", 0, executor.ClassTransient, "", executor.ErrDependency},              // no answer
		{executor.ServiceRailProxy, "", 502, executor.ClassTransient, "", executor.ErrDependency},            // not an envelope
		{executor.ServiceRailProxy, "NEWER_CODE", 409, executor.ClassPermanent, api.ReasonUnclassified, nil}, // a newer rail-proxy
	} {
		v := executor.Classify(c.svc, c.code, c.status)
		if v.Class != c.class || v.Reason != c.reason || v.Err != c.err {
			t.Errorf("Classify(%s, %q, %d) = %+v; want class %s reason %q err %v", c.svc, c.code, c.status, v, c.class, c.reason, c.err)
		}
	}
}

// TestLockServerAnswersOnAGrantedLeaseAreRedelivered: on a granted lease,
// every answer of lock-server, an unknown 4xx and no answer at all are
// transient; only the two that say the lease ended stop the worker as no
// longer the holder, the others are dependency failures.
func TestLockServerAnswersOnAGrantedLeaseAreRedelivered(t *testing.T) {
	for _, code := range append(lockCodes(t), "NEWER_CODE", "") {
		want := executor.ErrDependency
		if code == string(lockapi.CodeLeaseNotHeld) || code == string(lockapi.CodeStaleToken) {
			want = executor.ErrNoLongerHolder
		}
		for _, status := range []int{0, http.StatusBadRequest, http.StatusConflict, http.StatusServiceUnavailable} {
			if v := executor.ClassifyLease(code, status); v.Class != executor.ClassTransient || v.Err != want {
				t.Errorf("ClassifyLease(%q, %d) = %+v; want transient with %v", code, status, v, want)
			}
		}
	}
}

// TestRetryDelayGrowsIsCappedAndJittered: the waits of the in-process
// retry grow exponentially, stay within [d/2, d] of their step, are capped
// at Max, and are drawn from the random source (one seed, one sequence).
func TestRetryDelayGrowsIsCappedAndJittered(t *testing.T) {
	c := executor.RetryConfig{Attempts: 10, Initial: 100 * time.Millisecond, Max: time.Second}
	r := rand.New(rand.NewPCG(7, 7))
	for n, step := range []time.Duration{100, 200, 400, 800, 1000, 1000, 1000} {
		step *= time.Millisecond
		if step > time.Second {
			step = time.Second
		}
		for range 50 {
			d := c.Delay(n+1, r)
			if d < step/2 || d > step {
				t.Fatalf("Delay(%d) = %v; want within [%v, %v]", n+1, d, step/2, step)
			}
		}
	}
	a, b := rand.New(rand.NewPCG(1, 2)), rand.New(rand.NewPCG(1, 2))
	distinct := map[time.Duration]bool{}
	for range 20 {
		x, y := c.Delay(3, a), c.Delay(3, b)
		if x != y {
			t.Fatalf("same seed, different delays: %v, %v", x, y)
		}
		distinct[x] = true
	}
	if len(distinct) < 5 {
		t.Fatalf("20 delays took %d values; the jitter does not spread them", len(distinct))
	}
	if d := c.Delay(1000, a); d > time.Second || d < time.Second/2 {
		t.Fatalf("Delay(1000) = %v; the shift must not overflow past the cap", d)
	}
}

func TestReportRetryConfig(t *testing.T) {
	env := map[string]string{lockapi.EnvServerURL: "http://a", executor.EnvPaymentResourceURL: "http://b", executor.EnvRailProxyURL: "http://c",
		executor.EnvReportAttempts: "2", executor.EnvReportBackoffMs: "50", executor.EnvReportBackoffMaxMs: "500"}
	c, err := executor.LoadConfig(func(k string) string { return env[k] })
	if err != nil || c.ReportRetry != (executor.RetryConfig{Attempts: 2, Initial: 50 * time.Millisecond, Max: 500 * time.Millisecond}) {
		t.Fatalf("LoadConfig = %+v, %v", c.ReportRetry, err)
	}
	if executor.DefaultConfig().ReportRetry != executor.DefaultRetryConfig() {
		t.Fatal("DefaultConfig does not carry DefaultRetryConfig")
	}
	env[executor.EnvReportAttempts], env[executor.EnvReportBackoffMaxMs] = "0", "10"
	_, err = executor.LoadConfig(func(k string) string { return env[k] })
	if !errors.Is(err, executor.ErrInvalidConfig) || !strings.Contains(err.Error(), executor.EnvReportAttempts) ||
		!strings.Contains(err.Error(), executor.EnvReportBackoffMaxMs) {
		t.Fatalf("LoadConfig with 0 attempts and max < initial = %v; want both named", err)
	}
}

// TestRedeliveryAnswerCarriesNoInternalText: the 503 that makes Pub/Sub
// redeliver says what happens next, not the dependency's error (which
// names addresses); the cause is in the log.
func TestRedeliveryAnswerCarriesNoInternalText(t *testing.T) {
	deps := &fakeDeps{claimCode: api.CodeUnavailable}
	x, _ := newExecutor(t, deps, nil)
	body, _ := payoutevent.Encode(event, "m-1", "acct-7", 1)
	rec := httptest.NewRecorder()
	x.ServeHTTP(rec, httptest.NewRequest(http.MethodPost, "/", strings.NewReader(string(body))))
	if rec.Code != http.StatusServiceUnavailable {
		t.Fatalf("push answered %d; want 503", rec.Code)
	}
	for _, leak := range []string{"127.0.0.1", "scripted", "paymentresource client", "http://"} {
		if strings.Contains(rec.Body.String(), leak) {
			t.Errorf("push answer %s carries %q", rec.Body, leak)
		}
	}
}
