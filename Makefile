# rvma: make demo runs the main example, make test the tests.
GO          ?= go
STATICCHECK ?= $(GO) run honnef.co/go/tools/cmd/staticcheck@v0.8.2
FUZZTIME    ?= 20s
# make install: where librvma, rvma.h and rvma.pc go (DESTDIR for staging)
PREFIX      ?= /usr/local
LIBDIR      ?= $(PREFIX)/lib
INCLUDEDIR  ?= $(PREFIX)/include
BINDIR      ?= $(PREFIX)/bin
RVMA_VERSION ?= 0.1.0
# package:FuzzTarget pairs run by fuzz-short
FUZZ_TARGETS = ./internal/psn:FuzzDiff ./internal/wire:FuzzParse ./internal/wire:FuzzListEntries ./verbs/cm:FuzzMessage ./internal/pmi:FuzzParse ./internal/pmi:FuzzParse2 ./rma:FuzzDecodeAM ./rma:FuzzDecodeWin ./rma:FuzzDecodeBlocks ./internal/sdrwire:FuzzParse ./internal/shmfab:FuzzRing ./internal/shmbox:FuzzOpen ./cmd/haul:FuzzState ./cmd/haul:FuzzOffer ./internal/kvs:FuzzServerHandshake ./internal/kvs:FuzzSessionOpen ./cmd/haul:FuzzRepairRequest ./internal/pmix/wire:FuzzParseRequest ./internal/pmix/wire:FuzzParseGetReply ./internal/pmix/wire:FuzzParseConnect ./internal/pmix/wire:FuzzParseHeader ./internal/ghash:FuzzSum

.PHONY: all build lib libmpi install perf-capi test test-debug soak perf-mem perf-scale bench fuzz-short lint demo demo-verbs demo-haul perf perf-shm perf-rma perf-rma-mpi perf-halo-mpi perf-haul perf-haul-paths clean

all: build

build:
	$(GO) build ./...

# librvma, the C API (capi/, include/rvma.h): shared and static libraries,
# the header and a pkg-config file in lib/, usable in place
# (PKG_CONFIG_PATH=$(CURDIR)/lib/pkgconfig). cgo's generated header is
# removed: rvma.h is the interface.
lib:
	mkdir -p lib/include lib/pkgconfig
	$(GO) build -buildmode=c-shared -o lib/librvma.so ./capi
	$(GO) build -buildmode=c-archive -o lib/librvma.a ./capi
	rm -f lib/librvma.h
	cp capi/include/rvma.h lib/include/
	$(call rvma_pc,$(CURDIR)/lib,$(CURDIR)/lib,$(CURDIR)/lib/include) > lib/pkgconfig/rvma.pc
	$(MAKE) libmpi

# libmpi, the MPI compatibility library (mpi/: C over librvma), shared
# (linked against librvma, found by rpath next to it) and static, mpi.h
# beside rvma.h; mpi/rvmacc compiles against them in place.
CC          ?= cc
MPI_CFLAGS  ?= -O2 -g -std=c11 -Wall -Wextra -fPIC -pthread
MPI_SRC      = mpi/src/mpi.c mpi/src/win.c
libmpi:
	mkdir -p lib/include lib/obj
	cp mpi/include/mpi.h mpi/include/mpix_rvma.h lib/include/
	for f in $(MPI_SRC); do $(CC) $(MPI_CFLAGS) -Ilib/include -Impi/src -c -o lib/obj/$$(basename $$f .c).o $$f || exit 1; done
	$(CC) -shared -pthread -o lib/libmpi.so lib/obj/*.o -Llib -lrvma '-Wl,-rpath,$$ORIGIN'
	rm -f lib/libmpi.a && ar rcs lib/libmpi.a lib/obj/*.o

rvma_pc = sed -e 's|@PREFIX@|$(1)|' -e 's|@LIBDIR@|$(2)|' -e 's|@INCLUDEDIR@|$(3)|' -e 's|@VERSION@|$(RVMA_VERSION)|' capi/rvma.pc.in

install: lib
	install -d $(DESTDIR)$(LIBDIR)/pkgconfig $(DESTDIR)$(INCLUDEDIR)
	install -m 0755 lib/librvma.so $(DESTDIR)$(LIBDIR)/
	install -m 0644 lib/librvma.a $(DESTDIR)$(LIBDIR)/
	install -m 0644 capi/include/rvma.h $(DESTDIR)$(INCLUDEDIR)/
	$(call rvma_pc,$(PREFIX),$(LIBDIR),$(INCLUDEDIR)) > $(DESTDIR)$(LIBDIR)/pkgconfig/rvma.pc
	install -d $(DESTDIR)$(BINDIR)
	install -m 0755 lib/libmpi.so $(DESTDIR)$(LIBDIR)/
	install -m 0644 lib/libmpi.a $(DESTDIR)$(LIBDIR)/
	install -m 0644 mpi/include/mpi.h mpi/include/mpix_rvma.h $(DESTDIR)$(INCLUDEDIR)/
	install -m 0755 mpi/rvmacc $(DESTDIR)$(BINDIR)/

# What the C API adds per call over the Go API: the same loops in C and
# in Go, 2 ranks on shm, alternating runs (docs: capi/bench/overhead.c).
perf-capi:
	RVMA_CAPI_BENCH=1 $(GO) test -count=1 -run TestOverhead -v -timeout 20m ./capi

# The engine's locking rules checked as the suites run: verbs, progress and
# rma built with -tags rvmadebug (internal/lockcheck), where a broken rule
# panics instead of deadlocking. -short: the conformance suite at 2 and 5
# ranks, not every size (the race run above takes every size; the lock
# rules do not depend on it). Three to six minutes on two cores.
DEBUG_TEST = $(GO) test -tags rvmadebug -short -count=1 -timeout 14m ./internal/lockcheck/ ./verbs/ ./internal/progress/ ./rma/

# The tests that count allocations assert only without the race detector
# (its pools drop objects) and the debug build (its lock records allocate).
NOALLOC_TEST = $(GO) test -count=1 -run NoAlloc ./verbs/ ./rma/

# The README's test command; .ci/run runs exactly this.
test:
	$(GO) vet ./...
	$(GO) test -race -count=1 -timeout 14m ./...
	$(DEBUG_TEST)
	$(NOALLOC_TEST)

test-debug:
	$(DEBUG_TEST)

# The rma conformance suite with many seeds, and its lossy variants at
# every size (tens of minutes).
soak:
	RVMA_CONFORM_ROUNDS=$${RVMA_CONFORM_ROUNDS:-20} $(GO) test -race -count=1 -timeout 2h -run TestConformance ./rma/

# What one connected peer costs a rank (resident memory), udp and shm.
perf-mem:
	RVMA_MEMPEER=1 $(GO) test -count=1 -run TestMemoryPerPeer -v ./rma/

# Jobs of many ranks: 1024 as goroutines of one process, 256 processes of
# putwin and halo3d under rvmarun on each provider.
perf-scale:
	RVMA_RANKS=1024 $(GO) test -count=1 -timeout 20m -run TestManyRanks -v ./rma/
	$(GO) build -o bin/rvmarun ./cmd/rvmarun
	$(GO) build -o bin/putwin ./examples/putwin
	$(GO) build -o bin/halo3d ./examples/halo3d
	for p in udp shm auto; do time bin/rvmarun -n 256 --provider $$p bin/putwin | tail -1; done
	for p in udp shm auto; do time bin/rvmarun -n 256 --provider $$p bin/halo3d -n 8 --iters 20 --warmup 2 --serial=false; done

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
	$(GO) vet -tags rvmadebug ./internal/lockcheck/ ./verbs/... ./internal/progress/ ./rma/
	$(STATICCHECK) ./...
	$(GO) run ./scripts/layers
	# The library's portable paths (udpfab's one-datagram socket, no shm)
	# still build where Linux's system calls are missing.
	GOOS=darwin $(GO) build ./verbs/... ./rma/... ./mailbox/... ./epoch/... ./multipath/... ./reliability/...

# The main demo: four ranks over UDP on loopback, halo3d's variants side by
# side, checksums checked against a serial run.
demo:
	$(GO) build -o bin/rvmarun ./cmd/rvmarun
	$(GO) build -o bin/halo3d ./examples/halo3d
	bin/rvmarun -n 4 bin/halo3d

# The verbs demo (one connected QP pair: WRITE, READ, atomics).
demo-verbs:
	$(GO) run ./examples/verbsdemo

# A file across an emulated long-haul link: linkem at 25 ms RTT, 500 Mbit/s
# and 1% loss, haul with the model choosing the repair.
demo-haul:
	scripts/demo-haul.sh

# The reliability figures: haul through linkem for each loss rate and
# scheme (about three minutes); a table and docs/img/haul_loss.svg; then
# auto against forced sr and ec at 0.5, 1 and 2 bandwidth-delay products
# and far larger (25 and 100 ms RTT, three seeds a cell: about ten
# minutes); --rate auto against --rate at the link's rate (about three
# minutes); the unpaced run over loopback, 1 GiB, with CPU per GiB
# (about two minutes); haul against a QUIC transfer (tools/quicpeer) at
# 25 and 100 ms RTT, loss 0 and 1e-3 (about two minutes).
perf-haul:
	scripts/haul-matrix.sh 256 docs/img/haul_loss.svg
	scripts/haul-bdp.sh 3
	scripts/haul-auto.sh 3
	scripts/haul-unpaced.sh 1024 3
	scripts/haul-vs-quic.sh 3 32

# haul over one path, then two, each its own linkem (25 ms RTT, 1e-3 loss).
perf-haul-paths:
	scripts/haul-paths.sh 128 250mbit 250mbit 0.001
	scripts/haul-paths.sh 128 100mbit 400mbit 0.001

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

# The shm figures of docs/PERFORMANCE.md: two processes of this host.
perf-shm:
	$(GO) build -o bin/rvma-perf ./cmd/rvma-perf
	bin/rvma-perf write_lat --provider shm --size 8 --vs shm_pingpong --reps 3 --json
	bin/rvma-perf write_bw --provider shm --size 4194304 --vs memcpy --reps 3 --json
	bin/rvma-perf put_notify_lat --provider shm --size 8 --bind --json
	for t in write_ack_lat read_lat atomic_lat send_lat; do bin/rvma-perf $$t --provider shm --size 8 --json; done
	for s in 65536 4194304; do bin/rvma-perf put_bw --provider shm --size $$s --json; done

# The rma figures of docs/PERFORMANCE.md (halo3d and the rma layer against
# the mailbox layer).
perf-rma:
	$(GO) build -o bin/rvma-perf ./cmd/rvma-perf
	$(GO) build -o bin/rvmarun ./cmd/rvmarun
	$(GO) build -o bin/halo3d ./examples/halo3d
	bin/rvma-perf rma_put_lat --provider udp --size 8 --vs put_notify_lat --reps 5 --json
	bin/rvma-perf rma_put_bw --provider udp --size 1048576 --vs put_bw --reps 5 --json
	for n in 2 4 8; do bin/rvmarun -n $$n bin/halo3d --exchange-only --serial=false --json; bin/rvmarun -n $$n bin/halo3d --json; done

# rvma's MPI-style rma tests against the same tests written with MPI
# (bench/mpi), MPICH and Open MPI, 2 ranks bound to cores, shm and the
# network path, alternating runs (RUNS=5): medians and rvma/MPI ratios.
perf-rma-mpi:
	scripts/rma-vs-mpi.sh

# halo3d against the same program written with MPI (bench/mpi/halo3d.c),
# MPICH and Open MPI, 4 ranks, alternating runs (RUNS=5): medians and
# rvma/MPI ratios per variant; fails if a checksum differs.
perf-halo-mpi:
	scripts/halo3d-vs-mpi.sh

clean:
	rm -rf bin lib
