package deploytest

import (
	"fmt"
	"regexp"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// PodMonitoring is the part of Google Cloud Managed Service for
// Prometheus's PodMonitoring (monitoring.googleapis.com/v1) the lab uses.
// The type is not in k8s.io/api; its fields here follow the CRD's schema,
// so that strict decoding refuses a misspelt one.
type PodMonitoring struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata"`
	Spec              PodMonitoringSpec `json:"spec"`
}

// PodMonitoringSpec selects the pods to scrape and how.
type PodMonitoringSpec struct {
	Selector      metav1.LabelSelector `json:"selector"`
	Endpoints     []ScrapeEndpoint     `json:"endpoints"`
	TargetLabels  map[string]any       `json:"targetLabels,omitempty"`
	Limits        map[string]any       `json:"limits,omitempty"`
	FilterRunning *bool                `json:"filterRunning,omitempty"`
}

// ScrapeEndpoint is one port of the selected pods to scrape.
type ScrapeEndpoint struct {
	Port             intstr.IntOrString `json:"port"`
	Path             string             `json:"path,omitempty"`
	Scheme           string             `json:"scheme,omitempty"`
	Interval         string             `json:"interval,omitempty"`
	Timeout          string             `json:"timeout,omitempty"`
	MetricRelabeling []RelabelingRule   `json:"metricRelabeling,omitempty"`
}

// RelabelingRule is one metric relabeling rule of an endpoint, as in
// Prometheus' metric_relabel_configs.
type RelabelingRule struct {
	SourceLabels []string `json:"sourceLabels,omitempty"`
	Separator    string   `json:"separator,omitempty"`
	TargetLabel  string   `json:"targetLabel,omitempty"`
	Regex        string   `json:"regex,omitempty"`
	Modulus      uint64   `json:"modulus,omitempty"`
	Replacement  string   `json:"replacement,omitempty"`
	Action       string   `json:"action,omitempty"`
}

// MaxScrapeInterval is the longest scrape interval CheckScraped accepts:
// the alerts' shortest window is 5 minutes and their shortest for 1
// minute, which need a sample at least every minute.
const MaxScrapeInterval = time.Minute

// CheckScraped checks that every Deployment and StatefulSet of the
// manifests is scraped by exactly one PodMonitoring of its namespace, named
// after it (the job label of its series, which the alerts read), on a
// named container port its pods declare, at /metrics, every
// MaxScrapeInterval or more often.
func CheckScraped(m *Manifests) []string {
	type workload struct {
		kind, ns, name string
		spec           corev1.PodTemplateSpec
	}
	var ws []workload
	for _, d := range m.Deployments {
		ws = append(ws, workload{"Deployment", d.Namespace, d.Name, d.Spec.Template})
	}
	for _, s := range m.StatefulSets {
		ws = append(ws, workload{"StatefulSet", s.Namespace, s.Name, s.Spec.Template})
	}
	var out []string
	for _, w := range ws {
		var pms []*PodMonitoring
		for _, pm := range m.PodMonitorings {
			sel := pm.Spec.Selector
			if pm.Namespace == w.ns && selects(&sel, w.spec.Labels) {
				pms = append(pms, pm)
			}
		}
		what := w.kind + " " + w.name
		if len(pms) != 1 {
			out = append(out, fmt.Sprintf("%s: %d PodMonitorings select its pods, want 1 (Managed Service for Prometheus scrapes nothing else)", what, len(pms)))
			continue
		}
		pm := pms[0]
		if pm.Name != w.name {
			out = append(out, fmt.Sprintf("%s: its PodMonitoring is named %q: its series would carry job=%q, not the job %q the alerts read", what, pm.Name, pm.Name, w.name))
		}
		if len(pm.Spec.Endpoints) == 0 {
			out = append(out, what+": its PodMonitoring has no endpoint")
		}
		for _, e := range pm.Spec.Endpoints {
			if e.Port.Type != intstr.String || !declaresPort(w.spec.Spec, e.Port.StrVal) {
				out = append(out, fmt.Sprintf("%s: PodMonitoring port %q is no named container port of its pods", what, e.Port.String()))
			}
			if e.Path != "/metrics" {
				out = append(out, fmt.Sprintf("%s: PodMonitoring path %q, want /metrics", what, e.Path))
			}
			if d, err := time.ParseDuration(e.Interval); err != nil || d > MaxScrapeInterval {
				out = append(out, fmt.Sprintf("%s: PodMonitoring interval %q is not a duration of at most %s", what, e.Interval, MaxScrapeInterval))
			}
		}
	}
	return out
}

func declaresPort(spec corev1.PodSpec, name string) bool {
	for _, c := range spec.Containers {
		for _, p := range c.Ports {
			if p.Name == name {
				return true
			}
		}
	}
	return false
}

// Keeps reports whether the endpoint's metric relabeling keeps the series
// of the metric name: each keep or drop rule on __name__ alone is applied
// in order, its regex anchored as Prometheus anchors it. A rule of any
// other shape is an error: Keeps cannot tell what it does.
func (e ScrapeEndpoint) Keeps(name string) (bool, error) {
	for _, r := range e.MetricRelabeling {
		if len(r.SourceLabels) != 1 || r.SourceLabels[0] != "__name__" || (r.Action != "keep" && r.Action != "drop") {
			return false, fmt.Errorf("deploytest: relabeling rule %+v is not a keep or drop on __name__", r)
		}
		re, err := regexp.Compile("^(?:" + r.Regex + ")$")
		if err != nil {
			return false, err
		}
		if re.MatchString(name) != (r.Action == "keep") {
			return false, nil
		}
	}
	return true, nil
}
