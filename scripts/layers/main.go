// Command layers checks that the module's imports point down: each package
// imports only packages of a lower layer (docs/ARCHITECTURE.md draws
// them), and the providers behind verbs (internal/loopfab, udpfab,
// shmfab) are imported by verbs alone. `make lint` runs it; it prints every
// import that breaks a rule and exits 1.
package main

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
)

const module = "github.com/rvma/rvma/"

// layer of each package that imports another of the module; internal
// packages not named are utilities of layer 0, which may import each
// other. A package may import only packages of a lower layer (two of
// layer 0 excepted).
var layer = map[string]int{
	"epoch":             0,
	"verbs":             1,
	"verbs/cm":          2,
	"verbs/verbstest":   2,
	"internal/progress": 2, // one CQ's dispatcher, over verbs
	"reliability":       3,
	"multipath":         3,
	"mailbox":           4, // RVMA semantics over either transport
	"rma":               5,
}

// top is the layer of commands, examples, scripts and the C APIs (capi, mpi):
// they may import anything (but a provider).
const top = 9

var providers = map[string]bool{"internal/loopfab": true, "internal/udpfab": true, "internal/shmfab": true}

// providerUsers may import a provider: verbs chooses them, and rvma-perf's
// udp_raw measures the raw yardstick on the UDP provider's own sockets.
func providerUser(p string) bool {
	return p == "verbs" || strings.HasPrefix(p, "verbs/") || p == "cmd/rvma-perf"
}

func layerOf(p string) int {
	if l, ok := layer[p]; ok {
		return l
	}
	// capi is librvma, a command (package main) built as a library: it
	// stands above everything it exports, as the commands do. mpi is
	// libmpi's test alone (the library is C over librvma).
	if p == "capi" || p == "mpi" {
		return top
	}
	for _, pre := range []string{"cmd/", "examples/", "scripts/", "capi/"} {
		if strings.HasPrefix(p, pre) {
			return top
		}
	}
	if strings.HasPrefix(p, "internal/") {
		return 0
	}
	return -1 // a public package not placed yet: say so
}

type pkg struct {
	ImportPath string
	Imports    []string
}

func main() {
	out, err := exec.Command("go", "list", "-json", "./...").Output()
	if err != nil {
		fmt.Fprintln(os.Stderr, "layers: go list:", err)
		os.Exit(2)
	}
	bad := 0
	dec := json.NewDecoder(strings.NewReader(string(out)))
	for {
		var p pkg
		if err := dec.Decode(&p); err == io.EOF {
			break
		} else if err != nil {
			fmt.Fprintln(os.Stderr, "layers:", err)
			os.Exit(2)
		}
		from, ok := strings.CutPrefix(p.ImportPath, module)
		if !ok {
			continue
		}
		lf := layerOf(from)
		if lf < 0 {
			fmt.Printf("layers: %s has no layer: add it to scripts/layers\n", from)
			bad++
			continue
		}
		for _, imp := range p.Imports {
			to, ok := strings.CutPrefix(imp, module)
			if !ok {
				continue
			}
			lt := layerOf(to)
			switch {
			case providers[to] && !providerUser(from):
				fmt.Printf("layers: %s imports the provider %s: only verbs chooses providers\n", from, to)
				bad++
			case lt < 0:
			case lt > lf || lt == lf && lf != 0:
				fmt.Printf("layers: %s (layer %d) imports %s (layer %d): imports point down\n", from, lf, to, lt)
				bad++
			}
		}
	}
	if bad > 0 {
		os.Exit(1)
	}
}
