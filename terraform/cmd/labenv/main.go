// Command labenv takes the lab's Google Cloud environment (terraform/)
// through its lifecycle with terraform/tfdriver; `make plan`, `make deploy`
// and `make destroy` run it.
//
//	labenv plan      init and a saved plan, with its resource counts
//	labenv deploy    the signing keys (read from Secret Manager, or made
//	                 on a first deploy and stored there after a plan
//	                 targeted at the secrets), plan, apply, outputs, each
//	                 service's schema grant, lock-server's Kubernetes
//	                 Secret, then cloudbuild.yaml with this commit (gcloud
//	                 builds submit); a failed apply is destroyed at once
//	                 unless -keep-on-failure
//	labenv destroy   delete the GKE objects whose disks and load balancers
//	                 outlive the cluster, then terraform destroy; fail if
//	                 anything is left in the state, or if the zero-billable
//	                 check (terraform/leftovers) finds anything of the lab
//
// Before terraform or any Google API is called, it checks
// GOOGLE_CLOUD_PROJECT, BILLING_ACCOUNT and Application Default
// Credentials, and stops with one line naming what is missing.
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
	"os"
	"os/exec"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/distributed-lock-lab/distributed-lock-lab/terraform/labsetup"
	"github.com/distributed-lock-lab/distributed-lock-lab/terraform/leftovers"
	"github.com/distributed-lock-lab/distributed-lock-lab/terraform/tfdriver"
	sqladmin "google.golang.org/api/sqladmin/v1"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], os.Getenv, tfdriver.FileExists, os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

const usage = "usage: labenv [-dir terraform] [-keep-on-failure] plan|deploy|destroy"

// run is main without the process: it returns the exit code (2 for usage
// and missing credentials, 1 for a failed step).
func run(ctx context.Context, args []string, getenv func(string) string, exists func(string) bool, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("labenv", flag.ContinueOnError)
	fs.SetOutput(stderr)
	dir := fs.String("dir", "terraform", "the root module")
	keep := fs.Bool("keep-on-failure", false, "deploy: leave a failed apply in place instead of destroying it")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if fs.NArg() != 1 || !strings.Contains(" plan deploy destroy ", " "+fs.Arg(0)+" ") {
		fmt.Fprintln(stderr, usage)
		return 2
	}
	vars, err := tfdriver.Preflight(getenv, exists)
	if err != nil {
		fmt.Fprintf(stderr, "labenv %s: %v\n", fs.Arg(0), err)
		return 2
	}
	log := slog.New(slog.NewJSONHandler(stderr, nil))
	tfVars := vars.Map()
	var keys []labsetup.ResolvedKey
	if fs.Arg(0) == "deploy" {
		// The keys' public halves are variables of the plan: resolve
		// them (and make the missing ones) before terraform runs.
		if keys, err = resolveKeys(ctx, vars.Project, getenv); err != nil {
			fmt.Fprintf(stderr, "labenv deploy: %v\n", err)
			return 1
		}
		for k, v := range labsetup.Vars(keys) {
			tfVars[k] = v
		}
	}
	d, err := tfdriver.New(tfdriver.Config{Dir: *dir, Vars: tfVars, Output: stderr}, log)
	if err != nil {
		fmt.Fprintf(stderr, "labenv: %v\n", err)
		return 2
	}
	switch fs.Arg(0) {
	case "plan":
		err = plan(ctx, d, stdout)
	case "deploy":
		err = deploy(ctx, d, vars, keys, *keep, log, stdout, stderr)
	case "destroy":
		err = destroy(ctx, d, vars, getenv, stdout, stderr)
	}
	if err != nil {
		fmt.Fprintf(stderr, "labenv %s: %v\n", fs.Arg(0), err)
		return 1
	}
	return 0
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
func resolveKeys(ctx context.Context, project string, getenv func(string) string) ([]labsetup.ResolvedKey, error) {
	sv, closeSV, err := labsetup.NewSecretManager(ctx, project)
	if err != nil {
		return nil, err
	}
	defer func() { _ = closeSV() }()
	return labsetup.ResolveKeys(ctx, sv, namePrefix(getenv), labsetup.Keys, getenv, rand.Reader, time.Now())
}

func deploy(ctx context.Context, d *tfdriver.Driver, vars tfdriver.CloudVars, keys []labsetup.ResolvedKey, keep bool, log *slog.Logger, stdout, stderr io.Writer) error {
	if err := d.Init(ctx); err != nil {
		return err
	}
	applied := func(err error) error {
		if err == nil {
			return nil
		}
		if keep {
			return fmt.Errorf("%w (left in place: -keep-on-failure; run make destroy)", err)
		}
		fmt.Fprintln(stderr, "labenv deploy: apply failed; destroying what it created")
		return errors.Join(err, d.Destroy(context.WithoutCancel(ctx)))
	}
	if labsetup.AnyNew(keys) {
		// A first deploy: the secrets alone (and what they need, the
		// budget first), then their first versions, so that no service
		// that reads a secret starts before the secret has a value.
		sum, err := d.Plan(ctx, labsetup.SecretsTarget)
		if err != nil {
			return err
		}
		fmt.Fprintln(stdout, sum)
		if err := applied(d.Apply(ctx)); err != nil {
			return err
		}
		sv, closeSV, err := labsetup.NewSecretManager(ctx, vars.Project)
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
	sum, err := d.Plan(ctx)
	if err != nil {
		return err
	}
	fmt.Fprintln(stdout, sum)
	if err := applied(d.Apply(ctx)); err != nil {
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
	admin, err := sqladmin.NewService(ctx)
	if err != nil {
		return fmt.Errorf("the Cloud SQL Admin client: %w", err)
	}
	connect, closeConnect, err := labsetup.CloudSQLConnect(ctx)
	if err != nil {
		return err
	}
	err = labsetup.GrantSchemas(ctx, labsetup.NewSQLAdmin(admin, vars.Project), connect, out, labsetup.SchemaGrants, rand.Reader, log)
	_ = closeConnect()
	if err != nil {
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

func destroy(ctx context.Context, d *tfdriver.Driver, vars tfdriver.CloudVars, getenv func(string) string, stdout, stderr io.Writer) error {
	if err := d.Init(ctx); err != nil {
		return err
	}
	// What the zero-billable check looks for, read while the state still
	// has it; the module's defaults when it no longer does.
	// NamePrefix (the module's default; TF_VAR_name_prefix overrides it)
	// finds the Cloud Scheduler jobs, which carry no labels.
	scope := leftovers.Scope{Project: vars.Project, Region: vars.Region, Labels: map[string]string{"app": "distributed-lock-lab"}, NamePrefix: namePrefix(getenv)}
	if scope.Region == "" {
		scope.Region = "europe-west1"
	}
	// Disks of etcd's claims and the internal load balancer's forwarding
	// rule are made by GKE, not Terraform, and outlive the cluster: delete
	// their owners first. Best effort: the cluster may already be gone.
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
	clients, closeClients, err := leftovers.NewClients(ctx, vars.Project)
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
