# The lab's build. `make help` lists the targets.
#
#   make <chapter>      build one chapter, e.g. `make 03_ddp` -> 03_ddp/run
#   make all            every chapter, the tests and the tools
#   make tour           build and run every chapter briefly on 4 ranks (the lab's main job)
#   make test           build and run the whole test suite
#   make grade          the exercise table, built from the current sources (EX=08.1: one exercise)
#   make student        the student version in ./student (exercise solutions replaced by stubs)
#   make bench          single-rank training speed vs this core's SGEMM peak
#   make matrix         the test matrix: every chapter x dtype x layout x resume x accumulation vs 00
#   make mutants        every deliberate bug in mutants/*.patch is caught by the test that names it
#   make gpu-check      on a machine with a GPU: the CUDA path against the CPU path (tools/gpu_check.sh)
#   make compare ARGS="--np 4 05_zero --zero 2"   a run against chapter 00's, as distances
#   make questions      run every command of docs/QUESTIONS.md and check the page shows what they print
#   make drill          chapter 09 under a chaos schedule, restarted from its checkpoints (tools/drill.sh)
#   make learn          see it learn: a small GPT on English text on one core, samples as it
#                       goes, the loss curve as learn.png (tools/learn.sh)
#   make same-text      the same text from every layout (tools/same_text.sh)
#   make notes-layouts  the notes' layouts (7B DP 8, 70B DP 64 x TP 8, 405B DP 256 x TP 8 x PP 8, 70B on
#                       8 H100s): the planner at full size, a scaled run of each (tools/notes_layouts.sh)
#
# Options: CC=clang (default gcc; MPI flags come from mpicc -showme), CUDA=0|1 (default: 1 when nvcc is found),
#          SAN=1 (AddressSanitizer + UndefinedBehaviorSanitizer build), NP=4 (ranks for tour).

SHELL := /bin/bash
.DEFAULT_GOAL := all
CC ?= gcc
ifeq ($(origin CC),default)
CC := gcc
endif
NP ?= 4

# Debian packages the lab needs; `make deps` installs them when it can. fortunes-min and
# fortunes: the text the lab's corpus is built from (--data text, common/text.h).
DEB_PKGS := build-essential openmpi-bin libopenmpi-dev libopenblas-dev libcriterion-dev pkg-config \
            fortunes-min fortunes

CHAPTERS := $(sort $(patsubst %/main.c,%,$(wildcard [0-9][0-9]_*/main.c)))

BUILD ?= build
ifeq ($(SAN),1)
BUILD := build-san
endif

# --- dependencies --------------------------------------------------------------------------
# Installed while this Makefile is read, before the flags below ask mpicc and pkg-config, so that
# the first `make test` on a fresh machine installs the packages and builds in one go. deps.sh is
# quiet and takes milliseconds when everything is there; its output goes to stderr so that the
# user sees the install. `make help` and `make clean` need nothing installed.
ifneq ($(filter-out help clean,$(or $(MAKECMDGOALS),$(.DEFAULT_GOAL))),)
DEPS_RC := $(shell bash tools/deps.sh $(DEB_PKGS) 1>&2; echo $$?)
ifneq ($(DEPS_RC),0)
$(error the lab's packages are missing and could not be installed (tools/deps.sh said why above))
endif
endif
deps:
	@bash tools/deps.sh $(DEB_PKGS)

# --- flags -----------------------------------------------------------------------------------
MPI_CFLAGS := $(shell mpicc -showme:compile 2>/dev/null)
MPI_LIBS := $(shell mpicc -showme:link 2>/dev/null)
BLAS_CFLAGS := $(shell pkg-config --cflags openblas 2>/dev/null || echo -I/usr/include/x86_64-linux-gnu/openblas-pthread)
BLAS_LIBS := $(shell pkg-config --libs openblas 2>/dev/null || echo -lopenblas)
CRIT_LIBS := $(shell pkg-config --libs criterion 2>/dev/null || echo -lcriterion)

OPT ?= -O3 -march=native
WARN := -Wall -Wextra -Werror
CFLAGS_ALL := -std=c11 -D_DEFAULT_SOURCE -D_POSIX_C_SOURCE=200809L $(OPT) -g $(WARN) \
              -Icommon $(MPI_CFLAGS) $(BLAS_CFLAGS) $(EXTRA_CFLAGS)
LDLIBS_ALL := $(BLAS_LIBS) $(MPI_LIBS) -lm -lpthread
ifeq ($(SAN),1)
CFLAGS_ALL += -fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined
LDLIBS_ALL += -fsanitize=address,undefined
endif
ifeq ($(STUDENT),1)
# The student version: stubs leave parameters unused until the exercise is done.
CFLAGS_ALL += -Wno-unused-parameter -Wno-unused-variable -Wno-unused-but-set-variable \
              -Wno-unused-function -Wno-unused-label
endif

# --- CUDA (compiled when nvcc is present; runs only on a GPU) --------------------------------
NVCC ?= nvcc
ifeq ($(origin CUDA),undefined)
CUDA := $(shell command -v $(NVCC) >/dev/null 2>&1 && echo 1 || echo 0)
endif
CUDA_SRCS := $(wildcard common/*.cu)
ifeq ($(SAN),1)
CUDA := 0
endif
ifeq ($(CUDA),1)
CUDA_HOME ?= $(patsubst %/bin/nvcc,%,$(shell command -v $(NVCC)))
CFLAGS_ALL += -DLAB_CUDA=1 -I$(CUDA_HOME)/include
NVCCFLAGS := -O3 -std=c++17 -Icommon $(MPI_CFLAGS) -DLAB_CUDA=1 \
             -gencode arch=compute_80,code=sm_80 -gencode arch=compute_90,code=sm_90 \
             -Xcompiler -Wall,-Wextra,-Werror --expt-relaxed-constexpr
LDLIBS_ALL += -L$(CUDA_HOME)/lib64 -Wl,-rpath,$(CUDA_HOME)/lib64 -lcublas -lcudart -lnccl -lstdc++
CUDA_OBJS := $(patsubst common/%.cu,$(BUILD)/common/%.cu.o,$(CUDA_SRCS))
else
CUDA_OBJS :=
endif

# --- the common runtime ------------------------------------------------------------------------
COMMON_SRCS := $(wildcard common/*.c)
COMMON_OBJS := $(patsubst common/%.c,$(BUILD)/common/%.o,$(COMMON_SRCS)) $(CUDA_OBJS)
COMMON_HDRS := $(wildcard common/*.h)
LIBCOMMON := $(BUILD)/libcommon.a
# Build flags are part of the inputs: switching CUDA/SAN/STUDENT/CC rebuilds everything.
FLAGS_STAMP := $(BUILD)/.flags-$(shell echo '$(CC) $(CFLAGS_ALL) $(LDLIBS_ALL)' | md5sum | cut -c1-12)
$(FLAGS_STAMP):
	@mkdir -p $(BUILD) && rm -f $(BUILD)/.flags-* && touch $@

$(BUILD)/common/%.o: common/%.c $(COMMON_HDRS) $(FLAGS_STAMP)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS_ALL) -c $< -o $@
$(BUILD)/common/%.cu.o: common/%.cu $(COMMON_HDRS) $(FLAGS_STAMP)
	@mkdir -p $(dir $@)
	$(NVCC) $(NVCCFLAGS) -c $< -o $@
$(LIBCOMMON): $(COMMON_OBJS)
	@rm -f $@
	ar rcs $@ $^

# --- chapters ------------------------------------------------------------------------------------
# Each chapter: <chapter>/*.c (main.c + its own files) -> $(BUILD)/bin/<chapter>/run, copied to
# <chapter>/run, the path students type. The copy is refreshed on every make, so <chapter>/run
# is always the binary of the build last asked for (a `make SAN=1 test` leaves sanitizer
# binaries there until the next plain `make`). Copied under a temporary name and renamed, so a
# run in progress keeps its binary.
define chapter_rule
$(BUILD)/bin/$(1)/run: $(wildcard $(1)/*.c) $(wildcard $(1)/*.h) $(LIBCOMMON) $(COMMON_HDRS)
	@mkdir -p $$(dir $$@)
	$$(CC) $$(CFLAGS_ALL) -I$(1) $(wildcard $(1)/*.c) $(LIBCOMMON) $$(LDLIBS_ALL) -o $$@
$(1)/run: $(BUILD)/bin/$(1)/run FORCE
	@cmp -s $$< $$@ || { cp $$< $$@.tmp && mv -f $$@.tmp $$@; }
$(1): $(1)/run
.PHONY: $(1)
endef
FORCE:
.PHONY: FORCE
$(foreach c,$(CHAPTERS),$(eval $(call chapter_rule,$(c))))

# --- tests ---------------------------------------------------------------------------------------
# tests/test_*.c   Criterion unit tests (one binary each)
# tests/mpi_*.c    MPI programs that the Criterion tests launch with mpirun (see tests/harness.h)
# tests/test_matrix.c: the test matrix (every chapter x dtype x layout x resume x accumulation),
# built with the others but run by `make matrix`, not by `make test`
# (a tree without tests/test_matrix.c, e.g. the exercise tools' fixture, has no matrix)
MATRIX_BIN := $(if $(wildcard tests/test_matrix.c),$(BUILD)/tests/test_matrix)
TEST_SRCS := $(filter-out tests/test_matrix.c,$(wildcard tests/test_*.c))
TEST_BINS := $(patsubst tests/%.c,$(BUILD)/tests/%,$(TEST_SRCS))
MPI_TEST_SRCS := $(wildcard tests/mpi_*.c)
# tests/mpitest.c: the check counter and main() of mpi_collectives and mpi_ring, linked into every
# MPI test program (not named mpi_*.c: it is not a program of its own)
MPI_TEST_MAIN := tests/mpitest.c
MPI_TEST_BINS := $(patsubst tests/%.c,$(BUILD)/tests/%,$(MPI_TEST_SRCS))
HARNESS_SRCS := $(wildcard tests/harness*.c)
# Chapter sources a test links directly (everything but main.c), e.g. 00_memory_budget/planner.c,
# compiled once into $(BUILD)/chapters/ and linked into every test that needs them.
CHAPTER_LIB_SRCS := $(filter-out %/main.c,$(foreach c,$(CHAPTERS),$(wildcard $(c)/*.c)))
CHAPTER_LIB_OBJS := $(patsubst %.c,$(BUILD)/chapters/%.o,$(CHAPTER_LIB_SRCS))
CHAPTER_HDRS := $(foreach c,$(CHAPTERS),$(wildcard $(c)/*.h))
.SECONDARY: $(CHAPTER_LIB_OBJS)   # keep them: they are reused by every test binary
$(BUILD)/chapters/%.o: %.c $(COMMON_HDRS) $(CHAPTER_HDRS) $(FLAGS_STAMP)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS_ALL) $(addprefix -I,$(CHAPTERS)) -c $< -o $@

$(BUILD)/tests/test_%: tests/test_%.c $(HARNESS_SRCS) $(wildcard tests/*.h) $(CHAPTER_LIB_OBJS) $(LIBCOMMON)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS_ALL) -Itests $(addprefix -I,$(CHAPTERS)) $< $(HARNESS_SRCS) $(CHAPTER_LIB_OBJS) $(LIBCOMMON) $(CRIT_LIBS) $(LDLIBS_ALL) -o $@
$(BUILD)/tests/mpi_%: tests/mpi_%.c $(MPI_TEST_MAIN) $(wildcard tests/*.h) $(CHAPTER_LIB_OBJS) $(LIBCOMMON)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS_ALL) -Itests $(addprefix -I,$(CHAPTERS)) $< $(MPI_TEST_MAIN) $(CHAPTER_LIB_OBJS) $(LIBCOMMON) $(LDLIBS_ALL) -o $@

# tools/*.c  small programs of the lab (the benchmark, ...), linked with the runtime
TOOL_BINS := $(patsubst tools/%.c,$(BUILD)/tools/%,$(wildcard tools/*.c))
$(BUILD)/tools/%: tools/%.c $(LIBCOMMON)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS_ALL) $< $(LIBCOMMON) $(LDLIBS_ALL) -o $@

tests: $(TEST_BINS) $(MATRIX_BIN) $(MPI_TEST_BINS) $(TOOL_BINS) $(addsuffix /run,$(CHAPTERS))

all: $(addsuffix /run,$(CHAPTERS)) tests

# Runs every test binary; prints one closing line "N passed, N failed".
test: tests
	@bash tools/run_tests.sh $(BUILD) $(TEST_BINS)

# grade.sh runs $(MAKE) first for exactly the targets the graded tests need (their test binaries,
# the chapters and MPI programs they launch), with this make's variables and -j: never stale.
grade:
	@MAKE='$(MAKE)' bash tools/grade.sh $(BUILD) $(EX)

tour: $(addsuffix /run,$(CHAPTERS))
	@NP=$(NP) bash tools/tour.sh $(CHAPTERS)

bench: $(TOOL_BINS) $(addsuffix /run,$(CHAPTERS))
	@BUILD=$(BUILD) bash tools/bench.sh

# The test matrix (tests/test_matrix.c), two tests at a time: their runs are mostly mpirun
# start-up and small ranks, so two cores overlap them.
matrix: $(MATRIX_BIN) $(addsuffix /run,$(CHAPTERS))
	@LAB_MATRIX_JOBS=$${LAB_MATRIX_JOBS:-2} LAB_BUILD=$(BUILD) OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 \
	  OPENBLAS_NUM_THREADS=1 bash -c 't0=$$(date +%s); $(MATRIX_BIN) -j$$LAB_MATRIX_JOBS; rc=$$?; \
	  echo "matrix: $$(( $$(date +%s) - t0 )) s"; exit $$rc'

# The fire drill (tools/drill.sh): chapter 09 on 4 ranks under a chaos schedule (a killed rank, a
# hang, a NaN, a spike), restarted from its checkpoints; goodput, the cost of each fault, save and
# restore times, Young/Daly; the final weights against an uninterrupted run's, bit for bit.
drill: 09_3d/run
	@bash tools/drill.sh

# Every deliberate bug in mutants/*.patch is caught by the tests that name it (mutants/README.md);
# MUTANTS="a b" runs only those.
mutants: tests
	@BUILD=$(BUILD) bash tools/mutants.sh $(MUTANTS)

# A run's dump against chapter 00's for the same flags (tools/compare.sh):
#   make compare ARGS="--np 4 05_zero --zero 2 --steps 20"
compare: $(addsuffix /run,$(CHAPTERS))
	@bash tools/compare.sh $(ARGS)

# docs/QUESTIONS.md, the notes' eight questions: every command it quotes is run, and every line
# and answer figure it quotes must be what they print now (tools/questions.sh; test_questions).
questions: $(addsuffix /run,$(CHAPTERS))
	@bash tools/questions.sh

learn: 00_memory_budget/run
	@bash tools/learn.sh

same-text: $(addsuffix /run,$(CHAPTERS))
	@bash tools/same_text.sh

notes-layouts: 00_memory_budget/run 09_3d/run
	@bash tools/notes_layouts.sh

gpu-check:
	@BUILD=$(if $(filter build,$(BUILD)),build-cuda,$(BUILD)) bash tools/gpu_check.sh

student:
	@bash tools/make_student.sh $(or $(CHAPTER),all) student

clean:
	rm -rf build build-san $(addsuffix /run,$(CHAPTERS))

help:
	@sed -n '/^# The lab/,/^$$/p' Makefile | sed 's/^# \{0,1\}//'

.PHONY: all test tests grade tour bench gpu-check student clean help deps mutants matrix compare questions drill learn same-text notes-layouts
