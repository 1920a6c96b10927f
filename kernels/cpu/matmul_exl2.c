/* EXL2 (and 4-bit GPTQ) matrix multiplication on the CPU, dequantizing band by band.
 *
 * The output columns are cut into blocks of CB columns, handed to the threads in contiguous ranges. A thread walks
 * the matrix group by group and, inside a group, in bands of up to BAND stored rows; for each band it gathers the
 * band's activations through the permutation once (x[m][perm[row]]), then visits its column blocks NBLK at a time.
 * Each column is an independent bit stream, b packed rows per 32 rows at b bits; the shifts and packed rows are
 * constants of each width's unrolled code. The sums are of code · x: the zero point comes off once per group and
 * column, as zero · (the sum of the group's x), so a code needs no subtraction. One input row (decode) takes most
 * codes where they lie: the packed word masked in place is code · 2^shift, converted to float exactly, and
 * multiplied by x · 2^-shift (one scalar per row of the band), which is the same exact product x · code in two
 * vector operations and a multiply-add; codes in a word's top bits, or split across two words, are shifted out
 * first. Several rows (batches, prefill) decode the band into small tiles of codes first and run up to four rows
 * over each. A block's sums stay in registers across a band and in a per-thread buffer between bands; at the end
 * of the group each column's sum, less zero · Σx, is multiplied by its group scale and added to y. Walking a band
 * across all of the thread's columns reads each packed row contiguously, and the packed rows of the blocks two
 * visits ahead are prefetched (PF_WORDS).
 *
 * Each row's arithmetic (the order of its products and sums) is the same whatever M is and however the columns are
 * split over threads, so a sequence's results do not depend on what it is batched with or on the thread count
 * (tests/unit/test_exl2.c checks rows alone against the same rows in a batch; x · 2^-shift is exact unless x is
 * below 2^-98 in magnitude, where it would round and the two paths could differ in the last bit). Products are
 * fused multiply-adds where the build targets a CPU that has them (kernels/sources.cmake).
 *
 * The scales: EXL2 stores a 4-bit code per (group, column) standing for one of 16 fp16 values of the group
 * (tsr_qmatrix_code_scale), tabulated once per group here; GPTQ stores fp16 scales and a 4-bit zero point per
 * (group, column) (gptq.h), read once per group and column. The version before this one multiplied every weight by
 * a scale recomputed per column and chunk and decoded through a tile at every row count: 4.7 against 16 tok/s at
 * batch 1 for a 1B geometry on two cores (BENCHMARKS.md, "CPU decode"). */
#include "kernels/cpu/cpu_kernels.h"
#include "kernels/cpu/cpu_vec.h"
#include "kernels/cpu/threadpool.h"
#include "runtime/half.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#define CB   16 /* columns per block (EXL2 pads N to a multiple of 32; GPTQ's N may end inside a block: edge_band) */
#define BAND 64 /* stored rows decoded per visit of a block: a multiple of 32, so a band starts on a whole word */
#define MS   64 /* input rows per slab: the per-thread sums are [blocks][MS][CB] */
/* How far ahead of the block being decoded its packed rows are asked of memory (software prefetch, in words of a
 * packed row): two visits of NBLK blocks ahead. On the 2-core VM, 1B geometry at batch 1: 17.0 tok/s without,
 * 19.0-19.1 at one visit ahead, 19.0-19.5 at two, 18.4-18.6 at three, 16.8-17.0 at eight. */
#define PF_WORDS (2 * NBLK * CB)

/* The blocks taken together (NBLK) and the rows per pass over a tile (MT) keep about eight vector registers of sums
 * in flight (cpu_vec.h: VF floats per register). */
#define NBLK (VF / 4)          /* column blocks decoded before their products: 4, 2 or 1 */
#define MT   (VF >= 8 ? 4 : 2) /* input rows per pass over a decoded tile */
/* Blocks per pass of MT rows: with AVX-512, four (16 chains of sums; one block kept 4 in flight, which left half of
 * the multiply-adds' throughput unused: 1B geometry, batch 8 decode 42-45 -> 52-54 tok/s); AVX2's one block already
 * has 8 chains (CB / VF = 2), and more would not fit its 16 registers. */
#define MNB (VF >= 16 ? 4 : 1)

typedef struct {
    const tsr_qmatrix *q;
    int N; /* output columns computed */
    const float *x;
    int M;
    float *y;
} exl2_job;

/* ---- the per-thread workspace (a thread-specific key frees it when its thread exits: service loops and worker
 * threads come and go) ---- */
static _Thread_local float *ws_buf;
static _Thread_local size_t ws_cap;
static pthread_key_t ws_key;
static pthread_once_t ws_once = PTHREAD_ONCE_INIT;

static void ws_key_init(void) { pthread_key_create(&ws_key, free); }

static float *workspace(size_t n)
{
    if (n > ws_cap) {
        pthread_once(&ws_once, ws_key_init);
        float *grown = realloc(ws_buf, n * sizeof *grown);
        if (!grown) return NULL;
        ws_buf = grown;
        ws_cap = n;
        pthread_setspecific(ws_key, grown);
    }
    return ws_buf;
}

/* ---- decoding a band of one column block: tile[j][c] = code(row j, column c) ---- */

/* Row j's codes of the band at VF columns from w (the band's first packed row; N: the packed row length), as
 * floats (exact). */
static inline __attribute__((always_inline)) vf decode_vec(const int B, int j, const uint32_t *w, size_t N)
{
    const int bit = j * B, t = bit >> 5, sh = bit & 31;
    const vu mask = (vu){0} + ((1u << B) - 1u);
    vu code = vu_load(w + (size_t)t * N) >> sh;
    if (sh + B > 32) code |= vu_load(w + (size_t)(t + 1) * N) << (32 - sh);
    return vu_to_vf(code & mask);
}

/* Whether row j's codes sit below a word's top bit: masked in place, they are code · 2^shift below 2^31 (the
 * signed conversion takes them), and x · 2^-shift multiplies them (fused_bits). */
static inline __attribute__((always_inline)) int in_place(const int B, int j)
{
    return (j * B & 31) + B < 32;
}

/* Row j's codes at VF columns from w as floats code · 2^shift (in_place rows only; exact). */
static inline __attribute__((always_inline)) vf placed_vec(const int B, int j, const uint32_t *w, size_t N)
{
    const int bit = j * B, t = bit >> 5, sh = bit & 31;
    const vu mask = (vu){0} + (((1u << B) - 1u) << sh);
    return vu_to_vf(vu_load(w + (size_t)t * N) & mask);
}

/* The `bytes` of each of the band's `packed` rows that a visit PF_WORDS ahead will read, asked of memory a cache line
 * at a time. */
static inline void prefetch_ahead(const uint32_t *w, size_t N, int packed, int bytes)
{
    for (int t = 0; t < packed; t++)
        for (int l = 0; l < bytes; l += 64) __builtin_prefetch((const char *)(w + (size_t)t * N + PF_WORDS) + l);
}

/* Row j of the band into tile[j]. */
static inline __attribute__((always_inline)) void decode_row(const int B, int j, const uint32_t *w, size_t N,
                                                             float (*tile)[CB])
{
    for (int v = 0; v < CB / VF; v++) vf_store(&tile[j][v * VF], decode_vec(B, j, w + v * VF, N));
}

/* B is a constant after inlining (decode_band's switch); each whole 32 rows (B packed rows) are unrolled, so that
 * every shift and packed row is a constant too. */
static inline __attribute__((always_inline)) void decode_bits(const int B, const uint32_t *w, size_t N, int rows,
                                                              float (*tile)[CB])
{
    prefetch_ahead(w, N, (rows * B + 31) / 32, CB * 4);
    int j0 = 0;
    for (; j0 + 32 <= rows; j0 += 32) {
        const uint32_t *w32 = w + (size_t)(j0 / 32 * B) * N;
        _Pragma("GCC unroll 32") for (int j = 0; j < 32; j++) decode_row(B, j, w32, N, tile + j0);
    }
    for (int j = j0; j < rows; j++) decode_row(B, j, w, N, tile);
}

static void decode_band(int bits, const uint32_t *w, size_t N, int rows, float (*tile)[CB])
{
    switch (bits) {
    case 2: decode_bits(2, w, N, rows, tile); break;
    case 3: decode_bits(3, w, N, rows, tile); break;
    case 4: decode_bits(4, w, N, rows, tile); break;
    case 5: decode_bits(5, w, N, rows, tile); break;
    case 6: decode_bits(6, w, N, rows, tile); break;
    default: decode_bits(8, w, N, rows, tile); break;
    }
}

/* One input row over NBLK blocks without a tile (decode at one row): each row's codes go straight into their
 * multiply-adds, in place (placed_vec, times xs[j] = x[j] · 2^-shift) or decoded (decode_vec, times x[j]); both
 * products are exactly x[j] · code, the product band_rows takes from the tile, so the sums are the same. sum: block
 * k's at sum + k * CB. */
static inline __attribute__((always_inline)) void fused_bits(const int B, const uint32_t *w, size_t N, int rows,
                                                             const float *xg, float *sum, int first)
{
    float xs[BAND];
    _Pragma("GCC unroll 32") for (int j = 0; j < 32; j++) {
        const float down = 1.0f / (float)(1u << (j * B & 31));
        for (int j1 = j; j1 < rows; j1 += 32) xs[j1] = xg[j1] * down;
    }
    vf a[NBLK][CB / VF];
    _Pragma("GCC unroll 16") for (int k = 0; k < NBLK; k++)
    _Pragma("GCC unroll 16") for (int v = 0; v < CB / VF; v++)
        a[k][v] = first ? (vf){0} : vf_load(sum + k * CB + v * VF);
    prefetch_ahead(w, N, (rows * B + 31) / 32, NBLK * CB * 4);
    int j0 = 0;
    for (; j0 + 32 <= rows; j0 += 32) {
        const uint32_t *w32 = w + (size_t)(j0 / 32 * B) * N;
        _Pragma("GCC unroll 32") for (int j = 0; j < 32; j++) {
            const float xv = in_place(B, j) ? xs[j0 + j] : xg[j0 + j];
            _Pragma("GCC unroll 16") for (int k = 0; k < NBLK; k++)
            _Pragma("GCC unroll 16") for (int v = 0; v < CB / VF; v++)
                a[k][v] += xv * (in_place(B, j) ? placed_vec(B, j, w32 + k * CB + v * VF, N)
                                                : decode_vec(B, j, w32 + k * CB + v * VF, N));
        }
    }
    for (int j = j0; j < rows; j++) {
        const float xv = xg[j];
        _Pragma("GCC unroll 16") for (int k = 0; k < NBLK; k++)
        _Pragma("GCC unroll 16") for (int v = 0; v < CB / VF; v++)
            a[k][v] += xv * decode_vec(B, j, w + k * CB + v * VF, N);
    }
    _Pragma("GCC unroll 16") for (int k = 0; k < NBLK; k++)
    _Pragma("GCC unroll 16") for (int v = 0; v < CB / VF; v++) vf_store(sum + k * CB + v * VF, a[k][v]);
}

static void fused_band(int bits, const uint32_t *w, size_t N, int rows, const float *xg, float *sum, int first)
{
    switch (bits) {
    case 2: fused_bits(2, w, N, rows, xg, sum, first); break;
    case 3: fused_bits(3, w, N, rows, xg, sum, first); break;
    case 4: fused_bits(4, w, N, rows, xg, sum, first); break;
    case 5: fused_bits(5, w, N, rows, xg, sum, first); break;
    case 6: fused_bits(6, w, N, rows, xg, sum, first); break;
    default: fused_bits(8, w, N, rows, xg, sum, first); break;
    }
}

/* ---- products: sum[m][c] += Σ_j xg[m][j] · tile[j][c] ----
 *
 * R input rows over NB consecutive column blocks (a function per pair used). Every (row, column) sum is one
 * chain of multiply-adds over j in order, whatever R and NB: they only choose how many chains run side by side
 * (one or two rows keep NBLK or 2 blocks' chains in flight, so that the adds' latency does not bound them).
 * sum: block k's sums of row r at sum[k * bstride + r * CB + c]; first: the group's first band, whose sums start
 * at zero instead of being read. */
#define BAND_ROWS(R, NB)                                                                                       \
    __attribute__((unused)) static void band_rows_##R##_##NB(const float(*tiles)[BAND][CB], int rows,           \
                                                             const float *xg, float *sum, size_t bstride,      \
                                                             int first)                                        \
    {                                                                                                          \
        vf a[R][NB][CB / VF]; /* exactly the chains in flight, in registers */                                 \
        _Pragma("GCC unroll 16") for (int r = 0; r < R; r++)                                                   \
        _Pragma("GCC unroll 16") for (int k = 0; k < NB; k++)                                                  \
        _Pragma("GCC unroll 16") for (int v = 0; v < CB / VF; v++)                                             \
            a[r][k][v] = first ? (vf){0} : vf_load(sum + k * bstride + r * CB + v * VF);                       \
        for (int j = 0; j < rows; j++)                                                                         \
            _Pragma("GCC unroll 16") for (int r = 0; r < R; r++) {                                             \
                const float xv = xg[r * BAND + j];                                                             \
                _Pragma("GCC unroll 16") for (int k = 0; k < NB; k++)                                          \
                _Pragma("GCC unroll 16") for (int v = 0; v < CB / VF; v++)                                     \
                    a[r][k][v] += xv * vf_load(&tiles[k][j][v * VF]);                                          \
            }                                                                                                  \
        _Pragma("GCC unroll 16") for (int r = 0; r < R; r++)                                                   \
        _Pragma("GCC unroll 16") for (int k = 0; k < NB; k++)                                                  \
        _Pragma("GCC unroll 16") for (int v = 0; v < CB / VF; v++)                                             \
            vf_store(sum + k * bstride + r * CB + v * VF, a[r][k][v]);                                         \
    }
BAND_ROWS(4, 4)
BAND_ROWS(4, 2)
BAND_ROWS(4, 1)
BAND_ROWS(3, 1)
BAND_ROWS(2, 2)
BAND_ROWS(2, 1)
BAND_ROWS(1, 4)
BAND_ROWS(1, 3)
BAND_ROWS(1, 2)
BAND_ROWS(1, 1)

/* One row over nb (1-4) tiles. */
static void band_rows_1(int nb, const float (*tiles)[BAND][CB], int rows, const float *xg, float *sum, size_t bs,
                        int first)
{
    switch (nb) {
    case 4: band_rows_1_4(tiles, rows, xg, sum, bs, first); break;
    case 3: band_rows_1_3(tiles, rows, xg, sum, bs, first); break;
    case 2: band_rows_1_2(tiles, rows, xg, sum, bs, first); break;
    default: band_rows_1_1(tiles, rows, xg, sum, bs, first); break;
    }
}

/* The `ms` rows of a slab over nb (<= NBLK) decoded tiles; sums: the first tile's block, ms · CB per block. */
static void band_products(const float (*tiles)[BAND][CB], int nb, int rows, const float *xg, int ms, float *sums,
                          int first)
{
    const size_t bs = (size_t)ms * CB;
    int m = 0;
    for (; m + MT <= ms; m += MT) {
        const float *x = xg + (size_t)m * BAND;
        int k = 0;
        for (; MT == 4 && MNB == 4 && k + 4 <= nb; k += 4)
            band_rows_4_4(tiles + k, rows, x, sums + k * bs + (size_t)m * CB, bs, first);
        for (; MT == 4 && MNB >= 2 && k + 2 <= nb; k += 2)
            band_rows_4_2(tiles + k, rows, x, sums + k * bs + (size_t)m * CB, bs, first);
        for (; k < nb; k++) {
            float *s = sums + k * bs + (size_t)m * CB;
            if (MT == 4)
                band_rows_4_1(tiles + k, rows, x, s, bs, first);
            else
                band_rows_2_1(tiles + k, rows, x, s, bs, first);
        }
    }
    const float *x = xg + (size_t)m * BAND;
    float *s = sums + (size_t)m * CB;
    int k = 0;
    switch (ms - m) {
    case 3:
        for (; k < nb; k++) band_rows_3_1(tiles + k, rows, x, s + k * bs, bs, first);
        break;
    case 2:
        for (; NBLK >= 2 && k + 2 <= nb; k += 2) band_rows_2_2(tiles + k, rows, x, s + k * bs, bs, first);
        for (; k < nb; k++) band_rows_2_1(tiles + k, rows, x, s + k * bs, bs, first);
        break;
    case 1:
        for (; k < nb; k += NBLK)
            band_rows_1(nb - k < NBLK ? nb - k : NBLK, tiles + k, rows, x, s + k * bs, bs, first);
        break;
    default: break;
    }
}

/* ---- one thread's column blocks [begin, end) ---- */

/* Group gi's scale and zero point of the CB columns from n0 (EXL2: through the group's table of 16 scales; GPTQ:
 * 0 past the matrix's last column). */
static void group_params(const tsr_qmatrix *q, int gi, const float *table, int n0, float *scale, float *zero)
{
    if (q->kind == TSR_QMATRIX_GPTQ) { /* a block per call: two calls per column had been 10 % of a step */
        const int live = q->N - n0 < CB ? q->N - n0 : CB;
        tsr_qmatrix_gptq_params(q, gi, n0, live, scale, zero);
        for (int c = live; c < CB; c++) scale[c] = zero[c] = 0.0f;
        return;
    }
    const uint32_t *codes = q->q_scale + (size_t)gi * (size_t)(q->N / 8) + (size_t)(n0 / 8);
    const float z = (float)(1 << (q->groups[gi].bits - 1));
    for (int c = 0; c < CB; c++) {
        scale[c] = table[(codes[c / 8] >> (4 * (c % 8))) & 0xfu];
        zero[c] = z;
    }
}

static int slab_rows(const exl2_job *job) { return job->M < MS ? job->M : MS; }

/* The packed rows of a band (rows at `bits`) for the block at column n0 of a matrix whose rows end inside the
 * block (GPTQ: N need not be a multiple of CB), copied into edge[][CB] with zeros past the end, so that decoding
 * reads nothing outside the matrix. Returns edge, whose packed row length is CB. */
static const uint32_t *edge_band(const uint32_t *band, size_t N, size_t n0, int rows, int bits,
                                 uint32_t (*edge)[CB])
{
    const int words = (rows * bits + 31) / 32;
    for (int t = 0; t < words; t++)
        for (size_t c = 0; c < CB; c++) edge[t][c] = n0 + c < N ? band[(size_t)t * N + n0 + c] : 0u;
    return &edge[0][0];
}

/* Column blocks [begin, end); ws holds their sums [blocks][slab_rows][CB], then their scales and zeros
 * [blocks][2][CB]. */
static void exl2_blocks(const exl2_job *job, int begin, int end, float *ws)
{
    const tsr_qmatrix *q = job->q;
    const int n_blocks = end - begin;
    const size_t N = (size_t)q->N;
    float *sums = ws, *par = sums + (size_t)n_blocks * slab_rows(job) * CB;
    float xg[MS * BAND], tiles[NBLK][BAND][CB], table[16], sx[MS];
    uint32_t edge[BAND * 8 / 32][CB];

    for (int bi = 0; bi < n_blocks; bi++) {
        const int n0 = (begin + bi) * CB, nb = job->N - n0 < CB ? job->N - n0 : CB;
        for (int m = 0; m < job->M; m++) {
            float *yr = job->y + (size_t)m * job->N + n0;
            for (int c = 0; c < nb; c++) yr[c] = q->bias ? tsr_half_to_float(q->bias[n0 + c]) : 0.0f;
        }
    }
    for (int m0 = 0; m0 < job->M; m0 += MS) {
        const int ms = job->M - m0 < MS ? job->M - m0 : MS;
        const float *x = job->x + (size_t)m0 * q->K;
        for (int gi = 0; gi < q->G; gi++) {
            const tsr_qgroup *g = &q->groups[gi];
            if (q->kind != TSR_QMATRIX_GPTQ)
                for (uint32_t code = 0; code < 16; code++) table[code] = tsr_qmatrix_code_scale(q, gi, code);
            for (int bi = 0; bi < n_blocks; bi++) {
                float *scale = par + (size_t)bi * 2 * CB;
                group_params(q, gi, table, (begin + bi) * CB, scale, scale + CB);
            }
            for (int m = 0; m < ms; m++) sx[m] = 0.0f;
            for (int j0 = 0; j0 < g->rows; j0 += BAND) {
                const int rows = g->rows - j0 < BAND ? g->rows - j0 : BAND;
                const int32_t *perm = q->perm + g->row0 + j0;
                for (int m = 0; m < ms; m++)
                    for (int j = 0; j < rows; j++) {
                        const float v = x[(size_t)m * q->K + perm[j]];
                        xg[(size_t)m * BAND + j] = v;
                        sx[m] += v; /* the group's Σx, in row order: what zero · Σx takes off at its end */
                    }
                const uint32_t *band = q->q_weight + ((size_t)g->qrow0 + (size_t)j0 * (size_t)g->bits / 32) * N;
                for (int bi = 0; bi < n_blocks; bi += NBLK) {
                    const int nb = n_blocks - bi < NBLK ? n_blocks - bi : NBLK;
                    const int inside = (size_t)(begin + bi + nb) * CB <= N; /* no block reads past a packed row */
                    if (ms == 1 && nb == NBLK && inside) {
                        fused_band(g->bits, band + (size_t)(begin + bi) * CB, N, rows, xg, sums + (size_t)bi * CB,
                                   j0 == 0);
                        continue;
                    }
                    for (int k = 0; k < nb; k++) {
                        const size_t n0 = (size_t)(begin + bi + k) * CB;
                        if (n0 + CB <= N)
                            decode_band(g->bits, band + n0, N, rows, tiles[k]);
                        else
                            decode_band(g->bits, edge_band(band, N, n0, rows, g->bits, edge), CB, rows, tiles[k]);
                    }
                    band_products((const float(*)[BAND][CB])tiles, nb, rows, xg, ms, sums + (size_t)bi * ms * CB,
                                  j0 == 0);
                }
            }
            for (int bi = 0; bi < n_blocks; bi++) {
                const int n0 = (begin + bi) * CB, nb = job->N - n0 < CB ? job->N - n0 : CB;
                const float *scale = par + (size_t)bi * 2 * CB, *zero = scale + CB, *s = sums + (size_t)bi * ms * CB;
                for (int m = 0; m < ms; m++) {
                    float *yr = job->y + (size_t)(m0 + m) * job->N + n0;
                    for (int c = 0; c < nb; c++) yr[c] += scale[c] * (s[(size_t)m * CB + c] - zero[c] * sx[m]);
                }
            }
        }
    }
}

static void exl2_range(void *ctx, int begin, int end)
{
    const exl2_job *job = ctx;
    float *ws = workspace((size_t)(end - begin) * (size_t)(slab_rows(job) + 2) * CB);
    if (ws) {
        exl2_blocks(job, begin, end, ws);
        return;
    }
    float one[(MS + 2) * CB]; /* no memory for the range's sums: one block at a time */
    for (int b = begin; b < end; b++) exl2_blocks(job, b, b + 1, one);
}

void tsr_cpu_linear_exl2(const tsr_qmatrix *q, int N, const float *x, int M, float *y)
{
    exl2_job job = {q, N, x, M, y};
    tsr_parallel_for((N + CB - 1) / CB, exl2_range, &job);
}
