// Package integration tests the Go SDK (lockserver/client) against the
// real lock-server over an in-memory store: the SDK's deadline against the
// server's expiry (INV-06), its retries against the server's refusals, its
// connections and long-polls. They live here, in the repository's module,
// because the SDK's own module must not depend on the server. It has no
// code besides its tests.
package integration
