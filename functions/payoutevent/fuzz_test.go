package payoutevent_test

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"errors"
	"io"
	"testing"

	"github.com/distributed-lock-lab/distributed-lock-lab/functions/payoutevent"
)

// strictJSON reports whether b is exactly one JSON value with no object
// key repeated at any depth and, when keys is not nil, an object whose
// keys are all in keys (spelled exactly).
func strictJSON(b []byte, keys map[string]bool) bool {
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.UseNumber()
	var walk func(depth int) bool
	walk = func(depth int) bool {
		tok, err := dec.Token()
		if err != nil {
			return false
		}
		d, ok := tok.(json.Delim)
		if !ok {
			return true
		}
		switch d {
		case '{':
			seen := map[string]bool{}
			for dec.More() {
				k, err := dec.Token()
				if err != nil {
					return false
				}
				key := k.(string)
				if seen[key] || depth == 0 && keys != nil && !keys[key] {
					return false
				}
				seen[key] = true
				if !walk(depth + 1) {
					return false
				}
			}
		case '[':
			for dec.More() {
				if !walk(depth + 1) {
					return false
				}
			}
		}
		_, err = dec.Token() // the closing delimiter
		return err == nil
	}
	if !walk(0) {
		return false
	}
	_, err := dec.Token()
	return errors.Is(err, io.EOF)
}

var eventKeys = map[string]bool{"payoutId": true, "accountId": true, "amountMinor": true, "currency": true}

// FuzzDecode feeds arbitrary push bodies to Decode: a refusal wraps
// ErrMalformed; an accepted event is valid, comes from a body and an event
// that are each exactly one JSON value with no key repeated (and event
// keys spelled exactly), and survives Encode and Decode unchanged.
func FuzzDecode(f *testing.F) {
	good := payoutevent.Event{PayoutID: "po-1", AccountID: "acct-7", AmountMinor: 2500, Currency: "EUR"}
	body, _ := payoutevent.Encode(good, "m-1", "acct-7", 1)
	f.Add(body)
	wrap := func(data string) []byte {
		b, _ := payoutevent.EncodeRaw([]byte(data), nil, "m-2", "acct-7", 0)
		return b
	}
	for _, data := range []string{
		`{"payoutId":"po-1","accountId":"acct-7","amountMinor":2500,"currency":"EUR"}`,
		`{"payoutId":"po-1","accountId":"acct-7","amountMinor":2500,"currency":"EUR"} trailing`,
		`{"payoutId":"po-1","payoutId":"po-2","accountId":"acct-7","amountMinor":2500,"currency":"EUR"}`,
		`{"PAYOUTID":"po-1","accountId":"acct-7","amountMinor":2500,"currency":"EUR"}`,
		`{"payoutId":"po-1","accountId":"acct-7","amountMinor":2500,"currency":"EUR","extra":1}`,
		`{"payoutId":"po-1","accountId":"acct-7","amountMinor":0,"currency":"EUR"}`,
		`{"payoutId":"po-1","accountId":"acct-7","amountMinor":2500.5,"currency":"EUR"}`,
		`{"payoutId":"po-1","accountId":"acct-7","amountMinor":2500,"currency":"eur"}`,
		`{"payoutId":"po 1","accountId":"acct-7","amountMinor":2500,"currency":"EUR"}`,
		`null`, `[]`, ``, `"x"`,
	} {
		f.Add(wrap(data))
	}
	f.Add([]byte(`{"message":{"data":"not base64!","messageId":"m"}}`))
	f.Add([]byte(`{"message":{"data":"` + base64.StdEncoding.EncodeToString([]byte(`{"payoutId":"po-1"}`)) + `"},"message":{}}`))
	f.Add(append(body, []byte(" {}")...))
	f.Add([]byte(`{}`))
	f.Add([]byte(`null`))
	f.Fuzz(func(t *testing.T, body []byte) {
		push, ev, err := payoutevent.Decode(body)
		if err != nil {
			if !errors.Is(err, payoutevent.ErrMalformed) {
				t.Fatalf("Decode(%q) = %v; want ErrMalformed", body, err)
			}
			return
		}
		if err := ev.Validate(); err != nil {
			t.Fatalf("Decode(%q) accepted an invalid event %+v: %v", body, ev, err)
		}
		data, _ := base64.StdEncoding.DecodeString(push.Message.Data)
		if !strictJSON(body, nil) || !strictJSON(data, eventKeys) {
			t.Fatalf("Decode(%q) accepted input that is not strict JSON (trailing data, a repeated key or a key in another case)", body)
		}
		again, err := payoutevent.Encode(ev, push.Message.MessageID, push.Message.OrderingKey, 0)
		if err != nil {
			t.Fatal(err)
		}
		if _, ev2, err := payoutevent.Decode(again); err != nil || ev2 != ev {
			t.Fatalf("event %+v re-encoded decodes as %+v, %v", ev, ev2, err)
		}
	})
}
