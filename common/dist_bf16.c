// dist_bf16.c: the element-wise work of dist.h's reductions that MPI does not do for us: bf16
// sum and max (MPI has no bf16 type), and AVG's division (MPI has no average).
//
// bf16 conversions come from kernels.h: round to nearest even, NaN stays NaN.
#include <stdint.h>

#include "dist_backend.h"
#include "kernels.h"

void dist_bf16_sum_fn(void *in, void *inout, int *len, MPI_Datatype *dt) {
    (void)dt;
    const uint16_t *a = in;
    uint16_t *b = inout;
    for (int i = 0; i < *len; i++) b[i] = bf16_from_f32(bf16_to_f32(a[i]) + bf16_to_f32(b[i]));
}

void dist_bf16_max_fn(void *in, void *inout, int *len, MPI_Datatype *dt) {
    (void)dt;
    const uint16_t *a = in;
    uint16_t *b = inout;
    for (int i = 0; i < *len; i++)
        if (bf16_to_f32(a[i]) > bf16_to_f32(b[i])) b[i] = a[i];
}

// x[i] = expr over the count elements of buf, seen as T.
#define EACH_AS(T, expr)                                    \
    do {                                                    \
        T *x = buf;                                         \
        for (size_t i = 0; i < count; i++) x[i] = (expr);   \
    } while (0)

void dist_finish_avg(void *buf, size_t count, DistDtype dt, int n) {
    if (n == 1 || count == 0) return;
    switch (dt) {
    case DIST_F32: EACH_AS(float, x[i] / (float)n); break;
    case DIST_BF16: EACH_AS(uint16_t, bf16_from_f32(bf16_to_f32(x[i]) / (float)n)); break;
    case DIST_F64: EACH_AS(double, x[i] / (double)n); break;
    case DIST_I32: EACH_AS(int32_t, x[i] / n); break;
    case DIST_U8: EACH_AS(uint8_t, (uint8_t)(x[i] / n)); break;
    default: break;
    }
}
#undef EACH_AS
