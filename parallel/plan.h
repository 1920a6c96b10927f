/* The planner: how a model is split over the worker ranks, decided before any weight is loaded.
 *
 * Input: the model's description (per-layer bytes as stored, embedding and head bytes, dimensions), the number of
 * workers, the split (--split layers | layers:r1,r2,... | tensor, and --tp N for tensor groups inside layer stages),
 * each worker's usable device memory (min of its free memory and --gpu-memory; 0 = not limited, e.g. CPU workers)
 * and the KV pool wanted. Output: a tsr_plan, a flat struct the coordinator broadcasts so that every rank runs the
 * same plan: per worker its stage, tensor rank, layer range, whether it holds the embedding and the head, and the
 * bytes of its weights, KV pool and workspace; the KV pool size in pages (the same page numbering on every rank).
 *
 * Layer stages get contiguous layers, sized so that each stage's bytes (its layers' actual bytes, which differ
 * between EXL2 layers, plus the embedding on the first and the final norm and head on the last) follow the explicit
 * ratios, or else the workers' memory, or else are equal. Tensor groups split every layer (parallel/shard.h). The
 * KV pool is as large as asked, or (when it is 0 and memory is limited) as large as the tightest worker allows; a
 * plan that does not fit fails with TSR_ERR_NOMEM naming the worker and the numbers. */
#ifndef TSR_PARALLEL_PLAN_H
#define TSR_PARALLEL_PLAN_H

#include "runtime/dtype.h"
#include "runtime/model.h"

#include <stdint.h>
#include <stdio.h>

#define TSR_PLAN_MAX     64
#define TSR_PLAN_VERSION 3u /* 2: stream_bytes; 3: max_context */

typedef enum tsr_split_kind { TSR_SPLIT_NONE = 0, TSR_SPLIT_LAYERS, TSR_SPLIT_TENSOR } tsr_split_kind;

typedef struct tsr_split_spec {
    tsr_split_kind kind;
    int n_ratios; /* layers:r1,r2,...: one ratio per stage (0: derive) */
    double ratios[TSR_PLAN_MAX];
} tsr_split_spec;

/* Parses "none", "layers", "layers:0.45,0.55" or "tensor" (TSR_ERR_ARG with a message otherwise). */
tsr_status tsr_split_parse(const char *s, tsr_split_spec *out);

/* Parses a byte size: "24GiB", "24G" (= GiB), "1500MiB", "20GB" (10^9), "123456" (bytes); "0" = no limit. */
tsr_status tsr_size_parse(const char *s, uint64_t *bytes);
/* A comma-separated list of sizes ("24GiB" or "24GiB,20GiB"); at most max entries. */
tsr_status tsr_sizes_parse(const char *s, uint64_t *v, int max, int *n);

typedef struct tsr_plan_input {
    int n_workers; /* 1 in a single process */
    tsr_split_spec split;
    int tp;                          /* tensor group size: tensor split = n_workers; layers: 1 or --tp */
    uint64_t capacity[TSR_PLAN_MAX]; /* usable bytes per worker (0: unlimited) */
    int gpu;                         /* workers are GPUs: reserve 512 MiB each for the runtime */
    int page_size, max_tokens;
    tsr_dtype kv_dtype;
    long kv_tokens;     /* KV pool wanted (0: as much as fits, or max_position_embeddings) */
    double kv_fraction; /* as much as fits: this share of what weights and workspace leave (0: 0.95) */
    long max_context;   /* the longest sequence served, below the model's context (0: the model's) */
} tsr_plan_input;

typedef struct tsr_plan_worker {
    int stage, tp_rank;
    int layer0, layer1; /* its layers */
    int embed, head;    /* holds the embedding / the final norm and head */
    uint64_t weight_bytes, kv_bytes, work_bytes, capacity;
    uint64_t stream_bytes; /* weight bytes a decode step reads: its layers' and head's share, not the embedding
                              table (a step gathers a few rows of it) unless the head is tied to it */
} tsr_plan_worker;

typedef struct tsr_plan {
    uint32_t version;
    int n_workers, n_stages, tp;
    int n_layers;
    int page_size, n_pages, max_tokens;
    int max_context; /* the longest sequence served (at most the model's context) */
    int kv_dtype; /* tsr_dtype */
    int split;    /* tsr_split_kind as asked */
    tsr_plan_worker w[TSR_PLAN_MAX];
} tsr_plan;

/* Makes the plan for a whole model (loaded with tsr_model_load: only its description is read). */
tsr_status tsr_plan_make(const tsr_model *m, const tsr_plan_input *in, tsr_plan *out);

/* Index of the worker at (stage, tp_rank). */
static inline int tsr_plan_worker_at(const tsr_plan *p, int stage, int tp_rank)
{
    return stage * p->tp + tp_rank;
}

/* The model part of worker w (tp_size 1: the shard is cut after loading). */
tsr_model_part tsr_plan_part(const tsr_plan *p, int w);

/* Writes a human-readable description. */
void tsr_plan_print(FILE *f, const tsr_plan *p, const tsr_model *m);

/* Checks a plan received from another rank (version, counts, ranges) against the model's layer count. */
tsr_status tsr_plan_check(const tsr_plan *p, int n_layers);

#endif
