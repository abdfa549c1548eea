// Package badinput holds the bad-input table of docs/reliability.md:
// TestBadInputTable sends named bad requests to the real handlers of every
// service, asserts each row, and fails when the committed table differs;
// `go test ./harness/badinput -run TestBadInputTable -update` rewrites it.
package badinput
