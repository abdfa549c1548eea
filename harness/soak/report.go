package soak

import (
	"encoding/json"
	"fmt"
	"image/color"
	"io"
	"math"
	"slices"
	"time"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"

	"github.com/distributed-lock-lab/distributed-lock-lab/functions/paymentresource/api"
	"github.com/distributed-lock-lab/distributed-lock-lab/functions/payoutaudit"
	"github.com/distributed-lock-lab/distributed-lock-lab/functions/rail"
	"github.com/distributed-lock-lab/distributed-lock-lab/internal/svgplot"
)

// Report is the result of one soak, written to harness/out/soak.json.
type Report struct {
	// Backend, Seed and the sizes of the run; the fence points' settings.
	Backend        string `json:"backend"`
	Seed           uint64 `json:"seed"`
	Payouts        int    `json:"payouts"`
	Accounts       int    `json:"accounts"`
	Executors      int    `json:"executors"`
	PaymentFencing bool   `json:"paymentFencing"`
	RailFencing    bool   `json:"railFencing"`
	// Dir is the stack's run folder (every process's log, the rail's
	// journal).
	Dir string `json:"dir"`
	// Start is when the first payout was created; LoadEnd when the last
	// was created and the chaos had stopped; DrainedAt when no payout was
	// in an executor's hands any more; SettledAt when the reconciliation
	// ended.
	Start     time.Time `json:"start"`
	LoadEnd   time.Time `json:"loadEnd"`
	DrainedAt time.Time `json:"drainedAt"`
	SettledAt time.Time `json:"settledAt"`
	// Duplicates counts the payout events published a second time;
	// Redriven the events published again by the drain because their
	// payouts had stopped moving (dead-lettered).
	Duplicates int `json:"duplicates"`
	Redriven   int `json:"redriven"`
	// Outcomes counts the payouts by final state in paydb (posted,
	// declined, failed, needs_attention; anything else is lost).
	Outcomes map[string]int `json:"outcomes"`
	// Paths counts how payouts entered declined, failed and
	// needs_attention ("claimed->declined": the rail declined;
	// "ambiguous->failed": the reconciler found the submission never
	// reached the rail).
	Paths map[string]int `json:"paths"`
	// NeedsAttention lists every payout left for a person, with its
	// reason and history.
	NeedsAttention []PayoutRecord `json:"needsAttention"`
	// Lost lists the payouts that ended in no final state (should be
	// empty), with their history.
	Lost []PayoutRecord `json:"lost"`
	// RailSubmissions, RailAcks and Debits are counted from the rail's
	// journal and the ledger.
	RailSubmissions int `json:"railSubmissions"`
	// RailStopOrders counts the reconciler's stop orders in the journal
	// (not payments).
	RailStopOrders int `json:"railStopOrders"`
	RailAcks       int `json:"railAcks"`
	Debits         int `json:"debits"`
	// Audit is payoutaudit's report (without the per-payout lists when
	// they are empty).
	Audit payoutaudit.Report `json:"audit"`
	// ReconcilerPasses counts the passes the settle phase ran;
	// ReconcilerResults sums their results; LastPass is the last one's.
	ReconcilerPasses  int            `json:"reconcilerPasses"`
	ReconcilerResults map[string]int `json:"reconcilerResults"`
	LastPass          any            `json:"lastPass"`
	// ForwardingOfFinishedPayouts lists the payouts that are posted,
	// declined or failed in paydb while their rail-proxy attempt stays
	// 'forwarding' in raildb: raildb died between the rail's answer and
	// its recording. Money and books agree (the checks hold); raildb's
	// record of the attempt is never finished by any process.
	ForwardingOfFinishedPayouts []string `json:"forwardingOfFinishedPayouts"`
	// Kills lists every kill with its recovery times.
	Kills []Kill `json:"kills"`
	// NetFaults lists every network fault (Config.Faults with FaultsNet).
	NetFaults []NetFault `json:"netFaults"`
	// Throughput is payouts finished (posted, declined or failed) per
	// second, in buckets of BucketS seconds from Start.
	BucketS    float64   `json:"bucketS"`
	Throughput []float64 `json:"throughput"`
	// PayoutsPerSecond is every finished payout over the time from Start
	// to the last finish.
	PayoutsPerSecond float64 `json:"payoutsPerSecond"`
	// Settled is false when the pipeline did not settle within
	// Config.SettleTimeout: the records were then read while payouts
	// were still in flight, and Failures holds what that snapshot shows
	// (payouts not finished yet, submissions and debits in between), not
	// a verdict.
	Settled bool `json:"settled"`
	// Failures lists every broken rule (Check); empty for a good run.
	Failures []string `json:"failures"`
	// FailuresAfterBreak is Check's verdict on the records after
	// Config.Break changed them on purpose (absent without Break).
	FailuresAfterBreak []string `json:"failuresAfterBreak,omitempty"`
}

// fill computes the report's counts, recovery times and throughput from
// the records.
func (rep *Report) fill(r Records, bucket time.Duration) {
	rep.Outcomes = map[string]int{}
	rep.NeedsAttention, rep.Lost = []PayoutRecord{}, []PayoutRecord{}
	seen := map[string]bool{}
	for _, p := range r.Payouts {
		seen[p.ID] = true
		if final(p.State) {
			rep.Outcomes[p.State]++
		} else {
			rep.Outcomes["lost:"+p.State]++
			rep.Lost = append(rep.Lost, p)
		}
		if api.State(p.State) == api.StateNeedsAttention {
			rep.NeedsAttention = append(rep.NeedsAttention, p)
		}
	}
	for _, id := range r.Expected {
		if !seen[id] {
			rep.Outcomes["lost:missing"]++
			rep.Lost = append(rep.Lost, PayoutRecord{ID: id, State: "missing"})
		}
	}
	for _, s := range r.Journal {
		if s.Stop {
			rep.RailStopOrders++
			continue
		}
		rep.RailSubmissions++
		if s.Answer.Status == rail.StatusAck {
			rep.RailAcks++
		}
	}
	for _, n := range r.Debits {
		rep.Debits += n
	}
	rep.Audit = r.Audit
	if rep.ForwardingOfFinishedPayouts == nil {
		rep.ForwardingOfFinishedPayouts = []string{}
	}
	rep.Paths = r.Paths

	var posted []time.Time
	for _, f := range r.Finished {
		if f.State == string(api.StatePosted) {
			posted = append(posted, f.At)
		}
	}
	for i := range rep.Kills {
		k := &rep.Kills[i]
		k.AtS = k.At.Sub(rep.Start).Seconds()
		j, _ := slices.BinarySearchFunc(posted, k.At, func(t, at time.Time) int { return t.Compare(at) })
		if j < len(posted) {
			ms := posted[j].Sub(k.At).Milliseconds()
			k.NextPostedMs = &ms
		}
	}
	for i := range rep.NetFaults {
		f := &rep.NetFaults[i]
		f.AtS = f.At.Sub(rep.Start).Seconds()
		j, _ := slices.BinarySearchFunc(posted, f.At, func(t, at time.Time) int { return t.Compare(at) })
		if j < len(posted) {
			ms := posted[j].Sub(f.At).Milliseconds()
			f.NextPostedMs = &ms
		}
	}
	rep.BucketS = bucket.Seconds()
	rep.Throughput = []float64{}
	if len(r.Finished) == 0 {
		return
	}
	last := r.Finished[len(r.Finished)-1].At
	n := int(last.Sub(rep.Start)/bucket) + 1
	counts := make([]float64, max(n, 1))
	for _, f := range r.Finished {
		i := int(f.At.Sub(rep.Start) / bucket)
		if i >= 0 && i < len(counts) {
			counts[i]++
		}
	}
	for i := range counts {
		counts[i] /= bucket.Seconds()
	}
	rep.Throughput = counts
	if d := last.Sub(rep.Start).Seconds(); d > 0 {
		rep.PayoutsPerSecond = math.Round(float64(len(r.Finished))/d*10) / 10
	}
}

// WriteJSON writes reports as {"runs": [...]}, indented.
func WriteJSON(w io.Writer, reports []*Report) error {
	b, err := json.MarshalIndent(struct {
		Runs []*Report `json:"runs"`
	}{reports}, "", "  ")
	if err != nil {
		return err
	}
	_, err = w.Write(append(b, '\n'))
	return err
}

// WriteSVG draws the run's throughput over time (payouts finished per
// second, per bucket) with a vertical line at each kill, labelled with
// the part killed, as SVG (gonum.org/v1/plot, vgsvg).
func (rep *Report) WriteSVG(w io.Writer) error {
	p := plot.New()
	p.Title.Text = fmt.Sprintf("crash soak, %s backend: %d payouts, %d kills (seed %d)", rep.Backend, rep.Payouts, len(rep.Kills), rep.Seed)
	p.X.Label.Text = "seconds since the first payout"
	p.Y.Label.Text = "payouts finished per second"
	pts := make(plotter.XYs, len(rep.Throughput))
	top := 1.0
	for i, v := range rep.Throughput {
		pts[i] = plotter.XY{X: (float64(i) + 0.5) * rep.BucketS, Y: v}
		top = max(top, v)
	}
	line, err := plotter.NewLine(pts)
	if err != nil {
		return err
	}
	line.Color = color.RGBA{B: 200, A: 255}
	line.Width = vg.Points(1.5)
	p.Add(line)
	p.Y.Min, p.Y.Max = 0, top*1.25
	var labels plotter.XYLabels
	for i, k := range rep.Kills {
		mark, err := plotter.NewLine(plotter.XYs{{X: k.AtS, Y: 0}, {X: k.AtS, Y: top * 1.05}})
		if err != nil {
			return err
		}
		mark.Color = color.RGBA{R: 200, A: 255}
		mark.Dashes = []vg.Length{vg.Points(3), vg.Points(2)}
		p.Add(mark)
		name := k.Process
		if k.Leader != nil && *k.Leader {
			name += " (leader)"
		}
		labels.XYs = append(labels.XYs, plotter.XY{X: k.AtS, Y: top * (1.06 + 0.06*float64(i%3))})
		labels.Labels = append(labels.Labels, name)
	}
	if len(labels.XYs) > 0 {
		l, err := plotter.NewLabels(labels)
		if err != nil {
			return err
		}
		for i := range l.TextStyle {
			l.TextStyle[i].Font.Size = vg.Points(6)
			l.TextStyle[i].Color = color.RGBA{R: 160, A: 255}
			l.TextStyle[i].XAlign = draw.XCenter
		}
		p.Add(l)
	}
	return svgplot.Write(w, p, vg.Points(900), vg.Points(360))
}
