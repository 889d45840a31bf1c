# rvma: make demo runs the main example, make test the tests.
GO          ?= go
STATICCHECK ?= $(GO) run honnef.co/go/tools/cmd/staticcheck@v0.8.2
FUZZTIME    ?= 20s
# package:FuzzTarget pairs run by fuzz-short
FUZZ_TARGETS = ./internal/psn:FuzzDiff ./verbs/cm:FuzzMessage

.PHONY: all build test bench fuzz-short lint demo perf clean

all: build

build:
	$(GO) build ./...

# The README's test command; .ci/run runs exactly this.
test:
	$(GO) vet ./...
	$(GO) test -race -count=1 -timeout 14m ./...

bench:
	$(GO) test -run '^$$' -bench . -benchtime 2s ./...

fuzz-short:
	@set -e; for t in $(FUZZ_TARGETS); do \
		pkg=$${t%%:*}; fn=$${t##*:}; \
		echo "fuzz $$pkg $$fn for $(FUZZTIME)"; \
		$(GO) test -run '^$$' -fuzz "^$$fn$$" -fuzztime $(FUZZTIME) $$pkg; \
	done

lint:
	@test -z "$$(gofmt -l .)" || { echo "gofmt needed:"; gofmt -l .; exit 1; }
	$(GO) vet ./...
	$(STATICCHECK) ./...

demo:
	$(GO) run ./examples/verbsdemo

# The side-by-side figures of docs/PERFORMANCE.md (loop provider).
perf:
	$(GO) build -o bin/rvma-perf ./cmd/rvma-perf
	bin/rvma-perf write_bw --provider loop --size 1048576 --json
	bin/rvma-perf memcpy --size 1048576 --json
	bin/rvma-perf memcpy --size 1048576 --chunk 65536 --json
	bin/rvma-perf write_lat --provider loop --size 8 --json
	bin/rvma-perf read_lat --provider loop --size 8 --json
	bin/rvma-perf send_lat --provider loop --size 8 --json
	bin/rvma-perf atomic_lat --provider loop --json
	bin/rvma-perf read_bw --provider loop --size 1048576 --json
	bin/rvma-perf send_bw --provider loop --size 65536 --json

clean:
	rm -rf bin
