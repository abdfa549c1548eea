// Command framework serves one payout function through
// functions-framework-go, as Google's documentation runs a function
// locally:
//
//	FUNCTION_TARGET=rail-stub HOST=127.0.0.1 PORT=8080 go run ./functions/cmd/framework
//
// FUNCTION_TARGET is one of payment-resource, rail-proxy, rail-stub,
// reconciler (HTTP functions) or executor (a CloudEvent function); the
// function reads the same variables as its functions/cmd/<name> main.
// HOST defaults to every interface, PORT to 8080. The framework's server
// has no timeouts and no drain on SIGTERM: the images and the local stack
// use functions/cmd/<name> (docs/cloud.md).
package main

import (
	"fmt"
	"os"

	"github.com/GoogleCloudPlatform/functions-framework-go/funcframework"

	_ "github.com/distributed-lock-lab/distributed-lock-lab"
)

func main() {
	if os.Getenv("FUNCTION_TARGET") == "" {
		fmt.Fprintln(os.Stderr, "framework: set FUNCTION_TARGET to payment-resource, rail-proxy, rail-stub, reconciler or executor")
		os.Exit(2)
	}
	port := os.Getenv("PORT")
	if port == "" {
		port = "8080"
	}
	if err := funcframework.StartHostPort(os.Getenv("HOST"), port); err != nil {
		fmt.Fprintf(os.Stderr, "framework: %v\n", err)
		os.Exit(1)
	}
}
