/* Synthetic quantized models: the bit packer, the per-matrix bit-width planner and a streaming model writer.
 *
 * Owner: the `tessera synth` / `tessera bench` work (runtime/synth.c, launcher/cmd_synth.c). tsr_synth_write()
 * produces a model directory of one of two formats. EXL2 (the default; EXL2.md §1, §3-§6, §9): config.json with
 * a quantization_config block, generation_config.json, and output.safetensors (or output-0000i-of-0000N shards)
 * holding an fp16 embedding, fp16 norms and, for every linear layer and the head, the EXL2 tensor set with random
 * codes, random scale codes, random row permutations and bit widths mixed inside each matrix so that the decoder
 * layers average the requested bits per weight. GPTQ (EXL2.md §8): every decoder linear layer as a 4-bit GPTQ set
 * (qweight, qzeros, scales, g_idx; bias for Qwen2's q/k/v), v1 checkpoint format (qzeros store zero − 1), groups
 * in file order or, with act_order, a random desc_act assignment (g_idx[k] = position of row k in a random order
 * / group size, shared by the matrices reading the same input); lm_head and the embedding fp16; config.json's
 * quantization_config and AutoGPTQ's quantize_config.json; model.safetensors, or model-0000i-of-0000N shards
 * with model.safetensors.index.json. Everything is derived from the seed (same seed, same bytes), and it streams:
 * at most one quantization group (EXL2) or one 128-row block (GPTQ) of one matrix, plus one K-entry permutation,
 * is in memory at a time, so a 70B-geometry model can be written on a small machine. Weights dequantize to a
 * standard deviation of about 1/sqrt(K), which keeps activations finite through many layers. The host must be
 * little-endian (x86-64, arm64). Errors: TSR_ERR_ARG for a geometry, target or option that cannot be built
 * (message says why and what is reachable), TSR_ERR_IO for files that cannot be written (partial files are
 * removed), TSR_ERR_NOMEM. */
#ifndef TSR_SYNTH_H
#define TSR_SYNTH_H

#include "runtime/config.h"
#include "runtime/status.h"

#include <stdint.h>

/* Packs `rows` codes per column into EXL2 column bit streams (EXL2.md §5.1): codes is [rows][N] row-major (each
 * code < 2^bits), words is [rows*bits/32][N] and is overwritten. rows*bits must be a multiple of 32. */
void tsr_synth_pack(const uint8_t *codes, int rows, int bits, int N, uint32_t *words);

#define TSR_SYNTH_MAX_WIDTHS 4

/* Bit-width layout of one matrix, as the converter describes it: widths in descending order, the rows quantized
 * at each width and the group size used for them (the last group of the last width may be shorter). */
typedef struct tsr_synth_qplan {
    int K, N;                 /* input rows; output columns padded to a multiple of 32 */
    int n_widths;
    int bits[TSR_SYNTH_MAX_WIDTHS];
    int rows[TSR_SYNTH_MAX_WIDTHS];
    int group_size[TSR_SYNTH_MAX_WIDTHS];
    int G, Q;                 /* groups, packed 32-bit rows */
} tsr_synth_qplan;

/* Fills G and Q from bits/rows/group_size and checks the layout (descending widths, whole words, rows summing to
 * K, K <= 65535). */
tsr_status tsr_synth_qplan_finish(tsr_synth_qplan *p);
/* Stored bits of the matrix as tsr_qmatrix_bpw counts them (q_weight, q_scale, q_scale_max, q_groups,
 * q_invperm; no bias). */
uint64_t tsr_synth_qplan_bits(const tsr_synth_qplan *p);
/* A converter option given as proportions (EXL2.md §4.1): width i gets ceil(min(K*prop[i], rows left) / gs[i])
 * groups of gs[i] rows, cut at K; the last width takes whatever is left. N is padded to 32. */
tsr_status tsr_synth_qplan_props(int K, int N, int n, const int *bits, const double *prop, const int *group_size,
                                 tsr_synth_qplan *p);
/* The head layout of the converter's -hb option (EXL2.md §9.2): head_bits 2, 3, 4, 5, 6 or 8. */
tsr_status tsr_synth_head_plan(int K, int N, int head_bits, tsr_synth_qplan *p);
/* Writes the q_groups table of a plan: [2G] pairs (bits, first packed row). */
void tsr_synth_qplan_groups(const tsr_synth_qplan *p, int16_t *q_groups);

typedef enum tsr_synth_format { TSR_SYNTH_EXL2 = 0, TSR_SYNTH_GPTQ = 1 } tsr_synth_format;

typedef struct tsr_synth_opts {
    tsr_arch arch;
    int hidden, layers, heads, kv_heads, head_dim, intermediate, vocab;
    tsr_synth_format format;  /* TSR_SYNTH_EXL2 (0) or TSR_SYNTH_GPTQ */
    double bpw;               /* EXL2: target average of the decoder layers' linear layers (ignored for GPTQ) */
    int head_bits;            /* EXL2: converter -hb option for lm_head (default 6; ignored for GPTQ) */
    /* GPTQ: rows per group, a power of two 8..65536, -1 one group per matrix, 0 = 128; EXL2: 32, 64 or 128 rows
     * for both widths of every decoder matrix (not the 8-bit top slice), 0 = a random variant per matrix */
    int group_size;
    /* GPTQ only (must stay 0 for EXL2): */
    int act_order;            /* desc_act: g_idx a random non-monotonic assignment (else g_idx[k] = k / gs) */
    int sym;                  /* symmetric: every zero point 8 (else random zero points 6..10) */
    uint64_t seed;
    int max_pos;              /* max_position_embeddings */
    uint64_t shard_bytes;     /* 0: one file */
    int threads;              /* shards written at once (0: one per core); the files do not depend on it */
    int verbose;              /* progress lines on stderr */
} tsr_synth_opts;

typedef struct tsr_synth_result {
    double layers_bpw;        /* achieved average over the decoder layers (bits / (K*N), as tsr_qmatrix_bpw) */
    double head_bpw;          /* GPTQ: 16 (fp16 lm_head) */
    int n_files;
    uint64_t total_bytes;     /* of the safetensors files */
    uint64_t n_params;        /* K*N summed over linear layers (padded N) plus embedding and norms */
} tsr_synth_result;

/* Writes the model into directory `dir` (created if missing). */
tsr_status tsr_synth_write(const tsr_synth_opts *o, const char *dir, tsr_synth_result *res);

#endif
