package link

import (
	"log/slog"
	"slices"
	"testing"
	"time"

	"github.com/Shopify/toxiproxy/v2/stream"
	"github.com/Shopify/toxiproxy/v2/toxics"
)

// holds injects f on a new link and passes n chunks through the latency
// toxic toxiproxy made of it, returning how long each was held. The
// chunks were read an hour ago, so none waits: the hold is read from
// the Timestamp each leaves with.
func holds(t *testing.T, f Fault, n int) []time.Duration {
	t.Helper()
	l, err := Open(slog.New(slog.DiscardHandler), "test->nowhere", "127.0.0.1:9") // never dialled
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	if err := l.Inject(f); err != nil {
		t.Fatal(err)
	}
	w := l.proxies[0].Toxics.GetToxic("latency")
	tox, ok := w.Toxic.(*latencyToxic)
	if !ok {
		t.Fatalf("the link's latency toxic is a %T, want the seeded one", w.Toxic)
	}
	in, out := make(chan *stream.StreamChunk, n+1), make(chan *stream.StreamChunk, n)
	read := time.Now().Add(-time.Hour)
	for range n {
		in <- &stream.StreamChunk{Data: []byte("x"), Timestamp: read}
	}
	in <- nil // the stream ends
	tox.Pipe(toxics.NewToxicStub(in, out))
	var got []time.Duration
	for c := range out {
		got = append(got, c.Timestamp.Sub(read))
	}
	if len(got) != n {
		t.Fatalf("%d chunks came through, want %d", len(got), n)
	}
	return got
}

// TestLatencyJitterIsDrawnFromTheSeed: two runs with the same seed hold
// the same chunks for the same delays; another seed gives others; every
// delay is within Latency ± Jitter, and the jitter varies them.
func TestLatencyJitterIsDrawnFromTheSeed(t *testing.T) {
	f := Fault{Kind: Latency, Latency: 200 * time.Millisecond, Jitter: 100 * time.Millisecond, Seed: 42}
	first, second := holds(t, f, 20), holds(t, f, 20)
	if !slices.Equal(first, second) {
		t.Fatalf("seed %d: delays %v, then %v; want the same", f.Seed, first, second)
	}
	for _, d := range first {
		if d < f.Latency-f.Jitter || d > f.Latency+f.Jitter {
			t.Fatalf("delay %v outside %v ± %v", d, f.Latency, f.Jitter)
		}
	}
	if slices.Min(first) == slices.Max(first) {
		t.Fatalf("every delay is %v: no jitter", first[0])
	}
	other := f
	other.Seed = 43
	if o := holds(t, other, 20); slices.Equal(o, first) {
		t.Fatalf("seeds %d and %d gave the same delays %v", f.Seed, other.Seed, o)
	}
	t.Logf("seed %d: %v", f.Seed, first)
}
