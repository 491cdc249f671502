# trainq — build, test, run.
#   make            build build/trainq (CPU backend; CUDA backend: see CUDA= below)
#   make test       install missing packages, build, run every test (what CI runs)
#   make run        install missing packages, build, run the default job
#   make CUDA=0|1   force the CUDA backend off / on (on is the GPU issue's work)

CC      ?= cc
BUILD   ?= build
OPT     ?= -O2
CFLAGS  ?= $(OPT) -g
CFLAGS  += -std=c11 -D_GNU_SOURCE -Wall -Wextra -Wno-unused-parameter -Wshadow \
           -fopenmp -march=x86-64-v2 -mtune=native -I. -Ikernels -Itrain
LDLIBS  += -lopenblas -lsqlite3 -lcjson -lz -lm -lpthread -fopenmp
PYTHON  ?= /usr/bin/python3

CUDA ?= 0
ifeq ($(CUDA),1)
  $(error CUDA=1: the CUDA backend is not part of this build yet (see the CUDA backend issue))
endif

LIB_SRC  := $(wildcard kernels/cpu/*.c) $(wildcard train/*.c) $(wildcard schema/*.c)
MAIN_SRC := $(wildcard daemon/*.c)
TEST_SRC := $(wildcard tests/unit/test_*.c)

LIB_OBJ  := $(LIB_SRC:%.c=$(BUILD)/obj/%.o)
MAIN_OBJ := $(MAIN_SRC:%.c=$(BUILD)/obj/%.o)
TESTS    := $(TEST_SRC:tests/unit/%.c=$(BUILD)/tests/%)
LIB      := $(BUILD)/libtrainq.a

.PHONY: all deps test unit parity run clean bench
all: $(BUILD)/trainq

deps:
	@scripts/install-deps

$(BUILD)/obj/%.o: %.c
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -MMD -MP -c $< -o $@

$(LIB): $(LIB_OBJ)
	@mkdir -p $(dir $@)
	rm -f $@ && ar rcs $@ $^

$(BUILD)/trainq: $(MAIN_OBJ) $(LIB)
	$(CC) $(CFLAGS) -o $@ $(MAIN_OBJ) $(LIB) $(LDLIBS)

$(BUILD)/tests/%: tests/unit/%.c $(LIB)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -Itests/unit -o $@ $< $(LIB) $(LDLIBS) -lcmocka

unit: $(TESTS)
	@set -e; for t in $(TESTS); do echo "== $$t"; CMOCKA_MESSAGE_OUTPUT=stdout $$t; done

parity: $(BUILD)/trainq
	$(PYTHON) -m pytest -q tests/parity tests/integration

test: deps
	$(MAKE) all $(TESTS)
	$(MAKE) unit
	$(MAKE) parity

run: deps
	$(MAKE) all
	@mkdir -p var
	$(BUILD)/trainq run examples/default.json --db var/trainq.db --out var/run

bench: deps
	$(MAKE) all
	bench/cpu

clean:
	rm -rf $(BUILD)

-include $(LIB_OBJ:.o=.d) $(MAIN_OBJ:.o=.d)
