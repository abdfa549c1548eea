// Package e2e holds the end-to-end test of the payout pipeline in one
// process: lock-server (over PostgreSQL and over etcd), payment-resource,
// rail-proxy, rail-stub, three executors, and Pub/Sub (pstest) with a push
// bridge that delivers every message two or three times, some copies at
// once. It has no non-test code.
package e2e
