/* A model served by this process for the non-HTTP front doors (tessera batch, tessera intake): the run opened
 * through parallel/session.h (this process's engine and local executor, or under mpirun the coordinator's
 * executor over the worker ranks), the tokenizer and chat template, the service loop, and the description
 * launcher/openai.h needs (tsr_oai_model).
 *
 * Under mpirun, worker ranks call tsr_host_run_worker() instead: it serves the coordinator's steps until the run
 * ends and returns the rank's exit code. A command that fails on rank 0 before tsr_host_open() must call
 * tsr_session_cancel() so the waiting workers leave.
 *
 * Ownership: tsr_host_open() returns a host that owns all of these; tsr_host_close() stops the service (grace
 * seconds for running requests, then cancels; every request gets its final event) and closes the run (NULL
 * accepted). The chat template is optional: a model without one serves /v1/completions only.
 * Errors: whatever loading fails with (IO, FORMAT, UNSUPPORTED, MISSING, NOMEM, REMOTE), with a tsr_fail message. */
#ifndef TSR_LAUNCHER_BATCH_HOST_H
#define TSR_LAUNCHER_BATCH_HOST_H

#include "launcher/openai.h"
#include "parallel/session.h"

typedef struct tsr_host_opts {
    const char *cmd; /* the command, for messages */
    const char *model_dir;
    const char *device;      /* "cpu" (default), "cuda", "cuda:N" */
    const char *served_name; /* the model name requests must use; default: the directory's last component */
    long kv_tokens;          /* KV pool size in tokens; 0: as much as fits (the engine's default) */
    double kv_fraction;      /* with kv_tokens 0: the pool's share of free memory (0: the default) */
    long max_context;        /* the longest sequence served (0: the model's context) */
    tsr_dtype kv_dtype;      /* the KV cache's storage; TSR_DTYPE_INVALID (the zero value): fp16 */
    int step_tokens;         /* tokens per step and forward call; 0: TSR_STEP_TOKENS_DEFAULT */
    int prefill_chunk;       /* prompt tokens in a step that also decodes (0: as many as the step leaves) */
    int max_running;         /* ceiling on running sequences; the commands set tsr_default_max_running's where none
                              * was given (0 here: the scheduler's 64) */
    int threads;             /* CPU threads; 0: default */
    int no_prefix_cache;     /* 1: do not share or keep prompt pages */
    tsr_par_opts par;        /* multi-rank options (tsr_par_opts_init / tsr_par_opts_take) */
} tsr_host_opts;

typedef struct tsr_host {
    tsr_session *session;
    tsr_tokenizer *tok;
    tsr_chat_template *tpl;
    char *bos, *eos, *name;
    int32_t *eos_ids;
    tsr_service *svc;
    tsr_oai_model model;
} tsr_host;

/* argv[*i] if it is an option batch and intake share (--model, --device, --served-model-name, --max-running,
 * --kv-tokens, --kv-fraction, --kv-dtype, --max-context, --step-tokens, --prefill-chunk, --threads,
 * --no-prefix-cache, and parallel/options.h's multi-rank options) into o, *i advanced past its value: 1 taken, 0 not
 * one of them, -1 a bad or missing value (the message printed, naming o->cmd). */
int tsr_host_opts_take(tsr_host_opts *o, int argc, char **argv, int *i);
/* The help lines of the KV cache's shared options (--kv-tokens .. --max-context), for batch's and intake's usage. */
void tsr_host_opts_kv_help(FILE *f);

/* Rank 0 (or the only process). */
tsr_status tsr_host_open(const tsr_host_opts *o, tsr_host **out);
void tsr_host_close(tsr_host *h, double grace_s);

/* A worker rank: runs the worker loop and returns its exit code (1 after printing why it could not start). */
int tsr_host_run_worker(const tsr_host_opts *o);

/* One line "prefix_lookups=.. prefix_hits=.. ..." of the service's counters (for logs and tests). */
void tsr_host_stats_line(tsr_host *h, char *buf, size_t cap);

#endif
