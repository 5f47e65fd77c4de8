// test_reliability.c: the reliability every training chapter owes, one harness call each
// (tests/harness.h, harness_assert_reliable): a killed rank ends the job within 10 s, a signal
// (SIGTERM, SIGKILL) inside a save leaves the old checkpoint intact and loadable, an injected
// NaN stops the run with one message naming the step. Chapters 05-09 add one Test() here.
//
// Seen to catch (each break made, the test seen failing, restored):
//   - signal(SIGXFSZ...) is not this; for save-signal: ckpt.c's atomic_commit renaming the tmp
//     BEFORE its stall (a torn new file in place of the old one): "changed under signal";
//   - lab_fail instead of lab_fail_collective for the NaN (optim.c): "printed 3 times" on 02/03;
//   - the NaN message counting from 0 (step, not step + 1): "does not name NaN and step 5".
#include <criterion/criterion.h>

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

Test(reliability, chapter_03_ddp, .timeout = 400) {
    harness_assert_reliable("./03_ddp/run --quiet --overlap-steps 0", 2, MODEL, &CFG);
}
