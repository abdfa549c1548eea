package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"cloud.google.com/go/artifactregistry/apiv1/artifactregistrypb"
	"cloud.google.com/go/container/apiv1/containerpb"
	"cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"
	"cloud.google.com/go/run/apiv2/runpb"
	"cloud.google.com/go/scheduler/apiv1/schedulerpb"
	"cloud.google.com/go/secretmanager/apiv1/secretmanagerpb"
	"google.golang.org/api/option"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
)

// fakeCloud is a Google Cloud project as a first run meets it, behind
// fakes of every API labenv calls (gRPC servers from the generated
// interfaces, REST through httptest) and of the calls Terraform's
// providers would make (the fixture module's curl, under /fake/). Only
// Service Usage is on at first; an API answers 403 SERVICE_DISABLED until
// it is enabled and for propagation after; a binding that names a service
// account younger than propagation is refused with 400 "does not exist".
// Time is a fake clock that only labenv's waits (sleep) advance.
type fakeCloud struct {
	project, billing string
	propagation      time.Duration

	mu        sync.Mutex
	now       time.Duration
	enabled   map[string]time.Duration // service -> when it was enabled
	accounts  map[string]time.Duration // email -> when it was created
	secrets   map[string]*fakeSecret   // secret id -> secret
	services  map[string]string        // Cloud Run "region/name" -> labels (JSON)
	instances map[string]string        // Cloud SQL name -> labels (JSON)
	refusals  []string                 // every SERVICE_DISABLED or "does not exist" answered
	badImage  bool                     // Cloud Run refuses every service (an error no retry fixes)
	slept     time.Duration
}

type fakeSecret struct {
	labels   map[string]string
	versions [][]byte
	disabled bool // the latest version is disabled
}

func newFakeCloud() *fakeCloud {
	return &fakeCloud{
		project: "lab-1", billing: "000000-000000-000000", propagation: 60 * time.Second,
		enabled:  map[string]time.Duration{"serviceusage.googleapis.com": -time.Hour},
		accounts: map[string]time.Duration{}, secrets: map[string]*fakeSecret{},
		services: map[string]string{}, instances: map[string]string{},
	}
}

// sleep is labenv's wait: it advances the clock at once.
func (f *fakeCloud) sleep(ctx context.Context, d time.Duration) error {
	f.mu.Lock()
	f.now += d
	f.slept += d
	f.mu.Unlock()
	return ctx.Err()
}

// enableAll makes the project an established one: every API on long ago.
func (f *fakeCloud) enableAll() {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, s := range []string{"cloudresourcemanager", "billingbudgets", "iam", "secretmanager", "run", "sqladmin", "container",
		"artifactregistry", "compute", "pubsub", "cloudscheduler"} {
		f.enabled[s+".googleapis.com"] = -time.Hour
	}
}

// off reports (with f.mu held) whether service answers SERVICE_DISABLED
// now, and records the refusal.
func (f *fakeCloud) off(service string) bool {
	at, ok := f.enabled[service]
	if ok && f.now >= at+f.propagation {
		return false
	}
	f.refusals = append(f.refusals, "SERVICE_DISABLED "+service)
	return true
}

func disabledStatus(service string) error {
	st, _ := status.New(codes.PermissionDenied, service+" has not been used in project before or it is disabled").
		WithDetails(&errdetails.ErrorInfo{Reason: "SERVICE_DISABLED", Domain: "googleapis.com", Metadata: map[string]string{"service": service}})
	return st.Err()
}

// grpcService is the API a gRPC method belongs to.
var grpcService = map[string]string{
	"google.cloud.secretmanager.v1.":       "secretmanager.googleapis.com",
	"google.cloud.run.v2.":                 "run.googleapis.com",
	"google.container.v1.":                 "container.googleapis.com",
	"google.devtools.artifactregistry.v1.": "artifactregistry.googleapis.com",
	"google.pubsub.v1.":                    "pubsub.googleapis.com",
	"google.cloud.scheduler.v1.":           "cloudscheduler.googleapis.com",
}

func (f *fakeCloud) enablement(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
	for prefix, svc := range grpcService {
		if strings.HasPrefix(info.FullMethod, "/"+prefix) {
			f.mu.Lock()
			off := f.off(svc)
			f.mu.Unlock()
			if off {
				return nil, disabledStatus(svc)
			}
		}
	}
	return h(ctx, req)
}

type fakeSecretManager struct {
	secretmanagerpb.UnimplementedSecretManagerServiceServer
	f *fakeCloud
}

func (s fakeSecretManager) ListSecrets(_ context.Context, req *secretmanagerpb.ListSecretsRequest) (*secretmanagerpb.ListSecretsResponse, error) {
	s.f.mu.Lock()
	defer s.f.mu.Unlock()
	out := &secretmanagerpb.ListSecretsResponse{}
	for id, sec := range s.f.secrets {
		out.Secrets = append(out.Secrets, &secretmanagerpb.Secret{Name: req.Parent + "/secrets/" + id, Labels: sec.labels})
	}
	return out, nil
}

func (s fakeSecretManager) secret(name string) (*fakeSecret, string, error) {
	parts := strings.Split(name, "/")
	if len(parts) < 4 || parts[1] != s.f.project {
		return nil, "", status.Error(codes.InvalidArgument, "bad name "+name)
	}
	sec, ok := s.f.secrets[parts[3]]
	if !ok {
		return nil, "", status.Errorf(codes.NotFound, "Secret [%s] not found", name)
	}
	return sec, parts[3], nil
}

func (s fakeSecretManager) AccessSecretVersion(_ context.Context, req *secretmanagerpb.AccessSecretVersionRequest) (*secretmanagerpb.AccessSecretVersionResponse, error) {
	s.f.mu.Lock()
	defer s.f.mu.Unlock()
	sec, _, err := s.secret(req.Name)
	switch {
	case err != nil:
		return nil, err
	case len(sec.versions) == 0:
		return nil, status.Errorf(codes.NotFound, "Secret Version [%s] not found", req.Name)
	case sec.disabled:
		return nil, status.Errorf(codes.FailedPrecondition, "Secret Version [%s] is in DISABLED state", req.Name)
	}
	return &secretmanagerpb.AccessSecretVersionResponse{Payload: &secretmanagerpb.SecretPayload{Data: sec.versions[len(sec.versions)-1]}}, nil
}

func (s fakeSecretManager) AddSecretVersion(_ context.Context, req *secretmanagerpb.AddSecretVersionRequest) (*secretmanagerpb.SecretVersion, error) {
	s.f.mu.Lock()
	defer s.f.mu.Unlock()
	sec, _, err := s.secret(req.Parent)
	if err != nil {
		return nil, err
	}
	sec.versions = append(sec.versions, req.Payload.Data)
	return &secretmanagerpb.SecretVersion{Name: fmt.Sprintf("%s/versions/%d", req.Parent, len(sec.versions))}, nil
}

type fakeRun struct {
	runpb.UnimplementedServicesServer
	f *fakeCloud
}

func (s fakeRun) ListServices(_ context.Context, req *runpb.ListServicesRequest) (*runpb.ListServicesResponse, error) {
	s.f.mu.Lock()
	defer s.f.mu.Unlock()
	out := &runpb.ListServicesResponse{}
	for key, labels := range s.f.services {
		region, name, _ := strings.Cut(key, "/")
		if req.Parent == "projects/"+s.f.project+"/locations/"+region {
			var l map[string]string
			_ = json.Unmarshal([]byte(labels), &l)
			out.Services = append(out.Services, &runpb.Service{Name: req.Parent + "/services/" + name, Labels: l})
		}
	}
	return out, nil
}

// The kinds the fixture never creates: the zero-billable check still
// lists each, through its own API.
type (
	fakeGKE struct {
		containerpb.UnimplementedClusterManagerServer
	}
	fakeRegistry struct {
		artifactregistrypb.UnimplementedArtifactRegistryServer
	}
	fakePublisher struct {
		pubsubpb.UnimplementedPublisherServer
	}
	fakeSubscriber struct {
		pubsubpb.UnimplementedSubscriberServer
	}
	fakeScheduler struct {
		schedulerpb.UnimplementedCloudSchedulerServer
	}
)

func (fakeGKE) ListClusters(context.Context, *containerpb.ListClustersRequest) (*containerpb.ListClustersResponse, error) {
	return &containerpb.ListClustersResponse{}, nil
}

func (fakeRegistry) ListRepositories(context.Context, *artifactregistrypb.ListRepositoriesRequest) (*artifactregistrypb.ListRepositoriesResponse, error) {
	return &artifactregistrypb.ListRepositoriesResponse{}, nil
}

func (fakePublisher) ListTopics(context.Context, *pubsubpb.ListTopicsRequest) (*pubsubpb.ListTopicsResponse, error) {
	return &pubsubpb.ListTopicsResponse{}, nil
}

func (fakeSubscriber) ListSubscriptions(context.Context, *pubsubpb.ListSubscriptionsRequest) (*pubsubpb.ListSubscriptionsResponse, error) {
	return &pubsubpb.ListSubscriptionsResponse{}, nil
}

func (fakeScheduler) ListJobs(context.Context, *schedulerpb.ListJobsRequest) (*schedulerpb.ListJobsResponse, error) {
	return &schedulerpb.ListJobsResponse{}, nil
}

// restService is the API a REST path belongs to (checked in order).
func (f *fakeCloud) restService(path string) string {
	p := "/v1/projects/" + f.project
	switch {
	case strings.HasPrefix(path, p+"/services/"), strings.HasPrefix(path, "/v1/operations/"), strings.HasPrefix(path, "/fake/enable"):
		return "serviceusage.googleapis.com"
	case strings.HasPrefix(path, "/v3/projects/"):
		return "cloudresourcemanager.googleapis.com"
	case strings.HasPrefix(path, "/v1/billingAccounts/"), strings.HasPrefix(path, "/fake/budget"):
		return "billingbudgets.googleapis.com"
	case strings.HasPrefix(path, p+"/serviceAccounts"), strings.HasPrefix(path, "/fake/serviceaccounts"), strings.HasPrefix(path, "/fake/bind"):
		return "iam.googleapis.com"
	case strings.HasPrefix(path, p+"/instances"), strings.HasPrefix(path, "/fake/sql/"):
		return "sqladmin.googleapis.com"
	case strings.HasPrefix(path, "/compute/v1/"):
		return "compute.googleapis.com"
	case strings.HasPrefix(path, "/fake/secrets/"):
		return "secretmanager.googleapis.com"
	case strings.HasPrefix(path, "/fake/run/"):
		return "run.googleapis.com"
	}
	return ""
}

// restError writes Google's JSON error, in the words the google provider
// prints it ("Error 403: ...") for the fixture's curl to pass on.
func restError(w http.ResponseWriter, code int, reason, msg string, meta map[string]string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(map[string]any{"error": map[string]any{
		"code": code, "message": fmt.Sprintf("Error %d: %s, %s", code, msg, reason),
		"details": []map[string]any{{"@type": "type.googleapis.com/google.rpc.ErrorInfo", "reason": reason, "domain": "googleapis.com", "metadata": meta}},
	}})
}

func (f *fakeCloud) rest(w http.ResponseWriter, r *http.Request) {
	f.mu.Lock()
	defer f.mu.Unlock()
	path := r.URL.Path
	svc := f.restService(path)
	if svc == "" {
		http.NotFound(w, r)
		return
	}
	if f.off(svc) {
		restError(w, http.StatusForbidden, "SERVICE_DISABLED", svc+" has not been used in project "+f.project+" before or it is disabled", map[string]string{"service": svc})
		return
	}
	body, _ := io.ReadAll(r.Body)
	ok := func(v any) {
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(v)
	}
	rest := path[strings.LastIndex(path, "/")+1:]
	switch {
	// Service Usage.
	case strings.HasSuffix(path, ":enable"):
		f.enabled[strings.TrimSuffix(rest, ":enable")] = f.now
		ok(map[string]any{"name": "operations/enable", "done": true})
	case strings.HasPrefix(path, "/v1/projects/"+f.project+"/services/"):
		state := "DISABLED"
		if _, on := f.enabled[rest]; on {
			state = "ENABLED"
		}
		ok(map[string]any{"name": path[4:], "state": state})
	// The probes.
	case strings.HasPrefix(path, "/v3/projects/"):
		ok(map[string]any{"name": "projects/123", "projectId": f.project})
	case path == "/v1/billingAccounts/"+f.billing+"/budgets":
		ok(map[string]any{})
	case strings.HasSuffix(path, "/serviceAccounts"):
		ok(map[string]any{})
	// The zero-billable check.
	case path == "/v1/projects/"+f.project+"/instances":
		var items []map[string]any
		for name, labels := range f.instances {
			var l map[string]string
			_ = json.Unmarshal([]byte(labels), &l)
			items = append(items, map[string]any{"name": name, "project": f.project, "settings": map[string]any{"userLabels": l}})
		}
		ok(map[string]any{"items": items})
	case path == "/compute/v1/projects/"+f.project+"/aggregated/disks":
		ok(map[string]any{"items": map[string]any{}})
	// What the providers would do, called by the fixture.
	case path == "/fake/enable":
		for _, s := range strings.Split(r.URL.Query().Get("services"), ",") {
			if _, on := f.enabled[s]; !on {
				f.enabled[s] = f.now
			}
		}
	case path == "/fake/budget":
	case path == "/fake/serviceaccounts":
		for _, e := range strings.Split(r.URL.Query().Get("emails"), ",") {
			if _, ok := f.accounts[e]; !ok {
				f.accounts[e] = f.now
			}
		}
	case path == "/fake/bind":
		member := r.URL.Query().Get("member")
		if at, ok := f.accounts[member]; !ok || f.now < at+f.propagation {
			f.refusals = append(f.refusals, "does not exist "+member)
			restError(w, http.StatusBadRequest, "badRequest", "Service account "+member+" does not exist.", nil)
		}
	case strings.HasPrefix(path, "/fake/secrets/"):
		id := rest
		if r.Method == http.MethodDelete {
			delete(f.secrets, id)
			return
		}
		var l map[string]string
		_ = json.Unmarshal(body, &l)
		f.secrets[id] = &fakeSecret{labels: l}
	case strings.HasPrefix(path, "/fake/run/"):
		key := strings.TrimPrefix(path, "/fake/run/")
		if r.Method == http.MethodDelete {
			delete(f.services, key)
			return
		}
		if f.badImage {
			restError(w, http.StatusBadRequest, "badRequest", "Image 'europe-west1-docker.pkg.dev/x' not found.", nil)
			return
		}
		f.services[key] = string(body)
	case strings.HasPrefix(path, "/fake/sql/"):
		if r.Method == http.MethodDelete {
			delete(f.instances, rest)
			return
		}
		f.instances[rest] = string(body)
	default:
		http.NotFound(w, r)
	}
}

// serve starts the fakes, points the fixture's curl at them ($FAKE_CLOUD)
// and returns the client options that reach them.
func (f *fakeCloud) serve(t *testing.T) *clientOptions {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := grpc.NewServer(grpc.UnaryInterceptor(f.enablement))
	secretmanagerpb.RegisterSecretManagerServiceServer(s, fakeSecretManager{f: f})
	runpb.RegisterServicesServer(s, fakeRun{f: f})
	containerpb.RegisterClusterManagerServer(s, fakeGKE{})
	artifactregistrypb.RegisterArtifactRegistryServer(s, fakeRegistry{})
	pubsubpb.RegisterPublisherServer(s, fakePublisher{})
	pubsubpb.RegisterSubscriberServer(s, fakeSubscriber{})
	schedulerpb.RegisterCloudSchedulerServer(s, fakeScheduler{})
	go func() { _ = s.Serve(lis) }() // ends with Stop below
	t.Cleanup(s.Stop)
	rest := httptest.NewServer(http.HandlerFunc(f.rest))
	t.Cleanup(rest.Close)
	t.Setenv("FAKE_CLOUD", rest.URL)
	restOpts := func(endpoint string) []option.ClientOption {
		return []option.ClientOption{option.WithEndpoint(endpoint), option.WithoutAuthentication(), option.WithHTTPClient(rest.Client())}
	}
	return &clientOptions{
		GRPC: []option.ClientOption{option.WithEndpoint(lis.Addr().String()), option.WithoutAuthentication(),
			option.WithGRPCDialOption(grpc.WithTransportCredentials(insecure.NewCredentials()))},
		REST:    restOpts(rest.URL + "/"),
		Compute: restOpts(rest.URL),
	}
}

// fakeCommands puts gcloud and kubectl stand-ins first on PATH; each
// appends its arguments to the returned file and succeeds.
func fakeCommands(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	calls := filepath.Join(dir, "calls")
	for _, name := range []string{"gcloud", "kubectl"} {
		script := "#!/bin/sh\necho \"" + name + " $*\" >> '" + calls + "'\ncase \"$*\" in *'-f -'*) cat >/dev/null ;; esac\n"
		if err := os.WriteFile(filepath.Join(dir, name), []byte(script), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	t.Setenv("PATH", dir+string(os.PathListSeparator)+os.Getenv("PATH"))
	return calls
}

// refused returns the refusals answered so far.
func (f *fakeCloud) refused() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.refusals)
}
