/* A check shared by the CPU and GPU suites: device-side reductions of more logits rows than one head call takes
 * (runtime/forward.c, TSR_HEAD_ROWS). A decode batch of `rows` one-token sequences on a fixture model: its greedy picks
 * (tsr_forward_argmax) and sampling candidates (tsr_forward_top), whose head and reduction run slice by slice inside
 * the forward, against the whole rows of tsr_forward reduced on the host; each call twice, so that a backend that
 * records decode steps (CUDA graphs) is checked on the recording and on its replay; then tsr_forward_fetch_rows for
 * rows of the slice still held, of an earlier slice, and across both (rows must be at least TSR_HEAD_ROWS + 13). */
#ifndef TSR_TESTS_FORWARD_SLICES_H
#define TSR_TESTS_FORWARD_SLICES_H

#include "kernels/ops.h"

#include <stddef.h>

/* ops must have argmax_rows and top_rows. Picks, candidate ids and values and fetched rows must equal the host's
 * bit for bit; each row's normalizer z within z_rel relative (0: exact; a device sums in its own order). Returns 0,
 * or -1 with the first difference (or failure) described in err. */
int tsr_check_forward_slices(const char *model_dir, const tsr_ops *ops, int rows, float z_rel, char *err, size_t cap);

#endif
