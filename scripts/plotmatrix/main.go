// Command plotmatrix turns scripts/haul-matrix.sh's JSON lines into a
// Markdown table (stdout) and an SVG plot of goodput against loss.
package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"os"
	"sort"
	"strconv"

	"github.com/rvma/rvma/internal/plot"
)

type run struct {
	Bytes     int64   `json:"bytes"`
	Seconds   float64 `json:"seconds"`
	Gbps      float64 `json:"gbps"`
	Scheme    string  `json:"scheme"`
	Ideal     float64 `json:"ideal_seconds"`
	Predicted float64 `json:"predicted_seconds"`
	OK        bool    `json:"ok"`
	Repaired  int     `json:"repaired_chunks"`
	Overhead  float64 `json:"wire_overhead"`
}

type row struct {
	Loss   float64 `json:"loss"`
	Forced string  `json:"forced"`
	Run    run     `json:"run"`
}

func main() {
	if len(os.Args) != 3 {
		fmt.Fprintln(os.Stderr, "usage: plotmatrix RESULTS.jsonl OUT.svg")
		os.Exit(2)
	}
	f, err := os.Open(os.Args[1])
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	cells := map[float64]map[string]run{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		var r row
		if err := json.Unmarshal(sc.Bytes(), &r); err != nil {
			fmt.Fprintln(os.Stderr, "skipping:", err)
			continue
		}
		if cells[r.Loss] == nil {
			cells[r.Loss] = map[string]run{}
		}
		cells[r.Loss][r.Forced] = r.Run
	}
	var losses []float64
	for l := range cells {
		losses = append(losses, l)
	}
	sort.Float64s(losses)
	schemes := []string{"auto", "sr", "ec"}
	fmt.Println("| loss/packet | scheme | seconds | x ideal | Gbit/s | chose | model s | model err | wire | repaired | ok |")
	fmt.Println("|---|---|---|---|---|---|---|---|---|---|---|")
	p := plot.Lines{Title: "haul through linkem: 25 ms RTT, 500 Mbit/s", XLabel: "per-packet loss", YLabel: "goodput Gbit/s", Markers: true}
	for i, l := range losses {
		p.X = append(p.X, float64(i))
		p.XTicks = append(p.XTicks, strconv.FormatFloat(l, 'g', -1, 64))
	}
	for _, s := range schemes {
		var ys []float64
		for _, l := range losses {
			r := cells[l][s]
			ys = append(ys, r.Gbps)
			best := min(cells[l]["sr"].Seconds, cells[l]["ec"].Seconds)
			note := ""
			if s == "auto" && best > 0 {
				note = fmt.Sprintf(" (%.2fx best forced)", r.Seconds/best)
			}
			fmt.Printf("| %g | %s | %.3f | %.3f%s | %.3f | %s | %.3f | %+.1f%% | %.3f | %d | %v |\n", l, s, r.Seconds, r.Seconds/r.Ideal, note,
				r.Gbps, r.Scheme, r.Predicted, 100*(r.Predicted/r.Seconds-1), r.Overhead, r.Repaired, r.OK)
		}
		p.Y = append(p.Y, ys)
		p.Names = append(p.Names, s)
	}
	if err := plot.Save(os.Args[2], p); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}
