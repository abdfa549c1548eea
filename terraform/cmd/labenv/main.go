// Command labenv takes the lab's Google Cloud environment (terraform/)
// through its lifecycle; `make plan`, `make deploy` and `make destroy` run it.
//
//	labenv plan      read-only: the APIs deploy would enable, init and a
//	                 saved plan with its resource counts
//	labenv deploy    APIs, signing keys (Secret Manager), plan, apply,
//	                 schema grants, lock-server's Kubernetes Secret, then
//	                 cloudbuild.yaml at this commit; a failed apply is kept
//	                 unless -destroy-on-failure
//	labenv destroy   the GKE objects that outlive the cluster, terraform
//	                 destroy, then the zero-billable check (terraform/leftovers)
//
// It first checks GOOGLE_CLOUD_PROJECT, BILLING_ACCOUNT and Application
// Default Credentials. Every step: docs/cloud.md.
package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"os"
	"os/exec"
	"os/signal"
	"strings"
	"syscall"
	"time"

	secretmanager "cloud.google.com/go/secretmanager/apiv1"
	"cloud.google.com/go/secretmanager/apiv1/secretmanagerpb"
	"github.com/distributed-lock-lab/distributed-lock-lab/terraform/bootstrap"
	"github.com/distributed-lock-lab/distributed-lock-lab/terraform/labsetup"
	"github.com/distributed-lock-lab/distributed-lock-lab/terraform/leftovers"
	"github.com/distributed-lock-lab/distributed-lock-lab/terraform/tfdriver"
	billingbudgets "google.golang.org/api/billingbudgets/v1"
	cloudresourcemanager "google.golang.org/api/cloudresourcemanager/v3"
	iam "google.golang.org/api/iam/v1"
	"google.golang.org/api/iterator"
	"google.golang.org/api/option"
	sqladmin "google.golang.org/api/sqladmin/v1"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	e := &labenv{getenv: os.Getenv, exists: tfdriver.FileExists, stdout: os.Stdout, stderr: os.Stderr}
	code := e.run(ctx, os.Args[1:])
	stop()
	os.Exit(code)
}

const usage = "usage: labenv [-dir terraform] [-destroy-on-failure] [-retry-after 90s] plan|deploy|destroy"

// labenv is the command with what it reaches outside the process. The
// zero value of every field but getenv, exists, stdout and stderr is the
// production one.
type labenv struct {
	getenv func(string) string
	exists func(string) bool
	stdout io.Writer
	stderr io.Writer
	// clients are the options of the Google API clients; nil: Application
	// Default Credentials with the lab's project as quota project.
	clients *clientOptions
	// wait paces readiness polls and the wait before an apply is retried;
	// its Sleep is a timer unless a test sets it.
	wait bootstrap.Wait
	// grants makes the schema grants after apply; nil:
	// labsetup.GrantSchemas through the Cloud SQL Admin API and connector.
	grants func(ctx context.Context, project string, outputs map[string]json.RawMessage, log *slog.Logger) error
}

// clientOptions are the options of the Google API clients by kind.
type clientOptions struct {
	// GRPC: Secret Manager and the zero-billable check's gRPC clients.
	GRPC []option.ClientOption
	// REST: Service Usage, Resource Manager, IAM, Billing Budgets, Cloud
	// SQL Admin.
	REST []option.ClientOption
	// Compute: the Compute Engine REST client.
	Compute []option.ClientOption
}

// quotaProject are the production options: Application Default
// Credentials, with every call billed to and checked against the lab's
// project. User credentials have no quota project of their own unless
// `gcloud auth application-default set-quota-project` was run, and APIs
// such as Billing Budgets refuse user calls without one.
func quotaProject(project string) *clientOptions {
	o := []option.ClientOption{option.WithQuotaProject(project)}
	return &clientOptions{GRPC: o, REST: o, Compute: o}
}

// run is main without the process: it returns the exit code (2 for usage
// and missing credentials, 1 for a failed step).
func (e *labenv) run(ctx context.Context, args []string) int {
	stdout, stderr := e.stdout, e.stderr
	fs := flag.NewFlagSet("labenv", flag.ContinueOnError)
	fs.SetOutput(stderr)
	dir := fs.String("dir", "terraform", "the root module")
	destroyOnFailure := fs.Bool("destroy-on-failure", false, "deploy: destroy what a failed apply created (default: keep it, and say how to destroy it)")
	retryAfter := fs.Duration("retry-after", 90*time.Second, "deploy: wait before the one retry of an apply that failed with an error Google documents as transient")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if fs.NArg() != 1 || !strings.Contains(" plan deploy destroy ", " "+fs.Arg(0)+" ") {
		fmt.Fprintln(stderr, usage)
		return 2
	}
	cmd := fs.Arg(0)
	vars, err := tfdriver.Preflight(e.getenv, e.exists)
	if err != nil {
		fmt.Fprintf(stderr, "labenv %s: %v\n", cmd, err)
		return 2
	}
	if e.clients == nil {
		e.clients = quotaProject(vars.Project)
	}
	if e.wait.Sleep == nil {
		e.wait.Sleep = bootstrap.Sleep
	}
	log := slog.New(slog.NewJSONHandler(stderr, nil))
	tfVars := vars.Map()
	var keys []labsetup.ResolvedKey
	switch cmd {
	case "plan":
		// Read-only: report what deploy would enable, read the keys
		// that exist, placeholders for the others.
		kv := e.planKeys(ctx, vars)
		maps.Copy(tfVars, kv)
	case "deploy":
		if err := e.bootstrap(ctx, vars, log); err != nil {
			fmt.Fprintf(stderr, "labenv deploy: %v\n", err)
			return 1
		}
		// The keys' public halves are variables of the plan: resolve
		// them (and make the missing ones) before terraform runs.
		if keys, err = e.resolveKeys(ctx, vars.Project); err != nil {
			fmt.Fprintf(stderr, "labenv deploy: %v\n", err)
			return 1
		}
		maps.Copy(tfVars, labsetup.Vars(keys))
	case "destroy":
		// Destroy creates nothing from the keys: any valid value will
		// do, and none is read, so destroy works whatever state Secret
		// Manager is in.
		maps.Copy(tfVars, labsetup.PlaceholderVars(labsetup.Keys))
	}
	d, err := tfdriver.New(tfdriver.Config{Dir: *dir, Vars: tfVars, Output: stderr}, log)
	if err != nil {
		fmt.Fprintf(stderr, "labenv: %v\n", err)
		return 2
	}
	switch cmd {
	case "plan":
		err = plan(ctx, d, stdout)
	case "deploy":
		err = e.deploy(ctx, d, vars, keys, failurePolicy{destroy: *destroyOnFailure, retryAfter: *retryAfter}, log)
	case "destroy":
		err = e.destroy(ctx, d, vars)
	}
	if err != nil {
		fmt.Fprintf(stderr, "labenv %s: %v\n", cmd, err)
		return 1
	}
	return 0
}

// bootstrapAPIs are the APIs that must answer before Terraform runs, in
// the order they are needed: Service Usage to enable the others (it
// cannot enable itself); Resource Manager, which the providers read the
// project through; Billing Budgets, for the budget Terraform creates
// first; IAM, whose service accounts Terraform creates right after
// enabling the APIs (an API enabled in the same apply answers
// SERVICE_DISABLED for minutes); Secret Manager, which labenv reads the
// keys from before any plan.
func (e *labenv) bootstrapAPIs(ctx context.Context, vars tfdriver.CloudVars) ([]bootstrap.API, error) {
	crm, err := cloudresourcemanager.NewService(ctx, e.clients.REST...)
	if err != nil {
		return nil, err
	}
	bb, err := billingbudgets.NewService(ctx, e.clients.REST...)
	if err != nil {
		return nil, err
	}
	iamc, err := iam.NewService(ctx, e.clients.REST...)
	if err != nil {
		return nil, err
	}
	sm, err := secretmanager.NewClient(ctx, e.clients.GRPC...)
	if err != nil {
		return nil, err
	}
	context.AfterFunc(ctx, func() { _ = sm.Close() })
	return []bootstrap.API{
		{Service: "serviceusage.googleapis.com", Why: "labenv enables the other APIs through it"},
		{Service: "cloudresourcemanager.googleapis.com", Why: "the providers read the project", Probe: func(ctx context.Context) error {
			_, err := crm.Projects.Get("projects/" + vars.Project).Context(ctx).Do()
			return err
		}},
		{Service: "billingbudgets.googleapis.com", Why: "the budget, created first", Probe: func(ctx context.Context) error {
			_, err := bb.BillingAccounts.Budgets.List("billingAccounts/" + vars.BillingAccount).PageSize(1).Context(ctx).Do()
			return err
		}},
		{Service: "iam.googleapis.com", Why: "the services' accounts, created right after the APIs", Probe: func(ctx context.Context) error {
			_, err := iamc.Projects.ServiceAccounts.List("projects/" + vars.Project).PageSize(1).Context(ctx).Do()
			return err
		}},
		{Service: "secretmanager.googleapis.com", Why: "labenv reads the signing keys before planning", Probe: func(ctx context.Context) error {
			_, err := sm.ListSecrets(ctx, &secretmanagerpb.ListSecretsRequest{Parent: "projects/" + vars.Project, PageSize: 1}).Next()
			if errors.Is(err, iterator.Done) {
				return nil
			}
			return err
		}},
	}, nil
}

// bootstrap enables and awaits every bootstrap API (deploy).
func (e *labenv) bootstrap(ctx context.Context, vars tfdriver.CloudVars, log *slog.Logger) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	apis, err := e.bootstrapAPIs(ctx, vars)
	if err != nil {
		return err
	}
	su, err := bootstrap.NewServiceUsage(ctx, vars.Project, e.wait, e.clients.REST...)
	if err != nil {
		return err
	}
	return bootstrap.Ensure(ctx, vars.Project, su, apis, e.wait, log)
}

// planKeys returns the keys' variables for a plan, read-only, printing
// what is missing (never an error: a plan shows what deploy would do).
func (e *labenv) planKeys(ctx context.Context, vars tfdriver.CloudVars) map[string]string {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	if apis, err := e.bootstrapAPIs(ctx, vars); err == nil {
		if su, err := bootstrap.NewServiceUsage(ctx, vars.Project, e.wait, e.clients.REST...); err == nil {
			if err := bootstrap.Check(ctx, vars.Project, su, apis); err != nil {
				fmt.Fprintf(e.stderr, "labenv plan: %v\n", err)
			}
		}
	}
	sv, closeSV, err := labsetup.NewSecretManager(ctx, vars.Project, e.clients.GRPC...)
	if err != nil {
		sv = nil
	} else {
		defer func() { _ = closeSV() }()
	}
	m, notes := labsetup.PlanVars(ctx, sv, namePrefix(e.getenv), labsetup.Keys, e.getenv)
	for _, n := range notes {
		fmt.Fprintf(e.stderr, "labenv plan: %s\n", n)
	}
	return m
}

func plan(ctx context.Context, d *tfdriver.Driver, stdout io.Writer) error {
	if err := d.Init(ctx); err != nil {
		return err
	}
	sum, err := d.Plan(ctx)
	if err != nil {
		return err
	}
	fmt.Fprintln(stdout, sum)
	return nil
}

// namePrefix is the root module's name_prefix: TF_VAR_name_prefix, or
// the module's default.
func namePrefix(getenv func(string) string) string {
	if p := getenv("TF_VAR_name_prefix"); p != "" {
		return p
	}
	return "dlock"
}

// resolveKeys reads the signing keys' secret halves from the project's
// Secret Manager, making those that have no version yet
// (labsetup.ResolveKeys).
func (e *labenv) resolveKeys(ctx context.Context, project string) ([]labsetup.ResolvedKey, error) {
	sv, closeSV, err := labsetup.NewSecretManager(ctx, project, e.clients.GRPC...)
	if err != nil {
		return nil, err
	}
	defer func() { _ = closeSV() }()
	return labsetup.ResolveKeys(ctx, sv, namePrefix(e.getenv), labsetup.Keys, e.getenv, rand.Reader, time.Now())
}

// failurePolicy says what deploy does when an apply fails.
type failurePolicy struct {
	// destroy: destroy what the failed apply created; otherwise it is
	// kept and labenv prints how to destroy it.
	destroy bool
	// retryAfter is the wait before the one retry of an apply that failed
	// with a transient error (tfdriver.Transient).
	retryAfter time.Duration
}

// planApply plans (with targets) and applies; an apply that fails with
// an error Google documents as transient is planned and applied once
// more after the policy's wait. A failure that remains is kept in place
// or destroyed as the policy says.
func (e *labenv) planApply(ctx context.Context, d *tfdriver.Driver, p failurePolicy, targets ...string) error {
	var err error
	for attempt := 1; ; attempt++ {
		var sum tfdriver.PlanSummary
		if sum, err = d.Plan(ctx, targets...); err != nil {
			break
		}
		fmt.Fprintln(e.stdout, sum)
		if err = d.Apply(ctx); err == nil {
			return nil
		}
		reason, transient := tfdriver.Transient(err)
		if !transient || attempt > 1 {
			break
		}
		fmt.Fprintf(e.stderr, "labenv deploy: apply failed on %s, which Google documents as transient; planning and applying once more in %s\n", reason, p.retryAfter)
		if werr := e.wait.Sleep(ctx, p.retryAfter); werr != nil {
			return errors.Join(err, werr)
		}
	}
	if p.destroy {
		fmt.Fprintln(e.stderr, "labenv deploy: apply failed; destroying what it created (-destroy-on-failure)")
		return errors.Join(err, d.Destroy(context.WithoutCancel(ctx)))
	}
	return fmt.Errorf("%w\nWhat the apply created is kept (it bills until destroyed): fix the cause and run make deploy again to finish it, or make destroy to remove it", err)
}

func (e *labenv) deploy(ctx context.Context, d *tfdriver.Driver, vars tfdriver.CloudVars, keys []labsetup.ResolvedKey, p failurePolicy, log *slog.Logger) error {
	stdout, stderr := e.stdout, e.stderr
	if err := d.Init(ctx); err != nil {
		return err
	}
	if labsetup.AnyNew(keys) {
		// A first deploy: the secrets alone (and what they need, the
		// budget first), then their first versions, so that no service
		// that reads a secret starts before the secret has a value.
		if err := e.planApply(ctx, d, p, labsetup.SecretsTarget); err != nil {
			return err
		}
		sv, closeSV, err := labsetup.NewSecretManager(ctx, vars.Project, e.clients.GRPC...)
		if err != nil {
			return err
		}
		err = labsetup.AddNew(ctx, sv, keys)
		_ = closeSV()
		if err != nil {
			return err
		}
		fmt.Fprintln(stdout, "labenv deploy: made the signing keys and stored their secret halves in Secret Manager")
	}
	if err := e.planApply(ctx, d, p); err != nil {
		return err
	}
	out, err := d.Outputs(ctx)
	if err != nil {
		return err
	}
	str := func(k string) string {
		var s string
		_ = json.Unmarshal(out[k], &s)
		return s
	}
	// Each service creates its tables as its own IAM user: it needs
	// CREATE on its database's schema before it first starts.
	grants := e.grants
	if grants == nil {
		grants = e.grantSchemas
	}
	if err := grants(ctx, vars.Project, out, log); err != nil {
		return err
	}
	// lock-server's grant-proof key, as the Kubernetes Secret its
	// Deployment reads, before cloudbuild.yaml waits for its rollout.
	for _, k := range keys {
		if !k.Kubernetes {
			continue
		}
		manifest, err := labsetup.LockServerSecret(k.Signing)
		if err != nil {
			return err
		}
		steps := [][]string{
			{"gcloud", "container", "clusters", "get-credentials", str("gke_cluster"), "--region", str("gke_location"), "--project", vars.Project},
			{"kubectl", "apply", "-f", "lockserver/deploy/namespace.yaml"},
		}
		for _, s := range steps {
			cmd := exec.CommandContext(ctx, s[0], s[1:]...)
			cmd.Stdout, cmd.Stderr = stdout, stderr
			if err := cmd.Run(); err != nil {
				return fmt.Errorf("%s: %w", strings.Join(s[:2], " "), err)
			}
		}
		if err := labsetup.KubectlApply(ctx, "kubectl", manifest, stdout); err != nil {
			return err
		}
	}
	sha, err := exec.CommandContext(ctx, "git", "rev-parse", "HEAD").Output()
	if err != nil {
		return fmt.Errorf("git rev-parse HEAD: %w", err)
	}
	region := vars.Region
	if region == "" {
		region = str("gke_location")
	}
	subs := []string{
		"COMMIT_SHA=" + strings.TrimSpace(string(sha)),
		"_REGION=" + region,
		"_REPO=" + str("image_repository"),
		"_LOCK_INSTANCE=" + str("lock_instance"),
		"_LOCK_SERVER_ADDRESS=" + str("lock_server_address"),
		"_CLUSTER=" + str("gke_cluster"),
	}
	cmd := exec.CommandContext(ctx, "gcloud", "builds", "submit", "--project", vars.Project, "--region", region,
		"--config", "cloudbuild.yaml", "--substitutions", strings.Join(subs, ","),
		"--gcs-source-staging-dir", "gs://"+str("build_source_bucket")+"/source", ".")
	cmd.Stdout, cmd.Stderr = stdout, stderr
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("gcloud builds submit: %w", err)
	}
	return nil
}

// grantSchemas is the production grants step: labsetup.GrantSchemas
// through the Cloud SQL Admin API and the Cloud SQL Go connector.
func (e *labenv) grantSchemas(ctx context.Context, project string, out map[string]json.RawMessage, log *slog.Logger) error {
	admin, err := sqladmin.NewService(ctx, e.clients.REST...)
	if err != nil {
		return fmt.Errorf("the Cloud SQL Admin client: %w", err)
	}
	connect, closeConnect, err := labsetup.CloudSQLConnect(ctx)
	if err != nil {
		return err
	}
	defer func() { _ = closeConnect() }()
	return labsetup.GrantSchemas(ctx, labsetup.NewSQLAdmin(admin, project), connect, out, labsetup.SchemaGrants, rand.Reader, log)
}

func (e *labenv) destroy(ctx context.Context, d *tfdriver.Driver, vars tfdriver.CloudVars) error {
	stdout, stderr := e.stdout, e.stderr
	if err := d.Init(ctx); err != nil {
		return err
	}
	// What the zero-billable check looks for, read while the state still
	// has it; the module's defaults when it no longer does.
	// NamePrefix (the module's default; TF_VAR_name_prefix overrides it)
	// finds the Cloud Scheduler jobs, which carry no labels.
	scope := leftovers.Scope{Project: vars.Project, Region: vars.Region, Labels: map[string]string{"app": "distributed-lock-lab"}, NamePrefix: namePrefix(e.getenv)}
	if scope.Region == "" {
		scope.Region = "europe-west1"
	}
	// Disks of etcd's claims and the internal load balancer's forwarding
	// rule are made by GKE, not Terraform, and outlive the cluster: delete
	// their owners first. Best effort: the cluster may already be gone.
	// kubectl delete --wait returns once the Service is gone (its
	// finalizer holds it until the forwarding rule is deleted) and the
	// StatefulSet is gone, but its claims, and their disks, are deleted
	// after it by the garbage collector and the CSI driver: wait for the
	// volumes too (a volume object lives until its disk is deleted), or
	// terraform destroy removes the cluster before the driver has run.
	if out, err := d.Outputs(ctx); err == nil && len(out["gke_cluster"]) > 0 {
		var cluster, location string
		_ = json.Unmarshal(out["gke_cluster"], &cluster)
		_ = json.Unmarshal(out["gke_location"], &location)
		var labels map[string]string
		if json.Unmarshal(out["labels"], &labels) == nil && len(labels) > 0 {
			scope.Labels = labels
		}
		steps := [][]string{
			{"gcloud", "container", "clusters", "get-credentials", cluster, "--region", location, "--project", vars.Project},
			{"kubectl", "delete", "--ignore-not-found", "--wait", "-f", "lockserver/deploy/lock-server.yaml", "-f", "etcd/deploy/etcd.yaml"},
			{"kubectl", "wait", "--for=delete", "persistentvolume", "--all", "--timeout=10m"},
		}
		for _, s := range steps {
			var buf bytes.Buffer
			cmd := exec.CommandContext(ctx, s[0], s[1:]...)
			cmd.Stdout, cmd.Stderr = &buf, &buf
			if err := cmd.Run(); err != nil {
				fmt.Fprintf(stderr, "labenv destroy: %s: %v (continuing)\n%s", strings.Join(s[:2], " "), err, buf.String())
				break
			}
		}
	}
	if err := d.Destroy(context.WithoutCancel(ctx)); err != nil {
		return err
	}
	left, err := d.StateResources(ctx)
	if err != nil {
		return err
	}
	if len(left) > 0 {
		return fmt.Errorf("%d resources left in the state: %v", len(left), left)
	}
	fmt.Fprintln(stdout, "labenv destroy: the Terraform state is empty; listing labelled leftovers through the Google Cloud APIs")
	clients, closeClients, err := leftovers.NewClientsWith(ctx, vars.Project, leftovers.ClientOptions{GRPC: e.clients.GRPC, Compute: e.clients.Compute, SQL: e.clients.REST})
	if err != nil {
		return err
	}
	defer closeClients()
	if err := leftovers.Check(ctx, scope, clients); err != nil {
		return err
	}
	fmt.Fprintf(stdout, "labenv destroy: zero billable resources of the lab in %s (labels %v)\n", vars.Project, scope.Labels)
	return nil
}
