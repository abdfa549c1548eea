package pgerr

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"
)

func TestUnavailable(t *testing.T) {
	for _, tc := range []struct {
		err  error
		want bool
	}{
		{nil, false},
		{context.DeadlineExceeded, true},
		{errors.New("dial tcp: connection refused"), true},
		{&pgconn.PgError{Code: "08006"}, true}, // connection failure
		{&pgconn.PgError{Code: "40001"}, true}, // serialization failure
		{&pgconn.PgError{Code: "40P01"}, true}, // deadlock
		{&pgconn.PgError{Code: "53300"}, true}, // too many connections
		{&pgconn.PgError{Code: "57P01"}, true}, // admin shutdown
		{&pgconn.PgError{Code: "58030"}, true}, // I/O error
		{fmt.Errorf("wrapped: %w", &pgconn.PgError{Code: "57014"}), true},
		{&pgconn.PgError{Code: "23505"}, false}, // unique violation: a bug here
		{&pgconn.PgError{Code: "42P01"}, false}, // undefined table
		{&pgconn.PgError{Code: "DL001"}, false}, // a project's own refusal
	} {
		if got := Unavailable(tc.err); got != tc.want {
			t.Errorf("Unavailable(%v) = %v; want %v", tc.err, got, tc.want)
		}
	}
}

func TestIs(t *testing.T) {
	pk := fmt.Errorf("wrapped: %w", &pgconn.PgError{Code: UniqueViolation, ConstraintName: "t_pkey"})
	for _, tc := range []struct {
		err              error
		code, constraint string
		want             bool
	}{
		{pk, UniqueViolation, "", true},
		{pk, UniqueViolation, "t_pkey", true},
		{pk, UniqueViolation, "other_key", false},
		{pk, DivisionByZero, "", false},
		{errors.New(UniqueViolation), UniqueViolation, "", false},
		{nil, UniqueViolation, "", false},
	} {
		if got := Is(tc.err, tc.code, tc.constraint); got != tc.want {
			t.Errorf("Is(%v, %q, %q) = %v; want %v", tc.err, tc.code, tc.constraint, got, tc.want)
		}
	}
}
