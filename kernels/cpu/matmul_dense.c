/* Dense (F16 / BF16 / F32 weight) matrix multiplication on the CPU: y[m][n] = x[m] · W[n] + bias[n].
 *
 * Work is split over blocks of ROWS_N weight rows (= output columns). Each block walks K in chunks of CHUNK_K,
 * converting that piece of its rows to fp32 once into a stack tile, then adding the partial dot products of every
 * input row. fp32 accumulation; weights are read in place from the mapped file. fp16 weights convert sixteen or
 * eight at a time with AVX-512 or F16C where the build targets them (tsr_halves_to_floats in runtime/half.h; one at
 * a time it was 55 % of a decode step of a GPTQ model with an fp16 head in `perf`). */
#include "kernels/cpu/cpu_kernels.h"
#include "kernels/cpu/cpu_vec.h"
#include "kernels/cpu/threadpool.h"

#define ROWS_N 8
#define CHUNK_K 256

typedef struct {
    const tsr_dense *w, *bias;
    const float *x;
    int M;
    float *y;
} dense_job;

static void convert_row(const tsr_dense *w, int n, int k0, int nk, float *dst)
{
    size_t base = (size_t)n * (size_t)w->cols + (size_t)k0;
    switch (w->dtype) {
    case TSR_F16: {
        tsr_halves_to_floats((const uint16_t *)w->data + base, nk, dst);
        break;
    }
    case TSR_BF16: {
        const uint16_t *s = (const uint16_t *)w->data + base;
        for (int k = 0; k < nk; k++) dst[k] = tsr_bf16_to_float(s[k]);
        break;
    }
    default: {
        const float *s = (const float *)w->data + base;
        for (int k = 0; k < nk; k++) dst[k] = s[k];
        break;
    }
    }
}

static void dense_range(void *ctx, int begin, int end)
{
    const dense_job *job = ctx;
    const tsr_dense *w = job->w;
    const int K = w->cols, N = w->rows;
    float tile[ROWS_N][CHUNK_K];
    for (int blk = begin; blk < end; blk++) {
        const int n0 = blk * ROWS_N;
        const int nr = N - n0 < ROWS_N ? N - n0 : ROWS_N;
        for (int m = 0; m < job->M; m++)
            for (int r = 0; r < nr; r++)
                job->y[(size_t)m * N + n0 + r] =
                    job->bias && job->bias->data ? tsr_dense_get(job->bias->dtype, job->bias->data, (size_t)(n0 + r))
                                                 : 0.0f;
        for (int k0 = 0; k0 < K; k0 += CHUNK_K) {
            const int nk = K - k0 < CHUNK_K ? K - k0 : CHUNK_K;
            for (int r = 0; r < nr; r++) convert_row(w, n0 + r, k0, nk, tile[r]);
            for (int m = 0; m < job->M; m++) {
                const float *xr = job->x + (size_t)m * K + k0;
                float *yr = job->y + (size_t)m * N + n0;
                for (int r = 0; r < nr; r++) yr[r] += vf_dot(xr, tile[r], nk);
            }
        }
    }
}

void tsr_cpu_linear_dense(const tsr_dense *w, const tsr_dense *bias, const float *x, int M, float *y)
{
    dense_job job = {w, bias, x, M, y};
    tsr_parallel_for((w->rows + ROWS_N - 1) / ROWS_N, dense_range, &job);
}

void tsr_cpu_linear(const tsr_linear *L, const float *x, int M, float *y)
{
    if (L->kind == TSR_LINEAR_EXL2)
        tsr_cpu_linear_exl2(&L->q, L->N, x, M, y);
    else
        tsr_cpu_linear_dense(&L->w, &L->bias, x, M, y);
}
