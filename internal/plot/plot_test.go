package plot

import (
	"bytes"
	"encoding/xml"
	"io"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestWriteSVG(t *testing.T) {
	var b bytes.Buffer
	require.NoError(t, WriteSVG(&b, Lines{Title: "a <b>", XLabel: "loss", YLabel: "Gbit/s", X: []float64{0, 1, 2},
		XTicks: []string{"0", "1e-4", "1e-3"}, Y: [][]float64{{1, 2, 3}, {3, 2, 1}}, Names: []string{"sr", "ec"}, Markers: true}))
	s := b.String()
	require.Equal(t, 2, strings.Count(s, "<polyline"))
	require.Equal(t, 6, strings.Count(s, "<circle"))
	require.Contains(t, s, "a &lt;b&gt;")
	require.Contains(t, s, ">1e-4<")
	// Well-formed XML.
	d := xml.NewDecoder(&b)
	for {
		_, err := d.Token()
		if err == io.EOF {
			break
		}
		require.NoError(t, err)
	}
	require.Error(t, Save(filepath.Join(t.TempDir(), "x.png"), Lines{}))
	require.NoError(t, Save(filepath.Join(t.TempDir(), "x.svg"), Lines{}))
}
