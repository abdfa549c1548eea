package payoutevent_test

import (
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
}
