package fencing_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http/httptest"
	"os"

	"github.com/distributed-lock-lab/distributed-lock-lab/functions/fencing"
	"github.com/distributed-lock-lab/distributed-lock-lab/functions/fencing/fencewire"
)

// A fence point reads the holder's token from the request; a request
// without one, or with a malformed one, is refused before anything else.
func ExampleTokenFrom() {
	for _, v := range []string{"42", "", "042", "-1"} {
		r := httptest.NewRequest("POST", "/v1/rail/submissions", nil)
		if v != "" {
			r.Header.Set(fencewire.HeaderToken, v)
		}
		tok, err := fencing.TokenFrom(r)
		switch {
		case errors.Is(err, fencing.ErrMissingToken):
			fmt.Println("missing")
		case errors.Is(err, fencing.ErrBadToken):
			fmt.Printf("%q refused\n", v)
		default:
			fmt.Println("token", tok)
		}
	}
	// Output:
	// token 42
	// missing
	// "042" refused
	// "-1" refused
}

// When a fence point refuses a stale token, it logs one fenced_out event
// with both tokens and counts it; the holder gets 409 FENCED_OUT.
func ExampleRefusal_Log() {
	log := slog.New(slog.NewJSONHandler(os.Stdout, &slog.HandlerOptions{
		ReplaceAttr: func(_ []string, a slog.Attr) slog.Attr {
			if a.Key == slog.TimeKey {
				return slog.Attr{} // keep the output stable
			}
			return a
		},
	}))
	refusal := fencing.Refusal{Resource: "rail", ResourceID: "acct-7", PresentedToken: 1, HighestToken: 3, Owner: "A"}
	refusal.Log(context.Background(), log, "payoutId", "p-1")
	fmt.Println(refusal.Error())
	// Output:
	// {"level":"WARN","msg":"stale fencing token refused","event":"fenced_out","resource":"rail","resourceId":"acct-7","presentedToken":1,"highestToken":3,"ownerId":"A","payoutId":"p-1"}
	// fenced out: rail acct-7 has accepted token 3; token 1 is stale
}

// A kill switch is on unless it says otherwise; anything else is a
// configuration error naming the variable.
func ExampleSwitch() {
	for _, v := range []string{"", "false", "maybe"} {
		on, err := fencing.Switch("RAIL_PROXY_FENCING_ENABLED", v)
		fmt.Println(on, err)
	}
	// Output:
	// true <nil>
	// false <nil>
	// false RAIL_PROXY_FENCING_ENABLED="maybe": want true or false
}
