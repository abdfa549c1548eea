package labsetup

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"strings"
	"time"

	"cloud.google.com/go/cloudsqlconn"
	"github.com/jackc/pgx/v5"
	sqladmin "google.golang.org/api/sqladmin/v1"
)

// SchemaGrant is the one right a service's IAM database user lacks on a
// fresh Cloud SQL database: PostgreSQL 15 gives CREATE on schema public
// only to the database's owner (cloudsqlsuperuser for databases Terraform
// makes), and each service creates its own tables with its embedded
// migrations, as itself (docs/cloud.md, "Table ownership").
type SchemaGrant struct {
	// Instance is the root-module output holding the instance's
	// connection name ("project:region:instance").
	Instance string
	// Database is the database's name.
	Database string
	// Service is the service's key in the service_accounts output.
	Service string
}

// SchemaGrants are the lab's three: paydb and raildb on the pay instance,
// lockdb on its own regional one.
var SchemaGrants = []SchemaGrant{
	{Instance: "pay_instance", Database: "paydb", Service: "payment-resource"},
	{Instance: "pay_instance", Database: "raildb", Service: "rail-proxy"},
	{Instance: "lock_instance", Database: "lockdb", Service: "lock-server"},
}

// adminUser is Cloud SQL's built-in PostgreSQL user, a member of
// cloudsqlsuperuser.
const adminUser = "postgres"

// ErrOutputs: an output SchemaGrants needs is missing or malformed.
var ErrOutputs = errors.New("labsetup: terraform outputs")

// Passwords sets the password of a built-in user of a Cloud SQL instance
// (by instance name, the last part of the connection name) and returns
// once the change is done. NewSQLAdmin returns the Cloud SQL Admin one.
type Passwords interface {
	SetPassword(ctx context.Context, instance, user, password string) error
}

// Connect opens a connection to a database of a Cloud SQL instance (by
// connection name) as a user with a password. CloudSQLConnect is the
// Cloud SQL Go connector's.
type Connect func(ctx context.Context, instance, database, user, password string) (*pgx.Conn, error)

// IAMUser is the PostgreSQL user name of a service account's IAM database
// user: its email without ".gserviceaccount.com".
func IAMUser(email string) string { return strings.TrimSuffix(email, ".gserviceaccount.com") }

// GrantStatement is the statement that gives user the right to create its
// tables in schema public.
func GrantStatement(user string) string {
	return "GRANT USAGE, CREATE ON SCHEMA public TO " + pgx.Identifier{user}.Sanitize()
}

// GrantSchemas runs each grant as the postgres user. The postgres password
// lives only for the duration: per instance it is set to a random value
// from rnd, the grants run, and it is set again to another random value
// that nobody keeps, even when a grant failed. The passwords never leave
// this process. Errors name the instance, database and user, and join
// every failure (a grant left undone, a password not reset).
func GrantSchemas(ctx context.Context, pw Passwords, connect Connect, outputs map[string]json.RawMessage, grants []SchemaGrant, rnd io.Reader, log *slog.Logger) error {
	var emails map[string]string
	if err := json.Unmarshal(outputs["service_accounts"], &emails); err != nil {
		return fmt.Errorf("%w: service_accounts: %v", ErrOutputs, err)
	}
	byInstance := map[string][]SchemaGrant{}
	var order []string
	for _, g := range grants {
		var conn string
		if err := json.Unmarshal(outputs[g.Instance], &conn); err != nil || strings.Count(conn, ":") != 2 {
			return fmt.Errorf("%w: %s is not a connection name (project:region:instance)", ErrOutputs, g.Instance)
		}
		if emails[g.Service] == "" {
			return fmt.Errorf("%w: service_accounts has no %s", ErrOutputs, g.Service)
		}
		if _, ok := byInstance[conn]; !ok {
			order = append(order, conn)
		}
		byInstance[conn] = append(byInstance[conn], g)
	}
	var errs []error
	for _, conn := range order {
		name := conn[strings.LastIndex(conn, ":")+1:]
		first, err := password(rnd)
		if err != nil {
			return err
		}
		if err := pw.SetPassword(ctx, name, adminUser, first); err != nil {
			errs = append(errs, fmt.Errorf("labsetup: set the %s password of instance %s: %w", adminUser, name, err))
			continue
		}
		for _, g := range byInstance[conn] {
			user := IAMUser(emails[g.Service])
			if err := grantOne(ctx, connect, conn, g.Database, first, user); err != nil {
				errs = append(errs, fmt.Errorf("labsetup: grant on %s/%s to %s: %w", name, g.Database, user, err))
				continue
			}
			log.InfoContext(ctx, "schema grant made", "event", EventSchemaGranted, "instance", name, "database", g.Database, "user", user)
		}
		last, err := password(rnd)
		if err == nil {
			// A fresh context: the reset must run even when ctx ended.
			rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Minute)
			err = pw.SetPassword(rctx, name, adminUser, last)
			cancel()
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("labsetup: reset the %s password of instance %s (reset it by hand: gcloud sql users set-password): %w", adminUser, name, err))
		}
	}
	return errors.Join(errs...)
}

// EventSchemaGranted is the log event of a schema grant made.
const EventSchemaGranted = "schema_granted"

func grantOne(ctx context.Context, connect Connect, instance, database, password, user string) error {
	c, err := connect(ctx, instance, database, adminUser, password)
	if err != nil {
		return err
	}
	defer func() { _ = c.Close(context.WithoutCancel(ctx)) }()
	_, err = c.Exec(ctx, GrantStatement(user))
	return err
}

func password(rnd io.Reader) (string, error) {
	b := make([]byte, 32)
	if _, err := io.ReadFull(rnd, b); err != nil {
		return "", fmt.Errorf("labsetup: random password: %w", err)
	}
	return base64.RawURLEncoding.EncodeToString(b), nil
}

// sqlAdmin is Passwords over the Cloud SQL Admin API.
type sqlAdmin struct {
	s       *sqladmin.Service
	project string
	poll    time.Duration
}

// NewSQLAdmin returns Passwords of the project's Cloud SQL instances
// through the Cloud SQL Admin API (users.update, then operations.get until
// the operation is DONE).
func NewSQLAdmin(s *sqladmin.Service, project string) Passwords {
	return sqlAdmin{s: s, project: project, poll: 2 * time.Second}
}

func (a sqlAdmin) SetPassword(ctx context.Context, instance, user, password string) error {
	op, err := a.s.Users.Update(a.project, instance, &sqladmin.User{Name: user, Password: password}).Name(user).Context(ctx).Do()
	if err != nil {
		return err
	}
	for op.Status != "DONE" {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(a.poll):
		}
		if op, err = a.s.Operations.Get(a.project, op.Name).Context(ctx).Do(); err != nil {
			return err
		}
	}
	if op.Error != nil && len(op.Error.Errors) > 0 {
		return fmt.Errorf("operation %s: %s: %s", op.Name, op.Error.Errors[0].Code, op.Error.Errors[0].Message)
	}
	return nil
}

// CloudSQLConnect returns a Connect through the Cloud SQL Go connector
// (the instance's public IP, TLS by the connector, the operator's
// Application Default Credentials) and its close function.
func CloudSQLConnect(ctx context.Context) (Connect, func() error, error) {
	d, err := cloudsqlconn.NewDialer(ctx, cloudsqlconn.WithLazyRefresh())
	if err != nil {
		return nil, nil, fmt.Errorf("labsetup: Cloud SQL connector: %w", err)
	}
	connect := func(ctx context.Context, instance, database, user, password string) (*pgx.Conn, error) {
		cfg, err := pgx.ParseConfig("")
		if err != nil {
			return nil, err
		}
		cfg.User, cfg.Password, cfg.Database = user, password, database
		cfg.DialFunc = func(ctx context.Context, _, _ string) (net.Conn, error) { return d.Dial(ctx, instance) }
		return pgx.ConnectConfig(ctx, cfg)
	}
	return connect, d.Close, nil
}
