/* A worker's part of one step: runs a step plan (runtime/step.h) on the worker's engine, which holds one stage's
 * layers and, in a tensor group, one shard of them (parallel/plan.h, parallel/shard.h).
 *
 * Every worker of the job receives the same plan and cuts it into the same forward calls: at most the plan's
 * max_tokens tokens each, and, with several stages, at least `micro_batches` calls (two by default) when the step has
 * that many tokens, so that stage s works on call k+1 while stage s+1 works on call k (a sequence's chunk may be cut
 * across calls; each stage runs the calls in order, so a later piece always finds the earlier piece's keys and values
 * in its cache). With several stages the coordinator also keeps tsr_stage_depth steps in flight, each with its own
 * sequences (parallel/coordinator.h): stage 0 runs step n+1 while the last stage runs step n. A step of decode tokens
 * alone is then one call, as the other steps in flight already keep the stages busy. Per call: a stage other than the
 * first receives the call's hidden state [tokens][hidden] from the same tensor rank of the previous stage, runs its
 * layers, and sends the result to the next stage. The last stage's tensor group gathers its vocabulary shards of the
 * logits on its first member, the leader, which copies the rows the plan asks for and samples (tsr_step_sample) the
 * sequences whose last token was in the call. A call whose rows only feed greedy choices gathers each member's pick
 * instead of the rows; a call whose rows only feed draws without log-probabilities, penalties or biases gathers each
 * member's candidates of its columns (tsr_forward_top), which the leader merges and draws from; it then tells the
 * group the rows they could not decide (a broadcast of their span), which are gathered whole.
 *
 * Workers keep no state between steps beyond the KV cache contents the plans address. Errors (a comm failure,
 * TSR_ERR_REMOTE; an invalid plan) leave the stage unusable: the caller reports and leaves. */
#ifndef TSR_PARALLEL_STAGE_H
#define TSR_PARALLEL_STAGE_H

#include "parallel/comm.h"
#include "parallel/plan.h"
#include "runtime/engine.h"
#include "runtime/executor.h"
#include "runtime/step.h"

typedef struct tsr_stage {
    tsr_engine *engine; /* the worker's engine (its model part and KV pool) */
    const tsr_plan *plan;
    int worker;        /* index in plan->w */
    tsr_comm *tp;      /* the tensor group (tp > 1): sums inside the forward pass (device or host comm) */
    tsr_comm *tp_host; /* the tensor group over host buffers: gathers the logits shards (may equal tp) */
    tsr_comm *pipe;    /* every worker (member i = worker i): hidden states between stages */
    int micro_batches; /* calls per step to pipeline over stages (default 2; 1 turns it off) */
    /* scratch, owned */
    void *stage_buf; /* host staging for host comms on device backends */
    size_t stage_cap;
    void *sum_buf;
    size_t sum_cap;
    float *shard_logits, *gathered, *full;
    size_t cap_rows;
    struct tsr_seq_input *in;
    int *owner;
    int32_t *picks; /* [2 + 2 * tp][cap_in]: a call's greedy picks (ids, value bits), then the group's gathered */
    tsr_top_bufs top;       /* a call's candidates (in a tensor group: merged on the leader) */
    int32_t *top_all;       /* [1 + tp][cap_in][2 * TSR_TOP_MAX + 1]: a member's candidates, then the group's */
    int cap_in;
} tsr_stage;

/* Wires the engine's forward pass to the tensor group (when plan->tp > 1) and, for device comms, runs one small
 * all-reduce so that NCCL connects before any forward pass is recorded into a CUDA graph. Call once, on every
 * member of the group, before the first step. */
tsr_status tsr_stage_attach(tsr_stage *s);

/* Runs the plan. results (n_seqs entries) and logits ([rows][vocab] as tsr_step_logit_rows) are filled on the leader
 * only (other workers may pass NULL). */
tsr_status tsr_stage_run(tsr_stage *s, const tsr_step *step, tsr_step_result *results, float *logits);

/* Steps the coordinator keeps in flight for this plan: min(micro_batches, stages) with several stages (default
 * micro_batches 2 when <= 0), else 1. Coordinator and workers compute it alike. */
int tsr_stage_depth(const tsr_plan *p, int micro_batches);

/* 1 when worker `w` is the leader (first tensor rank of the last stage). */
int tsr_stage_is_leader(const tsr_plan *p, int w);

/* Frees the scratch (not the engine or the comms). */
void tsr_stage_free(tsr_stage *s);

#endif
