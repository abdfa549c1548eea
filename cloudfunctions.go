// Package payoutfunctions registers the payout pipeline's functions with
// functions-framework-go under their service names: payment-resource,
// rail-proxy, rail-stub and reconciler as HTTP functions, the executor as
// the CloudEvent function of a Pub/Sub trigger. Google's Go buildpack
// (gcloud run deploy --function) wants them in a package at the module's
// root; locally, FUNCTION_TARGET=<name> go run ./functions/cmd/framework
// serves one. Each is built as its functions/cmd main builds it (package
// functions/catalog); docs/cloud.md says when to use which.
package payoutfunctions

import (
	"os"

	"github.com/GoogleCloudPlatform/functions-framework-go/functions"

	"github.com/distributed-lock-lab/distributed-lock-lab/functions/catalog"
	"github.com/distributed-lock-lab/distributed-lock-lab/functions/catalog/executorfn"
	"github.com/distributed-lock-lab/distributed-lock-lab/functions/catalog/paymentresourcefn"
	"github.com/distributed-lock-lab/distributed-lock-lab/functions/catalog/railproxyfn"
	"github.com/distributed-lock-lab/distributed-lock-lab/functions/catalog/railstubfn"
	"github.com/distributed-lock-lab/distributed-lock-lab/functions/catalog/reconcilerfn"
)

func init() {
	for _, f := range []catalog.Function{paymentresourcefn.Function, railproxyfn.Function, railstubfn.Function, reconcilerfn.Function} {
		functions.HTTP(f.Name, f.Lazy(os.Getenv, os.Environ).ServeHTTP)
	}
	functions.CloudEvent(executorfn.Function.Name, executorfn.Function.Lazy(os.Getenv, os.Environ).ReceivePubSub)
}
