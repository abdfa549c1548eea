// Package iso4217 is the one currency check of the project's servers:
// Check accepts a code only if it names money that is legal tender today
// (golang.org/x/text/currency), spelled as ISO 4217 writes it. Test codes,
// metals, funds and withdrawn currencies are bad input (400);
// docs/payout-api.md lists the rule.
package iso4217

import (
	"errors"
	"fmt"

	"golang.org/x/text/currency"
)

// ErrNotCurrency is wrapped by every error of Check.
var ErrNotCurrency = errors.New("iso4217: not a currency in use")

// tender holds every code that is legal tender in some region today: the
// library's list, corrected by the changes since its data (below).
var tender = func() map[string]bool {
	m := map[string]bool{}
	for it := currency.Query(); it.Next(); {
		m[it.Unit().String()] = true
	}
	for code := range withdrawnSinceData {
		delete(m, code)
	}
	for code := range introducedSinceData {
		m[code] = true
	}
	return m
}()

// The currency data of golang.org/x/text (CLDR's, as of its build) predates
// these changes to ISO 4217, found by a probe of the running stack (session
// 4): it still lists the withdrawn codes as tender and does not know the
// new ones. Remove an entry once the library's data has it.
var (
	// withdrawnSinceData: no longer legal tender.
	withdrawnSinceData = map[string]string{
		"HRK": "2023-01-15, Croatia adopted the euro",
		"VEF": "2018-08-20, replaced by VES",
		"CUC": "2021-01-01, Cuba unified its currencies",
		"SLL": "2024-04-01, replaced by SLE (redenominated 2022)",
		"MRO": "2018-01-01, replaced by MRU",
	}
	// introducedSinceData: legal tender, unknown to the library's data.
	introducedSinceData = map[string]string{
		"VES": "2018-08-20, Venezuela",
		"MRU": "2018-01-01, Mauritania",
		"SLE": "2022-07-01, Sierra Leone",
		"ZWG": "2024-04-05, Zimbabwe",
	}
)

// Check returns nil if code is the ISO 4217 code of a currency that is
// legal tender today, or an error wrapping ErrNotCurrency that says why
// not (the code is quoted, so it is safe to return to a client).
func Check(code string) error {
	if len(code) != 3 || !upper(code) {
		return fmt.Errorf("%w: %q is not three upper-case letters", ErrNotCurrency, code)
	}
	if _, err := currency.ParseISO(code); err != nil && introducedSinceData[code] == "" {
		return fmt.Errorf("%w: %q is not an ISO 4217 code", ErrNotCurrency, code)
	}
	if !tender[code] {
		return fmt.Errorf("%w: %q is an ISO 4217 code but not money in use (a test, metal, fund or withdrawn code)", ErrNotCurrency, code)
	}
	return nil
}

func upper(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] < 'A' || s[i] > 'Z' {
			return false
		}
	}
	return true
}
