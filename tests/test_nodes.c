// test_nodes.c: the multi-node path. Ranks on separate machines talk over the network, not over
// shared memory; Open MPI's TCP transport is what they use where there is no InfiniBand. These
// tests run chapters with `--mca pml ob1 --mca btl tcp,self` on the loopback interface (the
// shared-memory transport vader left out, so every message between two ranks crosses a TCP
// socket, as it would between nodes) and require the same bits as the usual shared-memory run:
// the transport moves bytes, it must not change one. 09_3d/README.md ("Real nodes") says how to
// run the same programs on machines of your own.
#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"

#define TCP_MCA "--mca pml ob1 --mca btl tcp,self --mca btl_tcp_if_include lo --mca btl_base_verbose 30"
#define SMALL "--quiet --layers 2 --channels 64 --heads 4 --seq 32 --batch 8 --steps 3"

// Runs prog with flags on np ranks twice, over shared memory and over TCP; the two dumps must
// be identical (losses and weights to the bit), and the TCP run's log must show that Open MPI
// opened its TCP transport on the loopback interface (else the test would prove nothing).
static void same_bits_over_tcp(const char *prog, int np, const char *flags) {
    RunResults shm, tcp;
    char *out = NULL;
    unsetenv("LAB_TEST_MCA");
    int rc = harness_run_dump(prog, np, flags, &shm, &out, 120);
    cr_assert_eq(rc, 0, "%s %s over shared memory failed:\n%s", prog, flags, out);
    free(out);
    setenv("LAB_TEST_MCA", TCP_MCA, 1);
    rc = harness_run_dump(prog, np, flags, &tcp, &out, 120);
    unsetenv("LAB_TEST_MCA");
    cr_assert_eq(rc, 0, "%s %s over TCP failed:\n%s", prog, flags, out);
    cr_assert(harness_contains(out, "btl: tcp: Using interface: lo"),
              "the TCP run does not show Open MPI's TCP transport on lo:\n%s", out);
    free(out);
    cr_assert(harness_results_match("over TCP vs shared memory", &tcp, &shm, 0.0f, 0.0f),
              "%s %s: the TCP run differs from the shared-memory run", prog, flags);
}

// Mutant: mutants/nodes-transport-ignored.patch
Test(nodes, zero1_over_tcp_is_bit_identical, .timeout = 240) {
    same_bits_over_tcp("./05_zero/run", 2, SMALL " --zero 1");
}

// Mutant: mutants/nodes-transport-ignored.patch
Test(nodes, grid_2x2x1_over_tcp_is_bit_identical, .timeout = 240) {
    same_bits_over_tcp("./09_3d/run", 4, SMALL " --tp 2 --pp 2 --micro-batches 2");
}
