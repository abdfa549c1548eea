package lockserver_test

import (
	"testing"
	"testing/synctest"
)

// TestACallerLeavingAsItsBatchAnswersGetsTheGrantOrItIsReleased: the
// caller's context ends at the same moment its batch answers. Whichever
// wins, exactly one of these holds: the caller got the grant and still
// holds the key with its token, or it was told ErrUnavailable and the
// Batcher released the grant (the key is free). Never both, never
// neither: a grant received and released, or refused and left held.
func TestACallerLeavingAsItsBatchAnswersGetsTheGrantOrItIsReleased(t *testing.T) {
	received, released := 0, 0
	for i := range 300 {
		synctest.Test(t, func(t *testing.T) {
			hb := holdBatchWithALeaver(t, "racer")
			s, b, cancel, racer := hb.s, hb.b, hb.cancel, &hb.leaver
			// Three orders of the two events, in turn.
			switch i % 3 {
			case 0:
				go cancel()
				close(s.holdMany)
			case 1:
				close(s.holdMany)
				cancel()
			default:
				cancel()
				close(s.holdMany)
			}
			hb.wg.Wait()
			if err := b.Close(); err != nil {
				t.Fatal(err)
			}
			st, _ := s.Inspect(t.Context(), "racer")
			switch {
			case racer.err == nil && st.Lease != nil && st.Lease.Token == racer.lease.Token:
				received++
			case racer.err != nil && st.Lease == nil && b.Abandoned() == 1:
				released++
			default:
				t.Fatalf("racer: %+v %v; key %+v; Abandoned %d: want the grant held by its caller, or refused and released", racer.lease, racer.err, st.Lease, b.Abandoned())
			}
		})
	}
	t.Logf("received %d, released %d", received, released)
}
