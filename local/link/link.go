// Package link puts a TCP proxy (toxiproxy, in this process) on the path
// from one process of the local stack to another, so that a run can make
// that path slow, narrow, mute, lossy or cut, and heal it again:
//
//	l, err := link.Open(log, "executor-A->lock-server", "127.0.0.1:5400")
//	defer l.Close()
//	// the client dials l.Addr() instead of the upstream
//	err = l.Inject(link.Fault{Kind: link.Timeout})
//	err = l.Heal()
//
// A link holds one proxy per upstream address (an etcd cluster has one per
// member). Faults act on every connection, open or new.
package link

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"time"

	"github.com/Shopify/toxiproxy/v2"
	"github.com/rs/zerolog"
	zlog "github.com/rs/zerolog/log"
)

// Kinds of Fault.
const (
	// Latency delays every answer (the stream from the upstream back to
	// the client) by Fault.Latency ± Fault.Jitter, the jitter drawn from
	// Fault.Seed.
	Latency = "latency"
	// Bandwidth limits both directions to Fault.RateKBps kilobytes a
	// second.
	Bandwidth = "bandwidth"
	// Timeout keeps connections open and mute: nothing passes either
	// way; after Fault.After (0: never) each connection is closed.
	Timeout = "timeout"
	// ResetAfter lets each connection's answers through up to Fault.Bytes
	// bytes, then closes it: with 0, the request reaches the upstream,
	// which acts on it, and its answer is lost.
	ResetAfter = "reset-after"
	// Cut closes every connection and refuses new ones until Heal.
	Cut = "cut"
)

// Kinds lists every Kind, in the order above.
var Kinds = []string{Latency, Bandwidth, Timeout, ResetAfter, Cut}

// Errors of this package; test them with errors.Is.
var (
	// ErrInvalidFault: a Fault's kind is unknown or a field out of range.
	ErrInvalidFault = errors.New("link: invalid fault")
	// ErrClosed: the link was closed.
	ErrClosed = errors.New("link: closed")
)

// Fault is one fault of a link. Kind says which fields apply.
type Fault struct {
	Kind string `json:"kind"`
	// Latency and Jitter, for Latency (whole milliseconds; Jitter <=
	// Latency).
	Latency time.Duration `json:"latency,omitempty"`
	Jitter  time.Duration `json:"jitter,omitempty"`
	// Seed, for Latency: the seed of the jitter's draws (the run's seed
	// or one drawn from it); the same seed gives the same delays.
	Seed uint64 `json:"seed,omitempty"`
	// RateKBps, for Bandwidth (> 0).
	RateKBps int64 `json:"rateKBps,omitempty"`
	// After, for Timeout: how long a mute connection stays open before
	// it is closed (0: until Heal).
	After time.Duration `json:"after,omitempty"`
	// Bytes, for ResetAfter: the answer bytes a connection carries before
	// it is closed (>= 0).
	Bytes int64 `json:"bytes,omitempty"`
}

// String names the fault and its figures, as a report lists it.
func (f Fault) String() string {
	switch f.Kind {
	case Latency:
		return fmt.Sprintf("latency %v±%v", f.Latency, f.Jitter)
	case Bandwidth:
		return fmt.Sprintf("bandwidth %d KB/s", f.RateKBps)
	case Timeout:
		if f.After == 0 {
			return "timeout (mute until healed)"
		}
		return fmt.Sprintf("timeout (closed after %v)", f.After)
	case ResetAfter:
		return fmt.Sprintf("reset after %d answer bytes", f.Bytes)
	}
	return f.Kind
}

// Validate returns nil or an error wrapping ErrInvalidFault.
func (f Fault) Validate() error {
	bad := func(format string, a ...any) error {
		return fmt.Errorf("%w: %s: "+format, append([]any{ErrInvalidFault, f.Kind}, a...)...)
	}
	switch f.Kind {
	case Latency:
		if f.Latency < 0 || f.Jitter < 0 || f.Jitter > f.Latency {
			return bad("latency %v, jitter %v: want 0 <= jitter <= latency", f.Latency, f.Jitter)
		}
	case Bandwidth:
		if f.RateKBps <= 0 {
			return bad("rate %d KB/s: want > 0", f.RateKBps)
		}
	case Timeout:
		if f.After < 0 {
			return bad("after %v: want >= 0", f.After)
		}
	case ResetAfter:
		if f.Bytes < 0 {
			return bad("bytes %d: want >= 0", f.Bytes)
		}
	case Cut:
	default:
		return bad("want one of %s", strings.Join(Kinds, ", "))
	}
	return nil
}

// toxics returns the toxiproxy toxics (JSON) of f.
func (f Fault) toxics() []string {
	ms := func(d time.Duration) int64 { return d.Milliseconds() }
	switch f.Kind {
	case Latency:
		return []string{fmt.Sprintf(`{"name":"latency","type":%q,"stream":"downstream","attributes":{"latency":%d,"jitter":%d,"seed":%d}}`,
			toxicLatency, ms(f.Latency), ms(f.Jitter), f.Seed)}
	case Bandwidth:
		return []string{
			fmt.Sprintf(`{"name":"bandwidth-up","type":"bandwidth","stream":"upstream","attributes":{"rate":%d}}`, f.RateKBps),
			fmt.Sprintf(`{"name":"bandwidth-down","type":"bandwidth","stream":"downstream","attributes":{"rate":%d}}`, f.RateKBps),
		}
	case Timeout:
		return []string{
			fmt.Sprintf(`{"name":"timeout-up","type":"timeout","stream":"upstream","attributes":{"timeout":%d}}`, ms(f.After)),
			fmt.Sprintf(`{"name":"timeout-down","type":"timeout","stream":"downstream","attributes":{"timeout":%d}}`, ms(f.After)),
		}
	case ResetAfter:
		return []string{fmt.Sprintf(`{"name":"reset-after","type":"limit_data","stream":"downstream","attributes":{"bytes":%d}}`, f.Bytes)}
	}
	return nil
}

// Link is the proxied path from one process to another. It is safe for
// concurrent use.
type Link struct {
	name string
	log  *slog.Logger

	mu      sync.Mutex
	proxies []*toxiproxy.Proxy
	fault   *Fault
	closed  bool
}

// quietToxics silences zerolog's global logger, through which toxiproxy's
// bandwidth toxic writes a trace line to standard error every time it is
// interrupted; nothing else in this module uses zerolog.
var quietToxics sync.Once

// Open starts a link called name with one proxy per upstream host:port,
// each listening on a free loopback port (Addrs). Close stops it.
func Open(log *slog.Logger, name string, upstreams ...string) (*Link, error) {
	if len(upstreams) == 0 {
		return nil, fmt.Errorf("link %s: no upstream", name)
	}
	quietToxics.Do(func() { zlog.Logger = zerolog.Nop() })
	// The server is only the proxies' owner; its HTTP API is never served.
	srv := toxiproxy.NewServer(toxiproxy.NewMetricsContainer(nil), zerolog.Nop())
	l := &Link{name: name, log: log.With("link", name)}
	for i, up := range upstreams {
		p := toxiproxy.NewProxy(srv, fmt.Sprintf("%s-%d", name, i), "127.0.0.1:0", up)
		if err := p.Start(); err != nil {
			l.Close()
			return nil, fmt.Errorf("link %s: proxy to %s: %w", name, up, err)
		}
		l.proxies = append(l.proxies, p)
	}
	return l, nil
}

// Name returns the link's name.
func (l *Link) Name() string { return l.name }

// Addrs returns the host:port a client dials instead of each upstream, in
// the order of Open's upstreams.
func (l *Link) Addrs() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := make([]string, len(l.proxies))
	for i, p := range l.proxies {
		out[i] = p.Listen
	}
	return out
}

// Addr returns the first of Addrs.
func (l *Link) Addr() string { return l.Addrs()[0] }

// Fault returns the fault in force, if any.
func (l *Link) Fault() (Fault, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.fault == nil {
		return Fault{}, false
	}
	return *l.fault, true
}

// Inject puts f on the link, in place of the fault in force, if any.
func (l *Link) Inject(f Fault) error {
	if err := f.Validate(); err != nil {
		return err
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return ErrClosed
	}
	if err := l.heal(); err != nil {
		return err
	}
	for _, p := range l.proxies {
		if f.Kind == Cut {
			p.Stop()
			continue
		}
		for _, t := range f.toxics() {
			if _, err := p.Toxics.AddToxicJson(strings.NewReader(t)); err != nil {
				return fmt.Errorf("link %s: %s: %w", l.name, f, err)
			}
		}
	}
	l.fault = &f
	l.log.Info("link fault injected", "event", EventFaultInjected, "fault", f.String())
	return nil
}

// Heal removes the fault in force: the link passes everything again. A
// cut link listens again on the same ports. Healing a healthy link does
// nothing.
func (l *Link) Heal() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return ErrClosed
	}
	return l.heal()
}

func (l *Link) heal() error {
	if l.fault == nil {
		return nil
	}
	f := *l.fault
	var errs []error
	for _, p := range l.proxies {
		if f.Kind == Cut {
			// Listen names the port the proxy was given at its first
			// start, so it comes back where its clients dial.
			if err := p.Start(); err != nil {
				errs = append(errs, fmt.Errorf("link %s: listen again on %s: %w", l.name, p.Listen, err))
			}
			continue
		}
		p.Toxics.ResetToxics(context.Background())
	}
	l.fault = nil
	l.log.Info("link healed", "event", EventHealed, "fault", f.String())
	return errors.Join(errs...)
}

// Close stops the link's proxies and closes their connections. It may be
// called more than once.
func (l *Link) Close() {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return
	}
	l.closed = true
	for _, p := range l.proxies {
		p.Toxics.ResetToxics(context.Background())
		p.Stop()
	}
}

// Events logged by a link.
const (
	EventFaultInjected = "link_fault_injected"
	EventHealed        = "link_healed"
)
