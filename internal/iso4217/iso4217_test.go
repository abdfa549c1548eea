package iso4217_test

import (
	"errors"
	"testing"

	"github.com/distributed-lock-lab/distributed-lock-lab/internal/iso4217"
)

func TestCheck(t *testing.T) {
	for _, ok := range []string{"EUR", "USD", "JPY", "GBP", "CHF", "SEK", "BHD",
		"VES", "MRU", "SLE", "ZWG", // introduced after the library's data (a probe found them refused)
	} {
		if err := iso4217.Check(ok); err != nil {
			t.Errorf("Check(%q) = %v; want nil", ok, err)
		}
	}
	for _, bad := range []string{
		"ZZZ", "QQQ", // not assigned
		"XXX", "XTS", // no currency, testing
		"XAU", "XAG", "XPT", "XPD", // metals
		"XDR",        // a fund, not tender
		"DEM", "FRF", // withdrawn
		"HRK", "VEF", "CUC", "SLL", "MRO", // withdrawn after the library's data (a probe found them accepted)
		"eur", "Eur", "EU", "EURO", "", "E1R", "ÉUR",
	} {
		if err := iso4217.Check(bad); !errors.Is(err, iso4217.ErrNotCurrency) {
			t.Errorf("Check(%q) = %v; want ErrNotCurrency", bad, err)
		}
	}
}
