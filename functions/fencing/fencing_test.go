package fencing

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"net/http/httptest"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/distributed-lock-lab/distributed-lock-lab/functions/fencing/fencewire"
	lockapi "github.com/distributed-lock-lab/distributed-lock-lab/lockserver/api"
)

func TestTokenFrom(t *testing.T) {
	for _, tc := range []struct {
		vals []string
		want int64
		err  error
	}{
		{nil, 0, ErrMissingToken},
		{[]string{"42"}, 42, nil},
		{[]string{" 7 "}, 7, nil},
		{[]string{"0"}, 0, ErrBadToken},
		{[]string{"-3"}, 0, ErrBadToken},
		{[]string{"+3"}, 0, ErrBadToken},
		{[]string{"05"}, 0, ErrBadToken},
		{[]string{"10"}, 10, nil},
		{[]string{"abc"}, 0, ErrBadToken},
		{[]string{"1.5"}, 0, ErrBadToken},
		{[]string{"99999999999999999999"}, 0, ErrBadToken},
		{[]string{"1", "2"}, 0, ErrBadToken},
	} {
		r := httptest.NewRequest("POST", "/", nil)
		for _, v := range tc.vals {
			r.Header.Add(fencewire.HeaderToken, v)
		}
		got, err := TokenFrom(r)
		if got != tc.want || !errors.Is(err, tc.err) || (tc.err == nil) != (err == nil) {
			t.Errorf("TokenFrom(%q) = %d, %v; want %d, %v", tc.vals, got, err, tc.want, tc.err)
		}
	}
}

func TestRefusalLogsThePinnedEvent(t *testing.T) {
	var buf bytes.Buffer
	log := slog.New(slog.NewJSONHandler(&buf, nil))
	Refusal{Resource: "account", ResourceID: "acct-7", PresentedToken: 41, HighestToken: 42, Owner: "A"}.Log(context.Background(), log, "payoutId", "p-1")
	var got map[string]any
	if err := json.Unmarshal(buf.Bytes(), &got); err != nil {
		t.Fatal(err)
	}
	want := map[string]any{"event": "fenced_out", "resource": "account", "resourceId": "acct-7",
		"presentedToken": 41.0, "highestToken": 42.0, "ownerId": "A", "payoutId": "p-1", "level": "WARN"}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("%s = %v; want %v (line %s)", k, got[k], v, buf.String())
		}
	}
}

func TestSwitch(t *testing.T) {
	for v, want := range map[string]bool{"": true, "true": true, "ON": true, "1": true, "false": false, "off": false, "0": false} {
		if got, err := Switch("X", v); err != nil || got != want {
			t.Errorf("Switch(%q) = %v, %v; want %v", v, got, err, want)
		}
	}
	if _, err := Switch("X", "maybe"); err == nil {
		t.Error("Switch(maybe) accepted")
	}
}

func TestOwnerFrom(t *testing.T) {
	for _, tc := range []struct {
		vals []string
		want string
		err  error
	}{
		{nil, "", nil},
		{[]string{"worker-a"}, "worker-a", nil},
		{[]string{"host:123/abc@x"}, "host:123/abc@x", nil},
		{[]string{strings.Repeat("a", fencewire.MaxOwnerLen)}, strings.Repeat("a", fencewire.MaxOwnerLen), nil},
		{[]string{strings.Repeat("a", fencewire.MaxOwnerLen+1)}, "", ErrBadOwner},
		{[]string{strings.Repeat("é", 65)}, "", ErrBadOwner},
		{[]string{"\xff"}, "", ErrBadOwner},
		{[]string{"a\x00b"}, "", ErrBadOwner},
		{[]string{""}, "", ErrBadOwner},
		{[]string{"a", "b"}, "", ErrBadOwner},
	} {
		r := httptest.NewRequest("POST", "/", nil)
		for _, v := range tc.vals {
			r.Header.Add(fencewire.HeaderOwner, v)
		}
		got, err := OwnerFrom(r)
		if got != tc.want || !errors.Is(err, tc.err) || (tc.err == nil) != (err == nil) {
			t.Errorf("OwnerFrom(%q) = %q, %v; want %q, %v", tc.vals, got, err, tc.want, tc.err)
		}
		if err != nil && !utf8.ValidString(err.Error()) {
			t.Errorf("OwnerFrom(%q): error text %q is not valid UTF-8", tc.vals, err)
		}
	}
	if fencewire.MaxOwnerLen != lockapi.MaxOwnerLen {
		t.Fatalf("fencewire.MaxOwnerLen %d differs from lock-server's MaxOwnerLen %d", fencewire.MaxOwnerLen, lockapi.MaxOwnerLen)
	}
}
