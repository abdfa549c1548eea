// Command reconciler is the payout reconciler as a process (package
// functions/reconciler): POST /v1/reconciler/runs on $PORT runs one pass
// (Cloud Scheduler's target on Cloud Run), and with
// RECONCILER_INTERVAL_MS set it also runs a pass every interval (the
// local stack). Configuration is read from the environment
// (docs/configuration.md).
package main

import (
	"github.com/distributed-lock-lab/distributed-lock-lab/functions/catalog/reconcilerfn"
	"github.com/distributed-lock-lab/distributed-lock-lab/functions/serve"
)

func main() {
	f := reconcilerfn.Function
	serve.Main(f.Name, f.EnvNames(), f.Build, f.Collectors()...)
}
