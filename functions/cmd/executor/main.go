// Command executor is the payout worker as a process (package
// functions/executor): it accepts Pub/Sub push requests on $PORT and
// executes each payout under a lease. Configuration is read from the
// environment (docs/configuration.md).
//
// The fencing experiment and the game day arm a fault through the
// environment (package functions/executor/fault); production arms none.
package main

import (
	"github.com/distributed-lock-lab/distributed-lock-lab/functions/catalog/executorfn"
	"github.com/distributed-lock-lab/distributed-lock-lab/functions/serve"
)

func main() {
	f := executorfn.Function
	serve.Main(f.Name, f.EnvNames(), f.Build, f.Collectors()...)
}
