// mpi_flags.c: the shared command line (common/flags.c) inside a real MPI job.
//
// Launched by tests/test_flags.c as `mpirun -np N build/tests/mpi_flags [flags]`. It parses
// like a chapter does (dist_init first, then lab_parse_args with a few chapter flags) and rank
// 0 prints every parsed value as "name=value", one per line, for the test to compare.
//
//   mpi_flags parse-before-init [flags]   parses before dist_init instead (the order a program
//                                         may use when it needs a flag to set up MPI)
//   mpi_flags no-training [flags]         takes no shared flag group but --collective-timeout
//                                         (LAB_FLAGS_NONE), as 01/04
//   mpi_flags single [flags]              takes every group but --kill-* (LAB_FLAGS_SINGLE), as 00
//   mpi_flags fail-on-last [flags]        after parsing, only the last rank (not rank 0) calls
//                                         lab_fail_collective: its message must not be lost
#include <stdio.h>
#include <string.h>

#include "check.h"
#include "dist.h"
#include "flags.h"

static const char *USAGE =
    "mpi_flags: a test program for the lab's command line.\n"
    "  mpirun -np 4 build/tests/mpi_flags --steps 5 --micro 8\n";

int main(int argc, char **argv) {
    const char *mode = argc > 1 ? argv[1] : "";
    int before = strcmp(mode, "parse-before-init") == 0;
    int fail_last = strcmp(mode, "fail-on-last") == 0;
    unsigned groups = strcmp(mode, "no-training") == 0 ? LAB_FLAGS_NONE
                    : strcmp(mode, "single") == 0      ? LAB_FLAGS_SINGLE
                                                       : LAB_FLAGS_ALL;
    if (!before) dist_init(&argc, &argv);
    if (before || fail_last || groups != LAB_FLAGS_ALL) {  // drop the mode word: the rest is the command line
        argv[1] = argv[0];
        argv++;
        argc--;
    }

    // A chapter's own flags, one of each kind.
    float bucket_mb = 25.0f;
    int micro = 4, verbose = 0;
    const char *schedule = "1f1b", *tag = NULL;
    FlagSpec extra[] = {
        {"--bucket-mb", FLAG_FLOAT, &bucket_mb, 0.0, 1024.0, NULL, "gradient bucket size (MiB)"},
        {"--micro", FLAG_INT, &micro, 1, 64, NULL, "micro-batches per step"},
        {"--schedule", FLAG_CHOICE, &schedule, 0, 0, "gpipe|1f1b", "pipeline schedule"},
        {"--verbose", FLAG_BOOL, &verbose, 0, 1, NULL, "print more"},
        {"--tag", FLAG_STRING, &tag, 0, 0, NULL, "a free-form label"},
    };
    LabArgs a = lab_args_defaults();
    lab_parse_args_for(groups, argc, argv, &a, extra, (int)(sizeof(extra) / sizeof(extra[0])),
                       "mpi_flags", USAGE);
    if (before) dist_init(&argc, &argv);
    if (strcmp(mode, "fail-on-last") == 0 && dist_rank() == dist_size() - 1 && dist_size() > 1)
        lab_fail_collective("only rank %d met this error", dist_rank());

    if (dist_rank() == 0) {
#define S(x) ((x) ? (x) : "(null)")
        printf("world=%d\n", dist_size());
        printf("vocab=%d\nseq=%d\nlayers=%d\nchannels=%d\nheads=%d\n", a.V, a.T, a.L, a.C, a.NH);
        printf("batch=%d\nsteps=%d\nlr=%g\nweight-decay=%g\ngrad-clip=%g\nwarmup=%d\n", a.batch,
               a.steps, (double)a.lr, (double)a.weight_decay, (double)a.grad_clip, a.warmup);
        printf("seed=%d\ndata-seed=%d\ndata=%s\n", a.seed, a.data_seed, S(a.data));
        printf("device=%s\nbackend=%s\ndtype=%s\nthreads=%d\n", a.device, a.backend, a.dtype, a.threads);
        printf("log-every=%d\nquiet=%d\ntrace=%s\ndump=%s\n", a.log_every, a.quiet, S(a.trace), S(a.dump));
        printf("save=%s\nsave-every=%d\nresume=%s\nload-weights=%s\nsave-weights=%s\n", S(a.save),
               a.save_every, S(a.resume), S(a.load_weights), S(a.save_weights));
        printf("inject-nan-step=%d\nkill-rank=%d\nkill-step=%d\n", a.inject_nan_step, a.kill_rank, a.kill_step);
        printf("bucket-mb=%g\nmicro=%d\nschedule=%s\nverbose=%d\ntag=%s\n", (double)bucket_mb, micro,
               schedule, verbose, S(tag));
#undef S
    }
    dist_finalize();
    return 0;
}
