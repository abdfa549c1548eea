package link

import (
	"math/rand/v2"
	"sync"
	"time"

	"github.com/Shopify/toxiproxy/v2/stream"
	"github.com/Shopify/toxiproxy/v2/toxics"
)

// toxicLatency is the toxiproxy type name of latencyToxic.
const toxicLatency = "seeded_latency"

func init() { toxics.Register(toxicLatency, new(latencyToxic)) }

// latencyToxic holds every chunk of a stream for Latency ± Jitter
// milliseconds, like toxiproxy's own latency toxic, but draws the jitter
// from a source seeded with Seed (toxiproxy's draws from the global
// math/rand): the same seed gives the same sequence of delays, in the
// order the link's connections ask for them. A chunk leaves with its
// Timestamp set to the moment it was due.
type latencyToxic struct {
	Latency int64  `json:"latency"` // ms
	Jitter  int64  `json:"jitter"`  // ms, <= Latency
	Seed    uint64 `json:"seed"`

	mu  sync.Mutex
	rng *rand.Rand // from Seed, at the first draw
}

// GetBufferSize sets the chunks a stream buffers ahead of the toxic
// (toxics.BufferedToxic): enough that a held chunk does not stall the
// reader behind it.
func (t *latencyToxic) GetBufferSize() int { return 1024 }

// delay draws the next hold, uniformly in [Latency-Jitter, Latency+Jitter].
func (t *latencyToxic) delay() time.Duration {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.rng == nil {
		t.rng = rand.New(rand.NewPCG(t.Seed, 0))
	}
	ms := t.Latency
	if t.Jitter > 0 {
		ms += t.rng.Int64N(2*t.Jitter+1) - t.Jitter
	}
	return time.Duration(ms) * time.Millisecond
}

// Pipe passes stub's chunks on, each once its delay after it was read has
// passed. It returns when the stream ends or the toxic is interrupted (a
// held chunk is then passed on at once, so nothing is lost).
func (t *latencyToxic) Pipe(stub *toxics.ToxicStub) {
	for {
		var c *stream.StreamChunk
		select {
		case <-stub.Interrupt:
			return
		case c = <-stub.Input:
		}
		if c == nil {
			stub.Close()
			return
		}
		due := c.Timestamp.Add(t.delay())
		hold := time.NewTimer(time.Until(due))
		select {
		case <-hold.C:
			c.Timestamp = due
			stub.Output <- c
		case <-stub.Interrupt:
			hold.Stop()
			stub.Output <- c
			return
		}
	}
}
