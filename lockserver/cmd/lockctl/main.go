// Command lockctl is the operator's break-glass tool for lock-server. Every
// command prints JSON on stdout and exits non-zero with the server's error
// code on stderr when refused.
//
//	lockctl --server http://127.0.0.1:8080 inspect payout:acct-7
//	lockctl revoke payout:acct-7 --token 42 --reason "stuck worker, INC-12"
//	lockctl acquire payout:acct-7 --ttl 30s --owner operator
//	lockctl release payout:acct-7 --owner operator --token 43
//	lockctl ready
//	lockctl advance --past 48210 --store postgres --lockdb-url "$LOCKDB_URL"
//
// --server defaults to $LOCK_SERVER_URL, else http://127.0.0.1:8080.
// "advance" (docs/runbooks/lockdb-restore.md) opens the store itself, with
// lock-server's settings (LOCK_STORE, LOCKDB_URL, ETCD_*) or the flags.
package main

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/distributed-lock-lab/distributed-lock-lab/lockserver/fenceproof"

	"github.com/distributed-lock-lab/distributed-lock-lab/lockserver/api"
	"github.com/distributed-lock-lab/distributed-lock-lab/lockserver/client"
	"github.com/distributed-lock-lab/distributed-lock-lab/lockserver/config"
	"github.com/distributed-lock-lab/distributed-lock-lab/lockserver/store"
	"github.com/distributed-lock-lab/distributed-lock-lab/lockserver/store/etcdstore"
	"github.com/distributed-lock-lab/distributed-lock-lab/lockserver/store/pgstore"
)

func main() {
	root := newRoot(os.Stdout)
	if err := root.Execute(); err != nil {
		err = withHint(err, root.PersistentFlags().Lookup("server").Value.String())
		fmt.Fprintln(os.Stderr, "lockctl:", err)
		var e *client.Error
		if errors.As(err, &e) && e.Code != "" {
			fmt.Fprintln(os.Stderr, "code:", e.Code)
		}
		os.Exit(1)
	}
}

// withHint adds to an error of a lock-server that could not be reached
// which server was tried and what the failure says: a connection that was
// accepted and never answered is a hung lock-server at the right URL (the
// hint names its liveness URL and the runbook), anything else is nothing
// answering there (the hint says how to name another URL).
func withHint(err error, server string) error {
	var e *client.Error
	if !errors.Is(err, client.ErrUnavailable) || (errors.As(err, &e) && e.Code != "") {
		return err
	}
	server = strings.TrimSuffix(server, "/")
	var op *net.OpError
	dialing := errors.As(err, &op) && op.Op == "dial"
	if !dialing && (errors.Is(err, context.DeadlineExceeded) || errors.Is(err, os.ErrDeadlineExceeded)) {
		return fmt.Errorf("%w\nno answer from lock-server at %s: it accepted the connection and answered nothing in time, "+
			"so the URL is right and lock-server is hung or overloaded (docs/runbooks/process-hung.md); "+
			"its liveness is %s%s", err, server, server, api.PathHealth)
	}
	return fmt.Errorf("%w\nno answer from lock-server at %s: nothing accepted the connection, so lock-server is down or that is not its URL; "+
		"give its URL with --server or %s (go run ./local up prints the local one; on GKE, "+
		"kubectl -n dlock port-forward deploy/lock-server %d makes it %s)", err, server, api.EnvServerURL, gkePort, defaultServer)
}

// defaultServer is the server URL without --server or LOCK_SERVER_URL:
// lock-server's own default listen address, and where `kubectl
// port-forward deploy/lock-server 8080` puts the pod's port (gkePort,
// its containerPort in lockserver/deploy/lock-server.yaml).
const (
	defaultServer = "http://127.0.0.1:8080"
	gkePort       = 8080
)

func newRoot(out io.Writer) *cobra.Command {
	var server string
	var timeout time.Duration
	root := &cobra.Command{
		Use:           "lockctl",
		Short:         "Operate lock-server: inspect, acquire, release and force-revoke leases, advance after a restore",
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	def := os.Getenv(api.EnvServerURL)
	if def == "" {
		def = defaultServer
	}
	root.PersistentFlags().StringVar(&server, "server", def, "lock-server base URL; LOCK_SERVER_URL, when set, gives the default")
	root.PersistentFlags().DurationVar(&timeout, "timeout", 10*time.Second, "time allowed for the command")
	newClient := func(owner string) (*client.Client, context.Context, context.CancelFunc, error) {
		var opts []client.Option
		if owner != "" {
			opts = append(opts, client.WithOwner(owner))
		}
		c, err := client.New(server, opts...)
		if err != nil {
			return nil, nil, nil, err
		}
		ctx, cancel := context.WithTimeout(context.Background(), timeout)
		return c, ctx, cancel, nil
	}
	printJSON := func(v any) error {
		enc := json.NewEncoder(out)
		enc.SetIndent("", "  ")
		return enc.Encode(v)
	}

	root.AddCommand(&cobra.Command{
		Use:   "inspect KEY",
		Short: "Show the live lease on KEY and the last token granted",
		Args:  cobra.ExactArgs(1),
		RunE: func(_ *cobra.Command, args []string) error {
			c, ctx, cancel, err := newClient("")
			if err != nil {
				return err
			}
			defer cancel()
			st, err := c.Inspect(ctx, args[0])
			if err != nil {
				return err
			}
			return printJSON(st)
		},
	})

	var revokeToken int64
	var reason string
	revoke := &cobra.Command{
		Use:   "revoke KEY",
		Short: "Force-end the live lease on KEY, whoever holds it",
		Long: "Force-end the live lease on KEY. The holder is not told. A holder that confirms its lease\n" +
			"with lock-server before each side effect (the payout executor does) stops at its next\n" +
			"confirmation; a request it sent before that is stopped only by a fence point, once a newer\n" +
			"grant's token has reached it. With --token, only the lease with that token is revoked.",
		Args: cobra.ExactArgs(1),
		RunE: func(_ *cobra.Command, args []string) error {
			if reason == "" {
				return errors.New("--reason is required: say why, it goes to the server's log")
			}
			c, ctx, cancel, err := newClient("")
			if err != nil {
				return err
			}
			defer cancel()
			g, err := c.Revoke(ctx, args[0], revokeToken, reason)
			if err != nil {
				return err
			}
			return printJSON(g)
		},
	}
	revoke.Flags().Int64Var(&revokeToken, "token", 0, "revoke only the lease with this fencing token (0: whatever is live)")
	revoke.Flags().StringVar(&reason, "reason", "", "why (recorded in lock-server's log); required")
	root.AddCommand(revoke)

	var owner string
	var ttl time.Duration
	acquire := &cobra.Command{
		Use:   "acquire KEY",
		Short: "Take a lease on KEY once (no waiting, no renewal) and print it",
		Args:  cobra.ExactArgs(1),
		RunE: func(_ *cobra.Command, args []string) error {
			if err := api.ValidateTTLMs(ttl.Milliseconds()); err != nil || ttl%time.Millisecond != 0 {
				return fmt.Errorf("--ttl %v: want whole milliseconds between %v and %v", ttl,
					time.Duration(api.MinTTLMs)*time.Millisecond, time.Duration(api.MaxTTLMs)*time.Millisecond)
			}
			c, ctx, cancel, err := newClient(owner)
			if err != nil {
				return err
			}
			defer cancel()
			l, err := c.TryAcquire(ctx, args[0], client.WithTTL(ttl))
			if err != nil {
				return err
			}
			return printJSON(l.Grant())
		},
	}
	acquire.Flags().StringVar(&owner, "owner", "operator", "owner id of the lease")
	acquire.Flags().DurationVar(&ttl, "ttl", 30*time.Second, "lease TTL, 500ms..10m in whole milliseconds")
	root.AddCommand(acquire)

	var relOwner string
	var relToken int64
	release := &cobra.Command{
		Use:   "release KEY",
		Short: "Give back the lease (KEY, --owner, --token)",
		Args:  cobra.ExactArgs(1),
		RunE: func(_ *cobra.Command, args []string) error {
			c, ctx, cancel, err := newClient("")
			if err != nil {
				return err
			}
			defer cancel()
			if err := c.ReleaseLease(ctx, args[0], relOwner, relToken); err != nil {
				return err
			}
			return printJSON(map[string]any{"key": args[0], "token": relToken, "released": true})
		},
	}
	release.Flags().StringVar(&relOwner, "owner", "operator", "owner id the lease was granted to")
	release.Flags().Int64Var(&relToken, "token", 0, "fencing token of the lease (required)")
	_ = release.MarkFlagRequired("token") // the flag exists; cannot fail
	root.AddCommand(release)

	root.AddCommand(&cobra.Command{
		Use:   "ready",
		Short: "Exit 0 when lock-server and its backend answer",
		Args:  cobra.NoArgs,
		RunE: func(_ *cobra.Command, _ []string) error {
			c, ctx, cancel, err := newClient("")
			if err != nil {
				return err
			}
			defer cancel()
			if err := c.Ready(ctx); err != nil {
				return err
			}
			return printJSON(map[string]string{"status": "ready"})
		},
	})
	root.AddCommand(newAdvance(&timeout, printJSON))
	root.AddCommand(newProofKey(out))
	return root
}

// newProofKey is the "proof-key" command: it makes a grant-proof key pair
// (package fenceproof) and prints both halves as environment lines.
func newProofKey(out io.Writer) *cobra.Command {
	var id string
	cmd := &cobra.Command{
		Use:   "proof-key",
		Short: "Make a key pair for grant proofs: the secret for lock-server, the public key for fence points",
		Long: "Make an Ed25519 key pair for grant proofs and print it as two environment lines:\n" +
			config.EnvProofSigningKey + " (a secret: lock-server only) and " + config.EnvProofKeys + " (public: every fence point).\n" +
			"To rotate, add the new public key to " + config.EnvProofKeys + " (comma-separated) before lock-server signs with it.",
		Args: cobra.NoArgs,
		RunE: func(_ *cobra.Command, _ []string) error {
			if id == "" {
				id = time.Now().UTC().Format("20060102-150405")
			}
			k, err := fenceproof.GenerateSigningKey(id, rand.Reader)
			if err != nil {
				return err
			}
			_, err = fmt.Fprintf(out, "%s=%s\n%s=%s\n", config.EnvProofSigningKey, k, config.EnvProofKeys, k.VerifyKey())
			return err
		},
	}
	cmd.Flags().StringVar(&id, "id", "", "key id, 1-32 of [A-Za-z0-9_-] (default: the UTC time, 20061231-150405)")
	return cmd
}

// advancer is what "advance" needs of a store: pgstore.Store and
// etcdstore.Store.
type advancer interface {
	Advance(ctx context.Context, past int64) (store.Advanced, error)
	Close() error
}

// newAdvance is the "advance" command.
func newAdvance(timeout *time.Duration, printJSON func(any) error) *cobra.Command {
	var past int64
	var backend, lockdbURL, endpoints, prefix string
	envOr := func(key, def string) string {
		if v := os.Getenv(key); v != "" {
			return v
		}
		return def
	}
	cmd := &cobra.Command{
		Use:   "advance --past N",
		Short: "After a restore of the backend: make every later token larger than N and let grants resume",
		Long: "After a restore or rollback of lockdb or etcd, lock-server refuses grants (503 BACKEND_RESTORED).\n" +
			"N must be at least the largest token ever issued before the restore: the maximum over time of\n" +
			"lockserver_highest_token_issued in Prometheus, and of the tokens in lock_granted log lines and at\n" +
			"the fence points. PostgreSQL: moves fencing_token_seq past N (never backwards) and stamps the\n" +
			"database's identity. etcd: raises the token offset so that every later token is above N\n" +
			"(never lowering it; no --bump-revision needed) and stamps the cluster ID.\n" +
			"It opens the store directly (not through lock-server), with lock-server's settings.",
		Args: cobra.NoArgs,
		RunE: func(_ *cobra.Command, _ []string) error {
			if past <= 0 || past > store.MaxAdvancePast {
				return fmt.Errorf("--past %d: want the largest token ever issued, 1..%d", past, int64(store.MaxAdvancePast))
			}
			ctx, cancel := context.WithTimeout(context.Background(), *timeout)
			defer cancel()
			s, err := openAdvancer(ctx, backend, lockdbURL, endpoints, prefix)
			if err != nil {
				return err
			}
			defer s.Close()
			out, err := s.Advance(ctx, past)
			if err != nil {
				return err
			}
			return printJSON(out)
		},
	}
	cmd.Flags().Int64Var(&past, "past", 0, "the largest token ever issued before the restore (required)")
	cmd.Flags().StringVar(&backend, "store", envOr(config.EnvStore, "postgres"), "backend: postgres or etcd ($LOCK_STORE)")
	cmd.Flags().StringVar(&lockdbURL, "lockdb-url", os.Getenv(config.EnvLockDBURL), "PostgreSQL DSN of lockdb ($LOCKDB_URL)")
	cmd.Flags().StringVar(&endpoints, "etcd-endpoints", os.Getenv(config.EnvEtcdEndpoints), "comma-separated etcd client URLs ($ETCD_ENDPOINTS)")
	cmd.Flags().StringVar(&prefix, "etcd-prefix", envOr(config.EnvEtcdPrefix, etcdstore.DefaultPrefix), "etcd key prefix of the lock keys ($ETCD_PREFIX)")
	_ = cmd.MarkFlagRequired("past") // the flag exists; cannot fail
	return cmd
}

// openAdvancer opens the store named by store with the given settings.
func openAdvancer(ctx context.Context, store, lockdbURL, endpoints, prefix string) (advancer, error) {
	switch store {
	case "postgres":
		if lockdbURL == "" {
			return nil, errors.New("--store postgres needs --lockdb-url or $LOCKDB_URL")
		}
		cfg := pgstore.DefaultConfig()
		cfg.DSN, cfg.MaxConns = lockdbURL, 1
		return pgstore.Open(ctx, cfg, nil)
	case "etcd":
		var eps []string
		for _, e := range strings.Split(endpoints, ",") {
			if e = strings.TrimSpace(e); e != "" {
				eps = append(eps, e)
			}
		}
		if len(eps) == 0 {
			return nil, errors.New("--store etcd needs --etcd-endpoints or $ETCD_ENDPOINTS")
		}
		cfg := etcdstore.DefaultConfig()
		cfg.Endpoints, cfg.Prefix, cfg.IdleLeases = eps, prefix, 0 // one call: no idle leases
		return etcdstore.Open(ctx, cfg, nil)
	}
	return nil, fmt.Errorf("--store %q: want postgres or etcd", store)
}
