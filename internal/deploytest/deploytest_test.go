package deploytest_test

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/distributed-lock-lab/distributed-lock-lab/internal/deploytest"
	"github.com/distributed-lock-lab/distributed-lock-lab/lockserver/api"
	"github.com/distributed-lock-lab/distributed-lock-lab/ops/slo"
)

const repo = "../.."

var (
	etcdManifest       = filepath.Join(repo, "etcd", "deploy", "etcd.yaml")
	namespaceManifest  = filepath.Join(repo, "lockserver", "deploy", "namespace.yaml")
	lockServerManifest = filepath.Join(repo, "lockserver", "deploy", "lock-server.yaml")
	lockServerPaths    = deploytest.LockServerPaths{Health: api.PathHealth, Ready: api.PathReady}
)

func decode(t *testing.T, paths ...string) *deploytest.Manifests {
	t.Helper()
	m, err := deploytest.DecodeFiles(paths...)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

func TestManifestsDecodeStrictlyAndKeepEveryProperty(t *testing.T) {
	m := decode(t, namespaceManifest, etcdManifest, lockServerManifest)
	if got := len(m.Namespaces) + len(m.ServiceAccounts) + len(m.Services) + len(m.Deployments) + len(m.StatefulSets) + len(m.PDBs); got != 8 {
		t.Errorf("decoded %d objects, want 8", got)
	}
	for _, p := range deploytest.CheckEtcd(m) {
		t.Error(p)
	}
	for _, p := range deploytest.CheckLockServer(m, lockServerPaths) {
		t.Error(p)
	}
	// Everything lives in the one namespace the Terraform Workload
	// Identity binding names.
	if len(m.Namespaces) != 1 || m.Namespaces[0].Name != "dlock" {
		t.Fatalf("namespaces = %v, want dlock", m.Namespaces)
	}
	for _, s := range m.Services {
		if s.Namespace != "dlock" {
			t.Errorf("Service %s in namespace %q", s.Name, s.Namespace)
		}
	}
}

func TestStrictDecodingRefusesAMisspeltField(t *testing.T) {
	b, err := os.ReadFile(etcdManifest)
	if err != nil {
		t.Fatal(err)
	}
	broken := strings.Replace(string(b), "podManagementPolicy: Parallel", "podManagmentPolicy: Parallel", 1)
	if broken == string(b) {
		t.Fatal("the edit changed nothing")
	}
	p := filepath.Join(t.TempDir(), "etcd.yaml")
	if err := os.WriteFile(p, []byte(broken), 0o644); err != nil {
		t.Fatal(err)
	}
	_, err = deploytest.DecodeFiles(p)
	if !errors.Is(err, deploytest.ErrDecode) || !strings.Contains(err.Error(), "podManagmentPolicy") {
		t.Errorf("DecodeFiles(misspelt field) = %v, want ErrDecode naming the field", err)
	}
}

// Each case breaks one property of a decoded copy and expects the check
// to name it.
func TestEtcdChecksFailOnBrokenCopies(t *testing.T) {
	cases := []struct {
		name   string
		mutate func(m *deploytest.Manifests)
		want   string
	}{
		{"ordered pod management", func(m *deploytest.Manifests) {
			m.StatefulSets[0].Spec.PodManagementPolicy = appsv1.OrderedReadyPodManagement
		}, "podManagementPolicy is not Parallel"},
		{"a Service with a cluster IP", func(m *deploytest.Manifests) { m.Services[0].Spec.ClusterIP = "" }, "not headless"},
		{"not-ready addresses hidden", func(m *deploytest.Manifests) { m.Services[0].Spec.PublishNotReadyAddresses = false }, "does not publish not-ready addresses"},
		{"liveness on quorum health", func(m *deploytest.Manifests) {
			m.StatefulSets[0].Spec.Template.Spec.Containers[0].LivenessProbe.HTTPGet.Path = "/health"
		}, "liveness probe path is \"/health\""},
		{"no readiness probe", func(m *deploytest.Manifests) {
			m.StatefulSets[0].Spec.Template.Spec.Containers[0].ReadinessProbe = nil
		}, "readiness probe path"},
		{"no anti-affinity", func(m *deploytest.Manifests) { m.StatefulSets[0].Spec.Template.Spec.Affinity = nil }, "anti-affinity"},
		{"no auto-compaction", func(m *deploytest.Manifests) {
			c := &m.StatefulSets[0].Spec.Template.Spec.Containers[0]
			c.Args = slices.DeleteFunc(c.Args, func(a string) bool { return strings.HasPrefix(a, "--auto-compaction-mode") })
		}, "--auto-compaction-mode="},
		{"no fsync", func(m *deploytest.Manifests) {
			c := &m.StatefulSets[0].Spec.Template.Spec.Containers[0]
			c.Args = append(c.Args, "--unsafe-no-fsync")
		}, "--unsafe-no-fsync is set"},
		{"a cluster token without a generation", func(m *deploytest.Manifests) {
			c := &m.StatefulSets[0].Spec.Template.Spec.Containers[0]
			for i, a := range c.Args {
				if strings.HasPrefix(a, "--initial-cluster-token=") {
					c.Args[i] = "--initial-cluster-token=dlock-etcd"
				}
			}
		}, "carries no generation"},
		{"claims retained", func(m *deploytest.Manifests) { m.StatefulSets[0].Spec.PersistentVolumeClaimRetentionPolicy = nil }, "claims are retained"},
		{"two members may go", func(m *deploytest.Manifests) { v := intstr.FromInt32(2); m.PDBs[0].Spec.MaxUnavailable = &v }, "maxUnavailable: 1"},
		{"no PDB", func(m *deploytest.Manifests) { m.PDBs = nil }, "0 PodDisruptionBudgets"},
		{"no requests", func(m *deploytest.Manifests) {
			m.StatefulSets[0].Spec.Template.Spec.Containers[0].Resources.Requests = corev1.ResourceList{}
		}, "requests no cpu"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			m := decode(t, etcdManifest)
			tc.mutate(m)
			ps := deploytest.CheckEtcd(m)
			if !slices.ContainsFunc(ps, func(p string) bool { return strings.Contains(p, tc.want) }) {
				t.Errorf("CheckEtcd = %q, want a problem containing %q", ps, tc.want)
			}
		})
	}
}

func TestLockServerChecksFailOnBrokenCopies(t *testing.T) {
	cases := []struct {
		name   string
		mutate func(m *deploytest.Manifests)
		want   string
	}{
		{"liveness on readiness", func(m *deploytest.Manifests) {
			m.Deployments[0].Spec.Template.Spec.Containers[0].LivenessProbe.HTTPGet.Path = api.PathReady
		}, "liveness probe path"},
		{"no readiness", func(m *deploytest.Manifests) { m.Deployments[0].Spec.Template.Spec.Containers[0].ReadinessProbe = nil }, "readiness probe path"},
		{"one replica", func(m *deploytest.Manifests) { one := int32(1); m.Deployments[0].Spec.Replicas = &one }, "fewer than 2 replicas"},
		{"rolling update", func(m *deploytest.Manifests) {
			m.Deployments[0].Spec.Strategy = appsv1.DeploymentStrategy{Type: appsv1.RollingUpdateDeploymentStrategyType}
		}, "want Recreate"},
		{"external load balancer", func(m *deploytest.Manifests) {
			delete(m.Services[0].Annotations, "networking.gke.io/load-balancer-type")
		}, "external load balancer"},
		{"no PDB", func(m *deploytest.Manifests) { m.PDBs = nil }, "0 PodDisruptionBudgets"},
		{"no Workload Identity", func(m *deploytest.Manifests) { m.ServiceAccounts[0].Annotations = nil }, "Workload Identity"},
		{"sidecar without requests", func(m *deploytest.Manifests) {
			m.Deployments[0].Spec.Template.Spec.InitContainers[0].Resources.Requests = nil
		}, "container cloud-sql-proxy requests no cpu"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			m := decode(t, lockServerManifest)
			tc.mutate(m)
			ps := deploytest.CheckLockServer(m, lockServerPaths)
			if !slices.ContainsFunc(ps, func(p string) bool { return strings.Contains(p, tc.want) }) {
				t.Errorf("CheckLockServer = %q, want a problem containing %q", ps, tc.want)
			}
		})
	}
}

func TestCloudBuildDeploysEveryFunctionTaggedByCommit(t *testing.T) {
	cb, err := deploytest.LoadCloudBuild(filepath.Join(repo, "cloudbuild.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	fns, err := deploytest.Functions(filepath.Join(repo, "functions", "cmd"))
	if err != nil {
		t.Fatal(err)
	}
	if len(fns) < 4 {
		t.Fatalf("functions under functions/cmd = %v, want at least the four services", fns)
	}
	for _, p := range deploytest.CheckCloudBuild(cb, fns) {
		t.Error(p)
	}

	// A new function without steps fails.
	if ps := deploytest.CheckCloudBuild(cb, append(fns, "refund-worker")); !slices.ContainsFunc(ps, func(p string) bool {
		return strings.Contains(p, "no `gcloud run deploy refund-worker` step")
	}) {
		t.Errorf("a function without a deploy step passes: %q", ps)
	}
	// An image tagged otherwise fails.
	broken := *cb
	broken.Images = append(slices.Clone(cb.Images), "${_REPO}/executor:latest")
	if ps := deploytest.CheckCloudBuild(&broken, fns); !slices.ContainsFunc(ps, func(p string) bool { return strings.Contains(p, ":latest") }) {
		t.Errorf("an image tagged latest passes: %q", ps)
	}
	// A deploy of another image than the one built fails.
	broken = *cb
	broken.Steps = slices.Clone(cb.Steps)
	for i, s := range broken.Steps {
		if s.ID == "deploy-executor" {
			s.Args = slices.Clone(s.Args)
			s.Args[slices.Index(s.Args, "--image")+1] = "${_REPO}/rail-stub:$COMMIT_SHA"
			broken.Steps[i] = s
		}
	}
	if ps := deploytest.CheckCloudBuild(&broken, fns); !slices.ContainsFunc(ps, func(p string) bool { return strings.Contains(p, "not the image it built") }) {
		t.Errorf("deploying another image passes: %q", ps)
	}
}

func TestCloudBuildDecodingIsStrict(t *testing.T) {
	p := filepath.Join(t.TempDir(), "cloudbuild.yaml")
	if err := os.WriteFile(p, []byte("steps:\n  - name: gcr.io/cloud-builders/docker\n    arg: [build]\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := deploytest.LoadCloudBuild(p); !errors.Is(err, deploytest.ErrDecode) {
		t.Errorf("LoadCloudBuild(misspelt key) = %v, want ErrDecode", err)
	}
}

// TestEveryWorkloadIsScraped: lock-server and etcd each have their
// PodMonitoring, named for the job their alerts read; each broken copy
// is named by CheckScraped.
func TestEveryWorkloadIsScraped(t *testing.T) {
	m := decode(t, namespaceManifest, etcdManifest, lockServerManifest)
	if len(m.PodMonitorings) != 2 {
		t.Fatalf("decoded %d PodMonitorings, want 2", len(m.PodMonitorings))
	}
	for _, p := range deploytest.CheckScraped(m) {
		t.Error(p)
	}
	for _, tc := range []struct {
		name  string
		edit  func(m *deploytest.Manifests)
		wants string
	}{
		{"lock-server not scraped", func(m *deploytest.Manifests) { m.PodMonitorings = m.PodMonitorings[:1] }, "Deployment lock-server: 0 PodMonitorings"},
		{"named for another job", func(m *deploytest.Manifests) { m.PodMonitorings[0].Name = "etcd-members" }, `not the job "etcd"`},
		{"a port the pods do not declare", func(m *deploytest.Manifests) {
			m.PodMonitorings[0].Spec.Endpoints[0].Port = intstr.FromString("metric")
		}, `port "metric" is no named container port`},
		{"selecting no pod", func(m *deploytest.Manifests) {
			m.PodMonitorings[1].Spec.Selector.MatchLabels = map[string]string{"app.kubernetes.io/name": "lockserver"}
		}, "Deployment lock-server: 0 PodMonitorings"},
		{"scraped too rarely", func(m *deploytest.Manifests) { m.PodMonitorings[1].Spec.Endpoints[0].Interval = "5m" }, `interval "5m"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m := decode(t, namespaceManifest, etcdManifest, lockServerManifest)
			tc.edit(m)
			problems := deploytest.CheckScraped(m)
			if !slices.ContainsFunc(problems, func(p string) bool { return strings.Contains(p, tc.wants) }) {
				t.Errorf("problems %q do not name %q", problems, tc.wants)
			}
		})
	}
}

// TestScrapesKeepWhatTheAlertsRead: every metric ops/slo.yaml reads from
// etcd or lock-server survives the metric relabeling of their
// PodMonitoring (a keep filter that dropped one would blind its alert in
// silence); shown failing with a filter that keeps only the disk series.
func TestScrapesKeepWhatTheAlertsRead(t *testing.T) {
	spec, err := slo.Load(filepath.Join(repo, "ops", "slo.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	check := func(m *deploytest.Manifests) []string {
		var out []string
		for _, pm := range m.PodMonitorings {
			n := 0
			for _, metric := range spec.Metrics {
				if metric.From != pm.Name {
					continue
				}
				n++
				names := []string{metric.Name}
				if metric.Type == "histogram" {
					names = []string{metric.Name + "_bucket", metric.Name + "_count"}
				}
				for _, e := range pm.Spec.Endpoints {
					for _, name := range names {
						if ok, err := e.Keeps(name); err != nil || !ok {
							out = append(out, fmt.Sprintf("%s drops %s (%v)", pm.Name, name, err))
						}
					}
				}
			}
			if n == 0 {
				out = append(out, "ops/slo.yaml declares no metric from "+pm.Name)
			}
		}
		return out
	}
	m := decode(t, namespaceManifest, etcdManifest, lockServerManifest)
	for _, p := range check(m) {
		t.Error(p)
	}
	m.PodMonitorings[0].Spec.Endpoints[0].MetricRelabeling[0].Regex = "etcd_disk_.+"
	if got := check(m); len(got) == 0 || !strings.Contains(got[0], "drops etcd_server_has_leader") {
		t.Errorf("a filter keeping only the disk series: problems %q, want one naming etcd_server_has_leader", got)
	}
}

func TestStrictDecodingRefusesAMisspeltPodMonitoringField(t *testing.T) {
	b, err := os.ReadFile(lockServerManifest)
	if err != nil {
		t.Fatal(err)
	}
	broken := strings.Replace(string(b), "      interval: 30s", "      intervall: 30s", 1)
	if broken == string(b) {
		t.Fatal("the edit changed nothing")
	}
	p := filepath.Join(t.TempDir(), "lock-server.yaml")
	if err := os.WriteFile(p, []byte(broken), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := deploytest.DecodeFiles(p); !errors.Is(err, deploytest.ErrDecode) || !strings.Contains(err.Error(), "intervall") {
		t.Errorf("DecodeFiles(misspelt PodMonitoring field) = %v, want ErrDecode naming it", err)
	}
}
