# rvma: make demo runs the main example, make test the tests.
GO          ?= go
STATICCHECK ?= $(GO) run honnef.co/go/tools/cmd/staticcheck@v0.8.2
FUZZTIME    ?= 20s
# package:FuzzTarget pairs run by fuzz-short
FUZZ_TARGETS = ./internal/psn:FuzzDiff ./internal/wire:FuzzParse ./verbs/cm:FuzzMessage

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

# The side-by-side figures of docs/PERFORMANCE.md.
perf:
	$(GO) build -o bin/rvma-perf ./cmd/rvma-perf
	bin/rvma-perf write_bw --provider loop --size 1048576 --vs memcpy --reps 5 --json
	bin/rvma-perf write_bw --provider loop --size 1048576 --vs memcpy --chunk 65536 --reps 5 --json
	bin/rvma-perf write_lat --provider loop --size 8 --json
	bin/rvma-perf write_bw --provider udp --size 1048576 --vs udp_raw --reps 5 --json
	bin/rvma-perf write_lat --provider udp --size 8 --vs udp_pingpong --reps 5 --json
	for t in write_ack_lat read_lat send_lat atomic_lat; do bin/rvma-perf $$t --provider udp --size 8 --json; done
	for t in read_bw send_bw; do bin/rvma-perf $$t --provider udp --size 1048576 --json; done

clean:
	rm -rf bin
