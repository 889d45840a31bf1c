// Package plot draws line charts as SVG, for the benchmark tools' figures
// (no dependency: a handful of polylines and labels).
package plot

import (
	"fmt"
	"io"
	"os"
	"strings"
)

// Lines is a chart of one or more series over a shared X axis.
type Lines struct {
	Title, XLabel, YLabel string
	X                     []float64
	XTicks                []string // labels at X[i]; default: numbers spread over the axis
	Y                     [][]float64
	Names                 []string
	Markers               bool // draw a dot at every point
}

var colors = []string{"#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f",
	"#bcbd22", "#17becf", "#393b79", "#637939", "#8c6d31", "#843c39", "#7b4173", "#3182bd"}

// WriteSVG draws l.
func WriteSVG(w io.Writer, l Lines) error {
	const W, H, L, R, T, B = 800.0, 400.0, 60.0, 150.0, 40.0, 50.0
	minX, maxX, maxY := 0.0, 0.1, 0.001
	if len(l.X) > 0 {
		minX, maxX = l.X[0], l.X[0]
	}
	for i := range l.X {
		minX, maxX = min(minX, l.X[i]), max(maxX, l.X[i])
		for p := range l.Y {
			maxY = max(maxY, l.Y[p][i])
		}
	}
	if maxX == minX {
		maxX = minX + 1
	}
	maxY *= 1.1
	x := func(v float64) float64 { return L + (W-L-R)*(v-minX)/(maxX-minX) }
	y := func(v float64) float64 { return H - B - (H-T-B)*v/maxY }
	var b strings.Builder
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%g" height="%g" font-family="sans-serif" font-size="12">`+"\n", W, H)
	fmt.Fprintf(&b, `<rect width="100%%" height="100%%" fill="white"/><text x="%g" y="20" font-size="14">%s</text>`+"\n", L, escape(l.Title))
	fmt.Fprintf(&b, `<line x1="%g" y1="%g" x2="%g" y2="%g" stroke="black"/><line x1="%g" y1="%g" x2="%g" y2="%g" stroke="black"/>`+"\n",
		L, H-B, W-R, H-B, L, T, L, H-B)
	for k := 0; k <= 4; k++ {
		v := maxY * float64(k) / 4
		fmt.Fprintf(&b, `<text x="%g" y="%g" text-anchor="end">%.3g</text>`+"\n", L-5, y(v)+4, v)
	}
	if len(l.XTicks) == len(l.X) && len(l.X) > 0 {
		for i, t := range l.XTicks {
			fmt.Fprintf(&b, `<text x="%g" y="%g" text-anchor="middle">%s</text>`+"\n", x(l.X[i]), H-B+16, escape(t))
		}
	} else {
		for k := 0; k <= 4; k++ {
			v := minX + (maxX-minX)*float64(k)/4
			fmt.Fprintf(&b, `<text x="%g" y="%g" text-anchor="middle">%.2g</text>`+"\n", x(v), H-B+16, v)
		}
	}
	fmt.Fprintf(&b, `<text x="%g" y="%g" text-anchor="middle">%s</text>`+"\n", (L+W-R)/2, H-10, escape(l.XLabel))
	fmt.Fprintf(&b, `<text x="15" y="%g" transform="rotate(-90 15 %g)" text-anchor="middle">%s</text>`+"\n", (T+H-B)/2, (T+H-B)/2, escape(l.YLabel))
	for p := range l.Y {
		color := colors[p%len(colors)]
		var pts []string
		for i := range l.X {
			pts = append(pts, fmt.Sprintf("%.1f,%.1f", x(l.X[i]), y(l.Y[p][i])))
			if l.Markers {
				fmt.Fprintf(&b, `<circle cx="%.1f" cy="%.1f" r="3" fill="%s"/>`+"\n", x(l.X[i]), y(l.Y[p][i]), color)
			}
		}
		fmt.Fprintf(&b, `<polyline fill="none" stroke="%s" stroke-width="1.5" points="%s"/>`+"\n", color, strings.Join(pts, " "))
		name := ""
		if p < len(l.Names) {
			name = l.Names[p]
		}
		fmt.Fprintf(&b, `<line x1="%g" y1="%g" x2="%g" y2="%g" stroke="%s" stroke-width="3"/><text x="%g" y="%g">%s</text>`+"\n",
			W-R+10, T+float64(p)*18, W-R+30, T+float64(p)*18, color, W-R+35, T+float64(p)*18+4, escape(name))
	}
	b.WriteString("</svg>\n")
	_, err := io.WriteString(w, b.String())
	return err
}

func escape(s string) string {
	return strings.NewReplacer("&", "&amp;", "<", "&lt;", ">", "&gt;").Replace(s)
}

// Save writes l to path, which must end in .svg.
func Save(path string, l Lines) error {
	if !strings.HasSuffix(path, ".svg") {
		return fmt.Errorf("plot %s: only .svg is written", path)
	}
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if err := WriteSVG(f, l); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}
