package month

import (
	"context"
	"fmt"
	"image/color"
	"io"
	"maps"
	"math"
	"slices"
	"strconv"
	"strings"
	"time"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"

	"github.com/distributed-lock-lab/distributed-lock-lab/harness/gameday"
	"github.com/distributed-lock-lab/distributed-lock-lab/internal/svgplot"
	"github.com/distributed-lock-lab/distributed-lock-lab/local/stack"
	"github.com/distributed-lock-lab/distributed-lock-lab/ops/slo"
)

// Background is the cause of bad events outside every fault's window.
const Background = "no fault"

// The election allowance of docs/slo.md: 30 a month, each assumed to cost
// at most 2 s of acquires.
const (
	ElectionAllowance = 30
	ElectionCost      = 2 * time.Second
)

// Report is one simulated month. The first fields are measured; Scale,
// Elections, SLOs and Consequences are computed from them.
type Report struct {
	Backend string    `json:"backend"`
	Seed    uint64    `json:"seed"`
	Started time.Time `json:"started"`
	// RunStart and RunEnd bound the measured run: the healthy lead-in,
	// up to HealthyEnd, then every fault.
	RunStart   time.Time `json:"runStart"`
	HealthyEnd time.Time `json:"healthyEnd"`
	RunEnd     time.Time `json:"runEnd"`
	// LoadAverage is the machine's one-minute load average at RunStart
	// and at RunEnd.
	LoadAverage [2]string `json:"loadAverage"`
	Faults      []Fault   `json:"faults"`
	// Occurrences are the faults in the order of the month.
	Occurrences []Occurrence `json:"occurrences"`
	// HealthyBad are the bad events of each SLO in the healthy lead-in,
	// RunTotal all its events over the whole run.
	HealthyBad map[string]float64 `json:"healthyBad"`
	RunTotal   map[string]float64 `json:"runTotal"`
	// PolicyElections is docs/slo.md's count of elections,
	// max(increase(etcd_server_leader_changes_seen_total)), over the run.
	PolicyElections float64     `json:"policyElections"`
	Objectives      []Objective `json:"objectives"`

	// Scale is the month's time outside the faults' windows per second of
	// the healthy lead-in (the faults' own time is not compressed).
	Scale float64 `json:"scale"`
	// Elections is the number of evictions of the etcd leader.
	Elections    int         `json:"elections"`
	SLOs         []SLOResult `json:"slos"`
	Consequences []string    `json:"consequences"`
}

// Objective is one SLO of ops/slo.yaml, in percent.
type Objective struct {
	SLO       string  `json:"slo"`
	Objective float64 `json:"objective"`
}

// SLOResult is one SLO over the month.
type SLOResult struct {
	SLO       string  `json:"slo"`
	Objective float64 `json:"objective"`
	// Events and Bad are the month's events and bad events; Budget the
	// bad events the objective allows (0 for an objective of 100).
	Events float64 `json:"events"`
	Bad    float64 `json:"bad"`
	Budget float64 `json:"budget"`
	// Spent is the fraction of the budget spent (1: all of it), and
	// SpentBy the same per cause (Occurrence.Cause, or Background); both
	// 0 without a budget, where BadBy counts the bad events per cause.
	Spent   float64            `json:"spent"`
	SpentBy map[string]float64 `json:"spentBy"`
	BadBy   map[string]float64 `json:"badBy"`
}

// compute fills Scale, Elections, SLOs and Consequences from the
// measurements.
func (r *Report) compute() {
	run := r.RunEnd.Sub(r.RunStart)
	var faulty time.Duration
	r.Elections = 0
	for _, o := range r.Occurrences {
		faulty += o.End.Sub(o.Start)
		if o.Election {
			r.Elections++
		}
	}
	r.Scale = float64(Period-faulty) / float64(max(r.HealthyEnd.Sub(r.RunStart), time.Second))
	r.SLOs = nil
	for _, obj := range r.Objectives {
		s := SLOResult{SLO: obj.SLO, Objective: obj.Objective, SpentBy: map[string]float64{}, BadBy: map[string]float64{}}
		for _, o := range r.Occurrences {
			s.BadBy[o.Cause] += o.Bad[obj.SLO]
			s.Bad += o.Bad[obj.SLO]
		}
		s.BadBy[Background] = r.HealthyBad[obj.SLO] * r.Scale
		s.Bad += s.BadBy[Background]
		// The load is steady: the month has the run's rate of events.
		s.Events = r.RunTotal[obj.SLO] / max(run.Seconds(), 1) * Period.Seconds()
		s.Budget = (1 - obj.Objective/100) * s.Events
		if s.Budget > 0 {
			s.Spent = s.Bad / s.Budget
			for c, b := range s.BadBy {
				s.SpentBy[c] = b / s.Budget
			}
		}
		r.SLOs = append(r.SLOs, s)
	}
	r.Consequences = r.policy()
}

// The SLOs whose budget, spent, freezes the lock service; the others
// freeze the payout pipeline (docs/slo.md, the error-budget policy).
var lockSLOs = []string{"lock-acquire-availability", "lock-acquire-latency"}

// policy applies docs/slo.md's error-budget policy to the month.
func (r *Report) policy() []string {
	var out []string
	for _, s := range r.SLOs {
		if s.Budget == 0 {
			if s.Bad > 0 {
				out = append(out, fmt.Sprintf("`%s`: %.0f bad events: payouts stop at once and every deploy stops until both leads release them.", s.SLO, s.Bad))
			} else {
				out = append(out, fmt.Sprintf("`%s`: no bad event; nothing stops.", s.SLO))
			}
			continue
		}
		team, what := "Payouts", "the executor, payment-resource, rail-proxy and the Pub/Sub setup"
		if slices.Contains(lockSLOs, s.SLO) {
			team, what = "Platform", "lock-server, its stores and the SDK"
		}
		if s.Spent >= 1 {
			out = append(out, fmt.Sprintf("`%s`: %.0f %% of the budget spent: the %s lead freezes every change to %s but reliability fixes; the next work is its largest cause, %s.", s.SLO, 100*s.Spent, team, what, largest(s.SpentBy)))
		} else {
			out = append(out, fmt.Sprintf("`%s`: %.1f %% of the budget spent, %.1f %% left: no freeze.", s.SLO, 100*s.Spent, 100*(1-s.Spent)))
		}
		for _, o := range r.Occurrences {
			if o.Bad[s.SLO] > 0.2*s.Budget {
				out = append(out, fmt.Sprintf("`%s`: %s at day %.1f spent %.0f %% of the budget alone (more than 20 %%): a postmortem within five working days.", s.SLO, o.Cause, o.At.Hours()/24, 100*o.Bad[s.SLO]/s.Budget))
			}
		}
	}
	if r.Backend == stack.BackendEtcd {
		verdict := "within the allowance: an expense, not a fault"
		if r.Elections > ElectionAllowance {
			verdict = "over the allowance: a fault, the trigger of D-05 (etcd off Autopilot)"
		}
		line := fmt.Sprintf("etcd leader elections: %d from evictions (allowance %d), %s; the policy's query counts %.0f over the run.", r.Elections, ElectionAllowance, verdict, r.PolicyElections)
		if cost, ok := r.electionCost(); ok {
			line += fmt.Sprintf(" Their measured cost: %.1f s of acquires each (the policy assumes %v).", cost.Seconds(), ElectionCost)
		}
		out = append(out, line)
	}
	return out
}

// electionCost is the bad acquires of the leader evictions' windows, per
// election, as seconds of acquires at the run's steady rate.
func (r *Report) electionCost() (time.Duration, bool) {
	const a = "lock-acquire-availability"
	rate := r.RunTotal[a] / r.RunEnd.Sub(r.RunStart).Seconds()
	if r.Elections == 0 || rate == 0 {
		return 0, false
	}
	var bad float64
	for _, o := range r.Occurrences {
		if o.Election {
			bad += o.Bad[a]
		}
	}
	return time.Duration(bad / rate / float64(r.Elections) * float64(time.Second)), true
}

func largest(m map[string]float64) string {
	best, v := "", -1.0
	for _, k := range slices.Sorted(maps.Keys(m)) {
		if m[k] > v {
			best, v = k, m[k]
		}
	}
	return best
}

// Markdown is the report as a Markdown page section.
func (r *Report) Markdown() string {
	var b strings.Builder
	run := r.RunEnd.Sub(r.RunStart)
	fmt.Fprintf(&b, "### A month on %s (seed %d)\n\n", r.Backend, r.Seed)
	fmt.Fprintf(&b, "Run of %s (started %s): %d faults at their real length; the %s healthy lead-in stands for the rest of the month (%.0f times as long). Load average of the machine: %s at the start, %s at the end.\n\n",
		run.Round(time.Second), r.Started.Format("2006-01-02 15:04 UTC"), len(r.Occurrences), r.HealthyEnd.Sub(r.RunStart).Round(time.Second), r.Scale, r.LoadAverage[0], r.LoadAverage[1])
	fmt.Fprintf(&b, "| SLO | Objective | Events in the month | Bad | Budget (bad events) | Budget spent | Largest cause |\n|---|---|---|---|---|---|---|\n")
	for _, s := range r.SLOs {
		spent, budget := "no budget", "0"
		if s.Budget > 0 {
			spent, budget = fmt.Sprintf("%.1f %%", 100*s.Spent), fmt.Sprintf("%.0f", s.Budget)
		}
		cause := "—"
		if s.Bad > 0 {
			cause = largest(s.BadBy)
		}
		fmt.Fprintf(&b, "| `%s` | %s %% | %.0f | %.0f | %s | %s | %s |\n", s.SLO, strconv.FormatFloat(s.Objective, 'f', -1, 64), s.Events, s.Bad, budget, spent, cause)
	}
	causes := map[string]int{}
	for _, o := range r.Occurrences {
		causes[o.Cause]++
	}
	causes[Background] = 0
	fmt.Fprintf(&b, "\nBudget spent by cause (percent of each SLO's month budget; bad events where there is no budget):\n\n| Cause | Times |")
	for _, s := range r.SLOs {
		fmt.Fprintf(&b, " `%s` |", s.SLO)
	}
	fmt.Fprintf(&b, "\n|---|---|%s\n", strings.Repeat("---|", len(r.SLOs)))
	for _, c := range slices.Sorted(maps.Keys(causes)) {
		times := strconv.Itoa(causes[c])
		if c == Background {
			times = "—"
		}
		fmt.Fprintf(&b, "| %s | %s |", c, times)
		for _, s := range r.SLOs {
			if s.Budget > 0 {
				fmt.Fprintf(&b, " %.2f %% |", 100*s.SpentBy[c])
			} else {
				fmt.Fprintf(&b, " %.0f |", s.BadBy[c])
			}
		}
		b.WriteString("\n")
	}
	b.WriteString("\nWhat the policy does with this month:\n\n")
	for _, c := range r.Consequences {
		fmt.Fprintf(&b, "- %s\n", c)
	}
	return b.String()
}

// palette colours the chart's lines, one per SLO with a budget.
var palette = []color.Color{
	color.RGBA{R: 0x1f, G: 0x77, B: 0xb4, A: 0xff},
	color.RGBA{R: 0xd6, G: 0x27, B: 0x28, A: 0xff},
	color.RGBA{R: 0x2c, G: 0xa0, B: 0x2c, A: 0xff},
	color.RGBA{R: 0x94, G: 0x67, B: 0xbd, A: 0xff},
}

// Chart writes the budget remaining of each SLO with a budget over the
// month as an SVG: the background spends it evenly, each fault in one
// step on its day.
func (r *Report) Chart(w io.Writer) error {
	p := plot.New()
	p.Title.Text = fmt.Sprintf("Error budget remaining over a simulated month (%s, seed %d)", r.Backend, r.Seed)
	p.X.Label.Text = "day of the month"
	p.Y.Label.Text = "budget remaining (%)"
	p.X.Min, p.X.Max = 0, Period.Hours()/24
	p.Y.Max = 100
	p.Add(plotter.NewGrid())
	p.Legend.Top, p.Legend.Left = false, true
	i := 0
	for _, s := range r.SLOs {
		if s.Budget == 0 {
			continue
		}
		bg := s.SpentBy[Background]
		pts := plotter.XYs{{X: 0, Y: 100}}
		spent := 0.0
		at := func(t time.Duration) float64 { return 100 * (1 - spent - bg*float64(t)/float64(Period)) }
		for _, o := range r.Occurrences {
			day := o.At.Hours() / 24
			pts = append(pts, plotter.XY{X: day, Y: at(o.At)})
			spent += o.Bad[s.SLO] / s.Budget
			pts = append(pts, plotter.XY{X: day, Y: at(o.At)})
		}
		pts = append(pts, plotter.XY{X: Period.Hours() / 24, Y: at(Period)})
		line, err := plotter.NewLine(pts)
		if err != nil {
			return err
		}
		line.Color, line.Width = palette[i%len(palette)], vg.Points(1.5)
		p.Add(line)
		p.Legend.Add(s.SLO, line)
		p.Y.Min = math.Min(p.Y.Min, at(Period)-5)
		i++
	}
	if p.Y.Min > 0 {
		p.Y.Min = 0
	}
	return svgplot.Write(w, p, 20*vg.Centimeter, 11*vg.Centimeter)
}

// querier reads the SLIs of spec from mon's Prometheus.
type querier struct {
	mon  *gameday.Monitor
	spec *slo.Spec
}

// window returns the bad and all events of each SLO between from and to.
func (q *querier) window(ctx context.Context, from, to time.Time) (bad, total map[string]float64, err error) {
	d := to.Sub(from)
	slis, err := q.spec.SLIs(promDuration(d))
	if err != nil {
		return nil, nil, err
	}
	bad, total = map[string]float64{}, map[string]float64{}
	for _, s := range slis {
		e, err := q.value(ctx, s.Errors, to)
		if err != nil {
			return nil, nil, err
		}
		t, err := q.value(ctx, s.Total, to)
		if err != nil {
			return nil, nil, err
		}
		bad[s.SLO], total[s.SLO] = e*d.Seconds(), t*d.Seconds()
	}
	return bad, total, nil
}

// value evaluates expr at time at and returns the sum of its samples (0
// for an empty answer: no such events).
func (q *querier) value(ctx context.Context, expr string, at time.Time) (float64, error) {
	v, err := q.mon.Query(ctx, expr, at)
	if err != nil {
		return 0, err
	}
	var sum float64
	for _, s := range v {
		if f := float64(s.Value); !math.IsNaN(f) {
			sum += f
		}
	}
	return sum, nil
}

// promDuration writes d as a PromQL duration in milliseconds.
func promDuration(d time.Duration) string { return strconv.FormatInt(d.Milliseconds(), 10) + "ms" }
