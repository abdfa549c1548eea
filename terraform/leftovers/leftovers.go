// Package leftovers lists what of the lab is still billed in its project
// after a destroy, through the Google Cloud APIs rather than Terraform's
// state (which only knows what it made): Cloud Run services, Cloud SQL
// instances, GKE clusters, Pub/Sub, Artifact Registry repositories,
// persistent disks, Secret Manager secrets and Cloud Scheduler jobs. A
// resource is the lab's when it carries every one of the lab's labels, or,
// for the kinds that never carry them, when it is a GKE-created disk, the
// cloud-run-source-deploy repository, or a job named with Scope.NamePrefix.
// Check is the zero-billable check of `make destroy`; Services reads the
// deployed services' URLs and readiness for the harness.
package leftovers

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"

	artifactregistry "cloud.google.com/go/artifactregistry/apiv1"
	"cloud.google.com/go/artifactregistry/apiv1/artifactregistrypb"
	compute "cloud.google.com/go/compute/apiv1"
	"cloud.google.com/go/compute/apiv1/computepb"
	container "cloud.google.com/go/container/apiv1"
	"cloud.google.com/go/container/apiv1/containerpb"
	"cloud.google.com/go/pubsub/v2"
	"cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"
	run "cloud.google.com/go/run/apiv2"
	"cloud.google.com/go/run/apiv2/runpb"
	scheduler "cloud.google.com/go/scheduler/apiv1"
	"cloud.google.com/go/scheduler/apiv1/schedulerpb"
	secretmanager "cloud.google.com/go/secretmanager/apiv1"
	"cloud.google.com/go/secretmanager/apiv1/secretmanagerpb"
	"github.com/distributed-lock-lab/distributed-lock-lab/terraform/bootstrap"
	"google.golang.org/api/iterator"
	"google.golang.org/api/option"
	sqladmin "google.golang.org/api/sqladmin/v1"
)

var (
	// ErrLeftovers: billable resources of the lab remain; the message names
	// each one.
	ErrLeftovers = errors.New("leftovers: billable resources remain")
	// ErrInvalidScope: the project, region or labels are missing.
	ErrInvalidScope = errors.New("leftovers: invalid scope")
	// ErrList: an API could not be listed; nothing can be concluded.
	ErrList = errors.New("leftovers: cannot list")
)

// SourceDeployRepository is the Artifact Registry repository that
// `gcloud run deploy --source` creates outside Terraform's state.
const SourceDeployRepository = "cloud-run-source-deploy"

// Scope says where to look and what is the lab's.
type Scope struct {
	// Project is the project id.
	Project string
	// Region is the lab's one region (Cloud Run and Artifact Registry are
	// listed there; the other kinds are listed in every location).
	Region string
	// Labels are the lab's labels; a resource is the lab's when it carries
	// every pair. At least one is required.
	Labels map[string]string
	// NamePrefix is the lab's name prefix (terraform's var.name_prefix):
	// Cloud Scheduler jobs carry no labels, so a job is the lab's when its
	// id starts with NamePrefix + "-". Default: the value of the "lab"
	// label, which main.tf sets to the prefix. Without either, listing the
	// jobs fails (never a pass).
	NamePrefix string
}

// jobPrefix is the id prefix of the lab's Cloud Scheduler jobs, "" when
// unknown.
func (s Scope) jobPrefix() string {
	p := s.NamePrefix
	if p == "" {
		p = s.Labels["lab"]
	}
	if p == "" {
		return ""
	}
	return p + "-"
}

// Validate returns an error wrapping ErrInvalidScope.
func (s Scope) Validate() error {
	switch {
	case s.Project == "":
		return fmt.Errorf("%w: no project", ErrInvalidScope)
	case s.Region == "":
		return fmt.Errorf("%w: no region", ErrInvalidScope)
	case len(s.Labels) == 0:
		return fmt.Errorf("%w: no labels: every resource would match", ErrInvalidScope)
	}
	return nil
}

func (s Scope) ours(l map[string]string) bool {
	for k, v := range s.Labels {
		if l[k] != v {
			return false
		}
	}
	return true
}

// Leftover is one resource that remains.
type Leftover struct {
	// Kind is what it is ("Cloud Run service", "Cloud SQL instance", ...).
	Kind string
	// Name is its full resource name.
	Name string
}

// String is the kind and the name, as Check names the leftover.
func (l Leftover) String() string { return l.Kind + " " + l.Name }

// Clients are the API clients Find uses. Every one is required: a kind
// that cannot be listed is an error, never a pass.
type Clients struct {
	Run       *run.ServicesClient             // Cloud Run Admin API v2 (gRPC)
	GKE       *container.ClusterManagerClient // GKE (gRPC)
	Registry  *artifactregistry.Client        // Artifact Registry (gRPC)
	Disks     *compute.DisksClient            // Compute Engine disks (REST)
	SQL       *sqladmin.Service               // Cloud SQL Admin (REST)
	PubSub    *pubsub.Client                  // Pub/Sub admin (gRPC)
	Secrets   *secretmanager.Client           // Secret Manager (gRPC)
	Scheduler *scheduler.CloudSchedulerClient // Cloud Scheduler (gRPC)
}

// NewClients opens every client for project with opts (Application
// Default Credentials when opts are empty). The returned function closes
// them.
func NewClients(ctx context.Context, project string, opts ...option.ClientOption) (Clients, func(), error) {
	return NewClientsWith(ctx, project, ClientOptions{GRPC: opts, Compute: opts, SQL: opts})
}

// ClientOptions are NewClientsWith's options by kind of client: the REST
// clients of Compute and Cloud SQL Admin build their URLs differently
// from each other, so a test serving both needs an endpoint for each.
type ClientOptions struct {
	GRPC, Compute, SQL []option.ClientOption
}

// NewClientsWith is NewClients with options by kind of client.
func NewClientsWith(ctx context.Context, project string, o ClientOptions) (Clients, func(), error) {
	opts := o.GRPC
	var c Clients
	var closers []func() error
	closeAll := func() {
		for _, f := range closers {
			_ = f()
		}
	}
	fail := func(what string, err error) (Clients, func(), error) {
		closeAll()
		return Clients{}, nil, fmt.Errorf("leftovers: %s client: %w", what, err)
	}
	var err error
	if c.Run, err = run.NewServicesClient(ctx, opts...); err != nil {
		return fail("Cloud Run", err)
	}
	closers = append(closers, c.Run.Close)
	if c.GKE, err = container.NewClusterManagerClient(ctx, opts...); err != nil {
		return fail("GKE", err)
	}
	closers = append(closers, c.GKE.Close)
	if c.Registry, err = artifactregistry.NewClient(ctx, opts...); err != nil {
		return fail("Artifact Registry", err)
	}
	closers = append(closers, c.Registry.Close)
	if c.Disks, err = compute.NewDisksRESTClient(ctx, o.Compute...); err != nil {
		return fail("Compute disks", err)
	}
	closers = append(closers, c.Disks.Close)
	if c.SQL, err = sqladmin.NewService(ctx, o.SQL...); err != nil {
		return fail("Cloud SQL Admin", err)
	}
	if c.PubSub, err = pubsub.NewClient(ctx, project, opts...); err != nil {
		return fail("Pub/Sub", err)
	}
	closers = append(closers, c.PubSub.Close)
	if c.Secrets, err = secretmanager.NewClient(ctx, opts...); err != nil {
		return fail("Secret Manager", err)
	}
	closers = append(closers, c.Secrets.Close)
	if c.Scheduler, err = scheduler.NewCloudSchedulerClient(ctx, opts...); err != nil {
		return fail("Cloud Scheduler", err)
	}
	closers = append(closers, c.Scheduler.Close)
	return c, closeAll, nil
}

// Find lists every kind and returns the lab's resources that remain,
// sorted. Listing errors are joined, each wrapping ErrList; the leftovers
// found by the other kinds are returned with them. A kind whose API
// answers 403 SERVICE_DISABLED has nothing: an API that is off holds no
// resource of the lab.
func Find(ctx context.Context, s Scope, c Clients) ([]Leftover, error) {
	if err := s.Validate(); err != nil {
		return nil, err
	}
	var out []Leftover
	var errs []error
	for _, k := range []struct {
		kind string
		list func() ([]Leftover, error)
		ok   bool
	}{
		{"Cloud Run services", func() ([]Leftover, error) { return runServices(ctx, s, c.Run) }, c.Run != nil},
		{"Cloud SQL instances", func() ([]Leftover, error) { return sqlInstances(ctx, s, c.SQL) }, c.SQL != nil},
		{"GKE clusters", func() ([]Leftover, error) { return gkeClusters(ctx, s, c.GKE) }, c.GKE != nil},
		{"Pub/Sub topics and subscriptions", func() ([]Leftover, error) { return pubsubResources(ctx, s, c.PubSub) }, c.PubSub != nil},
		{"Artifact Registry repositories", func() ([]Leftover, error) { return repositories(ctx, s, c.Registry) }, c.Registry != nil},
		{"persistent disks", func() ([]Leftover, error) { return disks(ctx, s, c.Disks) }, c.Disks != nil},
		{"Secret Manager secrets", func() ([]Leftover, error) { return secrets(ctx, s, c.Secrets) }, c.Secrets != nil},
		{"Cloud Scheduler jobs", func() ([]Leftover, error) { return schedulerJobs(ctx, s, c.Scheduler) }, c.Scheduler != nil},
	} {
		if !k.ok {
			errs = append(errs, fmt.Errorf("%w %s: no client", ErrList, k.kind))
			continue
		}
		l, err := k.list()
		if _, off := bootstrap.ServiceDisabled(err); off && len(l) == 0 {
			// The API is off in the project (labenv never disables one:
			// the lab's APIs keep disable_on_destroy = false), so none of
			// its resources can exist: a fresh project, or one whose
			// deploy stopped before Terraform enabled it.
			continue
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("%w %s: %w", ErrList, k.kind, err))
		}
		out = append(out, l...)
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].Kind != out[j].Kind {
			return out[i].Kind < out[j].Kind
		}
		return out[i].Name < out[j].Name
	})
	return out, errors.Join(errs...)
}

// Check is the zero-billable check: nil when every kind was listed and
// nothing of the lab remains; else an error wrapping ErrLeftovers that
// names each leftover, or the listing error.
func Check(ctx context.Context, s Scope, c Clients) error {
	left, err := Find(ctx, s, c)
	if len(left) > 0 {
		names := make([]string, len(left))
		for i, l := range left {
			names[i] = l.String()
		}
		return errors.Join(fmt.Errorf("%w (%d): %s", ErrLeftovers, len(left), strings.Join(names, "; ")), err)
	}
	return err
}

func runServices(ctx context.Context, s Scope, c *run.ServicesClient) ([]Leftover, error) {
	var out []Leftover
	err := each(c.ListServices(ctx, &runpb.ListServicesRequest{Parent: "projects/" + s.Project + "/locations/" + s.Region}), func(svc *runpb.Service) {
		if s.ours(svc.GetLabels()) {
			out = append(out, Leftover{"Cloud Run service", svc.GetName()})
		}
	})
	return out, err
}

// each calls f with every item of a Google API iterator, in order, and
// returns nil at its end or the first error of its Next.
func each[T any](it interface{ Next() (T, error) }, f func(T)) error {
	for {
		v, err := it.Next()
		if errors.Is(err, iterator.Done) {
			return nil
		}
		if err != nil {
			return err
		}
		f(v)
	}
}

func sqlInstances(ctx context.Context, s Scope, c *sqladmin.Service) ([]Leftover, error) {
	var out []Leftover
	err := c.Instances.List(s.Project).Pages(ctx, func(page *sqladmin.InstancesListResponse) error {
		for _, inst := range page.Items {
			var l map[string]string
			if inst.Settings != nil {
				l = inst.Settings.UserLabels
			}
			if s.ours(l) {
				out = append(out, Leftover{"Cloud SQL instance", "projects/" + inst.Project + "/instances/" + inst.Name})
			}
		}
		return nil
	})
	return out, err
}

func gkeClusters(ctx context.Context, s Scope, c *container.ClusterManagerClient) ([]Leftover, error) {
	resp, err := c.ListClusters(ctx, &containerpb.ListClustersRequest{Parent: "projects/" + s.Project + "/locations/-"})
	if err != nil {
		return nil, err
	}
	var out []Leftover
	for _, cl := range resp.GetClusters() {
		if s.ours(cl.GetResourceLabels()) {
			out = append(out, Leftover{"GKE cluster", "projects/" + s.Project + "/locations/" + cl.GetLocation() + "/clusters/" + cl.GetName()})
		}
	}
	if len(resp.GetMissingZones()) > 0 {
		return out, fmt.Errorf("zones not listed: %v", resp.GetMissingZones())
	}
	return out, nil
}

func pubsubResources(ctx context.Context, s Scope, c *pubsub.Client) ([]Leftover, error) {
	var out []Leftover
	err := each(c.TopicAdminClient.ListTopics(ctx, &pubsubpb.ListTopicsRequest{Project: "projects/" + s.Project}), func(t *pubsubpb.Topic) {
		if s.ours(t.GetLabels()) {
			out = append(out, Leftover{"Pub/Sub topic", t.GetName()})
		}
	})
	if err != nil {
		return out, err
	}
	err = each(c.SubscriptionAdminClient.ListSubscriptions(ctx, &pubsubpb.ListSubscriptionsRequest{Project: "projects/" + s.Project}), func(sub *pubsubpb.Subscription) {
		if s.ours(sub.GetLabels()) {
			out = append(out, Leftover{"Pub/Sub subscription", sub.GetName()})
		}
	})
	return out, err
}

func repositories(ctx context.Context, s Scope, c *artifactregistry.Client) ([]Leftover, error) {
	var out []Leftover
	err := each(c.ListRepositories(ctx, &artifactregistrypb.ListRepositoriesRequest{Parent: "projects/" + s.Project + "/locations/" + s.Region}), func(r *artifactregistrypb.Repository) {
		if s.ours(r.GetLabels()) || strings.HasSuffix(r.GetName(), "/repositories/"+SourceDeployRepository) {
			out = append(out, Leftover{"Artifact Registry repository", r.GetName()})
		}
	})
	return out, err
}

func disks(ctx context.Context, s Scope, c *compute.DisksClient) ([]Leftover, error) {
	var out []Leftover
	err := each(c.AggregatedList(ctx, &computepb.AggregatedListDisksRequest{Project: s.Project}), func(pair compute.DisksScopedListPair) {
		for _, d := range pair.Value.GetDisks() {
			if s.ours(d.GetLabels()) || madeByGKE(d.GetLabels()) {
				out = append(out, Leftover{"persistent disk", pair.Key + "/disks/" + d.GetName()})
			}
		}
	})
	return out, err
}

func secrets(ctx context.Context, s Scope, c *secretmanager.Client) ([]Leftover, error) {
	var out []Leftover
	err := each(c.ListSecrets(ctx, &secretmanagerpb.ListSecretsRequest{Parent: "projects/" + s.Project}), func(sec *secretmanagerpb.Secret) {
		if s.ours(sec.GetLabels()) {
			out = append(out, Leftover{"Secret Manager secret", sec.GetName()})
		}
	})
	return out, err
}

func schedulerJobs(ctx context.Context, s Scope, c *scheduler.CloudSchedulerClient) ([]Leftover, error) {
	prefix := s.jobPrefix()
	if prefix == "" {
		return nil, errors.New("no name prefix and no lab label: Cloud Scheduler jobs carry no labels, so none could be told apart")
	}
	var out []Leftover
	err := each(c.ListJobs(ctx, &schedulerpb.ListJobsRequest{Parent: "projects/" + s.Project + "/locations/" + s.Region}), func(j *schedulerpb.Job) {
		if strings.HasPrefix(j.GetName()[strings.LastIndex(j.GetName(), "/")+1:], prefix) {
			out = append(out, Leftover{"Cloud Scheduler job", j.GetName()})
		}
	})
	return out, err
}

func madeByGKE(l map[string]string) bool {
	for k := range l {
		if strings.HasPrefix(k, "goog-k8s-") || strings.HasPrefix(k, "goog-gke-") {
			return true
		}
	}
	return false
}

// ServiceStatus is one deployed Cloud Run service as the harness needs it.
type ServiceStatus struct {
	// Name is the short service name ("executor").
	Name string
	// URI is its https URL.
	URI string
	// Ready is true when its latest revision serves (terminal condition
	// succeeded) and that revision is the latest created.
	Ready bool
}

// Services returns the lab's Cloud Run services in s.Region, by short name.
func Services(ctx context.Context, s Scope, c *run.ServicesClient) (map[string]ServiceStatus, error) {
	if err := s.Validate(); err != nil {
		return nil, err
	}
	out := map[string]ServiceStatus{}
	err := each(c.ListServices(ctx, &runpb.ListServicesRequest{Parent: "projects/" + s.Project + "/locations/" + s.Region}), func(svc *runpb.Service) {
		if !s.ours(svc.GetLabels()) {
			return
		}
		short := svc.GetName()[strings.LastIndex(svc.GetName(), "/")+1:]
		ready := svc.GetTerminalCondition().GetState() == runpb.Condition_CONDITION_SUCCEEDED &&
			svc.GetLatestReadyRevision() != "" && svc.GetLatestReadyRevision() == svc.GetLatestCreatedRevision()
		out[short] = ServiceStatus{Name: short, URI: svc.GetUri(), Ready: ready}
	})
	if err != nil {
		return out, fmt.Errorf("%w Cloud Run services: %w", ErrList, err)
	}
	return out, nil
}
