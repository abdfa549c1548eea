package deploytest

import (
	"fmt"
	"regexp"
	"strings"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
)

// selects reports whether sel (a label selector) matches the labels l.
func selects(sel *metav1.LabelSelector, l map[string]string) bool {
	if sel == nil {
		return false
	}
	s, err := metav1.LabelSelectorAsSelector(sel)
	if err != nil || s.Empty() {
		return false
	}
	return s.Matches(labels.Set(l))
}

// pdbFor returns the PodDisruptionBudgets of the same namespace whose
// selector matches the pod labels l.
func (m *Manifests) pdbFor(ns string, l map[string]string) []*policyv1.PodDisruptionBudget {
	var out []*policyv1.PodDisruptionBudget
	for _, p := range m.PDBs {
		if p.Namespace == ns && selects(p.Spec.Selector, l) {
			out = append(out, p)
		}
	}
	return out
}

// checkPod returns the problems of a pod template every workload of the lab
// shares: each container (init containers too: Autopilot bills and
// schedules by them) requests CPU and memory.
func checkPod(what string, spec corev1.PodSpec) []string {
	var out []string
	all := append(append([]corev1.Container{}, spec.InitContainers...), spec.Containers...)
	for _, c := range all {
		for _, r := range []corev1.ResourceName{corev1.ResourceCPU, corev1.ResourceMemory} {
			if q, ok := c.Resources.Requests[r]; !ok || q.IsZero() {
				out = append(out, fmt.Sprintf("%s: container %s requests no %s (Autopilot needs requests)", what, c.Name, r))
			}
		}
	}
	return out
}

func httpProbePath(p *corev1.Probe) string {
	if p == nil || p.HTTPGet == nil {
		return ""
	}
	return p.HTTPGet.Path
}

// CheckEtcd checks the etcd StatefulSet: three replicas started in
// parallel; a headless Service that publishes not-ready addresses names
// it; liveness on /livez and readiness on /readyz; required anti-affinity
// by node; persistent volumes whose claims go with the StatefulSet;
// periodic auto-compaction; a PodDisruptionBudget that lets at most one
// member go; resource requests.
func CheckEtcd(m *Manifests) []string {
	var sts *appsv1.StatefulSet
	for _, s := range m.StatefulSets {
		if s.Name == "etcd" {
			sts = s
		}
	}
	if sts == nil {
		return []string{"no StatefulSet named etcd"}
	}
	var out []string
	if sts.Spec.Replicas == nil || *sts.Spec.Replicas != 3 {
		out = append(out, "etcd: replicas is not 3")
	}
	if sts.Spec.PodManagementPolicy != appsv1.ParallelPodManagement {
		out = append(out, "etcd: podManagementPolicy is not Parallel: the first member would wait for a quorum whose peers are not created yet")
	}
	var headless *corev1.Service
	for _, s := range m.Services {
		if s.Name == sts.Spec.ServiceName && s.Namespace == sts.Namespace {
			headless = s
		}
	}
	switch {
	case headless == nil:
		out = append(out, fmt.Sprintf("etcd: no Service %q (serviceName) in namespace %q", sts.Spec.ServiceName, sts.Namespace))
	default:
		if headless.Spec.ClusterIP != corev1.ClusterIPNone {
			out = append(out, "etcd: its Service is not headless (clusterIP: None)")
		}
		if !headless.Spec.PublishNotReadyAddresses {
			out = append(out, "etcd: its Service does not publish not-ready addresses: members could not find each other before they are ready")
		}
		if !selects(&metav1.LabelSelector{MatchLabels: headless.Spec.Selector}, sts.Spec.Template.Labels) {
			out = append(out, "etcd: its Service does not select the StatefulSet's pods")
		}
	}
	cs := sts.Spec.Template.Spec.Containers
	if len(cs) != 1 {
		return append(out, "etcd: want exactly one container")
	}
	c := cs[0]
	if p := httpProbePath(c.LivenessProbe); p != "/livez" {
		out = append(out, fmt.Sprintf("etcd: liveness probe path is %q, want /livez", p))
	}
	if p := httpProbePath(c.ReadinessProbe); p != "/readyz" {
		out = append(out, fmt.Sprintf("etcd: readiness probe path is %q, want /readyz", p))
	}
	args := strings.Join(c.Args, " ")
	for _, flag := range []string{"--auto-compaction-mode=", "--auto-compaction-retention=", "--initial-cluster=", "--name=$(POD_NAME)"} {
		if !strings.Contains(args, flag) {
			out = append(out, "etcd: no "+flag+" flag")
		}
	}
	if strings.Contains(args, "--unsafe-no-fsync") && !strings.Contains(args, "--unsafe-no-fsync=false") {
		out = append(out, "etcd: --unsafe-no-fsync is set: a crash could lose grants already answered, and their tokens be issued again")
	}
	if !clusterTokenWithGeneration.MatchString(args) {
		out = append(out, "etcd: --initial-cluster-token carries no generation (-gen-N): a snapshot restored with it would keep the cluster ID")
	}
	if !requiredAntiAffinity(sts.Spec.Template.Spec.Affinity, "kubernetes.io/hostname", sts.Spec.Template.Labels) {
		out = append(out, "etcd: no required pod anti-affinity by kubernetes.io/hostname over its own pods")
	}
	if len(sts.Spec.VolumeClaimTemplates) == 0 {
		out = append(out, "etcd: no volumeClaimTemplates: data would not survive a restart")
	} else {
		mounted := false
		for _, vm := range c.VolumeMounts {
			if vm.Name == sts.Spec.VolumeClaimTemplates[0].Name {
				mounted = true
			}
		}
		if !mounted {
			out = append(out, "etcd: the claim template's volume is not mounted")
		}
	}
	if p := sts.Spec.PersistentVolumeClaimRetentionPolicy; p == nil || p.WhenDeleted != appsv1.DeletePersistentVolumeClaimRetentionPolicyType {
		out = append(out, "etcd: claims are retained when the StatefulSet is deleted: their disks would outlive the lab")
	}
	pdbs := m.pdbFor(sts.Namespace, sts.Spec.Template.Labels)
	if len(pdbs) != 1 {
		out = append(out, fmt.Sprintf("etcd: %d PodDisruptionBudgets select its pods, want 1", len(pdbs)))
	} else if mu := pdbs[0].Spec.MaxUnavailable; mu == nil || mu.String() != "1" {
		out = append(out, "etcd: its PodDisruptionBudget does not say maxUnavailable: 1")
	}
	return append(out, checkPod("etcd", sts.Spec.Template.Spec)...)
}

func requiredAntiAffinity(a *corev1.Affinity, topologyKey string, podLabels map[string]string) bool {
	if a == nil || a.PodAntiAffinity == nil {
		return false
	}
	for _, t := range a.PodAntiAffinity.RequiredDuringSchedulingIgnoredDuringExecution {
		if t.TopologyKey == topologyKey && selects(t.LabelSelector, podLabels) {
			return true
		}
	}
	return false
}

// LockServerPaths are the health endpoints the probes must use, from the
// lock API (lockserver/api): the caller passes them so that this package
// spells no path of that API.
type LockServerPaths struct {
	Health, Ready string
}

// CheckLockServer checks lock-server's objects: a Deployment of at least
// two replicas, updated by Recreate (never two versions at once), with
// liveness on paths.Health and readiness on paths.Ready;
// a PodDisruptionBudget that keeps one; a Service that selects its pods
// and is an internal load balancer (never an external one: the lock API
// has no authentication); the Kubernetes service account annotated for
// Workload Identity; resource requests.
func CheckLockServer(m *Manifests, paths LockServerPaths) []string {
	var d *appsv1.Deployment
	for _, x := range m.Deployments {
		if x.Name == "lock-server" {
			d = x
		}
	}
	if d == nil {
		return []string{"no Deployment named lock-server"}
	}
	var out []string
	if d.Spec.Replicas == nil || *d.Spec.Replicas < 2 {
		out = append(out, "lock-server: fewer than 2 replicas")
	}
	if d.Spec.Strategy.Type != appsv1.RecreateDeploymentStrategyType {
		out = append(out, fmt.Sprintf("lock-server: update strategy is %q, want Recreate: a rolling update runs old and new servers at once, and an old one does not know a newer store scheme", d.Spec.Strategy.Type))
	}
	var c *corev1.Container
	for i := range d.Spec.Template.Spec.Containers {
		if d.Spec.Template.Spec.Containers[i].Name == "lock-server" {
			c = &d.Spec.Template.Spec.Containers[i]
		}
	}
	if c == nil {
		return append(out, "lock-server: no container named lock-server")
	}
	if p := httpProbePath(c.LivenessProbe); p != paths.Health {
		out = append(out, fmt.Sprintf("lock-server: liveness probe path is %q, want %q", p, paths.Health))
	}
	if p := httpProbePath(c.ReadinessProbe); p != paths.Ready {
		out = append(out, fmt.Sprintf("lock-server: readiness probe path is %q, want %q", p, paths.Ready))
	}
	pdbs := m.pdbFor(d.Namespace, d.Spec.Template.Labels)
	if len(pdbs) != 1 {
		out = append(out, fmt.Sprintf("lock-server: %d PodDisruptionBudgets select its pods, want 1", len(pdbs)))
	} else if mn := pdbs[0].Spec.MinAvailable; mn == nil || mn.IntValue() < 1 {
		out = append(out, "lock-server: its PodDisruptionBudget does not keep at least one pod (minAvailable)")
	}
	var svc *corev1.Service
	for _, s := range m.Services {
		if s.Namespace == d.Namespace && selects(&metav1.LabelSelector{MatchLabels: s.Spec.Selector}, d.Spec.Template.Labels) {
			svc = s
		}
	}
	switch {
	case svc == nil:
		out = append(out, "lock-server: no Service selects its pods")
	case svc.Spec.Type == corev1.ServiceTypeLoadBalancer && svc.Annotations["networking.gke.io/load-balancer-type"] != "Internal":
		out = append(out, "lock-server: its Service is an external load balancer: the lock API has no authentication")
	case svc.Spec.Type != corev1.ServiceTypeLoadBalancer:
		out = append(out, "lock-server: its Service is not an internal load balancer: Cloud Run could not reach it over the VPC")
	}
	sa := d.Spec.Template.Spec.ServiceAccountName
	found := false
	for _, a := range m.ServiceAccounts {
		if a.Name == sa && a.Namespace == d.Namespace {
			found = a.Annotations["iam.gke.io/gcp-service-account"] != ""
		}
	}
	if !found {
		out = append(out, fmt.Sprintf("lock-server: service account %q is missing or has no iam.gke.io/gcp-service-account annotation (Workload Identity)", sa))
	}
	return append(out, checkPod("lock-server", d.Spec.Template.Spec)...)
}

// clusterTokenWithGeneration matches an --initial-cluster-token that ends
// in a generation, "-gen-" and a number, which every restore of the
// cluster must raise (docs/runbooks/etcd-restore.md).
var clusterTokenWithGeneration = regexp.MustCompile(`--initial-cluster-token=\S+-gen-[0-9]+(\s|$)`)
