// Package badinput holds the bad-input table of docs/reliability.md: named
// bad requests sent to the real handlers of every service (lock-server,
// payment-resource, rail-proxy, rail-stub, the executor's push endpoint),
// each with the status and code it gets. The table is produced by
// TestBadInputTable, which asserts every row, checks each answer's
// properties (internal/fuzztest) and that the refusal changed nothing,
// and fails when the committed table differs from what it produced:
//
//	go test ./harness/badinput -run TestBadInputTable -update
//
// rewrites the table between its markers in docs/reliability.md. The
// package has no code of its own.
package badinput
