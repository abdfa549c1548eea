package jsonhandler

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"reflect"
	"testing"

	payapi "github.com/distributed-lock-lab/distributed-lock-lab/functions/paymentresource/api"
	railapi "github.com/distributed-lock-lab/distributed-lock-lab/functions/railproxy/api"
	lockapi "github.com/distributed-lock-lab/distributed-lock-lab/lockserver/api"
)

// BenchmarkDecode is the cost of decoding one typical request body of the
// payout path, Content-Type check and body read included: lock-server's
// acquire (DecodeRefusingNull), and payment-resource's payout creation
// and result and rail-proxy's submission (Decode). (A claim has no body.)
func BenchmarkDecode(b *testing.B) {
	const receipt = "local-rail.Q2Vn1tXq5b9a0v3yR7ZkqL0uE8wM2pA6sN4dF1gH3jK5lZ7xC9vB0nM2qW4eR6tY8uI0oP1aS3dF5gH7jK9lQ"
	for _, c := range []struct {
		name       string
		v          any
		refuseNull bool
	}{
		{"acquire", lockapi.AcquireRequest{Owner: "executor-a-4f1c2e9b7d3a6058", TTLMs: 30_000, WaitMs: 10_000}, true},
		{"payout", payapi.PayoutRequest{PayoutID: "p-000123", AccountID: "acct-42", AmountMinor: 12_500, Currency: "EUR"}, false},
		{"result", payapi.ResultRequest{Outcome: payapi.OutcomeAck, RailRef: "rail-7f3c9a1e2b4d", Receipt: receipt}, false},
		{"submit", railapi.SubmitRequest{PayoutID: "p-000123", AccountID: "acct-42", AmountMinor: 12_500, Currency: "EUR"}, false},
	} {
		body, err := json.Marshal(c.v)
		if err != nil {
			b.Fatal(err)
		}
		newDst := func() any { return reflect.New(reflect.TypeOf(c.v)).Interface() }
		b.Run(c.name, func(b *testing.B) {
			w := httptest.NewRecorder()
			r := httptest.NewRequest(http.MethodPost, "/", nil)
			r.Header.Set("Content-Type", "application/json")
			rd := bytes.NewReader(body)
			b.SetBytes(int64(len(body)))
			b.ReportAllocs()
			for b.Loop() {
				rd.Reset(body)
				r.Body = io.NopCloser(rd)
				dst := newDst()
				if c.refuseNull {
					err = DecodeRefusingNull(w, r, dst, 4096)
				} else {
					err = Decode(w, r, dst, 4096)
				}
				if err != nil {
					var e *Error
					errors.As(err, &e)
					b.Fatalf("%s: %v", body, e)
				}
			}
		})
	}
}
