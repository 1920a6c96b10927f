/* Internal state of the scheduler, shared by its source files (scheduler.c: lifecycle, queue, events;
 * sched_plan.c: planning and committing steps; sched_check.c: invariants and test hooks). Not a public API.
 *
 * A sequence is in exactly one of three lists: waiting (sorted by id: FCFS, preempted sequences go back in id
 * order, so to the front), running (sorted by id, so the newest is last: the preemption victim) or dead
 * (finished, kept until the caller has drained its final event, then freed). Only running sequences hold pages.
 * Positions 0..n_computed-1 of a running sequence are in its pages; its page table covers at least those and at
 * most the tokens it knows (n_total). */
#ifndef TSR_SCHED_INTERNAL_H
#define TSR_SCHED_INTERNAL_H

#include "runtime/sched/prefix.h"
#include "runtime/sched/scheduler.h"

typedef enum { SEQ_WAITING, SEQ_RUNNING, SEQ_DEAD } seq_state;

typedef struct sched_seq {
    uint64_t id;
    seq_state state;
    int32_t *tokens;        /* prompt then generated tokens */
    int n_prompt, n_total, cap_tokens;
    int32_t *table;         /* page table */
    int n_table, cap_table;
    int n_computed;         /* positions whose KV is in the pages */
    int n_cached;           /* prompt tokens found in the prefix cache at first admission (usage) */
    int admitted;           /* admitted at least once */
    int n_reg;              /* table pages already offered to the prefix index */
    tsr_prefix_link link;   /* chain position after table page n_reg-1 */
    /* request */
    tsr_sampling sampling;
    uint64_t seed;
    int max_tokens, min_tokens, ignore_eos, n_logprobs;
    double deadline;
    int32_t *stop_ids;
    int n_stop;
    tsr_logit_bias *bias;   /* the request's n_bias entries, then room for n_stop masking entries */
    int n_bias;
    /* the outstanding plans */
    int planned;            /* 0, or 1 + the ring slot of the plan (planned, not yet committed) it is in */
    int plan_pos0, plan_n;
    tsr_finish_reason pending; /* ended (cancel/finish) while in flight: applied at commit */
} sched_seq;

typedef struct seq_list {
    sched_seq **v;
    int n, cap;
} seq_list;

struct tsr_sched {
    tsr_sched_opts o;       /* effective options (defaults filled in) */
    tsr_pages pages;
    tsr_prefix_index prefix;
    seq_list waiting, running, dead;
    seq_list plans[TSR_SCHED_MAX_PLANS]; /* a ring of the plans awaiting commit, oldest at plan_head */
    int plan_head, n_plans;
    int building;           /* ring slot of the plan tsr_sched_plan is building */
    int budget;             /* tokens left while planning */
    int preempted_now;      /* a preemption happened during this plan: admit nothing */
    /* events: ev_res[i] holds the result copy of events[i] when has_res[i] */
    tsr_sched_event *events;
    tsr_step_result *ev_res;
    uint8_t *has_res;
    int n_events, cap_events;
    int drained;            /* the events were handed out: clear them (and free dead sequences) on the next call */
    uint64_t next_id;
    int preempted_total;
    uint64_t prefill_tokens, decode_tokens, steps;
};

/* helpers shared between the files (scheduler.c) */
static inline int sched_pages_for(int tokens, int page_size) { return (tokens + page_size - 1) / page_size; }
static inline int seq_generated(const sched_seq *q) { return q->n_total - q->n_prompt; }

/* Makes room so that the rest of one public call cannot run out of memory: every list can take every live
 * sequence and the event queue one event per live sequence (no call emits more). TSR_ERR_NOMEM otherwise, before
 * anything changed. */
tsr_status sched_reserve(tsr_sched *s, int extra_seqs);
/* Inserts keeping the list sorted by id (room reserved by sched_reserve). */
void sched_list_insert(seq_list *l, sched_seq *q);
void sched_list_remove(seq_list *l, const sched_seq *q);
/* Clears drained events and frees the sequences whose final event they carried. */
void sched_settle(tsr_sched *s);
/* Queues an event for q (token -1 for none; result copied when not NULL; room reserved by sched_reserve). */
void sched_emit(tsr_sched *s, const sched_seq *q, int32_t token, const tsr_step_result *result,
                      tsr_finish_reason finish);
/* Drops q's page references (last page first, so a chain's first pages stay cached longest). */
void sched_release_pages(tsr_sched *s, sched_seq *q);
/* Ends q: its final event (with `token` when it carries one), pages released, moved to the dead list. */
void sched_end(tsr_sched *s, sched_seq *q, int32_t token, const tsr_step_result *result, tsr_finish_reason why);
/* Sends a running sequence back to the queue (pages released, tokens kept). */
void sched_preempt(tsr_sched *s, sched_seq *q);
sched_seq *sched_find(const tsr_sched *s, uint64_t id);

#endif
