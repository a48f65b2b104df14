# rdmafs build, test and benchmark targets. `make help` lists them.

GO          ?= go
STATICCHECK ?= honnef.co/go/tools/cmd/staticcheck@v0.8.2
FUZZTIME    ?= 10s
# Integration tests boot a qemu guest per test binary; one package at a
# time keeps two guests from competing for the machine's two cores.
TESTFLAGS   ?= -count=1 -p 1 -timeout 60m
BIN         := bin/rdmafs

.PHONY: all help build test test-guest-rdma unit fuzz bench bench-mount bench-v42 bench-kernel soak xfstests lint deps deps-packages demo demo-stop clean

all: build

help:
	@echo "make build   build $(BIN)"
	@echo "make test    make deps, then unit and integration tests (starts knfsd in qemu and nfs-ganesha), fuse and cmd/rdmafs again over FUSE-over-io_uring, then test-guest-rdma"
	@echo "make test-guest-rdma  rdma-core provider inside the knfsd guest over siw and rxe: verbs conformance, knfsd mounts, interop (~2-4 min)"
	@echo "make unit    unit tests only (go test -short)"
	@echo "make fuzz    run every fuzz target for FUZZTIME (default $(FUZZTIME))"
	@echo "make bench   data-path benchmarks"
	@echo "make bench-mount  fio through rdmafs vs a go-fuse loopback (KNFSD=1: also rdma vs tcp on knfsd; RELAY=1: rdma-relay vs tcp-relay on ganesha; NCONNECT=1: nconnect=1, 2, 4 over tcp and an rdma relay; SIZE, ROUNDS; EXPORT=disk: ganesha on the disk, not tmpfs)"
	@echo "make bench-kernel  rdmafs vs the Linux kernel NFS client in the knfsd guest, over tcp, siw and rxe: time ratios and RPCs per entry (TRANSPORTS, ROUNDS, SIZE; see scripts/bench-kernel.sh)"
	@echo "make bench-v42  NFSv4.2 COPY vs read/write copy on knfsd, sparse (SEEK) vs dense read on ganesha; medians of alternating rounds (SIZE, ROUNDS, PROTOS; see scripts/bench-v42.sh)"
	@echo "make soak    data-verification soak on each server and transport (DURATION=30m, PEERS, PARALLEL=1, CUT=60s, RESTART_CMD; see scripts/soak.sh)"
	@echo "make xfstests XFSTESTS_DIR=/path/to/built/xfstests [TESTS='-g quick'] [SERVER=ganesha|knfsd-rdma|knfsd-tcp]  xfstests on an rdmafs mount (docs/xfstests.md)"
	@echo "make lint    gofmt, go vet, staticcheck"
	@echo "make deps    install the Debian packages the tests need and build the knfsd guest"
	@echo "make demo    start knfsd, mount it over RPC-over-RDMA at ./mnt and show it working"
	@echo "make demo-stop  unmount ./mnt and stop the knfsd guest"

build:
	$(GO) build -o $(BIN) ./cmd/rdmafs

# The rdma-core suite (build tag guestrdma): the verbs conformance suite,
# the cgo-built rdmafs against knfsd and the interop with the pure-Go
# provider, inside the knfsd guest over siw0 and rxe0 (a few minutes
# under qemu's software emulation).
GUEST_RDMA  = $(GO) test -tags guestrdma -count=1 -timeout 30m -run '^TestKnfsdGuestRxeSiw$$' ./verbs/ibverbs

# The packages that mount, again, with every mount served over
# FUSE-over-io_uring (RDMAFS_URING=on: fuse.Options.URing, -o uring);
# make deps turns the kernel's enable_uring on.
URING_PASS  = RDMAFS_URING=on $(GO) test $(TESTFLAGS) ./fuse/... ./cmd/rdmafs/

# deps first: on a bare machine the ganesha and knfsd tests need it; once
# everything is installed and the guest is cached it takes a second.
# Then every package, the mounting ones again over io_uring, then the
# rdma-core suite.
test: deps build
	$(GO) test $(TESTFLAGS) ./...
	$(URING_PASS)
	$(GUEST_RDMA)

# The rdma-core suite alone.
test-guest-rdma: deps
	$(GUEST_RDMA)

unit:
	$(GO) test -short -count=1 ./...

# Every FuzzXxx in the module, each for FUZZTIME.
fuzz:
	@set -e; for pkg in $$($(GO) list ./...); do \
	  for f in $$($(GO) test -list '^Fuzz' $$pkg | grep '^Fuzz' || true); do \
	    echo "== $$pkg $$f ($(FUZZTIME))"; \
	    $(GO) test -run '^$$' -fuzz "^$$f$$" -fuzztime $(FUZZTIME) $$pkg; \
	  done; \
	done

bench:
	$(GO) test -run '^$$' -bench . -benchmem -count=1 ./...

bench-mount:
	scripts/bench-mount.sh

bench-v42:
	scripts/bench-v42.sh

bench-kernel:
	scripts/bench-kernel.sh

# The long data-verification run; make test runs it for 20 s per peer.
soak: deps build
	DURATION=$(or $(DURATION),30m) scripts/soak.sh

# xfstests (not part of rdmafs: build it yourself) against an rdmafs
# mount of a server started for the run; see docs/xfstests.md.
TESTS  ?= -g quick
SERVER ?= ganesha
xfstests: build
	@[ -n "$(XFSTESTS_DIR)" ] || { echo "make xfstests: set XFSTESTS_DIR to a built xfstests tree (docs/xfstests.md)"; exit 1; }
	XFSTESTS_DIR="$(XFSTESTS_DIR)" SERVER="$(SERVER)" RDMAFS_BIN=$(BIN) scripts/xfstests.sh $(TESTS)

# vet and staticcheck compile verbs/ibverbs, whose cgo needs rdma-core's
# headers: install the packages first (without building the guest).
lint: deps-packages
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi
	$(GO) vet ./...
	$(GO) run $(STATICCHECK) ./...

deps:
	scripts/deps.sh

deps-packages:
	DEPS_SKIP_KPEER=1 scripts/deps.sh

demo: deps build
	scripts/demo.sh

demo-stop:
	scripts/demo.sh stop

clean:
	rm -rf bin
