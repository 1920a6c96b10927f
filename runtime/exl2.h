/* EXL2 quantized linear layers: loading, validation and the reference dequantizer.
 *
 * A tsr_qmatrix borrows the packed tensors from the mmap'd safetensors set (q_weight, q_scale, q_scale_max,
 * q_groups, bias) and owns only what it derives at load: q_perm (argsort of q_invperm) and a per-group table
 * (bits, first stored row, row count, first packed row, fp16-rounded scale multiplier). Everything is checked
 * before use: group tables must cover exactly K rows with whole words and known bit widths, permutations must be
 * a permutation of 0..K-1, shapes must agree. Errors name the file and tensor. See EXL2.md §3-§7.
 *
 * GPTQ mode (kind == TSR_QMATRIX_GPTQ, loaded by tsr_gptq_load in gptq.h): the same structure describes a 4-bit
 * GPTQ matrix, since GPTQ's qweight [K/8][N] is exactly a 4-bit column bit stream. Groups are 4-bit, their
 * scale is the fp16 scales[g][n] and their zero point the per-(group, column) code from qzeros (+1 for v1
 * checkpoints) instead of EXL2's fixed offset 2^(b-1) and quadratic scale codes. With act-order the rows are
 * sorted by group (perm) and the packed words re-packed in that order into q_weight_owned. */
#ifndef TSR_EXL2_H
#define TSR_EXL2_H

#include "runtime/safetensors.h"
#include "runtime/status.h"

#include <stdint.h>

typedef struct tsr_qgroup {
    int bits;       /* 2, 3, 4, 5, 6 or 8 */
    int row0;       /* first stored row */
    int rows;       /* rows in the group */
    int qrow0;      /* first packed 32-bit row of q_weight */
    float scale_m;  /* h(q_scale_max[g] / 256): multiply by (code+1)^2 and round to fp16 for the column scale */
} tsr_qgroup;

typedef enum tsr_qmatrix_kind { TSR_QMATRIX_EXL2 = 0, TSR_QMATRIX_GPTQ = 1 } tsr_qmatrix_kind;

typedef struct tsr_qmatrix {
    int K, N;                   /* input rows, output columns (padded to a multiple of 32 by the converter) */
    int G, Q;                   /* groups, packed rows */
    const uint32_t *q_weight;   /* [Q][N] */
    const uint32_t *q_scale;    /* [G][N/8] 4-bit codes */
    const uint16_t *bias;       /* [N] fp16 bits, or NULL */
    int32_t *perm;              /* [K] stored row i holds original row perm[i] (owned) */
    tsr_qgroup *groups;         /* [G] (owned) */
    uint64_t bytes;             /* bytes of the tensors as stored in the file */
    /* GPTQ mode only (zero for EXL2; q_scale is NULL and scale_m unused there) */
    tsr_qmatrix_kind kind;
    const uint32_t *g_zeros;    /* qzeros [G][N/8]: 4-bit zero code of (g, n) in nibble n%8 */
    int zero_add;               /* added to the zero code: 1 for v1 ("gptq") files, 0 for gptq_v2 */
    const void *g_scales;       /* scales [G][N], fp16 bits or fp32 (g_scales_f32) */
    int g_scales_f32;           /* fp32 scales are rounded to fp16 on use, as ExLlamaV2 converts them */
    uint32_t *q_weight_owned;   /* act-order: packed rows re-packed in group order; q_weight points here */
} tsr_qmatrix;

/* Loads `<key>.q_weight` etc. K and N are the expected input and output widths before padding (N is padded to
 * 32 here). prescale multiplies q_scale_max (1 for Llama-family models). */
tsr_status tsr_qmatrix_load(const tsr_st_set *set, const char *key, int K, int N, int has_bias, float prescale,
                            tsr_qmatrix *out);
void tsr_qmatrix_free(tsr_qmatrix *m);

/* Column scale of group g, column n, as ExLlamaV2 evaluates it in fp16 (GPTQ: scales[g][n] as fp16). */
float tsr_qmatrix_scale(const tsr_qmatrix *m, int g, int n);

/* EXL2 only: the column scale that scale code `code` (0..15) stands for in group g, h((code + 1)^2 · scale_m), as
 * tsr_qmatrix_scale evaluates it (the CUDA backend tabulates it per group). */
float tsr_qmatrix_code_scale(const tsr_qmatrix *m, int g, uint32_t code);

/* Zero point of group g, column n: the code that dequantizes to 0 (EXL2: 2^(bits-1); GPTQ: qzeros code + zero_add). */
int tsr_qmatrix_zero(const tsr_qmatrix *m, int g, int n);

/* GPTQ only: scale[c] and zero[c] of group g for the n columns from n0, as tsr_qmatrix_scale and tsr_qmatrix_zero
 * give them one at a time (the CPU kernel reads a block of columns per group with one call). */
void tsr_qmatrix_gptq_params(const tsr_qmatrix *m, int g, int n0, int n, float *scale, float *zero);

/* Code (unsigned, 0..2^bits-1) of stored row `row` of group g in column n. Reference implementation: the
 * kernels decode whole tiles at once. */
uint32_t tsr_qmatrix_code(const tsr_qmatrix *m, const tsr_qgroup *g, int row_in_group, int n);

/* Dense dequantized weight in ORIGINAL row order, fp32 [K][N] (test and tool use only; the forward pass never
 * materializes a weight matrix). round_fp16 rounds each element like ExLlamaV2's reconstruct. */
void tsr_qmatrix_dequant_ref(const tsr_qmatrix *m, int round_fp16, float *W);

/* Average bits per weight of the stored tensors (q_weight, q_scale, q_scale_max, q_groups, q_invperm; GPTQ:
 * qweight, qzeros, scales, g_idx). */
double tsr_qmatrix_bpw(const tsr_qmatrix *m);

#endif
