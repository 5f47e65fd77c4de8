// test_reliability.c: the reliability every training chapter owes, one harness call each
// (tests/harness.h, harness_assert_reliable): a killed rank ends the job within 10 s, a signal
// (SIGTERM, SIGKILL) inside a save leaves the old checkpoint intact and loadable, an injected
// NaN stops the run with one message naming the step, an injected out-of-memory on the last
// rank (--inject-oom-step) ends the job within 10 s with that rank's one message and the last
// checkpoint loadable. Each new chapter adds one Test() here.
//
// Seen to catch (each break made, the test seen failing, then restored):
//   - a non-atomic save (ckpt.c writing <path> itself instead of <path>.tmp): on 00,
//     "save-signal: ... changed under signal 15 in a save" (and 9);
//   - the NaN failing with lab_fail instead of lab_fail_collective (optim.c): on 03,
//     "nan: the error is printed 2 times, not once";
//   - the NaN message counting steps from 0 (step, not step + 1): on 02, "nan: the message does
//     not name NaN and step 5";
//   - the killed rank of 03 sleeping 20 s before its _exit: "kill: the job took 21.1 s to end
//     after rank 1 died (from its message; limit 10 s)".
#include <criterion/criterion.h>
#include <stdlib.h>

#include "gpt2.h"
#include "harness.h"

// A small model (~120k parameters): each run takes a second or two.
#define MODEL "--layers 2 --channels 64 --heads 4 --seq 32 --batch 24"
static const GPT2Config CFG = {.V = 256, .T = 32, .L = 2, .C = 64, .NH = 4};

Test(reliability, chapter_00_single_device, .timeout = 400) {
    harness_assert_reliable("./00_memory_budget/run --train --quiet", 1, MODEL, &CFG);
}

Test(reliability, chapter_02_data_parallel, .timeout = 400) {
    harness_assert_reliable("./02_data_parallel/run --quiet", 3, MODEL, &CFG);
}

// Mutant: mutants/oom-rank-dropped.patch
Test(reliability, chapter_03_ddp, .timeout = 400) {
    harness_assert_reliable("./03_ddp/run --quiet --overlap-steps 0", 2, MODEL, &CFG);
}

// ZeRO-3 on 3 ranks: every rank holds only its pieces, so the save gathers them to rank 0
// first (05_zero/zero.c) and the NaN must be seen through the sharded clipping norm.
Test(reliability, chapter_05_zero, .timeout = 400) {
    harness_assert_reliable("./05_zero/run --quiet --zero 3", 3, MODEL, &CFG);
}

// 06: HSDP, 2 shard groups of 2: the save gathers the first group's pieces to rank 0; the NaN
// goes into a unit gradient before its reduce-scatter (fsdp_grads_done) and must reach every
// shard group through the replicas' all-reduce (when it went into one rank's piece after it,
// the other group went on and the error came from each rank of the first, after 5 s). Left
// out of CI for its time (run it with LAB_TEST_SLOW=1).
Test(reliability, chapter_06_fsdp, .timeout = 400) {
    if (!getenv("LAB_TEST_SLOW")) cr_skip_test("06 is left out of CI for time: LAB_TEST_SLOW=1");
    harness_assert_reliable("./06_fsdp/run --quiet --shard-group 2", 4, MODEL, &CFG);
}

// 07: a TP group of 2 in bf16: the save gathers the slices of the fp32 master (and Adam m, v) to
// rank 0 in the lab's format; the NaN is injected into rank 0's bf16 gradients (session_poison
// on the slice's gradient buffer) and must stop both ranks through the group's clipping norm
// (10.2 s at load 8; seen failing with the injection a no-op: "nan: the run succeeded").
Test(reliability, chapter_07_tensor_parallel, .timeout = 400) {
    harness_assert_reliable("./07_tensor_parallel/run --quiet --tp 2 --dtype bf16", 2, MODEL, &CFG);
}

// 08: a pipeline of 2 stages (1F1B, 4 micro-batches): the save gathers the whole model (weights,
// Adam m and v) to rank 0 in the lab's format; the NaN is injected on the last stage and must be
// seen by every stage through the global clipping norm.
Test(reliability, chapter_08_pipeline, .timeout = 400) {
    harness_assert_reliable("./08_pipeline/run --quiet --micro-batches 4", 2, MODEL, &CFG);
}

// 09: 2 pipeline stages (1F1B) through 09's grid (8.4 s here; the 4-rank 2 x 2 grid took
// 9.5-10.3 s): the save gathers every stage to rank 0 in the lab's format; the NaN is injected
// on the last rank and must stop both.
// Mutant: mutants/oom-rank-dropped.patch
Test(reliability, chapter_09_3d, .timeout = 400) {
    harness_assert_reliable("./09_3d/run --quiet --tp 1 --pp 2 --micro-batches 2", 2, MODEL, &CFG);
}
