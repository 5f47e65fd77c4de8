// calc_shard.c: the formulas of sharded data parallelism (ZeRO, FSDP) for chapters 05 and 06
// (calc.h, the section "Sharded data parallelism").
#include <string.h>

#include "calc.h"
#include "check.h"

int calc_gpt2_units(const CalcModel *m, int64_t *sizes) {
    LAB_CHECK(m->arch == CALC_ARCH_GPT2 && m->tied, "calc_gpt2_units: the lab's GPT-2 only");
    const int64_t V = m->V, T = m->T, C = m->C;
    sizes[0] = V * C + T * C;                                           // wte, wpe
    for (int l = 0; l < m->L; l++) sizes[1 + l] = 12 * C * C + 13 * C;  // a block
    sizes[m->L + 1] = 2 * C;                                            // lnf weight, bias
    return m->L + 2;
}

int64_t calc_unit_shard(const int64_t *sizes, int nunits, int N, int q) {
    int64_t s = 0;
    for (int u = 0; u < nunits; u++) s += calc_piece(sizes[u], N, q);
    return s;
}

CalcBreakdown calc_shard_state(int64_t psi, int64_t shard, int zero, CalcDtype dtype) {
    CalcBytesPerParam bpp = calc_bytes_per_param(dtype, CALC_ADAM);
    CalcShard sh = calc_zero_shard(psi, zero, 2);  // which states are sharded (any dp > 1)
    CalcBreakdown b;
    memset(&b, 0, sizeof b);
    const double p = (double)(sh.params == psi ? psi : shard);
    const double g = (double)(sh.grads == psi ? psi : shard);
    const double o = (double)(sh.opt == psi ? psi : shard);
    b.params = p * bpp.params;
    b.grads = g * bpp.grads;
    b.master = o * bpp.master;
    b.m = o * bpp.m;
    b.v = o * bpp.v;
    b.total = b.params + b.grads + b.master + b.m + b.v;
    b.rank_params = psi;
    return b;
}

double calc_zero_wire_bytes(int64_t psi, int zero, int N, double e) {
    const double mult = zero == 3 ? 3.0 : 2.0;
    return mult * (double)psi * (N - 1) / N * e;
}

double calc_zero2_grad_bytes(int64_t psi, int64_t shard, int64_t bucket, int in_flight,
                             int64_t embed, int64_t largest_unit, double e) {
    const int64_t nbuckets = (psi + bucket - 1) / bucket;
    const double buckets = (double)(nbuckets > in_flight ? in_flight * bucket : psi);
    return e * ((double)shard + buckets + (double)(embed + largest_unit));
}

int calc_fsdp_all_gathers(int L, int reshard, int K) { return K * (reshard ? 2 * L + 3 : L + 2); }

int calc_fsdp_reduce_scatters(int L, int K, int no_sync) { return (no_sync ? 1 : K) * (L + 2); }

void calc_fsdp_wire_bytes(int64_t psi, int64_t head, int G, int K, int reshard, int no_sync,
                          double e, double *all_gather, double *reduce_scatter) {
    const double n = (double)psi, g = G;
    *all_gather = K * (reshard ? 2 * n - (double)head : n) * (g - 1) / g * e;
    *reduce_scatter = (no_sync ? 1 : K) * n * (g - 1) / g * e;
}
