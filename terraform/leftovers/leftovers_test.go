package leftovers_test

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"cloud.google.com/go/artifactregistry/apiv1/artifactregistrypb"
	compute "cloud.google.com/go/compute/apiv1"
	"cloud.google.com/go/container/apiv1/containerpb"
	"cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"
	"cloud.google.com/go/pubsub/v2/pstest"
	"cloud.google.com/go/run/apiv2/runpb"
	"cloud.google.com/go/scheduler/apiv1/schedulerpb"
	"cloud.google.com/go/secretmanager/apiv1/secretmanagerpb"
	"google.golang.org/api/option"
	sqladmin "google.golang.org/api/sqladmin/v1"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/distributed-lock-lab/distributed-lock-lab/terraform/leftovers"
)

const project = "lab-1"

var (
	labLabels = map[string]string{"app": "distributed-lock-lab", "lab": "dlock"}
	scope     = leftovers.Scope{Project: project, Region: "europe-west1", Labels: labLabels}
	other     = map[string]string{"app": "something-else"}
)

// fakeCloud is what the fake APIs list. Zero value: an empty project.
type fakeCloud struct {
	mu       sync.Mutex
	services []*runpb.Service
	clusters []*containerpb.Cluster
	repos    []*artifactregistrypb.Repository
	disks    map[string][]map[string]any // zone key -> disks (REST JSON)
	sql      []map[string]any            // REST JSON instances
	sqlFails bool
	sqlOff   bool // the Cloud SQL Admin API answers 403 SERVICE_DISABLED
	secrets  []*secretmanagerpb.Secret
	jobs     []*schedulerpb.Job
}

type fakeSecrets struct {
	secretmanagerpb.UnimplementedSecretManagerServiceServer
	f *fakeCloud
}

func (s fakeSecrets) ListSecrets(_ context.Context, req *secretmanagerpb.ListSecretsRequest) (*secretmanagerpb.ListSecretsResponse, error) {
	s.f.mu.Lock()
	defer s.f.mu.Unlock()
	var out []*secretmanagerpb.Secret
	for _, sec := range s.f.secrets {
		if strings.HasPrefix(sec.Name, req.Parent+"/") {
			out = append(out, sec)
		}
	}
	return &secretmanagerpb.ListSecretsResponse{Secrets: out}, nil
}

type fakeScheduler struct {
	schedulerpb.UnimplementedCloudSchedulerServer
	f *fakeCloud
}

func (s fakeScheduler) ListJobs(_ context.Context, req *schedulerpb.ListJobsRequest) (*schedulerpb.ListJobsResponse, error) {
	s.f.mu.Lock()
	defer s.f.mu.Unlock()
	var out []*schedulerpb.Job
	for _, j := range s.f.jobs {
		if strings.HasPrefix(j.Name, req.Parent+"/") {
			out = append(out, j)
		}
	}
	return &schedulerpb.ListJobsResponse{Jobs: out}, nil
}

type fakeRun struct {
	runpb.UnimplementedServicesServer
	f *fakeCloud
}

func (s fakeRun) ListServices(_ context.Context, req *runpb.ListServicesRequest) (*runpb.ListServicesResponse, error) {
	s.f.mu.Lock()
	defer s.f.mu.Unlock()
	var out []*runpb.Service
	for _, svc := range s.f.services {
		if strings.HasPrefix(svc.Name, req.Parent+"/") {
			out = append(out, svc)
		}
	}
	return &runpb.ListServicesResponse{Services: out}, nil
}

type fakeGKE struct {
	containerpb.UnimplementedClusterManagerServer
	f *fakeCloud
}

func (s fakeGKE) ListClusters(context.Context, *containerpb.ListClustersRequest) (*containerpb.ListClustersResponse, error) {
	s.f.mu.Lock()
	defer s.f.mu.Unlock()
	return &containerpb.ListClustersResponse{Clusters: s.f.clusters}, nil
}

type fakeRegistry struct {
	artifactregistrypb.UnimplementedArtifactRegistryServer
	f *fakeCloud
}

func (s fakeRegistry) ListRepositories(_ context.Context, req *artifactregistrypb.ListRepositoriesRequest) (*artifactregistrypb.ListRepositoriesResponse, error) {
	s.f.mu.Lock()
	defer s.f.mu.Unlock()
	var out []*artifactregistrypb.Repository
	for _, r := range s.f.repos {
		if strings.HasPrefix(r.Name, req.Parent+"/") {
			out = append(out, r)
		}
	}
	return &artifactregistrypb.ListRepositoriesResponse{Repositories: out}, nil
}

// rest serves the two REST APIs: Compute disks (aggregated list) and the
// Cloud SQL Admin instances list.
func (f *fakeCloud) rest(w http.ResponseWriter, r *http.Request) {
	f.mu.Lock()
	defer f.mu.Unlock()
	w.Header().Set("Content-Type", "application/json")
	switch r.URL.Path {
	case "/compute/v1/projects/" + project + "/aggregated/disks":
		items := map[string]any{}
		for zone, ds := range f.disks {
			items[zone] = map[string]any{"disks": ds}
		}
		_ = json.NewEncoder(w).Encode(map[string]any{"items": items})
	case "/v1/projects/" + project + "/instances":
		if f.sqlFails {
			http.Error(w, `{"error":{"code":500,"message":"backend error"}}`, http.StatusInternalServerError)
			return
		}
		if f.sqlOff {
			w.WriteHeader(http.StatusForbidden)
			_, _ = w.Write([]byte(`{"error":{"code":403,"message":"Cloud SQL Admin API has not been used in project lab-1 before or it is disabled","status":"PERMISSION_DENIED",` +
				`"details":[{"@type":"type.googleapis.com/google.rpc.ErrorInfo","reason":"SERVICE_DISABLED","domain":"googleapis.com","metadata":{"service":"sqladmin.googleapis.com"}}]}}`))
			return
		}
		_ = json.NewEncoder(w).Encode(map[string]any{"items": f.sql})
	default:
		http.NotFound(w, r)
	}
}

// start serves the fakes (one gRPC server for Cloud Run, GKE, Artifact
// Registry and pstest's Pub/Sub; one HTTP server for the REST APIs) and
// returns clients connected to them.
func start(t *testing.T, f *fakeCloud) leftovers.Clients {
	t.Helper()
	ps := pstest.NewServerWithCallback(0, func(s *grpc.Server) {
		runpb.RegisterServicesServer(s, fakeRun{f: f})
		containerpb.RegisterClusterManagerServer(s, fakeGKE{f: f})
		artifactregistrypb.RegisterArtifactRegistryServer(s, fakeRegistry{f: f})
		secretmanagerpb.RegisterSecretManagerServiceServer(s, fakeSecrets{f: f})
		schedulerpb.RegisterCloudSchedulerServer(s, fakeScheduler{f: f})
	})
	t.Cleanup(func() { _ = ps.Close() })
	rest := httptest.NewServer(http.HandlerFunc(f.rest))
	t.Cleanup(rest.Close)

	ctx := context.Background()
	grpcClients, closeGRPC, err := leftovers.NewClients(ctx, project,
		option.WithEndpoint(ps.Addr), option.WithoutAuthentication(),
		option.WithGRPCDialOption(grpc.WithTransportCredentials(insecure.NewCredentials())))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(closeGRPC)
	restOpts := func(endpoint string) []option.ClientOption {
		return []option.ClientOption{option.WithEndpoint(endpoint), option.WithoutAuthentication(), option.WithHTTPClient(rest.Client())}
	}
	// The Compute client appends /compute/v1/...; the SQL Admin client
	// resolves v1/... against a base path that ends with a slash.
	disks, err := compute.NewDisksRESTClient(ctx, restOpts(rest.URL)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = disks.Close() })
	sql, err := sqladmin.NewService(ctx, restOpts(rest.URL+"/")...)
	if err != nil {
		t.Fatal(err)
	}
	grpcClients.Disks, grpcClients.SQL = disks, sql
	return grpcClients
}

func TestEmptyProjectPasses(t *testing.T) {
	c := start(t, &fakeCloud{})
	if err := leftovers.Check(context.Background(), scope, c); err != nil {
		t.Errorf("Check on an empty project = %v, want nil", err)
	}
}

func TestEveryLeftoverIsNamedAndOthersAreNot(t *testing.T) {
	loc := "projects/" + project + "/locations/europe-west1"
	f := &fakeCloud{
		services: []*runpb.Service{
			{Name: loc + "/services/executor", Labels: labLabels},
			{Name: loc + "/services/unrelated", Labels: other},
		},
		clusters: []*containerpb.Cluster{
			{Name: "dlock-gke", Location: "europe-west1", ResourceLabels: labLabels},
			{Name: "theirs", Location: "europe-west1", ResourceLabels: other},
		},
		repos: []*artifactregistrypb.Repository{
			{Name: loc + "/repositories/dlock-images", Labels: labLabels},
			{Name: loc + "/repositories/" + leftovers.SourceDeployRepository},
			{Name: loc + "/repositories/theirs", Labels: other},
		},
		disks: map[string][]map[string]any{
			"zones/europe-west1-b": {
				{"name": "pvc-1234", "labels": map[string]string{"goog-k8s-cluster-name": "dlock-gke"}},
				{"name": "theirs", "labels": other},
			},
		},
		sql: []map[string]any{
			{"name": "dlock-lock-a1b2c3", "project": project, "settings": map[string]any{"userLabels": labLabels}},
			{"name": "theirs", "project": project, "settings": map[string]any{"userLabels": other}},
		},
		secrets: []*secretmanagerpb.Secret{
			{Name: "projects/" + project + "/secrets/dlock-lock-proof-signing-key", Labels: labLabels},
			{Name: "projects/" + project + "/secrets/theirs", Labels: other},
		},
		jobs: []*schedulerpb.Job{
			{Name: loc + "/jobs/dlock-reconcile"},
			{Name: loc + "/jobs/theirs-nightly"},
		},
	}
	c := start(t, f)
	ctx := context.Background()
	if _, err := c.PubSub.TopicAdminClient.CreateTopic(ctx, &pubsubpb.Topic{Name: "projects/" + project + "/topics/dlock-payouts", Labels: labLabels}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.PubSub.TopicAdminClient.CreateTopic(ctx, &pubsubpb.Topic{Name: "projects/" + project + "/topics/theirs", Labels: other}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.PubSub.SubscriptionAdminClient.CreateSubscription(ctx, &pubsubpb.Subscription{
		Name: "projects/" + project + "/subscriptions/dlock-payouts-executor", Topic: "projects/" + project + "/topics/dlock-payouts", Labels: labLabels,
	}); err != nil {
		t.Fatal(err)
	}

	err := leftovers.Check(ctx, scope, c)
	if !errors.Is(err, leftovers.ErrLeftovers) || errors.Is(err, leftovers.ErrList) {
		t.Fatalf("Check = %v, want ErrLeftovers and no listing error", err)
	}
	msg := err.Error()
	for _, want := range []string{
		"Cloud Run service " + loc + "/services/executor",
		"GKE cluster projects/" + project + "/locations/europe-west1/clusters/dlock-gke",
		"Artifact Registry repository " + loc + "/repositories/dlock-images",
		"Artifact Registry repository " + loc + "/repositories/cloud-run-source-deploy",
		"persistent disk zones/europe-west1-b/disks/pvc-1234",
		"Cloud SQL instance projects/" + project + "/instances/dlock-lock-a1b2c3",
		"Pub/Sub topic projects/" + project + "/topics/dlock-payouts",
		"Pub/Sub subscription projects/" + project + "/subscriptions/dlock-payouts-executor",
		"Secret Manager secret projects/" + project + "/secrets/dlock-lock-proof-signing-key",
		"Cloud Scheduler job " + loc + "/jobs/dlock-reconcile",
		"(10)",
	} {
		if !strings.Contains(msg, want) {
			t.Errorf("Check's error does not name %q:\n%s", want, msg)
		}
	}
	if strings.Contains(msg, "theirs") || strings.Contains(msg, "unrelated") {
		t.Errorf("Check names resources without the lab's labels:\n%s", msg)
	}
}

func TestAListingFailureIsNeverAPass(t *testing.T) {
	c := start(t, &fakeCloud{sqlFails: true})
	err := leftovers.Check(context.Background(), scope, c)
	if !errors.Is(err, leftovers.ErrList) || !strings.Contains(err.Error(), "Cloud SQL instances") {
		t.Errorf("Check with Cloud SQL failing = %v, want ErrList naming Cloud SQL", err)
	}
	c.GKE = nil
	if err := leftovers.Check(context.Background(), scope, c); !strings.Contains(err.Error(), "GKE clusters: no client") {
		t.Errorf("Check without a GKE client = %v, want it named", err)
	}
	c = start(t, &fakeCloud{})
	if err := leftovers.Check(context.Background(), leftovers.Scope{Project: project, Region: "europe-west1", Labels: other}, c); !errors.Is(err, leftovers.ErrList) ||
		!strings.Contains(err.Error(), "Cloud Scheduler jobs: no name prefix") {
		t.Errorf("Check without a name prefix or lab label = %v, want ErrList naming Cloud Scheduler jobs", err)
	}
	if err := leftovers.Check(context.Background(), leftovers.Scope{Project: project, Region: "europe-west1"}, c); !errors.Is(err, leftovers.ErrInvalidScope) {
		t.Errorf("Check without labels = %v, want ErrInvalidScope", err)
	}
}

// TestADisabledAPIHasNothing: a kind whose API is off (403
// SERVICE_DISABLED, as on a fresh project) has no leftover, where any other
// refusal fails the check.
func TestADisabledAPIHasNothing(t *testing.T) {
	c := start(t, &fakeCloud{sqlOff: true})
	if err := leftovers.Check(context.Background(), scope, c); err != nil {
		t.Errorf("Check with the Cloud SQL Admin API off = %v, want nil", err)
	}
}

func TestServicesReportURLsAndReadiness(t *testing.T) {
	loc := "projects/" + project + "/locations/europe-west1"
	ok := &runpb.Condition{State: runpb.Condition_CONDITION_SUCCEEDED}
	f := &fakeCloud{services: []*runpb.Service{
		{Name: loc + "/services/executor", Labels: labLabels, Uri: "https://executor-x.a.run.app", TerminalCondition: ok,
			LatestReadyRevision: "executor-00002", LatestCreatedRevision: "executor-00002"},
		{Name: loc + "/services/rail-proxy", Labels: labLabels, Uri: "https://rail-proxy-x.a.run.app", TerminalCondition: ok,
			LatestReadyRevision: "rail-proxy-00001", LatestCreatedRevision: "rail-proxy-00002"},
		{Name: loc + "/services/unrelated", Labels: other, Uri: "https://unrelated"},
	}}
	c := start(t, f)
	got, err := leftovers.Services(context.Background(), scope, c.Run)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 2 {
		t.Fatalf("Services = %v, want executor and rail-proxy", got)
	}
	if e := got["executor"]; e.URI != "https://executor-x.a.run.app" || !e.Ready {
		t.Errorf("executor = %+v, want its URL and ready", e)
	}
	if r := got["rail-proxy"]; r.Ready {
		t.Errorf("rail-proxy = %+v: its latest revision is not the ready one, want not ready", r)
	}
}
