package executor

import (
	"testing"
	"time"

	"github.com/distributed-lock-lab/distributed-lock-lab/lockserver/api"
)

// queueWait turns AcquireWait into a wait lock-server accepts: whole
// milliseconds, at most api.MaxWaitMs, and none below api.MinWaitMs.
func TestQueueWaitBounds(t *testing.T) {
	for _, c := range []struct{ acquireWait, want time.Duration }{
		{15 * time.Second, 15 * time.Second},
		{1500*time.Millisecond + 700*time.Microsecond, 1500 * time.Millisecond},
		{2 * time.Minute, api.MaxWaitMs * time.Millisecond},
		{api.MinWaitMs * time.Millisecond, api.MinWaitMs * time.Millisecond},
		{api.MinWaitMs*time.Millisecond - time.Microsecond, 0},
		{5 * time.Millisecond, 0},
	} {
		if got := queueWait(c.acquireWait); got != c.want {
			t.Errorf("queueWait(%v) = %v; want %v", c.acquireWait, got, c.want)
		}
	}
}
