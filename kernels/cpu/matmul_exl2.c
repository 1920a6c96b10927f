/* EXL2 (and 4-bit GPTQ) matrix multiplication on the CPU, dequantizing tile by tile.
 *
 * Work is split over blocks of TILE_N output columns. For each block, every group is walked in chunks of up to
 * 32 stored rows: the chunk's packed words (b words per 32 rows at b bits, since each column is an independent bit
 * stream) are loaded for the block's columns, unpacked, offset by 2^(b-1) and multiplied by the fp16-rounded
 * column scale into a small fp32 tile [32][TILE_N] on the stack. Every input row then accumulates
 * x[m][perm[row]] · tile into y: the activation is gathered through the permutation, the weights stay in stored
 * order, and no full-precision copy of the matrix ever exists. Each weight value (code − offset) · scale is exact
 * in fp32; accumulation is fp32.
 *
 * GPTQ matrices (tsr_qmatrix kind TSR_QMATRIX_GPTQ, see gptq.h) go through the same loop: their groups are 4-bit
 * streams, and the per-column offset is the group's zero point (tsr_qmatrix_zero) instead of 2^(b-1), the scale
 * the fp16 GPTQ scale; both come from the same per-(group, column) tables, so EXL2 results are unchanged. */
#include "kernels/cpu/cpu_kernels.h"
#include "kernels/cpu/threadpool.h"
#include "runtime/half.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#define TILE_N 32
#define CHUNK_ROWS 32

typedef struct {
    const tsr_qmatrix *q;
    int N; /* output columns computed */
    const float *x;
    int M;
    float *y;
} exl2_job;

/* Decodes rows [j0, j0 + rows) of group g for columns [n0, n0 + nb) into tile[rows][TILE_N]:
 * (code − zero[c]) · scale[c]. */
static void decode_chunk(const tsr_qmatrix *q, const tsr_qgroup *g, int j0, int rows, int n0, int nb,
                         const float *zero, const float *scale, float tile[CHUNK_ROWS][TILE_N])
{
    const int b = g->bits;
    const uint32_t mask = (1u << b) - 1u;
    const size_t N = (size_t)q->N;
    /* j0 is a multiple of 32 within the group, so the chunk starts on a word boundary */
    const size_t w0 = (size_t)g->qrow0 + (size_t)j0 * (size_t)b / 32;
    const int n_words = (rows * b + 31) / 32;
    uint32_t words[8][TILE_N];
    for (int t = 0; t < n_words; t++) {
        const uint32_t *src = q->q_weight + (w0 + (size_t)t) * N + (size_t)n0;
        for (int c = 0; c < nb; c++) words[t][c] = src[c];
        for (int c = nb; c < TILE_N; c++) words[t][c] = 0;
    }
    for (int j = 0; j < rows; j++) {
        const int bit = j * b, t = bit >> 5, sh = bit & 31;
        float *dst = tile[j];
        if (sh + b <= 32) {
            for (int c = 0; c < TILE_N; c++) dst[c] = ((float)((words[t][c] >> sh) & mask) - zero[c]) * scale[c];
        } else {
            for (int c = 0; c < TILE_N; c++) {
                uint32_t v = (words[t][c] >> sh) | (words[t + 1][c] << (32 - sh));
                dst[c] = ((float)(v & mask) - zero[c]) * scale[c];
            }
        }
    }
}

/* Per-thread buffer of the current group's column scales and zero points over the thread's column range; a
 * thread-specific key frees it when its thread exits (the service loop and worker threads come and go). */
static _Thread_local float *param_buf;
static _Thread_local size_t param_cap;
static pthread_key_t param_key;
static pthread_once_t param_once = PTHREAD_ONCE_INIT;

static void param_key_init(void) { pthread_key_create(&param_key, free); }

static float *params(size_t n)
{
    if (n > param_cap) {
        pthread_once(&param_once, param_key_init);
        float *grown = realloc(param_buf, n * sizeof *grown);
        if (!grown) return NULL;
        param_buf = grown;
        param_cap = n;
        pthread_setspecific(param_key, grown);
    }
    return param_buf;
}

/* Walks the matrix row chunk by row chunk, and inside each chunk across the thread's column blocks, so that the
 * packed words of one row are read contiguously (reading one 32-column block down all rows would stride by the
 * row length and touch a new page every row). Sums go straight into y. */
static void exl2_range(void *ctx, int begin, int end)
{
    const exl2_job *job = ctx;
    const tsr_qmatrix *q = job->q;
    float tile[CHUNK_ROWS][TILE_N];
    float acc[TILE_N];
    const int n_blocks = end - begin;
    float *par = params((size_t)n_blocks * TILE_N * 2);
    for (int blk = begin; blk < end; blk++) {
        const int n0 = blk * TILE_N;
        const int nb = job->N - n0 < TILE_N ? job->N - n0 : TILE_N;
        for (int m = 0; m < job->M; m++) {
            float *yr = job->y + (size_t)m * job->N + n0;
            for (int c = 0; c < nb; c++) yr[c] = q->bias ? tsr_half_to_float(q->bias[n0 + c]) : 0.0f;
        }
    }
    float scale_one[TILE_N], zero_one[TILE_N];
    for (int gi = 0; gi < q->G; gi++) {
        const tsr_qgroup *g = &q->groups[gi];
        /* the group's scales and zero points for every column of the range (recomputed per block if no buffer) */
        for (int bi = 0; par && bi < n_blocks; bi++) {
            const int n0 = (begin + bi) * TILE_N, nb = job->N - n0 < TILE_N ? job->N - n0 : TILE_N;
            float *sc = par + (size_t)bi * TILE_N * 2, *ze = sc + TILE_N;
            for (int c = 0; c < TILE_N; c++) sc[c] = c < nb ? tsr_qmatrix_scale(q, gi, n0 + c) : 0.0f;
            for (int c = 0; c < TILE_N; c++)
                ze[c] = q->kind == TSR_QMATRIX_GPTQ ? (c < nb ? (float)tsr_qmatrix_zero(q, gi, n0 + c) : 0.0f)
                                                    : (float)(1 << (g->bits - 1));
        }
        for (int j0 = 0; j0 < g->rows; j0 += CHUNK_ROWS) {
            const int rows = g->rows - j0 < CHUNK_ROWS ? g->rows - j0 : CHUNK_ROWS;
            const int32_t *perm = q->perm + g->row0 + j0;
            for (int bi = 0; bi < n_blocks; bi++) {
                const int n0 = (begin + bi) * TILE_N, nb = job->N - n0 < TILE_N ? job->N - n0 : TILE_N;
                const float *sc = par ? par + (size_t)bi * TILE_N * 2 : scale_one, *ze = par ? sc + TILE_N : zero_one;
                if (!par) {
                    for (int c = 0; c < TILE_N; c++) scale_one[c] = c < nb ? tsr_qmatrix_scale(q, gi, n0 + c) : 0.0f;
                    for (int c = 0; c < TILE_N; c++)
                        zero_one[c] = q->kind == TSR_QMATRIX_GPTQ ? (c < nb ? (float)tsr_qmatrix_zero(q, gi, n0 + c) : 0.0f)
                                                                  : (float)(1 << (g->bits - 1));
                }
                decode_chunk(q, g, j0, rows, n0, nb, ze, sc, tile);
                for (int m = 0; m < job->M; m++) {
                    const float *xr = job->x + (size_t)m * q->K;
                    for (int c = 0; c < TILE_N; c++) acc[c] = 0.0f;
                    for (int j = 0; j < rows; j++) {
                        const float xv = xr[perm[j]];
                        for (int c = 0; c < TILE_N; c++) acc[c] += xv * tile[j][c];
                    }
                    float *yr = job->y + (size_t)m * job->N + n0;
                    for (int c = 0; c < nb; c++) yr[c] += acc[c];
                }
            }
        }
    }
}

void tsr_cpu_linear_exl2(const tsr_qmatrix *q, int N, const float *x, int M, float *y)
{
    exl2_job job = {q, N, x, M, y};
    tsr_parallel_for((N + TILE_N - 1) / TILE_N, exl2_range, &job);
}
