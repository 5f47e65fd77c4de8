// test_mem.c: tagged allocations, per-category current and peak bytes, the report.
// (Criterion runs each test in a fresh process, so every test starts with nothing allocated.)
#include <criterion/criterion.h>
#include <setjmp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "check.h"
#include "mem.h"

// ---- catching lab_fail: the abort hook jumps back into the test ----
static jmp_buf failed_jump;
static void jump_back(int code) { longjmp(failed_jump, code ? code : 1); }

// Runs fn with stderr captured into out (NUL-ended); returns 1 if fn failed through lab_fail.
static int run_capturing_failure(void (*fn)(void), char *out, size_t n) {
    fflush(stderr);
    FILE *tmp = tmpfile();
    int saved = dup(2);
    dup2(fileno(tmp), 2);
    lab_abort_hook = jump_back;
    int failed = 0;
    if (setjmp(failed_jump) == 0) fn();
    else failed = 1;
    lab_abort_hook = NULL;
    fflush(stderr);
    dup2(saved, 2);
    close(saved);
    rewind(tmp);
    size_t got = fread(out, 1, n - 1, tmp);
    out[got] = '\0';
    fclose(tmp);
    return failed;
}

Test(mem, counts_by_category) {
    void *p = mem_alloc(1000, MEM_PARAMS, DEV_CPU);
    void *g = mem_alloc(1000, MEM_GRADS, DEV_CPU);
    void *m = mem_alloc(3000, MEM_OPT_M, DEV_CPU);
    cr_assert_eq(mem_current(MEM_PARAMS), 1000);
    cr_assert_eq(mem_current(MEM_GRADS), 1000);
    cr_assert_eq(mem_current(MEM_OPT_M), 3000);
    cr_assert_eq(mem_current(MEM_OPT_V), 0);
    cr_assert_eq(mem_total_current(), 5000);
    cr_assert_eq(mem_size_of(m), 3000);
    mem_free(m);
    cr_assert_eq(mem_current(MEM_OPT_M), 0);
    cr_assert_eq(mem_total_current(), 2000);
    mem_free(p);
    mem_free(g);
    mem_free(NULL);  // allowed
    cr_assert_eq(mem_total_current(), 0);
}

Test(mem, peaks_are_high_water_marks) {
    void *a = mem_alloc(1000, MEM_PARAMS, DEV_CPU);
    mem_free(a);
    void *b = mem_alloc(2000, MEM_ACTS, DEV_CPU);
    void *c = mem_alloc(500, MEM_ACTS, DEV_CPU);
    mem_free(b);
    // params peaked at 1000 and acts at 2500, but never at the same time
    cr_assert_eq(mem_peak(MEM_PARAMS), 1000);
    cr_assert_eq(mem_current(MEM_PARAMS), 0);
    cr_assert_eq(mem_peak(MEM_ACTS), 2500);
    cr_assert_eq(mem_current(MEM_ACTS), 500);
    cr_assert_eq(mem_total_peak(), 2500, "the total's peak is not the sum of the peaks: got %zu", mem_total_peak());
    mem_reset_peaks();
    cr_assert_eq(mem_peak(MEM_PARAMS), 0);
    cr_assert_eq(mem_peak(MEM_ACTS), 500);
    cr_assert_eq(mem_total_peak(), 500);
    mem_free(c);
    cr_assert_eq(mem_total_peak(), 500);
}

Test(mem, zeroed_aligned_and_zero_bytes) {
    for (size_t n = 0; n < 200; n += 13) {
        unsigned char *p = mem_alloc(n, MEM_OTHER, DEV_CPU);
        cr_assert_not_null(p, "mem_alloc(%zu) returned NULL", n);
        cr_assert_eq((uintptr_t)p % 64, 0, "mem_alloc(%zu) is not 64-byte aligned", n);
        for (size_t i = 0; i < n; i++) cr_assert_eq(p[i], 0, "byte %zu of %zu not zeroed", i, n);
        memset(p, 0xff, n);
        cr_assert_eq(mem_size_of(p), n);
        mem_free(p);
    }
    // memory handed back and allocated again must be zeroed too (fresh pages are zero anyway)
    unsigned char *blocks[64];
    for (int round = 0; round < 2; round++) {
        for (int b = 0; b < 64; b++) {
            blocks[b] = mem_alloc(1000, MEM_OTHER, DEV_CPU);
            for (size_t i = 0; i < 1000; i++) cr_assert_eq(blocks[b][i], 0, "round %d: byte %zu not zeroed", round, i);
            memset(blocks[b], 0xff, 1000);
        }
        for (int b = 0; b < 64; b++) mem_free(blocks[b]);
    }
    void *z1 = mem_alloc(0, MEM_COMM, DEV_CPU), *z2 = mem_alloc(0, MEM_COMM, DEV_CPU);
    cr_assert_neq(z1, z2, "two live allocations share a pointer");
    cr_assert_eq(mem_current(MEM_COMM), 0);
    mem_free(z1);
    mem_free(z2);
}

Test(mem, device_copy_and_zero_on_host) {
    float *a = mem_alloc(16 * sizeof(float), MEM_PARAMS, DEV_CPU);
    float b[16];
    cr_assert_eq(mem_device_of(a), DEV_CPU);
    cr_assert_eq(mem_device_of(a + 5), DEV_CPU);
    cr_assert_eq(mem_device_of(b), DEV_CPU);
    for (int i = 0; i < 16; i++) b[i] = (float)i + 0.5f;
    mem_copy(a, b, sizeof b);
    for (int i = 0; i < 16; i++) cr_assert_eq(a[i], (float)i + 0.5f);
    mem_zero(a + 4, 4 * sizeof(float));
    for (int i = 0; i < 16; i++) cr_assert_eq(a[i], (i >= 4 && i < 8) ? 0.0f : (float)i + 0.5f, "element %d", i);
    mem_free(a);
}

Test(mem, category_names) {
    cr_assert_str_eq(mem_category_name(MEM_PARAMS), "params");
    cr_assert_str_eq(mem_category_name(MEM_GRADS), "grads");
    cr_assert_str_eq(mem_category_name(MEM_MASTER), "master");
    cr_assert_str_eq(mem_category_name(MEM_OPT_M), "adam m");
    cr_assert_str_eq(mem_category_name(MEM_OPT_V), "adam v");
    cr_assert_str_eq(mem_category_name(MEM_ACTS), "activations");
    cr_assert_str_eq(mem_category_name(MEM_COMM), "comm");
    cr_assert_str_eq(mem_category_name(MEM_OTHER), "other");
}

Test(mem, format_units) {
    char buf[32];
    cr_assert_str_eq(mem_format(buf, sizeof buf, 0), "0 B");
    cr_assert_str_eq(mem_format(buf, sizeof buf, 1023), "1023 B");
    cr_assert_str_eq(mem_format(buf, sizeof buf, 1024), "1.00 KiB");
    cr_assert_str_eq(mem_format(buf, sizeof buf, 12.5 * 1024 * 1024), "12.50 MiB");
    cr_assert_str_eq(mem_format(buf, sizeof buf, 3.0 * 1024 * 1024 * 1024), "3.00 GiB");
}

Test(mem, report_lists_every_category_with_units) {
    void *p = mem_alloc((size_t)3 << 20, MEM_PARAMS, DEV_CPU);   // 3 MiB
    void *q = mem_alloc((size_t)1 << 20, MEM_OPT_V, DEV_CPU);    // 1 MiB
    mem_free(q);
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    mem_report(f, "memory of rank 0");
    fclose(f);
    cr_assert(strstr(text, "memory of rank 0") != NULL, "title missing:\n%s", text);
    for (int c = 0; c < MEM_NCATS; c++)
        cr_assert(strstr(text, mem_category_name((MemCategory)c)) != NULL, "category %s missing:\n%s",
                  mem_category_name((MemCategory)c), text);
    cr_assert(strstr(text, "3.00 MiB") != NULL, "params' 3 MiB missing:\n%s", text);
    cr_assert(strstr(text, "100.0%") != NULL, "params' share of 100%% missing:\n%s", text);
    // adam v: current 0, peak 1 MiB, on one line
    const char *v = strstr(text, "adam v");
    cr_assert(v != NULL);
    const char *eol = strchr(v, '\n');
    cr_assert(strstr(v, "1.00 MiB") != NULL && strstr(v, "1.00 MiB") < eol, "adam v's peak missing:\n%s", text);
    cr_assert(strstr(v, "0 B") != NULL && strstr(v, "0 B") < eol, "adam v's current missing:\n%s", text);
    cr_assert(strstr(text, "total") != NULL, "total missing:\n%s", text);
    free(text);
    mem_free(p);
}

static void free_foreign(void) {
    int x;
    mem_free(&x);
}

Test(mem, freeing_a_foreign_pointer_is_an_error) {
    char out[2048];
    cr_assert(run_capturing_failure(free_foreign, out, sizeof out), "mem_free of a stack pointer did not fail");
    cr_assert(strstr(out, "internal error at") != NULL && strstr(out, "not allocated by mem_alloc") != NULL,
              "unclear message: %s", out);
}

static void alloc_on_gpu(void) { mem_alloc(1024, MEM_PARAMS, DEV_CUDA); }

#ifndef LAB_CUDA
Test(mem, cuda_in_a_cpu_build_says_how_to_rebuild) {
    char out[2048];
    cr_assert(run_capturing_failure(alloc_on_gpu, out, sizeof out), "DEV_CUDA in a CPU build did not fail");
    cr_assert(strstr(out, "error: --device cuda needs a CUDA build") != NULL && strstr(out, "make CUDA=1") != NULL,
              "unclear message: %s", out);
}
#else
// In a CUDA build this only runs where a GPU is visible (the device check); elsewhere it is skipped.
Test(mem, cuda_allocation_is_counted_and_zeroed) {
    if (getenv("LAB_TEST_GPU") == NULL) cr_skip_test("set LAB_TEST_GPU=1 on a machine with a GPU");
    float host[256];
    float *d = mem_alloc(sizeof host, MEM_PARAMS, DEV_CUDA);
    cr_assert_eq(mem_device_of(d), DEV_CUDA);
    cr_assert_eq(mem_current(MEM_PARAMS), sizeof host);
    mem_copy(host, d, sizeof host);
    for (int i = 0; i < 256; i++) cr_assert_eq(host[i], 0.0f, "device memory not zeroed at %d", i);
    for (int i = 0; i < 256; i++) host[i] = (float)i;
    mem_copy(d, host, sizeof host);
    mem_zero(d, 16 * sizeof(float));
    float back[256];
    mem_copy(back, d, sizeof back);
    for (int i = 0; i < 256; i++) cr_assert_eq(back[i], i < 16 ? 0.0f : (float)i, "element %d", i);
    mem_free(d);
    cr_assert_eq(mem_current(MEM_PARAMS), 0);
    (void)alloc_on_gpu;
}
#endif
