// Package pgpool opens the pgx connection pools of the payout services:
// from a plain DSN locally, or through the Cloud SQL Go connector when a
// Cloud SQL instance connection name is configured (IAM-authorised TLS,
// no proxy sidecar). Either way the caller gets a *pgxpool.Pool.
package pgpool

import (
	"context"
	"errors"
	"fmt"
	"net"
	"time"

	"cloud.google.com/go/cloudsqlconn"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Config locates one database.
type Config struct {
	// DSN is a PostgreSQL URL or key=value string, as pgx parses it.
	// Required. With CloudSQLInstance set, its host, port and password are
	// ignored: the user is the IAM database user of the process's service
	// account (its email without ".gserviceaccount.com"), and the database
	// name is used.
	DSN string
	// CloudSQLInstance, when set ("project:region:instance"), makes every
	// connection go through the Cloud SQL connector with IAM database
	// authentication (the service account's token, never a password), as
	// the terraform module creates the users.
	CloudSQLInstance string
	// MaxConns caps the pool; 0 keeps pgx's default (4 or the CPU count).
	MaxConns int32
}

// ErrInvalidConfig: DSN is missing or does not parse, or MaxConns < 0.
var ErrInvalidConfig = errors.New("pgpool: invalid config")

// Validate returns an error wrapping ErrInvalidConfig.
func (c Config) Validate() error {
	if c.DSN == "" {
		return fmt.Errorf("%w: DSN is empty", ErrInvalidConfig)
	}
	if _, err := pgxpool.ParseConfig(c.DSN); err != nil {
		return fmt.Errorf("%w: DSN: %v", ErrInvalidConfig, err)
	}
	if c.MaxConns < 0 {
		return fmt.Errorf("%w: MaxConns %d is negative", ErrInvalidConfig, c.MaxConns)
	}
	return nil
}

// Open returns a pool for cfg and checks it with a ping. The returned close
// function closes the pool and, when used, the connector.
func Open(ctx context.Context, cfg Config) (*pgxpool.Pool, func(), error) {
	if err := cfg.Validate(); err != nil {
		return nil, nil, err
	}
	pc, _ := pgxpool.ParseConfig(cfg.DSN)
	if cfg.MaxConns > 0 {
		pc.MaxConns = cfg.MaxConns
	}
	closeDialer := func() {}
	if cfg.CloudSQLInstance != "" {
		d, err := cloudsqlconn.NewDialer(ctx, cloudsqlconn.WithLazyRefresh(), cloudsqlconn.WithIAMAuthN())
		if err != nil {
			return nil, nil, fmt.Errorf("pgpool: Cloud SQL connector: %w", err)
		}
		closeDialer = func() { _ = d.Close() }
		inst := cfg.CloudSQLInstance
		pc.ConnConfig.DialFunc = func(ctx context.Context, _, _ string) (net.Conn, error) {
			return d.Dial(ctx, inst)
		}
	}
	pool, err := pgxpool.NewWithConfig(ctx, pc)
	if err != nil {
		closeDialer()
		return nil, nil, fmt.Errorf("pgpool: %w", err)
	}
	if err := pool.Ping(ctx); err != nil {
		pool.Close()
		closeDialer()
		return nil, nil, fmt.Errorf("pgpool: ping: %w", err)
	}
	return pool, func() { pool.Close(); closeDialer() }, nil
}

// pingCloseTimeout bounds the goodbye of PingOnNewConn's connection.
const pingCloseTimeout = time.Second

// PingOnNewConn returns a ping of pool's database on a connection of its
// own, dialled as the pool dials (the Cloud SQL connector included) and
// closed after: a ping through the pool would wait for a free connection,
// and when the pool's connections are all held by calls waiting on a lock
// that wait is no news about the server. It honours ctx; an error means
// the server did not complete a connection and a ping in time. For
// overload.Config.Ping.
func PingOnNewConn(pool *pgxpool.Pool) func(context.Context) error {
	return func(ctx context.Context) error {
		conn, err := pgx.ConnectConfig(ctx, pool.Config().ConnConfig.Copy())
		if err != nil {
			return err
		}
		defer func() {
			cctx, cancel := context.WithTimeout(context.Background(), pingCloseTimeout)
			defer cancel()
			_ = conn.Close(cctx)
		}()
		return conn.Ping(ctx)
	}
}
