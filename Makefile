# gradcomp — make test installs what the tests need, then runs every test.
SHELL := /bin/bash
export PATH := /usr/local/go/bin:$(PATH)
GO ?= go
# Fuzz targets run briefly on every `make test`; `make fuzz FUZZTIME=1000000x`
# for longer. The budget is a count, not a duration: Go 1.26's fuzz
# coordinator can fail a clean run with "context deadline exceeded" when a
# duration expires under CPU contention (go.dev/issue/75804, fixed in 1.27).
FUZZTIME ?= 20000x
FUZZ_TARGETS := $(shell grep -ho '^func Fuzz[A-Za-z0-9_]*' compress/*_test.go 2>/dev/null | sed 's/func //')

.PHONY: test setup setup-check vet unit capi plugin wheel pytest purego race fuzz arm64 x86-32 avx512 bench gobench cuda gpu-binaries

# SUMMARY collects one line per part that says how it ran: each torch's
# test counts (pytest), where the cross-built tests ran (arm64, x86-32,
# avx512) and, plainly, what did NOT run on this machine and why. make
# test prints it at the end, passed or failed; a target made on its own
# prints its lines as it goes.
SUMMARY ?= /dev/null

# setup first, then the rest in a make that reads this file again: what
# setup installs (cuda.h, qemu) is probed when the Makefile is read, and a
# fresh machine has none of it before setup runs.
TEST_PARTS := setup-check vet unit capi pytest purego race fuzz arm64 x86-32 avx512 cuda
test: setup
	@mkdir -p build; sum=$$(mktemp build/summary.XXXXXX); \
	  $(MAKE) SUMMARY=$$sum $(TEST_PARTS); rc=$$?; \
	  echo; if [ $$rc = 0 ]; then echo "make test: passed"; else echo "make test: FAILED (exit $$rc)"; fi; \
	  cat $$sum; rm -f $$sum; exit $$rc

setup:
	./scripts/setup

# scripts/apt-components (what setup runs to enable contrib and non-free)
# on made-up /etc trees of both source formats.
setup-check:
	./scripts/apt-components-test

# gofmt, then go vet: everything, and compress again for arm64 and 386
# (asmdecl checks each assembly frame against its Go declaration) and
# with its purego twins.
vet:
	@unformatted=$$(gofmt -l $$(git ls-files '*.go')); \
	  if [ -n "$$unformatted" ]; then echo "gofmt needed: $$unformatted"; exit 1; fi
	$(GO) vet ./...
	$(GO) vet -tags fakegpu ./plugin
	GOARCH=arm64 CGO_ENABLED=0 $(GO) vet ./compress
	GOARCH=386 CGO_ENABLED=0 $(GO) vet ./compress
	$(GO) vet -tags purego ./compress

unit:
	$(GO) test -count=1 ./...
	$(GO) test -count=1 -tags fakegpu ./plugin
	$(GO) vet -tags mpi ./...
	$(GO) test -count=1 -tags mpi ./comm/... ./overlap/... ./train/... ./netbench/... ./cmd/...

# libgradcomp.so, the C ABI (plugin/include/gradcomp.h), and, where the
# CUDA headers are (cuda.h, from nvidia-cuda-toolkit), libgradcomp_cuda.so
# (-tags cuda: the device calls; links libcuda.so.1), both copied next to
# the Python package.
# The copies are renamed into place, never rewritten: a test that has the
# previous library loaded (another make, running beside this one) keeps
# its mapping instead of crashing on a truncated file.
HAVE_CUDA_H := $(shell $(CC) -E -include cuda.h -x c /dev/null >/dev/null 2>&1 && echo yes)
PKGDIR := plugin/python/gradcomp
plugin: mocknccl
	mkdir -p build $(PKGDIR)
	$(GO) build -buildmode=c-shared -o build/libgradcomp.so ./plugin
	cp build/libgradcomp.so $(PKGDIR)/.new-$$$$.so && mv -f $(PKGDIR)/.new-$$$$.so $(PKGDIR)/libgradcomp.so
	$(GO) build -tags fakegpu -buildmode=c-shared -o build/libgradcomp_fake.so ./plugin
	cp build/libgradcomp_fake.so $(PKGDIR)/.new-$$$$.so && mv -f $(PKGDIR)/.new-$$$$.so $(PKGDIR)/libgradcomp_fake.so
ifeq ($(HAVE_CUDA_H),yes)
	$(GO) build -tags cuda -buildmode=c-shared -o build/libgradcomp_cuda.so ./plugin
	cp build/libgradcomp_cuda.so $(PKGDIR)/.new-$$$$.so && mv -f $(PKGDIR)/.new-$$$$.so $(PKGDIR)/libgradcomp_cuda.so
else
	@echo "make plugin: cuda.h not found: libgradcomp_cuda.so not built (scripts/setup installs nvidia-cuda-toolkit)"
endif

# The Python package as a wheel for machines without Go:
# build/wheel/gradcomp-<version>-py3-none-<platform>.whl, holding
# libgradcomp.so and, where cuda.h is, libgradcomp_cuda.so (never the
# fake-device library). pip runs plugin/python/setup.py, whose build hook
# builds them with GO (go build -trimpath) into the wheel; WHEEL_PYTHON's
# own setuptools and wheel build it (--no-build-isolation: no package
# index; Debian's python3-setuptools and python3-wheel). setuptools'
# build directory, plugin/python/build, starts empty, so nothing of an
# earlier build goes in. The platform tag, not manylinux:
# libgradcomp_cuda.so needs libcuda.so.1, which no manylinux policy
# allows, and the wheel is for this platform's machines, not for PyPI.
# tests/python/test_install.py installs it where there is no Go.
WHEEL_PYTHON ?= /usr/bin/python3
wheel:
	rm -rf build/wheel plugin/python/build
	GO=$(GO) $(WHEEL_PYTHON) -m pip wheel --no-deps --no-build-isolation --disable-pip-version-check -w build/wheel ./plugin/python
	@ls build/wheel/*.whl

# The Python package (plugin/python) under two torches: Debian's
# python3-torch 1.13 (/usr/bin/python3) and torch 2.15 from PyPI in the
# virtual environment scripts/setup makes (TORCH_VENV; GRADCOMP_VENV
# moves it): the ctypes binding, the DDP hook on 4 gloo ranks, digits
# accuracy. Each run names its torch first and ends with its counts
# (scripts/pytest-torches). `make pytest PYTHON=...` runs one Python.
TORCH_VENV ?= $(or $(GRADCOMP_VENV),$(HOME)/.cache/gradcomp/torch-venv)
PYTHONS ?= /usr/bin/python3 $(TORCH_VENV)/bin/python
ifeq ($(origin PYTHON),command line)
PYTHONS := $(PYTHON)
endif
pytest: plugin
	GRADCOMP_SUMMARY=$(SUMMARY) ./scripts/pytest-torches $(PYTHONS)

# The mock libnccl.so.2 (internal/ncclmock/testdata: a test fixture, never
# installed) as a file, build/mocknccl/libnccl.so.2, for tests outside Go:
# Python ranks under torch load it as their NCCL. Built as ncclmock.Build
# builds it, and renamed into place like the plugin's copies.
MOCKNCCL_SRC := $(wildcard internal/ncclmock/testdata/*.c)
.PHONY: mocknccl
mocknccl:
	mkdir -p build/mocknccl
	$(CC) -O1 -shared -fPIC -Wl,-soname,libnccl.so.2 -o build/mocknccl/.new-$$$$.so $(MOCKNCCL_SRC) -lpthread -lrt \
	  && mv -f build/mocknccl/.new-$$$$.so build/mocknccl/libnccl.so.2

# The C programs that drive every function of the ABI, linked against
# build/libgradcomp.so (found through its rpath): capi_test (codecs,
# state, threads, leaks), capi_engine_test (the engine on 4 rank
# threads whose collectives it carries out itself, bit for bit against
# tests/golden, and the transport's bad inputs) and capi_outer_test (the
# outer loop on 2 rank threads: DiLoCo against a reference, the streaming
# schedule, resume, refused configurations). With libgradcomp_cuda.so,
# tests/capi/capi_cuda_test.c drives its device calls (its device tests
# say SKIPPED, with the driver's reason, without a GPU).
capi: plugin
	$(CC) -std=c11 -O2 -Wall -Wextra -Werror -pthread -Iplugin/include \
	  -o build/capi_test tests/capi/capi_test.c -Lbuild -lgradcomp -lm -Wl,-rpath,'$$ORIGIN'
	./build/capi_test
	$(CC) -std=c11 -O2 -Wall -Wextra -Werror -pthread -Iplugin/include \
	  -o build/capi_engine_test tests/capi/capi_engine_test.c -Lbuild -lgradcomp -lm -Wl,-rpath,'$$ORIGIN'
	./build/capi_engine_test
	$(CC) -std=c11 -O2 -Wall -Wextra -Werror -pthread -Iplugin/include \
	  -o build/capi_outer_test tests/capi/capi_outer_test.c -Lbuild -lgradcomp -lm -Wl,-rpath,'$$ORIGIN'
	./build/capi_outer_test
ifeq ($(HAVE_CUDA_H),yes)
	$(CC) -std=c11 -O2 -Wall -Wextra -Werror -pthread -Iplugin/include \
	  -o build/capi_cuda_test tests/capi/capi_cuda_test.c -Lbuild -lgradcomp_cuda -lcuda -lm -Wl,-rpath,'$$ORIGIN'
	./build/capi_cuda_test
endif

# The assembly kernels' pure-Go twins, on their own.
purego:
	$(GO) test -count=1 -tags purego ./compress/...

# The race detector slows the brute-force top-k comparisons ~20x; they run
# without it in `unit`, and nothing in them is concurrent beyond the runner.
race:
	$(GO) test -count=1 -race -short -skip 'TestTopKExactMatchesBruteForce|TestTopKSampledShortcut' ./compress/... ./bench/... ./cmd/... ./overlap/... ./comm/... ./train/... ./netbench/... ./plugin/...

# The cross targets below build their test binary (and vet it) always,
# then run it where this machine can: scripts/canrun builds a Go program
# that does nothing for the target and runs it, and says why it cannot
# (a kernel without IA-32 emulation: "exec format error"; an emulator that
# crashes at start). Where it cannot, the target says plainly that the
# tests did NOT run and why, into SUMMARY too, and succeeds: the build and
# vet still checked the code. PROBE_386 and PROBE_ARM64 replace the probe
# (e.g. `make x86-32 PROBE_386=false` shows the not-run path).

# The compress tests on arm64 (its NEON kernels, compared with the generic
# ones, and Go's arm64 code generation of the generic loops: fused
# multiply-adds are what the codecs' explicit float32 conversions forbid),
# cross-compiled and run under qemu-user (Debian's qemu-user-static), or
# directly where the kernel runs arm64 programs itself (an arm64 machine,
# or qemu registered with binfmt_misc). -short: the 256 MiB cases would
# take minutes under emulation. Then each fuzz target fuzzes for
# FUZZTIME_ARM64 inputs: go test's fuzzing execs the test binary again for
# its workers, which needs the kernel to run it (scripts/setup registers
# qemu with binfmt_misc where it can; elsewhere only the seed corpora run,
# in the tests, and this says so). About 3 minutes on 2 loaded cores.
QEMU_ARM64 := $(shell command -v qemu-aarch64-static || command -v qemu-aarch64)
FUZZTIME_ARM64 ?= 2000x
PROBE_ARM64 ?= ./scripts/canrun arm64
arm64:
	@mkdir -p build/arm64
	GOARCH=arm64 CGO_ENABLED=0 $(GO) vet ./compress ./compress/lowrank
	GOARCH=arm64 CGO_ENABLED=0 $(GO) test -c -o build/arm64/compress.test ./compress
	GOARCH=arm64 CGO_ENABLED=0 $(GO) test -c -o build/arm64/lowrank.test ./compress/lowrank
	@direct=yes; why=$$($(PROBE_ARM64)) || direct=""; \
	  runner=""; how="directly (natively or through binfmt_misc)"; \
	  if [ -n "$(QEMU_ARM64)" ]; then \
	    if qwhy=$$($(PROBE_ARM64) $(QEMU_ARM64)); then runner="$(QEMU_ARM64)"; how="under $(notdir $(QEMU_ARM64))"; \
	    elif [ -z "$$direct" ]; then \
	      echo "make arm64: NOT RUN: $$qwhy; nor directly: $$why. build/arm64/compress.test was built and vetted; its tests did not run" | tee -a $(SUMMARY); exit 0; fi; \
	  elif [ -z "$$direct" ]; then \
	    echo "make arm64: NOT RUN: qemu-aarch64-static not found (scripts/setup installs qemu-user-static) and $$why. build/arm64/compress.test was built and vetted; its tests did not run" | tee -a $(SUMMARY); exit 0; \
	  fi; \
	  echo "cd compress && $$runner ../build/arm64/compress.test -test.short -test.count=1 -test.timeout=20m"; \
	  (cd compress && $$runner ../build/arm64/compress.test -test.short -test.count=1 -test.timeout=20m) || exit 1; \
	  echo "cd compress/lowrank && $$runner ../../build/arm64/lowrank.test -test.short -test.count=1 -test.timeout=20m"; \
	  (cd compress/lowrank && $$runner ../../build/arm64/lowrank.test -test.short -test.count=1 -test.timeout=20m) || exit 1; \
	  if [ -z "$$direct" ]; then \
	    echo "make arm64: compress tests passed $$how; fuzzing NOT RUN ($$why: go test -fuzz execs the test binary itself), seed corpora only" | tee -a $(SUMMARY); exit 0; \
	  fi; \
	  log=$$(mktemp build/arm64/fuzz.XXXXXX.log); \
	  for f in $(FUZZ_TARGETS); do \
	    echo "fuzz $$f on arm64 ($(FUZZTIME_ARM64))"; \
	    GOARCH=arm64 CGO_ENABLED=0 $(GO) test ./compress -run '^$$' -fuzz "^$$f$$" -fuzztime $(FUZZTIME_ARM64) >$$log 2>&1 \
	      || { cat $$log; rm -f $$log; exit 1; }; \
	  done; rm -f $$log; \
	  echo "make arm64: compress tests passed $$how; each fuzz target fuzzed $(FUZZTIME_ARM64)" | tee -a $(SUMMARY)

# The compress tests as a 32-bit x86 program (GOARCH=386: generic kernels,
# a 32-bit int, so payload counts near MaxElements must not wrap), run
# natively where the kernel runs 32-bit programs. Some kernels do not
# (exec format error): Debian's qemu-i386-static is no way out there, it
# crashes a Go 386 binary at start, so the tests do not run and this says
# so. Go fuzzes only amd64 and arm64; here the seed corpora run.
PROBE_386 ?= ./scripts/canrun 386
x86-32:
	@mkdir -p build/386
	GOARCH=386 CGO_ENABLED=0 $(GO) vet ./compress ./compress/lowrank
	GOARCH=386 CGO_ENABLED=0 $(GO) test -c -o build/386/compress.test ./compress
	GOARCH=386 CGO_ENABLED=0 $(GO) test -c -o build/386/lowrank.test ./compress/lowrank
	@if why=$$($(PROBE_386)); then \
	  echo "cd compress && ../build/386/compress.test -test.short -test.count=1 -test.timeout=10m"; \
	  (cd compress && ../build/386/compress.test -test.short -test.count=1 -test.timeout=10m) || exit 1; \
	  (cd compress/lowrank && ../../build/386/lowrank.test -test.short -test.count=1 -test.timeout=10m) || exit 1; \
	  echo "make x86-32: compress tests passed as a 32-bit x86 program" | tee -a $(SUMMARY); \
	else \
	  echo "make x86-32: NOT RUN: $${why:-the probe failed}. build/386/compress.test was built and vetted; its tests did not run" | tee -a $(SUMMARY); \
	fi

# The compress tests on an AVX-512 CPU: natively where this one has
# AVX-512, else emulated: scripts/emu-avx512 boots Debian's kernel under
# Bochs (corei7_skylake_x: AVX-512 F/CD/BW/DQ/VL) and runs the test binary
# there, -short, the tests in AVX512_RUN. Bochs interprets every
# instruction, floating point in software: about 65 s in all, 27 s of it
# the boot (TestQuantClamp alone would take over 7 minutes: 1.3 s
# natively). The kernel is downloaded once (apt-get download) into
# EMU_CACHE, shared by every clone. The test binary is built always; where
# Bochs is missing, or the emulator cannot boot (exit 125: no kernel, no
# network to fetch it, ...), this says the tests did NOT run and why.
# AVX512_NATIVE=no emulates even on an AVX-512 CPU.
AVX512_NATIVE ?= yes
AVX512_RUN ?= TestKernels|TestQuantRun|TestQuantClampInKernel
AVX512_TIMEOUT ?= 900
export EMU_CACHE ?= $(HOME)/.cache/gradcomp/emu
HAVE_BOCHS := $(shell command -v bochs-bin >/dev/null 2>&1 && command -v xorriso >/dev/null 2>&1 && \
  [ -f /usr/lib/ISOLINUX/isolinux.bin ] && [ -f /usr/lib/x86_64-linux-gnu/bochs/plugins/libbx_term_gui.so ] && echo yes)
avx512:
	@mkdir -p build/emu
	CGO_ENABLED=0 $(GO) test -c -o build/emu/compress.test ./compress
	@if [ "$(AVX512_NATIVE)" != no ] && grep -qw avx512f /proc/cpuinfo; then \
	  echo "cd compress && ../build/emu/compress.test -test.short -test.v -test.run '$(AVX512_RUN)'"; \
	  (cd compress && ../build/emu/compress.test -test.short -test.v -test.run '$(AVX512_RUN)') || exit 1; \
	  echo "make avx512: the AVX-512 tests passed natively (this CPU has AVX-512)" | tee -a $(SUMMARY); \
	elif [ "$(HAVE_BOCHS)" != yes ]; then \
	  echo "make avx512: NOT RUN: this CPU has no AVX-512 and bochs, bochs-term, xorriso or isolinux is missing (scripts/setup installs them). build/emu/compress.test was built; its tests did not run" | tee -a $(SUMMARY); \
	else \
	  log=$$(mktemp build/emu/avx512.XXXXXX.log); \
	  echo "./scripts/emu-avx512 -timeout $(AVX512_TIMEOUT) -dir compress build/emu/compress.test -test.short -test.v -test.run '$(AVX512_RUN)'"; \
	  ./scripts/emu-avx512 -timeout $(AVX512_TIMEOUT) -dir compress build/emu/compress.test -test.short -test.v -test.run '$(AVX512_RUN)' 2>&1 | tee $$log; \
	  rc=$${PIPESTATUS[0]}; why=$$(grep '^emu-avx512:' $$log | tail -n 1); rm -f $$log; \
	  case $$rc in \
	  0) echo "make avx512: the AVX-512 tests passed under Bochs (corei7_skylake_x)" | tee -a $(SUMMARY) ;; \
	  125) echo "make avx512: NOT RUN: the emulator could not run the tests ($${why:-exit 125}). build/emu/compress.test was built; its tests did not run" | tee -a $(SUMMARY) ;; \
	  *) exit $$rc ;; \
	  esac; \
	fi

fuzz:
	@mkdir -p build; log=$$(mktemp build/fuzz.XXXXXX.log); \
	for f in $(FUZZ_TARGETS); do \
	  echo "fuzz $$f ($(FUZZTIME))"; \
	  $(GO) test ./compress -run '^$$' -fuzz "^$$f$$" -fuzztime $(FUZZTIME) >$$log 2>&1 \
	    || { cat $$log; rm -f $$log; exit 1; }; \
	done; rm -f $$log

# The main job: compressor benchmark on the CPU (see README).
bench:
	$(GO) run ./cmd/gradcomp bench

# Go benchmarks of every compressor against memcpy of the same bytes.
gobench:
	$(GO) test ./compress -run '^$$' -bench . -benchtime 3x

# CUDA (kernels/, -tags cuda), checked without a GPU: the committed PTX must
# be what `go generate` makes from kernels/cuda/*.cu with this nvcc, the
# cuda-tagged code must vet, and its test binaries must build and link
# against the CUDA driver library. (They run on a GPU machine: gpu-binaries.)
CUDA_TEST_PKGS := ./kernels ./plugin ./overlap
cuda:
	@command -v nvcc >/dev/null || { echo "make cuda: nvcc not found (scripts/setup installs nvidia-cuda-toolkit)"; exit 1; }
	$(GO) generate ./kernels
	@stale=$$(git status --porcelain -- kernels/ptx); \
	  if [ -n "$$stale" ]; then echo "make cuda: committed PTX is stale, commit the regenerated files:"; echo "$$stale"; exit 1; fi
	$(GO) vet -tags cuda ./...
	@mkdir -p build/cuda-check
	$(GO) test -c -tags cuda -o build/cuda-check/ $(CUDA_TEST_PKGS)
	set -o pipefail; ./build/cuda-check/kernels.test -test.run 'TestDevice|TestPlans' -test.v | grep -E '^(--- |ok|PASS|FAIL)'
	set -o pipefail; ./build/cuda-check/plugin.test -test.run 'TestDevice|TestGPU' -test.v | grep -E '^(--- |ok|PASS|FAIL)'
	set -o pipefail; ./build/cuda-check/overlap.test -test.run 'TestDeviceEngine' -test.v | grep -E '^(--- |ok|PASS|FAIL)'

# What scripts/gpu-check runs on the GPU machine (no Go there): carry build/gpu.
# The plugin's pieces: both libraries (the CPU one is the reference of
# scripts/gpu-plugin-check.py), its Go device tests and the C device test.
gpu-binaries: plugin
	@mkdir -p build/gpu
	$(GO) test -c -tags cuda -o build/gpu/kernels.test ./kernels
	$(GO) test -c -tags cuda -o build/gpu/overlap.test ./overlap
	$(GO) test -c -tags cuda -o build/gpu/plugin.test ./plugin
	$(GO) test -c -o build/gpu/compress.test ./compress
	cp build/libgradcomp.so build/libgradcomp_cuda.so build/gpu/
	$(CC) -std=c11 -O2 -Wall -Wextra -Werror -pthread -Iplugin/include \
	  -o build/gpu/capi_cuda_test tests/capi/capi_cuda_test.c -Lbuild/gpu -lgradcomp_cuda -lcuda -lm -Wl,-rpath,'$$ORIGIN'
	@ls -l build/gpu
