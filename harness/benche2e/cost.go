package benche2e

import (
	"fmt"
	"io"
	"slices"
	"strings"
)

// Prices are the list prices (USD) the cost model assumes, with where
// they were read and when.
type Prices struct {
	// Source names the pages the prices were read from; Date when.
	Source, Date string
	// Cloud Run, request-based billing, Tier 1 region: per vCPU-second,
	// per GiB-second and per million requests.
	RunVCPUSecond, RunGiBSecond, RunMillionRequests float64
	// Cloud SQL for PostgreSQL, Enterprise edition, dedicated core: per
	// vCPU-hour and per GB-hour of memory.
	SQLVCPUHour, SQLGBHour float64
	// GKE Autopilot, general-purpose pods: per vCPU-hour and per
	// GiB-hour of the pods' requests.
	AutopilotVCPUHour, AutopilotGiBHour float64
	// Pub/Sub message delivery: per TiB of throughput, each publish and
	// each delivery billed at least PubSubMinBytes.
	PubSubTiB, PubSubMinBytes float64
}

// DefaultPrices are the us-central1 list prices of 2026-12-05
// (docs/benchmarks.md names the pages).
func DefaultPrices() Prices {
	return Prices{
		Source:             "cloud.google.com/run/pricing, cloud.google.com/sql/pricing, cloud.google.com/kubernetes-engine/pricing, cloud.google.com/pubsub/pricing",
		Date:               "2026-12-05",
		RunVCPUSecond:      0.000024,
		RunGiBSecond:       0.0000025,
		RunMillionRequests: 0.40,
		SQLVCPUHour:        0.0413,
		SQLGBHour:          0.007,
		AutopilotVCPUHour:  0.0445,
		AutopilotGiBHour:   0.0049225,
		PubSubTiB:          40,
		PubSubMinBytes:     1000,
	}
}

// Shape is the deployed shape the model prices: what terraform/ and the
// GKE manifests (lockserver/deploy, etcd/deploy) ask for.
type Shape struct {
	// RunServices maps each Cloud Run service to the local processes
	// whose CPU it stands for (prefixes: "executor-" counts every
	// executor) and the request routes that reach it (service names of
	// Measurement.RequestsPerPayout).
	RunServices []RunService
	// RunVCPU and RunMemoryGiB are one Cloud Run instance's limits;
	// RunMaxInstances the cap per service; RunUtilization the share of
	// an instance's billed time its CPU is busy (Cloud Run bills an
	// instance while any request is in flight, and scales out near 60%).
	RunVCPU, RunMemoryGiB float64
	RunMaxInstances       int
	RunUtilization        float64
	// SQL lists the Cloud SQL instances (each at SQLVCPU and
	// SQLMemoryGB, the tier db-custom-1-3840) with the local cluster whose
	// CPU stands for it.
	SQL                  []SQLInstance
	SQLVCPU, SQLMemoryGB float64
	// Pods lists the GKE Autopilot workloads, by backend ("" for both).
	Pods []Pods
	// PubSubMessagesPerPayout: the payout event published once and
	// pushed once.
	PubSubMessagesPerPayout float64
}

// RunService is one Cloud Run service of Shape.
type RunService struct {
	Name      string
	Processes []string
	Requests  string
}

// SQLInstance is one Cloud SQL instance of Shape.
type SQLInstance struct {
	Name, Cluster string
}

// Pods is one GKE workload of Shape: Replicas pods of VCPU and MemoryGiB
// requested each, whose CPU is that of local process Process.
type Pods struct {
	Name, Backend, Process string
	Replicas               int
	VCPU, MemoryGiB        float64
}

// DefaultShape is the shape of terraform/ (Cloud Run: 1 vCPU, 512 MiB,
// at most 3 instances; Cloud SQL db-custom-1-3840 twice) and of the GKE
// manifests (lock-server: 2 pods of 250m + the 100m proxy sidecar; etcd:
// 3 members of 500m and 1 GiB).
func DefaultShape() Shape {
	return Shape{
		RunServices: []RunService{
			{Name: "payment-resource", Processes: []string{"payment-resource"}, Requests: "payment-resource"},
			{Name: "rail-proxy", Processes: []string{"rail-proxy"}, Requests: "rail-proxy"},
			{Name: "executor", Processes: []string{"executor-"}, Requests: "executor"},
			{Name: "reconciler", Processes: []string{"reconciler"}},
		},
		RunVCPU: 1, RunMemoryGiB: 0.5, RunMaxInstances: 3, RunUtilization: 0.6,
		SQL:     []SQLInstance{{Name: "paydb and raildb", Cluster: "postgres-paydb"}, {Name: "lockdb", Cluster: "postgres-lockdb"}},
		SQLVCPU: 1, SQLMemoryGB: 3.75,
		Pods: []Pods{
			{Name: "lock-server", Process: "lock-server", Replicas: 2, VCPU: 0.35, MemoryGiB: 0.375},
			{Name: "etcd", Backend: "etcd", Process: "etcd", Replicas: 3, VCPU: 0.5, MemoryGiB: 1},
		},
		PubSubMessagesPerPayout: 2,
	}
}

// CostLine is one part of what a million payouts cost.
type CostLine struct {
	// Part names the deployed part; Quantity what is billed for a
	// million payouts.
	Part, Quantity string
	// USD is the cost of a million payouts; for an always-on part
	// (Cloud SQL, GKE pods) that of the hours a million payouts take at
	// the pipeline's saturating throughput.
	USD float64
	// SaturatesAt is the payouts/s at which the part's CPU is used up
	// (0: not CPU-bound here).
	SaturatesAt float64
}

// Cost returns what a million payouts cost on shape s at prices p, from
// one run's measurement m of backend: each line, and the total, whose
// SaturatesAt is the lowest of the parts'.
func Cost(m Measurement, backend string, s Shape, p Prices) []CostLine {
	const million = 1e6
	cpu := func(prefix string) float64 { // ms per payout
		var ms float64
		for name, v := range m.CPUPerPayoutMs {
			if name == prefix || strings.HasSuffix(prefix, "-") && strings.HasPrefix(name, prefix) {
				ms += v
			}
		}
		return ms
	}
	requests := func(service string) float64 {
		var n float64
		for k, v := range m.RequestsPerPayout {
			if svc, _, _ := strings.Cut(k, " "); svc == service {
				n += v
			}
		}
		return n
	}
	var lines []CostLine
	var always []int // lines priced by the hour
	for _, svc := range s.RunServices {
		var ms float64
		for _, proc := range svc.Processes {
			ms += cpu(proc)
		}
		billed := ms / 1000 * million / s.RunUtilization // instance-seconds of 1 vCPU
		reqs := requests(svc.Requests) * million
		usd := billed*s.RunVCPU*p.RunVCPUSecond + billed*s.RunMemoryGiB*p.RunGiBSecond + reqs/million*p.RunMillionRequests
		l := CostLine{Part: "Cloud Run " + svc.Name, Quantity: fmt.Sprintf("%.0f vCPU-s, %.0f requests", billed*s.RunVCPU, reqs), USD: usd}
		if ms > 0 {
			l.SaturatesAt = float64(s.RunMaxInstances) * s.RunVCPU * s.RunUtilization * 1000 / ms
		}
		lines = append(lines, l)
	}
	for _, db := range s.SQL {
		ms := cpu(db.Cluster)
		if ms == 0 {
			continue // not in this backend's stack
		}
		always = append(always, len(lines))
		lines = append(lines, CostLine{Part: "Cloud SQL " + db.Name, SaturatesAt: s.SQLVCPU * 1000 / ms})
	}
	for _, pod := range s.Pods {
		if pod.Backend != "" && pod.Backend != backend {
			continue
		}
		l := CostLine{Part: "GKE Autopilot " + pod.Name}
		if ms := cpu(pod.Process); ms > 0 {
			// The work is spread over the replicas (etcd: the leader
			// does most; this is the optimistic bound).
			l.SaturatesAt = float64(pod.Replicas) * pod.VCPU * 1000 / ms
		}
		always = append(always, len(lines))
		lines = append(lines, l)
	}
	bytes := s.PubSubMessagesPerPayout * p.PubSubMinBytes * million
	lines = append(lines, CostLine{Part: "Pub/Sub", Quantity: fmt.Sprintf("%.0f messages, %.2f GB billed", s.PubSubMessagesPerPayout*million, bytes/1e9),
		USD: bytes / (1 << 40) * p.PubSubTiB})
	rate := 0.0
	for _, l := range lines {
		if l.SaturatesAt > 0 && (rate == 0 || l.SaturatesAt < rate) {
			rate = l.SaturatesAt
		}
	}
	hours := million / rate / 3600
	for _, i := range always {
		l := &lines[i]
		if strings.HasPrefix(l.Part, "Cloud SQL") {
			l.Quantity = fmt.Sprintf("%.2f instance-hours", hours)
			l.USD = hours * (s.SQLVCPU*p.SQLVCPUHour + s.SQLMemoryGB*p.SQLGBHour)
			continue
		}
		pod := s.Pods[slices.IndexFunc(s.Pods, func(p Pods) bool { return "GKE Autopilot "+p.Name == l.Part })]
		l.Quantity = fmt.Sprintf("%.2f pod-hours of %.2f vCPU, %.3f GiB", hours*float64(pod.Replicas), pod.VCPU, pod.MemoryGiB)
		l.USD = hours * float64(pod.Replicas) * (pod.VCPU*p.AutopilotVCPUHour + pod.MemoryGiB*p.AutopilotGiBHour)
	}
	total := CostLine{Part: "total", Quantity: fmt.Sprintf("%.2f hours at %.0f payouts/s", hours, rate), SaturatesAt: rate}
	for _, l := range lines {
		total.USD += l.USD
	}
	return append(lines, total)
}

// WriteCost writes Cost's lines as a Markdown table, with the prices.
func WriteCost(w io.Writer, backend string, lines []CostLine, p Prices) error {
	var b strings.Builder
	fmt.Fprintf(&b, "\nWhat a million payouts cost on the deployed shape, %s (list prices of %s: %s):\n\n", backend, p.Date, p.Source)
	b.WriteString("| part | billed for 10^6 payouts | USD | saturates at payouts/s |\n|---|---|---|---|\n")
	for _, l := range lines {
		sat := "-"
		if l.SaturatesAt > 0 {
			sat = fmt.Sprintf("%.0f", l.SaturatesAt)
		}
		fmt.Fprintf(&b, "| %s | %s | %.2f | %s |\n", l.Part, l.Quantity, l.USD, sat)
	}
	_, err := io.WriteString(w, b.String())
	return err
}
