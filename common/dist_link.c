// dist_link.c: virtual nodes and links (dist.h, "Virtual nodes and links"; docs/CLUSTER.md).
//
// The data still moves through MPI; this file only decides how long each op may take. With
// --links on, world rank r sits on virtual node r / ranks_per_node, and every op is held until
// the alpha-beta model's time for its bytes on the link it crosses has passed:
//   T = bytes / bw + hops * latency
// where bytes and hops are the ones the planner counts (common/calc_comm.c): a ring all-reduce
// of S bytes on n ranks 2(n-1)/n S and 2(n-1) hops, a reduce-scatter or all-gather the bytes
// dist counts for this rank (every block but one) and n-1 hops, a send its bytes and 1 hop, a
// broadcast, reduce, scatter or gather the bytes this rank sends or receives and 1 hop. A
// collective's link is the slowest its group crosses (between nodes as soon as two of its
// ranks sit on different nodes); a send's is the one between the two ranks.
//   sends       the sender holds the message for T before MPI gets it, so the receiver sees it
//               T after it was sent (the sender's link is busy meanwhile);
//   collectives every rank holds T after the real op has finished (the real op ends once the
//               last rank has arrived: the transfer starts when the whole group is there).
// A hold is a sleep (clock_nanosleep to an absolute time): no core spins, no byte changes.
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "check.h"
#include "dist.h"
#include "dist_backend.h"
#include "health.h"

static DistLinks links;   // ranks_per_node == 0: off
static int links_on = 0;

// seconds held per group (by gid: the communication thread's copy of a group is the same group)
#define LINK_GROUPS 64
static struct { uint64_t gid; double s, hidden; int used; } held[LINK_GROUPS];
static pthread_mutex_t held_mu = PTHREAD_MUTEX_INITIALIZER;
static double total_held, total_hidden;   // this process, every group

// The presets: per GPU, per direction. NVLink 4 (H100 SXM: 450 GB/s each way), 400 Gb/s
// InfiniBand NDR, one NIC per GPU (50 GB/s); latencies of a small message.
static const struct { const char *name, *about; double peak, intra_bw, intra_lat, inter_bw, inter_lat; }
    presets[] = {
        {"h100", "H100 SXM: NVLink 450 GB/s inside a node, 400 Gb/s InfiniBand (50 GB/s) between",
         989e12, 450e9, 2e-6, 50e9, 5e-6},
        {"a100", "A100 SXM: NVLink 300 GB/s inside a node, 200 Gb/s InfiniBand (25 GB/s) between",
         312e12, 300e9, 2e-6, 25e9, 5e-6},
};

static char link_msg[512];

// "4:450,2:50,5" = 4 ranks per node, inside 450 GB/s and 2 us, between 50 GB/s and 5 us;
// "h100:4" a preset; "h100:4:cpu" the preset scaled to this machine's compute (see dist.h).
const char *dist_links_parse(const char *spec, DistLinks *out, double cpu_peak) {
    memset(out, 0, sizeof *out);
    const char *valid = "valid: G:BW,LAT:BW,LAT (G ranks per node; GB/s and microseconds inside "
                        "a node, then between nodes; e.g. 4:450,2:50,5), or PRESET:G[:cpu] with "
                        "PRESET h100 or a100 (e.g. h100:4, h100:4:cpu)";
    char buf[128];
    if (!spec || strlen(spec) >= sizeof buf) {
        snprintf(link_msg, sizeof link_msg, "--links '%s': %s", spec ? spec : "", valid);
        return link_msg;
    }
    snprintf(buf, sizeof buf, "%s", spec);
    char *f[4] = {NULL, NULL, NULL, NULL};
    int nf = 0;
    for (char *p = buf; nf < 4;) {
        f[nf++] = p;
        char *c = strchr(p, ':');
        if (!c) break;
        *c = '\0';
        p = c + 1;
    }
    char *end;
    for (size_t i = 0; i < sizeof presets / sizeof presets[0]; i++) {
        if (strcmp(f[0], presets[i].name) != 0) continue;
        long g = nf >= 2 ? strtol(f[1], &end, 10) : 0;
        int cpu = nf == 3 && strcmp(f[2], "cpu") == 0;
        if (nf < 2 || nf > 3 || *end || g < 1 || g > 1 << 20 || (nf == 3 && !cpu)) {
            snprintf(link_msg, sizeof link_msg, "--links %s: %s", spec, valid);
            return link_msg;
        }
        out->ranks_per_node = (int)g;
        out->intra = (DistLink){presets[i].intra_bw, presets[i].intra_lat};
        out->inter = (DistLink){presets[i].inter_bw, presets[i].inter_lat};
        out->scale = 1;
        out->preset = presets[i].name;
        out->gpu_peak = presets[i].peak;
        if (cpu) {
            if (!(cpu_peak > 0)) {
                snprintf(link_msg, sizeof link_msg, "--links %s: this machine's compute peak is "
                         "unknown, so the links cannot be scaled to it; use --links %s:%ld", spec,
                         presets[i].name, g);
                return link_msg;
            }
            // compute is cpu_peak / gpu_peak as fast: so is every link (bandwidth x scale,
            // latency / scale), and the compute-to-communication ratio stays the GPUs'
            out->scale = cpu_peak / presets[i].peak;
            out->cpu_peak = cpu_peak;
            out->intra.bw *= out->scale, out->intra.lat /= out->scale;
            out->inter.bw *= out->scale, out->inter.lat /= out->scale;
        }
        return NULL;
    }
    double v[5];
    int ok = nf == 3;
    for (int i = 0, k = 0; ok && i < 3; i++) {
        char *p = f[i];
        int want = i == 0 ? 1 : 2;
        for (int j = 0; j < want && ok; j++) {
            v[k++] = strtod(p, &end);
            ok = end != p && (j + 1 < want ? *end == ',' : *end == '\0');
            p = end + 1;
        }
    }
    if (!ok || v[0] < 1 || v[0] > 1 << 20 || v[0] != floor(v[0]) || !(v[1] > 0) || !(v[3] > 0) ||
        !(v[2] >= 0) || !(v[4] >= 0) || !isfinite(v[1] + v[2] + v[3] + v[4])) {
        snprintf(link_msg, sizeof link_msg, "--links %s: %s; bandwidths > 0, latencies >= 0",
                 spec, valid);
        return link_msg;
    }
    out->ranks_per_node = (int)v[0];
    out->intra = (DistLink){v[1] * 1e9, v[2] * 1e-6};
    out->inter = (DistLink){v[3] * 1e9, v[4] * 1e-6};
    out->scale = 1;
    return NULL;
}

void dist_links_set(const DistLinks *l) {
    if (!l || l->ranks_per_node < 1) {
        links_on = 0;
        memset(&links, 0, sizeof links);
        return;
    }
    links = *l;
    links_on = 1;
}

const DistLinks *dist_links(void) { return links_on ? &links : NULL; }

int dist_links_enabled(void) { return links_on; }

int dist_group_nodes(const DistGroup *g) {
    if (!links_on || g->size <= 1) return 1;
    int nodes = 0;
    for (int i = 0; i < g->size; i++) {   // distinct nodes among the members
        int node = g->world_ranks[i] / links.ranks_per_node, seen = 0;
        for (int j = 0; j < i && !seen; j++) seen = g->world_ranks[j] / links.ranks_per_node == node;
        nodes += !seen;
    }
    return nodes;
}

double dist_link_seconds(DistOpKind k, double bytes, int n, const DistLink *l) {
    if (n <= 1 && k != OP_SEND && k != OP_RECV) return 0;
    double hops = k == OP_ALL_REDUCE ? 2.0 * (n - 1)
                : k == OP_REDUCE_SCATTER || k == OP_ALL_GATHER || k == OP_BARRIER ? n - 1.0
                : 1;
    return bytes / l->bw + hops * l->lat;
}

// The link a call on g crosses, and the bytes the model charges this rank for it.
static const DistLink *call_link(const DistCall *c, const DistGroup *g, double *bytes) {
    const double e = (double)dist_dtype_size(c->dt), N = g->size, S = (double)c->count * e;
    const int r = g->rank, n = g->size;
    switch (c->kind) {
    case OP_ALL_REDUCE: *bytes = floor(2 * (N - 1) * S / N); break;
    case OP_REDUCE_SCATTER: *bytes = (double)(call_total(c, n) - call_block_len(c, n, r)) * e; break;
    case OP_ALL_GATHER: *bytes = (double)(call_total(c, n) - call_block_len(c, n, (r + 1) % n)) * e; break;
    case OP_BROADCAST: *bytes = S; break;
    case OP_REDUCE: *bytes = c->peer == r ? (N - 1) * S : S; break;
    case OP_SCATTER: *bytes = c->peer == r ? (N - 1) * S : S; break;
    case OP_GATHER: {
        double total = (double)call_total(c, n);
        *bytes = c->peer == r ? (total - (double)call_block_len(c, n, r)) * e
                              : (double)call_block_len(c, n, r) * e;
    } break;
    case OP_SEND: case OP_RECV: {
        *bytes = S;
        int me = g->world_ranks[r], peer = g->world_ranks[c->peer];
        int cross = me / links.ranks_per_node != peer / links.ranks_per_node;
        if (c->kind == OP_SEND && c->recv) {   // sendrecv: the slower of the two directions
            int src = g->world_ranks[c->src];
            cross |= me / links.ranks_per_node != src / links.ranks_per_node;
            double in = (double)c->recvcount * e;
            if (in > *bytes) *bytes = in;
        }
        return cross ? &links.inter : &links.intra;
    }
    default: *bytes = 0; break;
    }
    return dist_group_nodes(g) > 1 ? &links.inter : &links.intra;
}

static void charge_as(const DistGroup *g, double s, int hidden) {
    pthread_mutex_lock(&held_mu);
    int at = -1;
    for (int i = 0; i < LINK_GROUPS && at < 0; i++)
        if (held[i].used && held[i].gid == g->gid) at = i;
    for (int i = 0; i < LINK_GROUPS && at < 0; i++)
        if (!held[i].used) at = i, held[i].used = 1, held[i].gid = g->gid, held[i].s = held[i].hidden = 0;
    if (at >= 0) held[at].s += s, held[at].hidden += hidden ? s : 0;
    total_held += s, total_hidden += hidden ? s : 0;
    pthread_mutex_unlock(&held_mu);
}

static void charge(const DistGroup *g, double s) { charge_as(g, s, 0); }

void dist_link_totals(double *held_s, double *hidden_s) {
    pthread_mutex_lock(&held_mu);
    *held_s = total_held, *hidden_s = total_hidden;
    pthread_mutex_unlock(&held_mu);
}

double dist_link_hidden_seconds(const DistGroup *g) {
    double s = 0;
    pthread_mutex_lock(&held_mu);
    for (int i = 0; i < LINK_GROUPS; i++)
        if (held[i].used && held[i].gid == g->gid) s = held[i].hidden;
    pthread_mutex_unlock(&held_mu);
    return s;
}

double dist_link_held_seconds(const DistGroup *g) {
    double s = 0;
    pthread_mutex_lock(&held_mu);
    for (int i = 0; i < LINK_GROUPS; i++)
        if (held[i].used && held[i].gid == g->gid) s = held[i].s;
    pthread_mutex_unlock(&held_mu);
    return s;
}

void dist_link_held_reset(const DistGroup *g) {
    pthread_mutex_lock(&held_mu);
    for (int i = 0; i < LINK_GROUPS; i++)
        if (held[i].used && held[i].gid == g->gid) held[i].s = held[i].hidden = 0;
    pthread_mutex_unlock(&held_mu);
}

static void sleep_until(double t) {
    struct timespec ts;
    ts.tv_sec = (time_t)floor(t);
    ts.tv_nsec = (long)((t - floor(t)) * 1e9);
    if (ts.tv_nsec >= 1000000000L) ts.tv_sec++, ts.tv_nsec -= 1000000000L;
    while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL) != 0) {}
}

static double mono_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

// The model's seconds for c on g (0 when links are off), charged to g.
static double model_seconds(const DistCall *c, const DistGroup *g) {
    double bytes = 0;
    const DistLink *l = call_link(c, g, &bytes);
    double s = dist_link_seconds(c->kind == OP_RECV ? OP_SEND : c->kind, bytes, g->size, l);
    return s;
}

double dist_link_call_seconds(const DistCall *c, const DistGroup *g) {
    if (!links_on || c->kind == OP_SEND || c->kind == OP_RECV) return 0;
    double s = model_seconds(c, g);
    charge(g, s);
    return s;
}

void dist_link_sleep(double seconds) {
    if (seconds > 0) sleep_until(mono_now() + seconds);
}

void dist_link_hold_before(const DistCall *c, const DistGroup *g) {
    if (!links_on || c->kind != OP_SEND) return;
    double s = model_seconds(c, g);
    charge(g, s);
    sleep_until(mono_now() + s);
}

void dist_link_hold_after(const DistCall *c, const DistGroup *g) { dist_link_hold_after_on(c, g, 0); }

void dist_link_hold_after_on(const DistCall *c, const DistGroup *g, int comm_thread) {
    if (!links_on || c->kind == OP_SEND || c->kind == OP_RECV) return;
    double s = model_seconds(c, g);
    charge_as(g, s, comm_thread);
    sleep_until(mono_now() + s);
}

static const char *bw_text(char *buf, size_t len, double bw) {
    if (bw >= 100e9) snprintf(buf, len, "%.0f GB/s", bw / 1e9);
    else snprintf(buf, len, "%.3g GB/s", bw / 1e9);
    return buf;
}

static const char *lat_text(char *buf, size_t len, double lat) {
    if (lat >= 1e-3) snprintf(buf, len, "%.4g ms", lat * 1e3);
    else snprintf(buf, len, "%.4g us", lat * 1e6);
    return buf;
}

void dist_links_print(FILE *out) {
    if (!links_on) return;
    char a[32], b[32], la[32], lb[32];
    int world = dist_size(), G = links.ranks_per_node;
    int nodes = (world + G - 1) / G;
    fprintf(out, "virtual cluster: %d rank%s in %d node%s of %d; inside a node %s, %s; "
            "between nodes %s, %s (alpha-beta: bytes / bw + hops x latency, held in dist)\n",
            world, world == 1 ? "" : "s", nodes, nodes == 1 ? "" : "s", G,
            bw_text(a, sizeof a, links.intra.bw), lat_text(la, sizeof la, links.intra.lat),
            bw_text(b, sizeof b, links.inter.bw), lat_text(lb, sizeof lb, links.inter.lat));
    if (links.preset && links.scale != 1)
        fprintf(out, "  preset %s scaled by this machine's compute: %.3g GFLOP/s measured (SGEMM, "
                "one rank) / %.0f TFLOP/s of the GPU = %.3g, so every link is %.3g x as fast (latency "
                "/ %.3g): the compute-to-communication ratio of the GPU cluster\n", links.preset,
                links.cpu_peak / 1e9, links.gpu_peak / 1e12, links.scale, links.scale, links.scale);
    else if (links.preset)
        fprintf(out, "  preset %s at the GPUs' own speeds (add :cpu to scale the links to this "
                "machine's compute)\n", links.preset);
}

double dist_links_cpu_peak(void) { return health_peak_flops(DEV_CPU, 0); }
