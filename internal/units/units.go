// Package units parses the rates and sizes the command-line tools take:
// rates as tc spells them ("500mbit", "1gbit", "800kbit", "100bit"), sizes
// with binary suffixes ("64K", "4MiB", "1G", "4096").
package units

import (
	"fmt"
	"strconv"
	"strings"
)

// ParseRate turns a tc rate into bits per second.
func ParseRate(s string) (float64, error) {
	for _, u := range []struct {
		suffix string
		bits   float64
	}{{"gbit", 1e9}, {"mbit", 1e6}, {"kbit", 1e3}, {"bit", 1}} {
		if v, ok := strings.CutSuffix(strings.ToLower(s), u.suffix); ok {
			f, err := strconv.ParseFloat(v, 64)
			if err != nil || f <= 0 {
				break
			}
			return f * u.bits, nil
		}
	}
	return 0, fmt.Errorf("rate %q: want a tc rate such as 500mbit or 1gbit", s)
}

// ParseSize turns a size with an optional binary suffix (K, M, G, with or
// without "iB"/"B") into bytes.
func ParseSize(s string) (int64, error) {
	t := strings.TrimSuffix(strings.TrimSuffix(strings.ToUpper(s), "B"), "I")
	mult := int64(1)
	if n := len(t); n > 0 {
		switch t[n-1] {
		case 'K':
			mult, t = 1<<10, t[:n-1]
		case 'M':
			mult, t = 1<<20, t[:n-1]
		case 'G':
			mult, t = 1<<30, t[:n-1]
		}
	}
	v, err := strconv.ParseInt(t, 10, 64)
	if err != nil || v < 0 || v > (1<<62)/mult {
		return 0, fmt.Errorf("size %q: want bytes such as 4096, 64K or 4MiB", s)
	}
	return v * mult, nil
}
