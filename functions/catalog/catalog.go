// Package catalog defines a payout function as a deployable (Function) and
// how functions-framework-go serves one (Function.Lazy). Each function
// lives in its own subpackage (catalog/railproxyfn, ...), so that a
// functions/cmd/<name> main links only its own function; the module's root
// package registers all five.
package catalog

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/distributed-lock-lab/distributed-lock-lab/functions/serve"
)

// Function is one deployable function.
type Function struct {
	// Name is the Cloud Run service's name, the value of "service" in
	// its logs and its FUNCTION_TARGET under functions-framework-go.
	Name string
	// EnvNames lists the variables Build reads, for the unknown-variable
	// warning at start.
	EnvNames func() []string
	// Build makes the handler from the environment.
	Build serve.Builder
	// Collectors returns the function's own metrics, served beside the
	// request and runtime metrics.
	Collectors func() []prometheus.Collector
}
