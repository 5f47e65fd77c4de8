// mpitest.c: the check counter and main() of the MPI test programs (see mpitest.h).
#include "mpitest.h"
#include "mem.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

static int nchecks = 0, nfailed = 0;

void mpi_check(int ok, const char *fmt, ...) {
    nchecks++;
    if (ok) return;
    if (++nfailed > 20) return;
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    fprintf(stderr, "[rank %d] FAIL: %s\n", dist_rank(), msg);
}

int mpi_failed(void) { return nfailed; }
int mpi_checks(void) { return nchecks; }

static uint64_t mark_sent, mark_recv;
void mpi_bytes_mark(void) {
    mark_sent = dist_counters()->sent[OP_SEND];
    mark_recv = dist_counters()->recv[OP_RECV];
}

void mpi_check_bytes(const char *what, size_t count, uint64_t want_sent, uint64_t want_recv,
                     DistGroup *g) {
    uint64_t s = dist_counters()->sent[OP_SEND] - mark_sent;
    uint64_t r = dist_counters()->recv[OP_RECV] - mark_recv;
    mpi_check(s == want_sent && r == want_recv,
              "%s count %zu on %s (rank %d of %d): moved sent %llu recv %llu bytes, formula says "
              "sent %llu recv %llu", what, count, g->name, g->rank, g->size, (unsigned long long)s,
              (unsigned long long)r, (unsigned long long)want_sent, (unsigned long long)want_recv);
}

int mpi_test_main(int argc, char **argv, const char *prog, const char *usage, const char *const *kinds, int nkinds,
                  void (*run)(int kind, DistGroup *g)) {
    dist_init(&argc, &argv);
    DistGroup *world = dist_world();
    if (argc < 2) lab_fail_collective("%s", usage);
    // odd and even world ranks apart, in reverse order, so group rank != world rank
    DistGroup *half = dist_split(world, world->rank % 2, -world->rank, "parity");
    char names[256] = "";
    for (int a = 1; a < argc; a++) {
        int kind = -1;
        for (int k = 0; k < nkinds; k++)
            if (strcmp(argv[a], kinds[k]) == 0) kind = k;
        if (kind < 0) lab_fail_collective("%s: unknown test '%s'\n%s", prog, argv[a], usage);
        run(kind, world);
        run(kind, half);
        strncat(names, argv[a], sizeof names - strlen(names) - 2);
        strcat(names, " ");
    }
    int counts[2] = {nchecks, nfailed};
    dist_all_reduce(NULL, counts, 2, DIST_I32, DIST_SUM, world);
    if (world->rank == 0)
        printf("%s: %son %d ranks: %d checks, %d failed\n", prog, names, world->size, counts[0], counts[1]);
    dist_group_free(half);
    dist_finalize();
    return counts[1] ? 1 : 0;
}

// ---------------------------------------------------------------------------------------------
// device twins of host buffers

int mpi_use_device = 0;

int mpi_take_device_flags(int *argc, char ***argv) {
    int nccl = 0;
    while (*argc > 1 && (strcmp((*argv)[1], "--device") == 0 || strcmp((*argv)[1], "--nccl") == 0)) {
        if (strcmp((*argv)[1], "--device") == 0) mpi_use_device = 1;
        else nccl = 1;
        (*argv)[1] = (*argv)[0];
        (*argv)++;
        (*argc)--;
    }
    return nccl;
}

void mpi_select_backend(int nccl) {
    static int done = 0;
    if (nccl && !done) dist_set_backend(DIST_BACKEND_NCCL);
    done = 1;
}
typedef struct Mirror {
    char *host, *dev;
    size_t bytes;
} Mirror;
static Mirror mirrors[8];
static int nmirrors = 0;

void mpi_mirror(void *host, size_t bytes) {
    if (!mpi_use_device) return;
    LAB_CHECK(nmirrors < 8, "too many mirrored buffers");
    Mirror *m = &mirrors[nmirrors++];
    m->host = host;
    m->bytes = bytes;
    m->dev = mem_alloc(m->bytes, MEM_COMM, DEV_CUDA);
    mem_copy(m->dev, m->host, m->bytes);
}

void *mpi_dev(const void *p) {
    if (!mpi_use_device || p == NULL) return (void *)p;
    for (int i = 0; i < nmirrors; i++)
        if ((const char *)p >= mirrors[i].host && (const char *)p < mirrors[i].host + mirrors[i].bytes)
            return mirrors[i].dev + ((const char *)p - mirrors[i].host);
    lab_fail_at(__FILE__, __LINE__, "pointer %p is in no mirrored buffer", p);
}

void mpi_unmirror(void) {
    for (int i = 0; i < nmirrors; i++) {
        mem_copy(mirrors[i].host, mirrors[i].dev, mirrors[i].bytes);
        mem_free(mirrors[i].dev);
    }
    nmirrors = 0;
}

float mpi_rel_err(const float *a, const float *b, size_t n) {
    float d = 0.0f, m = 0.0f;
    for (size_t i = 0; i < n; i++) {
        float e = fabsf(a[i] - b[i]);
        if (!(e <= d)) d = e;  // NaN counts as the worst
        if (fabsf(b[i]) > m) m = fabsf(b[i]);
    }
    return m > 0.0f ? d / m : d;
}
