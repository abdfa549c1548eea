package harness

import (
	"fmt"
	"html"
	"strings"
	"time"

	"github.com/distributed-lock-lab/distributed-lock-lab/functions/fencing/fencewire"
	"github.com/distributed-lock-lab/distributed-lock-lab/functions/paymentresource/api"
	railapi "github.com/distributed-lock-lab/distributed-lock-lab/functions/railproxy/api"
)

// timelineSVG draws one run on the server's clock: A's and B's leases (from
// grant to last known expiry or release), A's pause, and every write
// attempt at a fence point with its token and verdict.
func timelineSVG(r *Run) []byte {
	type lease struct{ from, to time.Time }
	leases := map[string]*lease{}
	type mark struct {
		at      time.Time
		owner   string
		label   string
		refused bool
	}
	var marks []mark
	var start, end time.Time
	for _, e := range r.Events {
		o := e.Owner()
		switch {
		case e.Service == "lock-server" && (e.Name == "lock_granted" || e.Name == "lease_renewed"):
			exp, _ := time.Parse(time.RFC3339Nano, e.Str("expiresAt"))
			if leases[o] == nil {
				leases[o] = &lease{from: e.Time}
			}
			leases[o].to = exp
		case e.Service == "lock-server" && e.Name == "lease_released":
			if l := leases[o]; l != nil {
				l.to = e.Time
			}
		case e.Service == "rail-proxy" && e.Name == railapi.EventSubmissionForwarding:
			marks = append(marks, mark{e.Time, o, fmt.Sprintf("rail token %d: forwarded", e.Int("token")), false})
		case e.Name == fencewire.EventFencedOut:
			marks = append(marks, mark{e.Time, o, fmt.Sprintf("%s token %d: %s (%d)", e.Str("resource"), e.Int("presentedToken"), fencewire.CodeFencedOut, e.Int("highestToken")), true})
		case e.Service == "payment-resource" && e.Name == api.EventPayoutClaimed:
			marks = append(marks, mark{e.Time, o, fmt.Sprintf("claim token %d: ok", e.Int("token")), false})
		case e.Service == "payment-resource" && e.Name == api.EventPayoutPosted:
			marks = append(marks, mark{e.Time, o, fmt.Sprintf("debit token %d: posted", e.Int("token")), false})
		case e.Service == "payment-resource" && e.Name == api.EventResultReplayed:
			marks = append(marks, mark{e.Time, o, fmt.Sprintf("result token %d: replay", e.Int("token")), false})
		}
	}
	for _, l := range leases {
		if start.IsZero() || l.from.Before(start) {
			start = l.from
		}
		if l.to.After(end) {
			end = l.to
		}
	}
	for _, m := range marks {
		if m.at.After(end) {
			end = m.at
		}
	}
	if r.Continued.After(end) {
		end = r.Continued
	}
	if start.IsZero() || !end.After(start) {
		return []byte(`<svg xmlns="http://www.w3.org/2000/svg" width="200" height="20"><text x="4" y="14">no events</text></svg>`)
	}
	const w, left, right = 960.0, 60.0, 20.0
	span := end.Sub(start).Seconds() * 1.05
	x := func(t time.Time) float64 { return left + (w-left-right)*t.Sub(start).Seconds()/span }
	row := map[string]float64{"A": 60, "B": 200}
	var b strings.Builder
	s := r.Summary
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%.0f" height="370" font-family="monospace" font-size="11">`+"\n", w)
	fmt.Fprintf(&b, `<text x="10" y="18" font-size="13">%s backend, payment fencing %s, rail fencing %s: rail %d, debits %d, balanced %v</text>`+"\n",
		s.Backend, onOff(s.PaymentFencing), onOff(s.RailFencing), s.RailSubmissions, s.Debits, s.LedgerBalanced)
	if !r.Stopped.IsZero() {
		fmt.Fprintf(&b, `<rect x="%.1f" y="40" width="%.1f" height="50" fill="#ddd"/><text x="%.1f" y="36">A paused (SIGSTOP .. SIGCONT)</text>`+"\n",
			x(r.Stopped), x(r.Continued)-x(r.Stopped), x(r.Stopped))
	}
	for _, o := range []string{"A", "B"} {
		y := row[o]
		fmt.Fprintf(&b, `<text x="10" y="%.0f" font-size="13">%s</text>`+"\n", y+14, o)
		if l := leases[o]; l != nil {
			tok := s.TokenA
			if o == "B" {
				tok = s.TokenB
			}
			// A label that would run off the right edge ends at its anchor.
			tx, anchor := x(l.from)+3, "start"
			if tx > 600 {
				tx, anchor = x(l.to)-3, "end"
			}
			fmt.Fprintf(&b, `<rect x="%.1f" y="%.0f" width="%.1f" height="18" fill="#9cf"/><text x="%.1f" y="%.0f" text-anchor="%s">lease token %d (server clock)</text>`+"\n",
				x(l.from), y, max(x(l.to)-x(l.from), 2), tx, y+13, anchor, tok)
		}
	}
	n := map[string]int{}
	for _, m := range marks {
		y := row[m.owner] + 30 + float64(n[m.owner])*16
		n[m.owner]++
		color := "#080" // accepted
		switch {
		case m.refused:
			color = "#c00" // refused by a fence point
		case m.owner == "A" && !r.Continued.IsZero() && m.at.After(r.Continued):
			// A stale holder's write that got through: the corruption.
			color = "#e07000"
			m.label += " (STALE, accepted)"
		}
		tx, anchor := x(m.at)+5, "start"
		if tx > 600 {
			tx, anchor = x(m.at)-5, "end"
		}
		fmt.Fprintf(&b, `<line x1="%.1f" y1="%.0f" x2="%.1f" y2="%.0f" stroke="%s"/><circle cx="%.1f" cy="%.0f" r="3" fill="%s"/><text x="%.1f" y="%.0f" fill="%s" text-anchor="%s">%s</text>`+"\n",
			x(m.at), row[m.owner], x(m.at), y, color, x(m.at), y, color, tx, y+4, color, anchor, html.EscapeString(m.label))
	}
	fmt.Fprintf(&b, `<line x1="%.0f" y1="320" x2="%.0f" y2="320" stroke="#000"/>`+"\n", left, w-right)
	// A tick every quarter second, labelled every half.
	for t := 0.0; t <= span; t += 0.25 {
		tx := left + (w-left-right)*t/span
		fmt.Fprintf(&b, `<line x1="%.1f" y1="316" x2="%.1f" y2="324" stroke="#000"/>`, tx, tx)
		if int(t*4)%2 == 0 {
			fmt.Fprintf(&b, `<text x="%.1f" y="336" text-anchor="middle">%.1f s</text>`, tx, t)
		}
		b.WriteString("\n")
	}
	legend(&b, left, 356)
	b.WriteString("</svg>\n")
	return []byte(b.String())
}

// legend writes the key of the timeline's colours, one row at y from x.
func legend(b *strings.Builder, x, y float64) {
	for _, k := range []struct{ color, label string }{
		{"#9cf", "lease (grant to expiry or release)"},
		{"#ddd", "A paused"},
		{"#080", "write accepted"},
		{"#c00", "refused by a fence point"},
		{"#e07000", "stale write accepted"},
	} {
		fmt.Fprintf(b, `<rect x="%.1f" y="%.0f" width="12" height="10" fill="%s"/><text x="%.1f" y="%.0f">%s</text>`+"\n", x, y-9, k.color, x+16, y, k.label)
		x += 16 + 6.6*float64(len(k.label)) + 18
	}
}
