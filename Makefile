# trainq — build, test, run.
#   make            build build/trainq (CPU backend; CUDA backend: see CUDA= below)
#   make test       install missing packages, build, run every test (what CI runs)
#   make run        install missing packages, build, start the daemon in the foreground (./var)
#   make docs       regenerate docs/spec.md and the man page docs/trainq.1 (train/spec.c's field table)
#   make CUDA=0|1   force the CUDA backend off / on (default: on when nvcc is found)
#   make CUDA_ARCH=sm_90   build machine code for one GPU only (fast local builds)

CC      ?= cc
# `make` alone builds `all`, whatever rule comes first below (the dashboard's generated file did)
.DEFAULT_GOAL := all
# ---- SANITIZE=1: AddressSanitizer + UBSan build (own dir, CPU only) -------------------------
#   make SANITIZE=1 unit        unit tests under ASan/UBSan in build-san/
#   TRAINQ_BIN=$$PWD/build-san/trainq pytest tests/integration   the daemon under ASan/UBSan
# nvcc objects are not instrumented, so the CUDA backend is forced off; the default BUILD is
# build-san so sanitized objects never mix with the normal build's.
SANITIZE ?= 0
ifeq ($(SANITIZE),1)
  BUILD   ?= build-san
  override CUDA := 0
  # TQ_NO_UNROLL: the vector kernels without their unroll pragmas (kernels/cpu/cpu_wino.c), which
  # cost their file minutes of compilation under the sanitizers and change no result
  SAN_FLAGS := -fsanitize=address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer \
               -DTQ_NO_UNROLL
endif
# ---- end of SANITIZE ------------------------------------------------------------------------
BUILD   ?= build
OPT     ?= -O2
CFLAGS  ?= $(OPT) -g
# -fno-trapping-math: nothing here reads the FP exception flags (inf/NaN are found by value), and
# without it GCC will not if-convert the 16-bit conversions' selects, so those loops stay scalar.
# It changes no result: no reassociation, no contraction, rounding as written.
# -fno-math-errno: nothing here reads errno after a math function (strtod's is read, which this
# does not touch); with it sqrtf is the sqrt instruction alone, so AdamW's loop vectorises. The
# same results: sqrt is exactly rounded either way.
# -mprefer-vector-width=512: the AVX-512 clones of the hot element-wise loops (target_clones in
# kernels/cpu) use zmm registers instead of GCC's default ymm: +2-6% on a 16-bit step, the same
# bits (those loops are element-wise; no reduction changes its order). The x86-64-v2 baseline
# has no 512-bit registers, so nothing else changes.
CFLAGS  += -std=c11 -D_GNU_SOURCE -Wall -Wextra -Wno-unused-parameter -Wshadow -fno-trapping-math \
           -fno-math-errno -fopenmp -march=x86-64-v2 -mtune=native -mprefer-vector-width=512 -I. -Ikernels -Itrain \
           $(SAN_FLAGS) $(EXTRA_CFLAGS)
LDLIBS  += -ldnnl -lopenblas -lsqlite3 -lcjson -lmicrohttpd -lcurl -lz -lm -lpthread -fopenmp $(SAN_FLAGS)
PYTHON  ?= /usr/bin/python3

# daemon/sched.c is pure (no processes): in the library, so that its unit test links it
LIB_SRC  := $(wildcard kernels/cpu/*.c) $(wildcard train/*.c) $(wildcard schema/*.c) $(wildcard api/*.c) \
            daemon/sched.c

# ---- the CUDA backend: built when nvcc is found (CUDA=auto), or forced with CUDA=0 / CUDA=1 ----
# Machine code for Turing..Blackwell plus PTX for the newest, so one binary runs on every card
# CUDA 13 supports; the CUDA runtime is linked statically, cuDNN and cuBLAS(Lt) dynamically.
CUDA ?= auto
NVCC ?= $(or $(shell command -v nvcc 2>/dev/null),$(wildcard /usr/local/cuda/bin/nvcc))
ifeq ($(CUDA),auto)
  override CUDA := $(if $(NVCC),1,0)
endif
ifeq ($(CUDA),1)
  ifeq ($(NVCC),)
    $(error CUDA=1 but nvcc was not found: put it on PATH or pass NVCC=/path/to/nvcc)
  endif
  CUDA_HOME ?= $(patsubst %/bin/nvcc,%,$(realpath $(NVCC)))
  CUDA_LIBDIR ?= $(firstword $(wildcard $(CUDA_HOME)/lib64 $(CUDA_HOME)/lib))
  ifdef CUDA_ARCH
    GENCODE := -arch=$(CUDA_ARCH)
  else
    GENCODE := $(foreach a,75 80 86 89 90 120,-gencode arch=compute_$(a),code=sm_$(a)) \
               -gencode arch=compute_120,code=compute_120
  endif
  NVCCFLAGS ?= -O3 -lineinfo
  NVCCFLAGS += -std=c++17 -I. -Ikernels -Itrain -I$(CUDA_HOME)/include $(GENCODE) \
               -Xcompiler -Wall,-Wno-unused-parameter,-fopenmp $(EXTRA_NVCCFLAGS)
  LIB_SRC  += $(wildcard kernels/cuda/*.c)
  CU_SRC   := $(wildcard kernels/cuda/*.cu)
  CFLAGS   += -I$(CUDA_HOME)/include
  LDLIBS   += -L$(CUDA_LIBDIR) -Wl,-rpath,$(CUDA_LIBDIR) -lcudnn \
              $(CUDA_LIBDIR)/libcudart_static.a -ldl -lrt -lstdc++
else ifeq ($(CUDA),0)
  LIB_SRC  += kernels/nocuda.c
  CU_SRC   :=
else
  $(error CUDA=$(CUDA): use CUDA=0, CUDA=1 or leave it unset (auto))
endif
# client/: the submit/ls/show/... commands, HTTP through libcurl only (DESIGN.md: "The client is a client")
CLIENT_SRC := $(wildcard client/*.c)
MAIN_SRC := $(filter-out daemon/sched.c,$(wildcard daemon/*.c)) $(CLIENT_SRC)
TEST_SRC := $(wildcard tests/unit/test_*.c)
ifneq ($(CUDA),1)
  TEST_SRC := $(filter-out tests/unit/test_cuda_%.c,$(TEST_SRC))
endif

LIB_OBJ  := $(LIB_SRC:%.c=$(BUILD)/obj/%.o) $(CU_SRC:%.cu=$(BUILD)/obj/%.o)
MAIN_OBJ := $(MAIN_SRC:%.c=$(BUILD)/obj/%.o)
TESTS    := $(TEST_SRC:tests/unit/%.c=$(BUILD)/tests/%)
LIB      := $(BUILD)/libtrainq.a

# Objects remember how they were built: $(BUILD)/config holds the CUDA setting and the compilers'
# flags (EXTRA_CFLAGS and the Makefile's own), is rewritten when make runs with other ones, and
# every object depends on it. So `make CUDA=0` and then `make test` in the same BUILD rebuild the
# objects instead of linking kernels/nocuda.o among the CUDA ones (undefined references to the
# CUDA backend), and a flag changed here (-fno-math-errno, say) reaches every object, not only
# those whose sources changed.
BUILD_CONFIG := CUDA=$(CUDA) CC=$(CC) CFLAGS=$(CFLAGS) NVCCFLAGS=$(NVCCFLAGS)
ifneq ($(file <$(BUILD)/config),$(BUILD_CONFIG))
  $(shell mkdir -p $(BUILD))
  $(file >$(BUILD)/config,$(BUILD_CONFIG))
endif

# ---- the dashboard (api/web/, served by api/web.c) ------------------------------------------
# scripts/embed-web compiles api/web/ and Debian's Chart.js (libjs-chart.js) into one C file;
# without that package the build still works and the page says why it draws no charts. It runs
# on every make (a file removed, the package installed later) and rewrites the C file only when
# its content changes, so nothing is recompiled for nothing.
CHARTJS   ?= $(firstword $(wildcard /usr/share/javascript/chart.js/chart.min.js))
WEB_CHART := $(if $(CHARTJS),--file /assets/chart.min.js=$(CHARTJS),\
               --missing "/assets/chart.min.js=no charts: this trainq was built without libjs-chart.js")
.PHONY: web-assets-check
$(BUILD)/gen/web_assets.c: web-assets-check
	@mkdir -p $(dir $@)
	@$(PYTHON) scripts/embed-web $@ api/web $(WEB_CHART)
$(BUILD)/gen/web_assets.o: $(BUILD)/gen/web_assets.c api/internal.h $(BUILD)/config
	$(CC) $(CFLAGS) -c $< -o $@
LIB_OBJ  += $(BUILD)/gen/web_assets.o
# ---- end of the dashboard -------------------------------------------------------------------

.PHONY: all deps test unit parity run clean bench bench-cpu
all: $(BUILD)/trainq $(BUILD)/gpu_ops

deps:
	@scripts/install-deps

$(BUILD)/obj/%.o: %.c $(BUILD)/config
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -MMD -MP -c $< -o $@

$(BUILD)/obj/%.o: %.cu $(BUILD)/config
	@mkdir -p $(dir $@)
	$(NVCC) $(NVCCFLAGS) -MMD -MP -c $< -o $@

$(LIB): $(LIB_OBJ)
	@mkdir -p $(dir $@)
	rm -f $@ && ar rcs $@ $^

$(BUILD)/trainq: $(MAIN_OBJ) $(LIB)
	$(CC) $(CFLAGS) -o $@ $(MAIN_OBJ) $(LIB) $(LDLIBS)

# every GPU op against the CPU op (scripts/gpu-check runs it on a machine with a GPU)
$(BUILD)/gpu_ops: tests/gpu/gpu_ops.c $(LIB)
	$(CC) $(CFLAGS) -o $@ $< $(LIB) $(LDLIBS)

# test_gpumem: daemon/gpumem.c against a stand-in NVML found through the binary's run path, as
# DT_RPATH (--disable-new-dtags): under ASan, dlopen is called from libasan's interceptor, and
# a DT_RUNPATH applies only to the object that calls it (make SANITIZE=1 test did not find it)
$(BUILD)/tests/stub/libnvidia-ml.so.1: tests/unit/stub/nvml_stub.c
	@mkdir -p $(dir $@)
	$(CC) -O1 -g -fPIC -shared -Wl,-soname,libnvidia-ml.so.1 -o $@ $<
$(BUILD)/tests/test_gpumem: tests/unit/test_gpumem.c daemon/gpumem.c daemon/gpumem.h $(BUILD)/tests/stub/libnvidia-ml.so.1
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -Idaemon -o $@ tests/unit/test_gpumem.c daemon/gpumem.c -ldl -lcmocka \
	    -Wl,--disable-new-dtags,-rpath,$(abspath $(BUILD)/tests/stub)

$(BUILD)/tests/%: tests/unit/%.c $(wildcard tests/unit/*.h) $(LIB)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -Itests/unit -o $@ $< $(LIB) $(LDLIBS) -lcmocka

# gpu_ops proves itself on every run: against a second CPU backend it must pass, and with one
# corrupted output it must fail (exit 1). Against the GPU it runs where one is present
# (exit 77, with the reason, where none is).
unit: $(TESTS) $(BUILD)/gpu_ops
	@set -e; for t in $(TESTS); do echo "== $$t"; CMOCKA_MESSAGE_OUTPUT=stdout $$t; done
	@echo "== $(BUILD)/tests/test_ops with TQ_CPU_DNNL=0 (the im2col convolutions oneDNN falls back to)"; \
	 TQ_CPU_DNNL=0 CMOCKA_MESSAGE_OUTPUT=stdout $(BUILD)/tests/test_ops
	@echo "== $(BUILD)/tests/test_ops with ONEDNN_MAX_CPU_ISA=AVX2 (an AVX2 CPU's oneDNN: bf16 convolutions in f32 chunks, 3x3 stride-1 ones by Winograd)"; \
	 ONEDNN_MAX_CPU_ISA=AVX2 CMOCKA_MESSAGE_OUTPUT=stdout $(BUILD)/tests/test_ops
	@echo "== $(BUILD)/gpu_ops --against cpu"; $(BUILD)/gpu_ops --against cpu
	@echo "== $(BUILD)/gpu_ops --against cpu --inject conv_fwd (must fail)"; \
	 rc=0; $(BUILD)/gpu_ops --against cpu --inject conv_fwd > $(BUILD)/gpu_ops.inject.log 2>&1 || rc=$$?; \
	 if [ $$rc -ne 1 ]; then cat $(BUILD)/gpu_ops.inject.log; \
	   echo "gpu_ops: an injected error was not caught (exit $$rc, expected 1)"; exit 1; fi; \
	 tail -n 1 $(BUILD)/gpu_ops.inject.log
	@echo "== $(BUILD)/gpu_ops (against the GPU)"; \
	 rc=0; $(BUILD)/gpu_ops || rc=$$?; \
	 if [ $$rc -ne 0 ] && [ $$rc -ne 77 ]; then exit $$rc; fi

parity: $(BUILD)/trainq
	$(PYTHON) -m pytest -q tests/parity tests/integration

# the build in parallel (one job per CPU): serial, it was 100 of CI's ~700 s on 2 cores
test: deps
	$(MAKE) -j$(shell nproc) all $(TESTS)
	$(MAKE) unit
	$(MAKE) -j2 fuzz-smoke FUZZ_SMOKE_TIME=20
	$(MAKE) parity

run: deps
	$(MAKE) all
	@mkdir -p var
	@echo "trainq: serving on http://127.0.0.1:8470 with the database var/trainq.db (Ctrl-C stops;" \
	      "try: curl --json @examples/default.json http://127.0.0.1:8470/v1/jobs)"
	exec $(BUILD)/trainq serve --db var/trainq.db

# the article's grid through the daemon, trainq next to PyTorch (~35 min on 2 cores with bench/.venv's
# PyTorch 2.x, whose CPU fp16 is slow; ~10 min with Debian's 1.13):
# rewrites docs/benchmarks.md's bench/run section, docs/img/bench-run-*.png, docs/bench-results.json
bench: deps
	$(MAKE) all
	TRAINQ=$(abspath $(BUILD))/trainq $(PYTHON) bench/run
# trainq vs PyTorch samples/s for cnn and resnet20 (bench/cpu; BATCH=, ROUNDS=)
bench-cpu: deps
	$(MAKE) all
	bench/cpu

clean:
	rm -rf $(BUILD)

# ---- docs: docs/spec.md and the man page docs/trainq.1 -----------------------------------------
# Generated from docs/spec.md.in and docs/trainq.1.in plus the spec parser's field table
# (train/spec.c: every field's type, default, range, meaning and example). tests/unit/test_spec
# fails when the committed files differ from what this writes: edit the templates or the table,
# then run `make docs`.
.PHONY: docs docs-check
$(BUILD)/gendocs: tools/gendocs.c $(LIB)
	$(CC) $(CFLAGS) -o $@ $< $(LIB) $(LDLIBS)
docs: $(BUILD)/gendocs
	$(BUILD)/gendocs --markdown docs/spec.md.in docs/spec.md
	$(BUILD)/gendocs --man docs/trainq.1.in docs/trainq.1
docs-check: $(BUILD)/gendocs
	$(BUILD)/gendocs --check --markdown docs/spec.md.in docs/spec.md
	$(BUILD)/gendocs --check --man docs/trainq.1.in docs/trainq.1
# ---- end of docs ---------------------------------------------------------------------------------

-include $(LIB_OBJ:.o=.d) $(MAIN_OBJ:.o=.d)

# ---- fuzzing (libFuzzer) ------------------------------------------------------------------
#   make fuzz            build every target of tests/fuzz/ and run each for FUZZ_TIME s (60)
#   make fuzz-smoke      run each over its seed corpus, then FUZZ_SMOKE_TIME s (15) of fuzzing;
#                        -j2 runs two targets at once
#   make fuzz-corpus     regenerate the seed corpora (tests/fuzz/make_corpus)
#   make fuzz-<target>   one target for FUZZ_TIME s, e.g. make fuzz-checkpoint FUZZ_TIME=600
# clang (Debian: clang, libclang-rt-14-dev for libFuzzer and the sanitizer runtimes, libomp-14-dev)
# builds the engine's C sources again with -fsanitize=fuzzer-no-link,address,undefined into
# $(BUILD)/fuzz/, CPU only (kernels/nocuda.c). New inputs a run finds go to
# $(BUILD)/fuzz/corpus/<target>/ (the committed seeds stay small); a crash is written to
# $(BUILD)/fuzz/crash/<target>-* and fails the make.
FUZZ_CC         ?= clang
FUZZ_TIME       ?= 60
FUZZ_SMOKE_TIME ?= 15
FUZZ_SAN        ?= -fsanitize=address,undefined -fno-sanitize-recover=undefined -fno-sanitize=function
FUZZ_CFLAGS     ?= -O1 -g -fno-omit-frame-pointer
FUZZ_CFLAGS     += -std=c11 -D_GNU_SOURCE -Wno-pass-failed -fopenmp -I. -Ikernels -Itrain -Itests/fuzz -DTQ_NO_UNROLL \
                   $(FUZZ_SAN)
FUZZ_LDLIBS     := -ldnnl -lopenblas -lcjson -lz -lm -lpthread -fopenmp
FUZZ_TARGETS    := $(patsubst tests/fuzz/fuzz_%.c,%,$(wildcard tests/fuzz/fuzz_*.c))
FUZZ_LIB_SRC    := $(wildcard kernels/cpu/*.c) $(wildcard train/*.c) kernels/nocuda.c
# the http target (fuzz_http.c) starts the API itself: schema/ and api/ (with the dashboard's
# generated assets) are in the library too; the other targets do not pull them in
FUZZ_LIB_SRC    += $(wildcard schema/*.c) $(wildcard api/*.c) $(if $(wildcard api/web.c),$(BUILD)/gen/web_assets.c)
FUZZ_LDLIBS_http := -lsqlite3 -lmicrohttpd
FUZZ_LIB_OBJ    := $(FUZZ_LIB_SRC:%.c=$(BUILD)/fuzz/obj/%.o)
FUZZ_BINS       := $(FUZZ_TARGETS:%=$(BUILD)/fuzz/fuzz_%)
# per-target libFuzzer options: the largest input (CIFAR needs whole 3073-byte records)
FUZZ_OPTS_cifar      := -max_len=16384
FUZZ_OPTS_checkpoint := -max_len=16384
FUZZ_OPTS_idx        := -max_len=4096
# http: one request (or a few pipelined) per input; -timeout above its own 5 s answer deadline
FUZZ_OPTS_http       := -max_len=8192 -timeout=30
# one thread everywhere: libFuzzer measures one process; OpenMP/OpenBLAS threads only add noise
FUZZ_ENV        := OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 ASAN_OPTIONS=detect_leaks=1:abort_on_error=0 \
                   UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1

.PHONY: fuzz fuzz-build fuzz-smoke fuzz-corpus
fuzz-build: $(FUZZ_BINS)

$(BUILD)/fuzz/obj/%.o: %.c
	@mkdir -p $(dir $@)
	$(FUZZ_CC) $(FUZZ_CFLAGS) -fsanitize=fuzzer-no-link -MMD -MP -c $< -o $@

$(BUILD)/fuzz/libtrainq-fuzz.a: $(FUZZ_LIB_OBJ)
	rm -f $@ && ar rcs $@ $^

$(BUILD)/fuzz/fuzz_%: tests/fuzz/fuzz_%.c $(BUILD)/fuzz/libtrainq-fuzz.a
	$(FUZZ_CC) $(FUZZ_CFLAGS) -fsanitize=fuzzer -MMD -MP -o $@ $< $(BUILD)/fuzz/libtrainq-fuzz.a $(FUZZ_LDLIBS) $(FUZZ_LDLIBS_$*)

# $(call fuzz_run,target,seconds,log): fuzz over a scratch corpus seeded from the committed one
define fuzz_run
	@mkdir -p $(BUILD)/fuzz/corpus/$(1) $(BUILD)/fuzz/crash
	@rc=0; $(FUZZ_ENV) $(BUILD)/fuzz/fuzz_$(1) $(FUZZ_OPTS_$(1)) -max_total_time=$(2) -print_final_stats=1 \
	    -artifact_prefix=$(BUILD)/fuzz/crash/$(1)- $(BUILD)/fuzz/corpus/$(1) tests/fuzz/corpus/$(1) \
	    > $(3) 2>&1 || rc=$$?; \
	 if [ $$rc -ne 0 ]; then tail -n 60 $(3); echo "== fuzz $(1): FAILED (exit $$rc; log $(3))"; exit 1; fi; \
	 echo "== fuzz $(1) ($(2) s): $$(grep -E '^#[0-9]+.*DONE' $(3) | tail -n 1 | tr -s ' \t' ' ')"
endef

fuzz: $(FUZZ_TARGETS:%=fuzz-%)
fuzz-smoke: $(FUZZ_TARGETS:%=fuzz-smoke-%)

fuzz-%: $(BUILD)/fuzz/fuzz_%
	$(call fuzz_run,$*,$(FUZZ_TIME),$(BUILD)/fuzz/$*.log)

fuzz-smoke-%: $(BUILD)/fuzz/fuzz_%
	$(call fuzz_run,$*,$(FUZZ_SMOKE_TIME),$(BUILD)/fuzz/$*.smoke.log)

fuzz-corpus: $(BUILD)/fuzz/fuzz_checkpoint
	tests/fuzz/make_corpus $(BUILD)/fuzz/fuzz_checkpoint

-include $(FUZZ_LIB_OBJ:.o=.d) $(FUZZ_BINS:=.d)
# ---- end of fuzzing ------------------------------------------------------------------------

# ---- install / uninstall (systemd service) ----------------------------------------------
#   make && sudo make install      binary, unit, config (kept if present), the trainq user, the docs
#                                  (README.md, docs/api.md, docs/spec.md) and the man page trainq(1)
#   sudo make uninstall            binary, unit, docs, man page; keeps /var/lib/trainq, the config, the user
#   make install DESTDIR=/tmp/pkg  staged install for packaging: no user, no systemctl
PREFIX     ?= /usr/local
BINDIR     ?= $(PREFIX)/bin
UNITDIR    ?= $(PREFIX)/lib/systemd/system
DOCDIR     ?= $(PREFIX)/share/doc/trainq
MANDIR     ?= $(PREFIX)/share/man
SYSCONFDIR ?= /etc
STATEDIR   ?= /var/lib/trainq

.PHONY: install uninstall
install: $(BUILD)/trainq
	install -d $(DESTDIR)$(BINDIR) $(DESTDIR)$(UNITDIR) $(DESTDIR)$(DOCDIR) $(DESTDIR)$(SYSCONFDIR)/trainq \
	           $(DESTDIR)$(MANDIR)/man1
	install -m 0755 $(BUILD)/trainq $(DESTDIR)$(BINDIR)/trainq
	sed -e 's|/usr/local/bin/trainq|$(BINDIR)/trainq|' -e 's|/usr/local/share/doc/trainq|$(DOCDIR)|' \
	    -e 's|/etc/trainq/|$(SYSCONFDIR)/trainq/|' systemd/trainq.service > $(DESTDIR)$(UNITDIR)/trainq.service
	chmod 0644 $(DESTDIR)$(UNITDIR)/trainq.service
	install -m 0644 README.md $(DESTDIR)$(DOCDIR)/README.md
	@[ ! -f docs/api.md ] || install -m 0644 docs/api.md $(DESTDIR)$(DOCDIR)/api.md
	install -m 0644 docs/spec.md $(DESTDIR)$(DOCDIR)/spec.md
	install -m 0644 docs/trainq.1 $(DESTDIR)$(MANDIR)/man1/trainq.1
	install -m 0644 systemd/trainq.conf.example $(DESTDIR)$(SYSCONFDIR)/trainq/trainq.conf.example
	@if [ -e $(DESTDIR)$(SYSCONFDIR)/trainq/trainq.conf ]; then \
	    echo "install: keeping the existing $(DESTDIR)$(SYSCONFDIR)/trainq/trainq.conf"; \
	else install -m 0644 systemd/trainq.conf.example $(DESTDIR)$(SYSCONFDIR)/trainq/trainq.conf; fi
	@if [ -z "$(DESTDIR)" ]; then \
	    if ! getent passwd trainq >/dev/null; then \
	        echo "install: creating the system user trainq"; \
	        useradd --system --user-group --home-dir $(STATEDIR) --no-create-home \
	                --shell /usr/sbin/nologin --comment "trainq training daemon" trainq || exit 1; \
	    fi; \
	    for g in video render; do \
	        if getent group $$g >/dev/null; then usermod -a -G $$g trainq || exit 1; fi; \
	    done; \
	    if [ -d /run/systemd/system ]; then systemctl daemon-reload; fi; \
	    echo "install: done. Start it with: systemctl enable --now trainq; logs: journalctl -u trainq -f"; \
	fi

uninstall:
	@if [ -z "$(DESTDIR)" ] && [ -d /run/systemd/system ] && \
	    systemctl list-unit-files trainq.service >/dev/null 2>&1; then \
	    systemctl disable --now trainq.service 2>/dev/null || true; \
	fi
	rm -f $(DESTDIR)$(BINDIR)/trainq $(DESTDIR)$(UNITDIR)/trainq.service $(DESTDIR)$(MANDIR)/man1/trainq.1
	rm -rf $(DESTDIR)$(DOCDIR)
	@if [ -z "$(DESTDIR)" ] && [ -d /run/systemd/system ]; then systemctl daemon-reload; fi
	@echo "uninstall: kept the data in $(STATEDIR) (trainq.db, jobs/), the config in" \
	      "$(SYSCONFDIR)/trainq/ and the user trainq; remove them with:" \
	      "rm -rf $(STATEDIR) $(SYSCONFDIR)/trainq && userdel trainq"

# ---- verify-unit: the systemd unit exactly as `make install` writes it, before installing ----
#   make verify-unit [PREFIX=/usr/local SYSCONFDIR=/etc]
# Stages the install under $(BUILD)/verify-root, adds this machine's own units there (the unit
# names multi-user.target, sysinit.target, ...) and runs
#   SYSTEMD_UNIT_PATH=$(UNITDIR): systemd-analyze verify --root=$(BUILD)/verify-root $(UNITDIR)/trainq.service
# (UNITDIR added to the search path, for a PREFIX whose unit directory systemd does not search)
# which checks every key and value, and that ExecStart's binary exists (in the staged root).
# Unknown keys and bad values are only warnings there (exit 0): any line about trainq fails.
.PHONY: verify-unit
verify-unit: $(BUILD)/trainq
	@command -v systemd-analyze >/dev/null || \
	    { echo "verify-unit: systemd-analyze is not installed (Debian package systemd)"; exit 1; }
	@rm -rf $(BUILD)/verify-root
	@$(MAKE) -s --no-print-directory install DESTDIR=$(abspath $(BUILD))/verify-root >/dev/null
	@mkdir -p $(BUILD)/verify-root/usr/lib/systemd
	@cp -a $(firstword $(wildcard /usr/lib/systemd/system /lib/systemd/system)) $(BUILD)/verify-root/usr/lib/systemd/
	@out=$$(SYSTEMD_UNIT_PATH=$(UNITDIR): systemd-analyze verify --root=$(abspath $(BUILD))/verify-root \
	        $(UNITDIR)/trainq.service 2>&1); rc=$$?; \
	 [ -z "$$out" ] || echo "$$out"; \
	 if [ $$rc -ne 0 ] || echo "$$out" | grep -q trainq; then \
	     echo "verify-unit: systemd-analyze verify finds problems in $(UNITDIR)/trainq.service (above)"; exit 1; fi; \
	 echo "verify-unit: systemd-analyze verify accepts $(UNITDIR)/trainq.service as installed (ExecStart=$(BINDIR)/trainq)"
