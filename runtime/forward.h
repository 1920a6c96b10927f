/* The forward pass of the Llama family, written once over the kernels/ops.h table.
 *
 * One call processes a batch of sequences, each with its own tokens, starting position and page table (a prefill
 * chunk, or one decode token, or anything between). Each sequence's K/V for the new tokens are written into the
 * paged cache; attention reads positions 0..p of that sequence from the cache. Logits are produced for the rows
 * each sequence asks for (none, its last token, or all its tokens), in sequence order.
 *
 * A tsr_forward_ctx owns the activation workspace, sized at creation for `max_tokens` tokens per call, so nothing
 * is allocated per call. */
#ifndef TSR_FORWARD_H
#define TSR_FORWARD_H

#include "kernels/ops.h"
#include "runtime/kv_cache.h"
#include "runtime/model.h"

typedef enum tsr_logits_mode { TSR_LOGITS_NONE, TSR_LOGITS_LAST, TSR_LOGITS_ALL } tsr_logits_mode;

typedef struct tsr_seq_input {
    const int32_t *tokens;
    int n_tokens;
    int pos0;                   /* position of tokens[0]; positions 0..pos0-1 are already cached */
    const int32_t *page_table;  /* covers positions 0 .. pos0 + n_tokens - 1 */
    int n_pages;                /* entries in page_table */
    tsr_logits_mode logits;
} tsr_seq_input;

typedef struct tsr_forward_ctx tsr_forward_ctx;

tsr_status tsr_forward_ctx_new(const tsr_model *model, const tsr_ops *ops, tsr_kv_cache *kv, int max_tokens,
                               tsr_forward_ctx **out);
void tsr_forward_ctx_free(tsr_forward_ctx *ctx);
int tsr_forward_max_tokens(const tsr_forward_ctx *ctx);

/* Runs the batch. logits receives [rows][vocab_size] fp32 for the requested rows, in order; it may be NULL when
 * no sequence asks for logits. Fails (changing nothing) on invalid input: token ids out of range, too many tokens,
 * page tables too short or naming pages outside the pool. */
tsr_status tsr_forward(tsr_forward_ctx *ctx, const tsr_seq_input *seqs, int n_seqs, float *logits);

/* Number of logit rows the batch produces. */
int tsr_forward_logit_rows(const tsr_seq_input *seqs, int n_seqs);

#endif
