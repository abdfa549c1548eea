package client_test

import (
	"fmt"
	"os"
	"runtime"
	"strings"
	"testing"
	"time"
)

// Leases renew and watch their deadlines in goroutines: every test must
// leave none behind (released, lost or cancelled leases stop theirs), nor
// an HTTP connection or server.
func TestMain(m *testing.M) {
	code := m.Run()
	if code == 0 {
		if left := awaitNoGoroutines(5 * time.Second); left != "" {
			fmt.Fprintf(os.Stderr, "goroutines left behind by the tests:\n\n%s\n", left)
			code = 1
		}
	}
	os.Exit(code)
}

// awaitNoGoroutines waits up to d for every goroutine running code of this
// package or of net/http to end (a closed connection's goroutines end a
// moment after the close), and returns the stacks of those still running.
func awaitNoGoroutines(d time.Duration) string {
	deadline := time.Now().Add(d)
	for {
		buf := make([]byte, 1<<20)
		stacks := strings.Split(string(buf[:runtime.Stack(buf, true)]), "\n\n")
		var left []string
		for _, s := range stacks[1:] { // the first is this goroutine
			if strings.Contains(s, "/lockserver/client.") || strings.Contains(s, "net/http.") {
				left = append(left, s)
			}
		}
		if len(left) == 0 || time.Now().After(deadline) {
			return strings.Join(left, "\n\n")
		}
		time.Sleep(10 * time.Millisecond)
	}
}
