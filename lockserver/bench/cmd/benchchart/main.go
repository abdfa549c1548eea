// Command benchchart draws lockserver/bench's acquire+release pairs per
// second against concurrent clients, one panel per backend and one line
// per path, from the benchmark output `make bench` writes:
//
//	go run ./lockserver/bench/cmd/benchchart -o bin/bench-pairs.svg bin/bench.txt
//
// Each point is the median round of a row, with a bar from the lowest to
// the highest round (package benchchart). It also prints the points as a
// Markdown table. Exit status 1 on an unreadable file, a malformed row or
// no AcquireRelease row at the GOMAXPROCS asked for.
package main

import (
	"bytes"
	"flag"
	"fmt"
	"os"

	"github.com/distributed-lock-lab/distributed-lock-lab/lockserver/bench/benchchart"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "benchchart:", err)
		os.Exit(1)
	}
}

func run() error {
	out := flag.String("o", "bin/bench-pairs.svg", "the SVG to write")
	procs := flag.Int("procs", 2, "the GOMAXPROCS of the rows to draw (the -N suffix of their names; 1 for rows without one)")
	title := flag.String("title", "Uncontended acquire+release pairs per second against clients (lockserver/bench)", "the chart's title")
	flag.Parse()
	if flag.NArg() != 1 {
		return fmt.Errorf("give one benchmark output file (bin/bench.txt)")
	}
	f, err := os.Open(flag.Arg(0))
	if err != nil {
		return err
	}
	defer f.Close()
	series, err := benchchart.Read(f)
	if err != nil {
		return fmt.Errorf("%s: %w", flag.Arg(0), err)
	}
	var svg bytes.Buffer
	if err := benchchart.WriteSVG(&svg, *title, series, *procs); err != nil {
		return err
	}
	if err := os.WriteFile(*out, svg.Bytes(), 0o644); err != nil {
		return err
	}
	fmt.Println("| backend | path | GOMAXPROCS | clients | pairs/s (median) | lowest | highest | rounds |")
	fmt.Println("|---|---|---|---|---|---|---|---|")
	for _, s := range series {
		for _, p := range s.Points {
			fmt.Printf("| %s | %s | %d | %d | %.0f | %.0f | %.0f | %d |\n", s.Backend, s.Path, s.Procs, p.Clients, p.PairsPerSec, p.Min, p.Max, p.Rounds)
		}
	}
	fmt.Println("wrote", *out)
	return nil
}
