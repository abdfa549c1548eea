// Command executor is the payout worker as a process (package
// functions/executor): it accepts Pub/Sub push requests on $PORT and
// executes each payout under a lease. Configuration is read from the
// environment (docs/configuration.md).
//
// For the fencing experiment only: EXECUTOR_SELF_STOP_BEFORE_SUBMIT set to
// a payout id makes the process send itself SIGSTOP, once, right after its
// last lease check and before the rail submission of that payout, so that
// the harness can let the lease expire and resume it with SIGCONT.
package main

import (
	"github.com/distributed-lock-lab/distributed-lock-lab/functions/catalog/executorfn"
	"github.com/distributed-lock-lab/distributed-lock-lab/functions/serve"
)

func main() {
	f := executorfn.Function
	serve.Main(f.Name, f.EnvNames(), f.Build, f.Collectors()...)
}
