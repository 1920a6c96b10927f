/* The forward pass of the Llama family, written once over the kernels/ops.h table.
 *
 * One call processes a batch of sequences, each with its own tokens, starting position and page table (a prefill
 * chunk, or one decode token, or anything between). Each sequence's K/V for the new tokens are written into the
 * paged cache; attention reads positions 0..p of that sequence from the cache. Logits are produced for the rows
 * each sequence asks for (none, its last token, or all its tokens), in sequence order.
 *
 * A tsr_forward_ctx owns the activation workspace, sized at creation for `max_tokens` tokens per call, so nothing
 * is allocated per call.
 *
 * Split models (model.h, tsr_model_part): a context runs only the layers its model part holds. A stage without the
 * embedding takes its input hidden state from tsr_forward_hidden() (the caller puts the previous stage's output
 * there), and a stage without the head leaves its output hidden state there. A tensor shard computes its local
 * heads, MLP features and vocabulary columns and sums the attention and MLP outputs over its group through the
 * comm hook (tsr_forward_set_comm) right after o_proj and down_proj; its logits rows hold its vocabulary columns
 * only (model->local.vocab wide). The KV cache holds the part's layers (indexed from layer0) and local KV heads. */
#ifndef TSR_FORWARD_H
#define TSR_FORWARD_H

#include "kernels/ops.h"
#include "runtime/kv_cache.h"
#include "runtime/model.h"

/* Tokens per forward call unless a command says otherwise (--step-tokens). A prompt's prefill runs in chunks of
 * this many tokens, and every chunk dequantizes each EXL2 matrix again for its GEMMs: on the H200, a 2048-token prompt
 * of the 8B shape prefills at 24k tok/s in 512-token chunks, 30k in 1024, 35k in one (NOTES.md, stop 27). A step
 * that carries a long chunk also delays the decode rows beside it by that long (about 60 ms for 2048 tokens of the
 * 8B shape there), and the workspace grows with it (about 230 KB per token for the 8B shape, 460 KB for 70B). */
#define TSR_STEP_TOKENS_DEFAULT 2048

/* Rows of logits one head call computes (the logits buffer holds this many rows, or max_tokens if fewer). More rows
 * (a larger decode batch, or every position of a prompt) run the head in slices of this many, and on the GPU each
 * slice dequantizes the whole head again: about 1 ms a slice for the 8B shape's 6-bit head on an H100 (NOTES.md,
 * stop 61). 256 rows keep decode batches up to 256 in one slice, for a buffer of 131 MB at a 128k vocabulary. */
#define TSR_HEAD_ROWS 256

/* The rows of logits a forward context for max_tokens tokens holds: min(max_tokens, TSR_HEAD_ROWS), or the
 * environment's TSR_HEAD_ROWS (1..4096; other values are ignored) in place of the constant: less memory for a large
 * vocabulary, or A/B timings. */
int tsr_forward_head_rows(int max_tokens);

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

/* Sums over a tensor-parallel group, called from inside the forward pass. */
typedef struct tsr_forward_comm {
    void *ctx;
    /* buf: n floats in the backend's memory, summed in place over the group (same result on every member) */
    tsr_status (*allreduce)(void *ctx, float *buf, size_t n);
    int capturable;         /* 1: the call may be recorded and replayed by ops->run_cached (NCCL on the stream);
                               0: it blocks on the host, so the forward pass is never recorded */
} tsr_forward_comm;

tsr_status tsr_forward_ctx_new(const tsr_model *model, const tsr_ops *ops, tsr_kv_cache *kv, int max_tokens,
                               tsr_forward_ctx **out);
void tsr_forward_ctx_free(tsr_forward_ctx *ctx);
int tsr_forward_max_tokens(const tsr_forward_ctx *ctx);

/* Installs (or with NULL removes) the tensor-parallel comm; required when model->part.tp_size > 1. The struct is
 * copied. */
void tsr_forward_set_comm(tsr_forward_ctx *ctx, const tsr_forward_comm *comm);

/* The hidden-state buffer: [max_tokens][hidden] fp32 in the backend's memory. A stage without the embedding reads
 * its input rows from here; a stage without the head leaves its output rows here (row order = token order of the
 * call). */
float *tsr_forward_hidden(tsr_forward_ctx *ctx);

/* Runs the batch. logits receives [rows][vocab_size] fp32 for the requested rows, in order (a vocabulary shard:
 * [rows][local.vocab]); it may be NULL when no sequence asks for logits or the part has no head. Fails (changing
 * nothing) on invalid input: token ids out of range, too many tokens, page tables too short or naming pages outside
 * the pool; fails with the hook's status (TSR_ERR_REMOTE) when the comm hook failed (the group is then unusable). */
tsr_status tsr_forward(tsr_forward_ctx *ctx, const tsr_seq_input *seqs, int n_seqs, float *logits);

/* Rows one tsr_forward_argmax call can pick from (max_tokens: past TSR_HEAD_ROWS rows the head and the picks run
 * in slices of that many); 0 when it cannot work here (the backend has no ops->argmax_rows, or the part holds no
 * head). */
int tsr_forward_pick_rows(const tsr_forward_ctx *ctx);

/* Runs the batch like tsr_forward, but hands back only each logits row's greedy pick: ids[r] the first index of
 * the row's largest logit (NaN entries skipped; 0 when the row has nothing else) and vals[r] that logit (NaN then),
 * over the part's vocabulary columns, in row order. Only the picks cross to the host, not the rows. Fails like
 * tsr_forward, with TSR_ERR_UNSUPPORTED when tsr_forward_pick_rows is 0, and with TSR_ERR_ARG for more rows. */
tsr_status tsr_forward_argmax(tsr_forward_ctx *ctx, const tsr_seq_input *seqs, int n_seqs, int32_t *ids, float *vals);

/* Rows one tsr_forward_top call can reduce (as tsr_forward_pick_rows); 0 when the backend has no ops->top_rows or
 * the part holds no head. */
int tsr_forward_top_rows(const tsr_forward_ctx *ctx);

/* Runs the batch like tsr_forward, but hands back each logits row reduced on the device (ops.h top_rows): its
 * TSR_TOP_MAX best logits, ids[r * TSR_TOP_MAX + j] and vals[...] (largest first, NaN skipped, id -1 past the
 * row's non-NaN count), and z[r], the sum of exp((l - max) * inv_temp[r]) over the row. Fails like
 * tsr_forward_argmax. The rows stay on the device until the next call: tsr_forward_fetch_rows copies them. */
tsr_status tsr_forward_top(tsr_forward_ctx *ctx, const tsr_seq_input *seqs, int n_seqs, const float *inv_temp,
                           int32_t *ids, float *vals, float *z);

/* Copies logits rows [row0, row0 + n) ([n][local.vocab] fp32) of the last tsr_forward_top or tsr_forward_argmax
 * call to out (for rows their candidates cannot sample), bit for bit the values that call reduced: in one copy, or,
 * where that call had more rows than one head call takes (TSR_HEAD_ROWS), from the head run again on each whole
 * slice that holds them. TSR_ERR_ARG for rows that call did not produce. */
tsr_status tsr_forward_fetch_rows(tsr_forward_ctx *ctx, int row0, int n, float *out);

/* Number of logit rows the batch produces (when the part has the head). */
int tsr_forward_logit_rows(const tsr_seq_input *seqs, int n_seqs);

#endif
