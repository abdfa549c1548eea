// Package pgerr classifies the errors of PostgreSQL calls the same way in
// every package that owns a database (lockdb, paydb, raildb): an error
// means either that the database could not serve the call now, so its
// outcome is unknown and the caller may try again, or that the statement
// itself was refused, which in this project is a bug.
package pgerr

import (
	"errors"

	"github.com/jackc/pgx/v5/pgconn"
)

// unavailableClasses are the SQLSTATE classes (the code's first two
// characters, PostgreSQL documentation appendix A) of a server that cannot
// serve now: 08 connection exception, 40 transaction rollback
// (serialization failure, deadlock), 53 insufficient resources (too many
// connections, disk full), 57 operator intervention (shutdown, cancel),
// 58 system error (I/O).
var unavailableClasses = map[string]bool{"08": true, "40": true, "53": true, "57": true, "58": true}

// Unavailable reports whether err says that the database could not serve
// the call: an error that is not PostgreSQL's answer (a dial, pool or
// network failure, a context's deadline or cancellation), or a PostgreSQL
// error of one of the classes above. The outcome of a write that failed
// so is unknown. nil is not unavailable.
func Unavailable(err error) bool {
	if err == nil {
		return false
	}
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) {
		return true
	}
	return len(pgErr.Code) >= 2 && unavailableClasses[pgErr.Code[:2]]
}

// SQLSTATE codes of PostgreSQL's own (documentation appendix A) that a
// fast path of this project reads as "not this way; take the
// transaction": a row another request wrote meanwhile, and a statement's
// deadline check (railproxy).
const (
	UniqueViolation = "23505"
	DivisionByZero  = "22012"
)

// Is reports whether err's chain holds PostgreSQL's error with SQLSTATE
// code and, when constraint is not "", on that constraint.
func Is(err error, code, constraint string) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == code && (constraint == "" || pgErr.ConstraintName == constraint)
}
