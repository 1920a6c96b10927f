/* When attention over a quantized KV cache should rebuild the batch's context as an fp16 copy first.
 *
 * A backend with fast kernels for an fp16 cache (CUDA) has two ways through a Q4/Q6/Q8 cache: rebuild every visible
 * position once into an fp16 copy and run the fp16 prefill kernels over it, or let the decode kernel rebuild each
 * row's positions in its own tiles. The copy costs one pass over n_seqs × the longest span; the decode kernel costs
 * one rebuild per row visit (Σ over rows of position + 1, at most `window` each). These functions choose between
 * them from host values only, so the choice is tested on any machine (tests/unit/test_kv_copy_plan.c); the kernels
 * that follow it are in kernels/cuda/attention_kvq.cu.
 *
 * The layout's pointers are never dereferenced here except the host mirrors (host_seq_row0, host_positions); a
 * split's halves share the caller's arrays, offset. Nothing is allocated; nothing fails. */
#ifndef TSR_KV_COPY_PLAN_H
#define TSR_KV_COPY_PLAN_H

#include "kernels/ops.h"

/* Row visits each rebuilt position must serve for the copy to pay: the copy writes and then reads every position
 * as fp16, so it needs at least two reads of each to beat rebuilding per visit. */
#define TSR_KV_COPY_MIN_VISITS 2

#ifdef __cplusplus
extern "C" { /* called from kernels/cuda/attention_kvq.cu */
#endif

/* The window the copy's extents follow: `window` where b has host mirrors to compute them from, else 0 (the copy then
 * holds every sequence from position 0). */
int tsr_kv_copy_window(const tsr_batch_layout *b, int window);

/* The first page of a sequence's positions the copy holds, for a sequence whose first row is at first_position:
 * the page of that row's window start (0 without a window, copy_window 0). The prefill kernels read a block's
 * positions from its first row's window start on, never before. The CUDA copy calls it on the device. */
static inline TSR_KV_HOST_DEVICE int tsr_kv_copy_first_page(int first_position, int window, int page_size)
{
    const int lo = window > 0 ? first_position - window + 1 : 0;
    return lo > 0 ? lo / page_size : 0;
}

/* Pages per sequence of a copy of batch b's visible context (the longest span from each sequence's first page, in
 * whole pages) where the copy pays and fits the room the pool's sizing left (kv->expand_positions;
 * TSR_KV_EXPAND_ROWS per row of b where that is 0); 0 where it does not, or where b's positions reach past its page
 * tables. window: the sliding window, 0 for none. */
int tsr_kv_copy_pages(const tsr_batch_layout *b, int window, const tsr_kv_cache *kv);

/* For a batch whose copy as a whole does not pay or fit (tsr_kv_copy_pages is 0): where it starts with one-row
 * sequences (decode tokens; the scheduler plans them before chunks and admissions) and goes on with sequences whose
 * own copy pays and fits, returns the number of leading one-row sequences and fills `decode` with them (the first
 * rows, every array as in b) and `rest` with the others (sequence arrays offset, rows keeping their numbers, so q
 * and out stay as they are). 0 otherwise, including where b has no host mirrors. */
int tsr_kv_copy_split(const tsr_batch_layout *b, int window, const tsr_kv_cache *kv, tsr_batch_layout *decode,
                      tsr_batch_layout *rest);

#ifdef __cplusplus
}
#endif

#endif
