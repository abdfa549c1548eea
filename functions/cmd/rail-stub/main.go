// Command rail-stub is the deliberately non-idempotent payment rail as a
// process (package functions/railstub): every POST /submit is a new movement
// of money. Configuration is read from the environment
// (docs/configuration.md).
package main

import (
	"github.com/distributed-lock-lab/distributed-lock-lab/functions/catalog/railstubfn"
	"github.com/distributed-lock-lab/distributed-lock-lab/functions/serve"
)

func main() {
	f := railstubfn.Function
	serve.Main(f.Name, f.EnvNames(), f.Build, f.Collectors()...)
}
