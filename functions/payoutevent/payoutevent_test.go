package payoutevent_test

import (
	"encoding/base64"
	"errors"
	"strings"
	"testing"

	"github.com/distributed-lock-lab/distributed-lock-lab/functions/payoutevent"
)

func TestValidate(t *testing.T) {
	good := payoutevent.Event{PayoutID: "po-1", AccountID: "acct-7", AmountMinor: 2500, Currency: "EUR"}
	if err := good.Validate(); err != nil {
		t.Fatalf("%+v: %v", good, err)
	}
	for name, mutate := range map[string]func(*payoutevent.Event){
		"empty payout id":         func(e *payoutevent.Event) { e.PayoutID = "" },
		"payout id with a slash":  func(e *payoutevent.Event) { e.PayoutID = "po/1" },
		"account id too long":     func(e *payoutevent.Event) { e.AccountID = strings.Repeat("a", payoutevent.MaxAccountIDLen+1) },
		"account id with space":   func(e *payoutevent.Event) { e.AccountID = "acct 7" },
		"account id leading dash": func(e *payoutevent.Event) { e.AccountID = "-acct" },
		"zero amount":             func(e *payoutevent.Event) { e.AmountMinor = 0 },
		"amount above the cap":    func(e *payoutevent.Event) { e.AmountMinor = payoutevent.MaxAmountMinor + 1 },
		"lower-case currency":     func(e *payoutevent.Event) { e.Currency = "eur" },
	} {
		e := good
		mutate(&e)
		if err := e.Validate(); !errors.Is(err, payoutevent.ErrMalformed) {
			t.Errorf("%s: Validate(%+v) = %v; want ErrMalformed", name, e, err)
		}
	}
	if err := payoutevent.ValidateID("accountId", strings.Repeat("a", payoutevent.MaxAccountIDLen), payoutevent.MaxAccountIDLen); err != nil {
		t.Errorf("an id of exactly the maximum length: %v", err)
	}
	if err := payoutevent.ValidateID("accountId", "a.b_c:d-e", 64); err != nil {
		t.Errorf("punctuation after the first byte: %v", err)
	}
	// A byte that is not ASCII is named escaped, as lock-server names it,
	// not as the Latin-1 character of its value (a probe found
	// "accountId has byte 'Ã'" for the first byte of "é").
	if err := payoutevent.ValidateID("accountId", "acct-\xc3\xa9", 64); err == nil || !strings.Contains(err.Error(), `byte "\xc3" at offset 5`) {
		t.Errorf("ValidateID of a non-ASCII id = %v; want it to name byte \"\\xc3\" at offset 5", err)
	}
}

// TestDecodeIsStrict: a push body or an event that encoding/json alone
// would accept, with a key given twice, anything after the JSON value, or
// a key spelled in another case, is refused; a body that is not a
// well-formed envelope is told apart (ErrMalformedPush).
func TestDecodeIsStrict(t *testing.T) {
	const event = `{"payoutId":"p-1","accountId":"acct-1","amountMinor":5,"currency":"EUR"}`
	push := func(data string) string {
		return `{"message":{"data":"` + base64.StdEncoding.EncodeToString([]byte(data)) + `","messageId":"m-1","message_id":"m-1"},"subscription":"s"}`
	}
	if _, e, err := payoutevent.Decode([]byte(push(event))); err != nil || e.PayoutID != "p-1" {
		t.Fatalf("Decode of a good push = %+v, %v", e, err)
	}
	for name, tc := range map[string]struct {
		body     string
		envelope bool // want ErrMalformedPush
	}{
		"trailing garbage after the envelope":      {push(event) + ` {"message":{}}`, true},
		"trailing garbage word after the envelope": {push(event) + `x`, true},
		"envelope key twice":                       {`{"message":{"data":"e30="},"message":{"data":"` + base64.StdEncoding.EncodeToString([]byte(event)) + `"}}`, true},
		"message key twice":                        {`{"message":{"data":"e30=","data":"` + base64.StdEncoding.EncodeToString([]byte(event)) + `"}}`, true},
		"attribute twice":                          {`{"message":{"data":"` + base64.StdEncoding.EncodeToString([]byte(event)) + `","attributes":{"a":"1","a":"2"}}}`, true},
		"trailing garbage after the event":         {push(event + `garbage`), false},
		"second object after the event":            {push(event + `{"payoutId":"p-2"}`), false},
		"event key twice":                          {push(`{"payoutId":"p-1","accountId":"acct-1","accountId":"acct-2","amountMinor":5,"currency":"EUR"}`), false},
		"event key in another case":                {push(`{"payoutId":"p-1","AccountID":"acct-1","amountMinor":5,"currency":"EUR"}`), false},
		"event key in two cases":                   {push(`{"payoutId":"p-1","accountId":"acct-1","ACCOUNTID":"acct-2","amountMinor":5,"currency":"EUR"}`), false},
	} {
		_, _, err := payoutevent.Decode([]byte(tc.body))
		if !errors.Is(err, payoutevent.ErrMalformed) {
			t.Errorf("%s: Decode = %v; want ErrMalformed", name, err)
			continue
		}
		if got := errors.Is(err, payoutevent.ErrMalformedPush); got != tc.envelope {
			t.Errorf("%s: Decode = %v; ErrMalformedPush %v, want %v", name, err, got, tc.envelope)
		}
	}
}
