package stack

import (
	"errors"
	"fmt"
	"net/url"
	"slices"

	"github.com/distributed-lock-lab/distributed-lock-lab/local/link"
)

// Links of the stack (Config.Links), by the name Link takes: the caller,
// "->", the part called. Executors have three each (ExecutorLink) and the
// push bridge one to each executor (PushLink).
const (
	LinkLockDB = "lock-server->lockdb"
	LinkEtcd   = "lock-server->etcd" // one proxy per member
	LinkPayDB  = "payment-resource->paydb"
	LinkRailDB = "rail-proxy->raildb"
	LinkRail   = "rail-proxy->rail-stub"
)

// Parts an executor calls, for ExecutorLink.
const (
	ToLockServer      = "lock-server"
	ToPaymentResource = "payment-resource"
	ToRailProxy       = "rail-proxy"
)

// ExecutorLink names the link from the executor called name (ExecutorSpec.Name)
// to the part to (ToLockServer, ToPaymentResource, ToRailProxy).
func ExecutorLink(name, to string) string { return "executor-" + name + "->" + to }

// PushLink names the link from the push bridge (Push) to the executor
// called name.
func PushLink(name string) string { return "push->executor-" + name }

// ErrNoSuchLink: Link of a name the stack has no link called, or a stack
// started without Config.Links.
var ErrNoSuchLink = errors.New("stack: no such link")

// via returns target (a URL or a PostgreSQL DSN) with its host:port
// replaced by that of a new link called name to it; target itself when
// the stack has no links.
func (s *Stack) via(name, target string) (string, error) {
	out, err := s.viaAll(name, []string{target})
	if err != nil {
		return "", err
	}
	return out[0], nil
}

// viaAll is via for several targets of one link (etcd's members).
func (s *Stack) viaAll(name string, targets []string) ([]string, error) {
	if !s.cfg.Links {
		return targets, nil
	}
	us := make([]*url.URL, len(targets))
	hosts := make([]string, len(targets))
	for i, t := range targets {
		u, err := url.Parse(t)
		if err != nil || u.Host == "" {
			return nil, fmt.Errorf("stack: link %s: target %q: not a URL with a host (%v)", name, t, err)
		}
		us[i], hosts[i] = u, u.Host
	}
	l, err := link.Open(s.log, name, hosts...)
	if err != nil {
		return nil, fmt.Errorf("stack: %w", err)
	}
	s.mu.Lock()
	s.links[name] = l
	s.mu.Unlock()
	out := make([]string, len(us))
	for i, a := range l.Addrs() {
		us[i].Host = a
		out[i] = us[i].String()
	}
	return out, nil
}

// Link returns the link called name (LinkRail, ExecutorLink("A",
// ToLockServer), ...), or ErrNoSuchLink.
func (s *Stack) Link(name string) (*link.Link, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	l, ok := s.links[name]
	if !ok {
		return nil, fmt.Errorf("%w: %q", ErrNoSuchLink, name)
	}
	return l, nil
}

// LinkNames returns the names of the stack's links, sorted; none without
// Config.Links.
func (s *Stack) LinkNames() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []string
	for n := range s.links {
		out = append(out, n)
	}
	slices.Sort(out)
	return out
}

// closeLinks stops every link (Stop, once the processes are gone).
func (s *Stack) closeLinks() {
	s.mu.Lock()
	ls := s.links
	s.mu.Unlock()
	for _, l := range ls {
		l.Close()
	}
}
