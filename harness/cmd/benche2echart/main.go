// Command benche2echart draws the end-to-end benchmark's payouts/s against
// concurrent creators from bench-e2e.json files
// written by benche2e, typically one invocation per -creators value:
//
//	for c in 1 4 16 64; do
//		go run ./harness/cmd/benche2e -modes spread -creators $c -out harness/out/creators-$c
//	done
//	go run ./harness/cmd/benche2echart -o docs/bench-e2e-creators.svg harness/out/creators-*/bench-e2e.json
//
// One line per backend, mode and variant: the median run at each number
// of creators, a bar from the lowest to the highest run; runs with a
// broken integrity check are left out. It also prints the points as a
// Markdown table.
package main

import (
	"bytes"
	"encoding/json"
	"flag"
	"fmt"
	"os"

	"github.com/distributed-lock-lab/distributed-lock-lab/harness/benche2e"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "benche2echart:", err)
		os.Exit(1)
	}
}

func run() error {
	out := flag.String("o", "harness/out/bench-e2e-creators.svg", "the SVG to write")
	title := flag.String("title", "End to end: payouts/s against concurrent creators", "the chart's title")
	target := flag.Float64("target", 500, "the target in payouts/s, drawn as a dashed line (0: none)")
	flag.Parse()
	if flag.NArg() == 0 {
		return fmt.Errorf("give one or more bench-e2e.json files")
	}
	var results []*benche2e.Result
	for _, path := range flag.Args() {
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		var res benche2e.Result
		if err := json.Unmarshal(b, &res); err != nil {
			return fmt.Errorf("%s: %w", path, err)
		}
		results = append(results, &res)
	}
	series := benche2e.CreatorsSeries(results...)
	var svg bytes.Buffer
	if err := benche2e.WriteCreatorsSVG(&svg, *title, series, *target); err != nil {
		return err
	}
	if err := os.WriteFile(*out, svg.Bytes(), 0o644); err != nil {
		return err
	}
	fmt.Println("| series | creators | payouts/s (median) | lowest | highest | runs |")
	fmt.Println("|---|---|---|---|---|---|")
	for _, s := range series {
		for _, p := range s.Points {
			fmt.Printf("| %s | %d | %.1f | %.1f | %.1f | %d |\n", s.Name, p.Creators, p.PayoutsPerSecond, p.Min, p.Max, p.Runs)
		}
	}
	fmt.Println("wrote", *out)
	return nil
}
