// Command payment-resource is fence point one as a process (package
// functions/paymentresource): payouts, accounts and the ledger in paydb,
// every holder's write conditional on its fencing token, and payout events
// published to Pub/Sub through a transactional outbox. Configuration is
// read from the environment (docs/configuration.md); Pub/Sub is the real
// service, or the emulator when PUBSUB_EMULATOR_HOST is set.
package main

import (
	"github.com/distributed-lock-lab/distributed-lock-lab/functions/catalog/paymentresourcefn"
	"github.com/distributed-lock-lab/distributed-lock-lab/functions/serve"
)

func main() {
	f := paymentresourcefn.Function
	serve.Main(f.Name, f.EnvNames(), f.Build, f.Collectors()...)
}
