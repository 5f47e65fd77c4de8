// nccl.h (NCCL emulator, C): the NCCL calls common/dist_nccl.c makes, over MPI on host memory
// (see cuda_runtime.h here). Reductions go through doubles (exact for every dtype the lab
// uses) and round once; AVG divides the sum (integers: C's truncation). A send outside a group
// is MPI_Ssend, so it waits for its receiver as ncclSend does; inside ncclGroupStart/End,
// sends and receives start together and finish at ncclGroupEnd.
#pragma once
#include <mpi.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_runtime.h"
#include "kernels.h"  // bf16_from_f32, bf16_to_f32

typedef enum { ncclSuccess = 0, ncclInvalidArgument = 4 } ncclResult_t;
typedef enum { ncclSum = 0, ncclMax = 2, ncclAvg = 4 } ncclRedOp_t;
typedef enum { ncclUint8 = 1, ncclInt32 = 2, ncclFloat32 = 7, ncclFloat64 = 8, ncclBfloat16 = 9 } ncclDataType_t;
typedef struct { char internal[128]; } ncclUniqueId;
typedef struct EmuComm { MPI_Comm comm; int rank, size; } *ncclComm_t;

static inline const char *ncclGetErrorString(ncclResult_t r) {
    return r == ncclSuccess ? "no error" : "invalid argument";
}

// The id names its creator's world rank and a number, so members can find each other.
static inline ncclResult_t ncclGetUniqueId(ncclUniqueId *id) {
    static int seq = 0;
    int me;
    MPI_Comm_rank(MPI_COMM_WORLD, &me);
    memset(id, 0, sizeof *id);
    int v[2] = {me, seq++};
    memcpy(id->internal, v, sizeof v);
    return ncclSuccess;
}

// Members send their world rank to the creator, which answers with the list; then
// MPI_Comm_create_group (collective over the members only, as ncclCommInitRank is).
static inline ncclResult_t ncclCommInitRank(ncclComm_t *out, int nranks, ncclUniqueId id, int rank) {
    int v[2], me;
    memcpy(v, id.internal, sizeof v);
    MPI_Comm_rank(MPI_COMM_WORLD, &me);
    int tag = 31000 + v[1] % 1000;
    int *world = calloc((size_t)nranks, sizeof(int));
    if (rank == 0) {
        world[0] = me;
        for (int i = 1; i < nranks; i++) {
            int msg[2];
            MPI_Recv(msg, 2, MPI_INT, MPI_ANY_SOURCE, tag, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
            world[msg[0]] = msg[1];
        }
        for (int i = 1; i < nranks; i++) MPI_Send(world, nranks, MPI_INT, world[i], tag, MPI_COMM_WORLD);
    } else {
        int msg[2] = {rank, me};
        MPI_Send(msg, 2, MPI_INT, v[0], tag, MPI_COMM_WORLD);
        MPI_Recv(world, nranks, MPI_INT, v[0], tag, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
    }
    MPI_Group wg, g;
    MPI_Comm_group(MPI_COMM_WORLD, &wg);
    MPI_Group_incl(wg, nranks, world, &g);
    ncclComm_t c = calloc(1, sizeof *c);
    MPI_Comm_create_group(MPI_COMM_WORLD, g, tag, &c->comm);
    MPI_Group_free(&g);
    MPI_Group_free(&wg);
    free(world);
    c->rank = rank, c->size = nranks;
    *out = c;
    return ncclSuccess;
}

static inline ncclResult_t ncclCommDestroy(ncclComm_t c) {
    MPI_Comm_free(&c->comm);
    free(c);
    return ncclSuccess;
}

static inline size_t emu_size(ncclDataType_t t) {
    return t == ncclUint8 ? 1 : t == ncclBfloat16 ? 2 : t == ncclFloat64 ? 8 : 4;
}

static inline void emu_to_double(double *d, const void *x, size_t n, ncclDataType_t t) {
    for (size_t i = 0; i < n; i++) {
        switch (t) {
        case ncclUint8: d[i] = ((const uint8_t *)x)[i]; break;
        case ncclInt32: d[i] = ((const int32_t *)x)[i]; break;
        case ncclFloat32: d[i] = ((const float *)x)[i]; break;
        case ncclFloat64: d[i] = ((const double *)x)[i]; break;
        case ncclBfloat16: d[i] = bf16_to_f32(((const uint16_t *)x)[i]); break;
        }
    }
}

// Back to the dtype; AVG divides by n first.
static inline void emu_from_double(void *x, const double *d, size_t n, ncclDataType_t t, ncclRedOp_t op, int nr) {
    for (size_t i = 0; i < n; i++) {
        double v = d[i];
        int integer = t == ncclUint8 || t == ncclInt32;
        if (op == ncclAvg) v = integer ? (double)((int64_t)v / nr) : v / nr;
        switch (t) {
        case ncclUint8: ((uint8_t *)x)[i] = (uint8_t)(int64_t)v; break;
        case ncclInt32: ((int32_t *)x)[i] = (int32_t)v; break;
        case ncclFloat32: ((float *)x)[i] = (float)v; break;
        case ncclFloat64: ((double *)x)[i] = v; break;
        case ncclBfloat16: ((uint16_t *)x)[i] = bf16_from_f32((float)v); break;
        }
    }
}

static inline MPI_Op emu_op(ncclRedOp_t op) { return op == ncclMax ? MPI_MAX : MPI_SUM; }

static inline ncclResult_t ncclAllReduce(const void *s, void *r, size_t n, ncclDataType_t t, ncclRedOp_t op,
                                         ncclComm_t c, cudaStream_t st) {
    (void)st;
    double *d = calloc(n + 1, sizeof(double));
    emu_to_double(d, s, n, t);
    MPI_Allreduce(MPI_IN_PLACE, d, (int)n, MPI_DOUBLE, emu_op(op), c->comm);
    emu_from_double(r, d, n, t, op, c->size);
    free(d);
    return ncclSuccess;
}

static inline ncclResult_t ncclReduce(const void *s, void *r, size_t n, ncclDataType_t t, ncclRedOp_t op, int root,
                                      ncclComm_t c, cudaStream_t st) {
    (void)st;
    double *d = calloc(n + 1, sizeof(double)), *out = calloc(n + 1, sizeof(double));
    emu_to_double(d, s, n, t);
    MPI_Reduce(d, out, (int)n, MPI_DOUBLE, emu_op(op), root, c->comm);
    if (c->rank == root) emu_from_double(r, out, n, t, op, c->size);
    free(d);
    free(out);
    return ncclSuccess;
}

static inline ncclResult_t ncclReduceScatter(const void *s, void *r, size_t n, ncclDataType_t t, ncclRedOp_t op,
                                             ncclComm_t c, cudaStream_t st) {
    (void)st;
    size_t all = n * (size_t)c->size;
    double *d = calloc(all + 1, sizeof(double)), *out = calloc(n + 1, sizeof(double));
    emu_to_double(d, s, all, t);
    MPI_Reduce_scatter_block(d, out, (int)n, MPI_DOUBLE, emu_op(op), c->comm);
    emu_from_double(r, out, n, t, op, c->size);
    free(d);
    free(out);
    return ncclSuccess;
}

static inline ncclResult_t ncclAllGather(const void *s, void *r, size_t n, ncclDataType_t t, ncclComm_t c,
                                         cudaStream_t st) {
    (void)st;
    size_t bytes = n * emu_size(t);
    char *mine = malloc(bytes + 1);
    memcpy(mine, s, bytes);
    MPI_Allgather(mine, (int)bytes, MPI_BYTE, r, (int)bytes, MPI_BYTE, c->comm);
    free(mine);
    return ncclSuccess;
}

static inline ncclResult_t ncclBroadcast(const void *s, void *r, size_t n, ncclDataType_t t, int root, ncclComm_t c,
                                         cudaStream_t st) {
    (void)st;
    size_t bytes = n * emu_size(t);
    if (c->rank == root && s != r) memmove(r, s, bytes);
    MPI_Bcast(r, (int)bytes, MPI_BYTE, root, c->comm);
    return ncclSuccess;
}

// Point to point: inside a group, requests wait for ncclGroupEnd.
#define EMU_MAX_REQS 256
static int emu_in_group = 0, emu_nreqs = 0;
static MPI_Request emu_reqs[EMU_MAX_REQS];

static inline ncclResult_t ncclGroupStart(void) { emu_in_group++; return ncclSuccess; }
static inline ncclResult_t ncclGroupEnd(void) {
    if (--emu_in_group == 0) {
        MPI_Waitall(emu_nreqs, emu_reqs, MPI_STATUSES_IGNORE);
        emu_nreqs = 0;
    }
    return ncclSuccess;
}

static inline ncclResult_t ncclSend(const void *b, size_t n, ncclDataType_t t, int peer, ncclComm_t c,
                                    cudaStream_t st) {
    (void)st;
    int bytes = (int)(n * emu_size(t));
    if (!emu_in_group) MPI_Ssend(b, bytes, MPI_BYTE, peer, 0, c->comm);
    else if (emu_nreqs == EMU_MAX_REQS) return ncclInvalidArgument;
    else MPI_Isend(b, bytes, MPI_BYTE, peer, 0, c->comm, &emu_reqs[emu_nreqs++]);
    return ncclSuccess;
}

static inline ncclResult_t ncclRecv(void *b, size_t n, ncclDataType_t t, int peer, ncclComm_t c, cudaStream_t st) {
    (void)st;
    int bytes = (int)(n * emu_size(t));
    if (!emu_in_group) MPI_Recv(b, bytes, MPI_BYTE, peer, 0, c->comm, MPI_STATUS_IGNORE);
    else if (emu_nreqs == EMU_MAX_REQS) return ncclInvalidArgument;
    else MPI_Irecv(b, bytes, MPI_BYTE, peer, 0, c->comm, &emu_reqs[emu_nreqs++]);
    return ncclSuccess;
}
