# rdmafs build, test and benchmark targets. `make help` lists them.

GO          ?= go
STATICCHECK ?= honnef.co/go/tools/cmd/staticcheck@v0.8.2
FUZZTIME    ?= 10s
# Integration tests boot a qemu guest per test binary; one package at a
# time keeps two guests from competing for the machine's two cores.
TESTFLAGS   ?= -count=1 -p 1 -timeout 60m
BIN         := bin/rdmafs

.PHONY: all help build test test-guest-rdma unit fuzz bench bench-mount soak lint deps demo demo-stop clean

all: build

help:
	@echo "make build   build $(BIN)"
	@echo "make test    make deps, then unit and integration tests (starts knfsd in qemu and nfs-ganesha)"
	@echo "make test-guest-rdma  rdmafs on rdma-core inside the knfsd guest over siw and rxe (~4 min)"
	@echo "make unit    unit tests only (go test -short)"
	@echo "make fuzz    run every fuzz target for FUZZTIME (default $(FUZZTIME))"
	@echo "make bench   data-path benchmarks"
	@echo "make bench-mount  fio through rdmafs vs a go-fuse loopback (KNFSD=1: also rdma vs tcp on knfsd; SIZE, ROUNDS)"
	@echo "make soak    data-verification soak on each server and transport (DURATION=30m, PEERS, PARALLEL=1, CUT=60s, RESTART_CMD; see scripts/soak.sh)"
	@echo "make lint    gofmt, go vet, staticcheck"
	@echo "make deps    install the Debian packages the tests need and build the knfsd guest"
	@echo "make demo    start knfsd, mount it over RPC-over-RDMA at ./mnt and show it working"
	@echo "make demo-stop  unmount ./mnt and stop the knfsd guest"

build:
	$(GO) build -o $(BIN) ./cmd/rdmafs

# deps first: on a bare machine the ganesha and knfsd tests need it; once
# everything is installed and the guest is cached it takes a second.
test: deps build
	$(GO) test $(TESTFLAGS) ./...

# A separate suite (build tag guestrdma): it runs the cgo-built rdmafs
# inside the knfsd guest over siw0 and rxe0, all under qemu's software
# emulation, which takes a few minutes.
test-guest-rdma: deps
	$(GO) test -tags guestrdma -count=1 -timeout 30m -run TestKnfsdGuestRxeSiw ./verbs/ibverbs

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

# The long data-verification run; make test runs it for 20 s per peer.
soak: deps build
	DURATION=$(or $(DURATION),30m) scripts/soak.sh

lint:
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi
	$(GO) vet ./...
	$(GO) run $(STATICCHECK) ./...

deps:
	scripts/deps.sh

demo: deps build
	scripts/demo.sh

demo-stop:
	scripts/demo.sh stop

clean:
	rm -rf bin
