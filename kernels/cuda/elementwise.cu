/* Row-wise and elementwise CUDA kernels: embedding gather, RMSNorm, rotary embedding, K/V store into the paged
 * cache (alone, or after the rope of q and k in one launch: rope_store), SiLU gate, residual add, row gather. fp32
 * math throughout; weights read in their stored dtype. Every kernel is launched with programmatic dependent launch
 * (launch.cuh): it waits for its predecessor before its first read and lets its successor (usually a GEMV, which
 * prefetches weights meanwhile) start at once. */
#include "kernels/cuda/cuda_common.cuh"
#include "kernels/cuda/cuda_kernels.cuh"
#include "kernels/cuda/launch.cuh"
#include "kernels/cuda/rope.cuh"
#include "kernels/cuda/stage_ahead.cuh"

#include <cooperative_groups.h>
#include <cuda_bf16.h>
#include <stdint.h>
#include <type_traits>

__device__ __forceinline__ float load_elem(const void *p, int dtype, size_t i)
{
    switch (dtype) {
    case TSR_F16: return __half2float(((const __half *)p)[i]);
    case TSR_BF16: return __bfloat162float(((const __nv_bfloat16 *)p)[i]);
    default: return ((const float *)p)[i];
    }
}

__global__ void embed_kernel(const void *table, int dtype, const int32_t *ids, int n, int dim, float *out)
{
    tsr_pdl_start();
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (size_t)n * dim) return;
    size_t r = i / dim, c = i % dim;
    out[i] = load_elem(table, dtype, (size_t)ids[r] * dim + c);
}

void tsr_cuda_embed(const tsr_dense *table, const int32_t *ids, int n, float *out)
{
    size_t total = (size_t)n * table->cols;
    tsr_launch(embed_kernel, dim3(tsr_div_up(total, 256)), dim3(256), table->dev, table->dtype, ids, n, table->cols,
               out);
    TSR_CUDA_LAUNCHED();
}

/* The sum of every thread's v over the block, returned to all threads. The first barrier also orders every read
 * the threads made before the call ahead of writes they make after it. */
__device__ __forceinline__ float block_sum(float v)
{
    __shared__ float part[32];
    for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(0xffffffffu, v, off);
    if ((threadIdx.x & 31) == 0) part[threadIdx.x >> 5] = v;
    __syncthreads();
    if (threadIdx.x < 32) {
        float t = threadIdx.x < (blockDim.x >> 5) ? part[threadIdx.x] : 0.0f;
        for (int off = 16; off > 0; off >>= 1) t += __shfl_xor_sync(0xffffffffu, t, off);
        if (threadIdx.x == 0) part[0] = t;
    }
    __syncthreads();
    return part[0];
}

/* One block per row (the general case: any width or alignment). */
__global__ void rmsnorm_kernel(const float *x, const void *w, int dtype, float eps, int dim, float *out)
{
    tsr_pdl_start();
    const float *xr = x + (size_t)blockIdx.x * dim;
    float *o = out + (size_t)blockIdx.x * dim;
    float ss = 0.0f;
    for (int i = threadIdx.x; i < dim; i += blockDim.x) ss += xr[i] * xr[i];
    const float inv = rsqrtf(block_sum(ss) / dim + eps);
    for (int i = threadIdx.x; i < dim; i += blockDim.x) o[i] = load_elem(w, dtype, i) * (xr[i] * inv);
}

/* Rows of up to 1024 V floats, 16-byte aligned: a block of 256 threads per row, each holding V float4 of it in
 * registers, so the row is read once and the norm's weights are requested before its sum of squares is known; more
 * rows are in flight per SM than with rmsnorm_kernel's 1024-thread blocks, which read each row twice (2048 rows of
 * 4096: about 50 us, 1.3 TB/s). out may alias x (every read precedes block_sum's barrier).
 * XP (prefill's hand-off, matmul.cu tsr_cuda_dq_handoff_plan): the normalized row also goes through shared memory
 * into xp as fp16 in the reading matrices' unit row order (xp[r][j] = out[r][uperm[j]], 0 where uperm[j] < 0;
 * uperm NULL: the identity), Kp values a row, as permute_half would convert it, so their products skip that pass. */
template <int V, bool XP>
__global__ void __launch_bounds__(256)
    rmsnorm_vec_kernel(const float *x, const void *w, int dtype, float eps, int dim, float *out, __half *xp,
                       const int32_t *uperm, int Kp)
{
    tsr_pdl_start();
    const float4 *xr = (const float4 *)(x + (size_t)blockIdx.x * dim);
    float4 *o = (float4 *)(out + (size_t)blockIdx.x * dim);
    const int n4 = dim >> 2;
    float4 v[V];
    float wv[V][4];
    float ss = 0.0f;
#pragma unroll
    for (int r = 0; r < V; r++) {
        const int i = r * 256 + (int)threadIdx.x;
        v[r] = i < n4 ? xr[i] : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#pragma unroll
        for (int c = 0; c < 4; c++)
            wv[r][c] = i < n4 ? load_elem(w, dtype, (size_t)4 * i + c) : 0.0f;
    }
#pragma unroll
    for (int r = 0; r < V; r++)
        ss += v[r].x * v[r].x + v[r].y * v[r].y + v[r].z * v[r].z + v[r].w * v[r].w;
    const float inv = rsqrtf(block_sum(ss) / dim + eps);
    __shared__ float4 hs[XP ? 256 * V : 1];
#pragma unroll
    for (int r = 0; r < V; r++) {
        const int i = r * 256 + (int)threadIdx.x;
        const float4 y = make_float4(wv[r][0] * (v[r].x * inv), wv[r][1] * (v[r].y * inv), wv[r][2] * (v[r].z * inv),
                                     wv[r][3] * (v[r].w * inv));
        if (i < n4) o[i] = y;
        if (XP) hs[i] = y;
    }
    if (!XP) return;
    __syncthreads();
    const float *h = (const float *)hs;
    uint2 *xr16 = (uint2 *)(xp + (size_t)blockIdx.x * Kp);
    for (int j = threadIdx.x; j < Kp >> 2; j += 256) {
        float4 y;
        if (uperm) {
            const int4 p = ((const int4 *)uperm)[j];
            y = make_float4(p.x >= 0 ? h[p.x] : 0.0f, p.y >= 0 ? h[p.y] : 0.0f, p.z >= 0 ? h[p.z] : 0.0f,
                            p.w >= 0 ? h[p.w] : 0.0f);
        } else {
            y = hs[j];
        }
        xr16[j] = make_uint2(h2_bits(__floats2half2_rn(y.x, y.y)), h2_bits(__floats2half2_rn(y.z, y.w)));
    }
}

void tsr_cuda_rmsnorm(const float *x, const tsr_dense *w, float eps, int rows, int dim, float *out)
{
    if (rows <= 0) return;
    const bool vec = dim % 4 == 0 && dim <= 8192 && ((uintptr_t)x & 15) == 0 && ((uintptr_t)out & 15) == 0;
    __half *xp = NULL;
    const int32_t *uperm = NULL;
    int Kp = 0;
    const bool hand = vec && tsr_cuda_dq_handoff_plan(w, rows, dim, &xp, &uperm, &Kp);
    if (vec) {
        auto kernel = dim <= 4096 ? (hand ? rmsnorm_vec_kernel<4, true> : rmsnorm_vec_kernel<4, false>)
                                  : (hand ? rmsnorm_vec_kernel<8, true> : rmsnorm_vec_kernel<8, false>);
        tsr_launch(kernel, dim3(rows), dim3(256), x, w->dev, w->dtype, eps, dim, out, xp, uperm, Kp);
    } else { /* one block per row, enough threads that each handles a few elements (one row is latency-bound) */
        tsr_launch(rmsnorm_kernel, dim3(rows), dim3(dim >= 4096 ? 1024 : dim >= 1024 ? 512 : 256), x, w->dev, w->dtype,
                   eps, dim, out);
    }
    TSR_CUDA_LAUNCHED();
    if (hand) tsr_cuda_dq_handoff_done(out, rows);
}

#define RESIDUAL_PER_THREAD 4 /* elements of a row per thread and pass (a 4096-wide row: one pass of 1024 threads) */
#define RESIDUAL_PARTS_AT_ONCE 8 /* parts whose loads go out together (K splits: 8 at one row, 16-32 at 8) */

/* x[r] += y[r] (the sum of n_parts parts of row r, part p at y + p · part_stride, rows ld apart, plus bias), then,
 * with w, out[r] = rmsnorm(x[r]) · w: the residual add of add_rmsnorm (one part) and of linear_add_norm (the K-split
 * partial sums of the product). One block per row, so the row's sum of squares needs no second kernel; the block is
 * alone on its SM, so it is bound by round trips to L2: each thread requests the loads of several parts before it
 * adds any (in part order, so the sums are those of a plain loop), the weights of the norm before the sum of squares
 * is known, and keeps the row in registers when one pass covers it. With S.n (a norm whose readers are decode GEMVs,
 * stage_ahead.cuh) the normalized row also goes to shared memory and from there into the readers' staged entries;
 * 1024 threads bound the registers to 64. */
__global__ void __launch_bounds__(1024)
    residual_kernel(float *x, const float *y, int n_parts, size_t part_stride, int ld, const __half *bias,
                    const void *w, int dtype, float eps, int dim, float *out, const __grid_constant__ tsr_stage_ahead S)
{
    /* with S.n: the sources of the thread's first entry of the first unit order (constant) travel while the
     * predecessor ends (one entry per thread covers a 4096-wide row) */
    tsr_pdl_trigger();
    const int per_row = S.n_units * 8;
    const int4 pre = S.n && (int)threadIdx.x < per_row ? stage_ahead_src(S, 0, threadIdx.x) : make_int4(-1, -1, -1, -1);
    tsr_pdl_wait();
    float *xr = x + (size_t)blockIdx.x * dim;
    const float *yr = y + (size_t)blockIdx.x * ld;
    const int step = RESIDUAL_PER_THREAD * (int)blockDim.x;
    float ss = 0.0f, v[RESIDUAL_PER_THREAD];
    for (int base = 0; base < dim; base += step) {
#pragma unroll
        for (int r = 0; r < RESIDUAL_PER_THREAD; r++) {
            const int i = base + r * (int)blockDim.x + (int)threadIdx.x;
            v[r] = i < dim ? xr[i] + (bias ? __half2float(bias[i]) : 0.0f) : 0.0f;
        }
        for (int p = 0; p < n_parts; p += RESIDUAL_PARTS_AT_ONCE) {
            float t[RESIDUAL_PARTS_AT_ONCE][RESIDUAL_PER_THREAD];
#pragma unroll
            for (int q = 0; q < RESIDUAL_PARTS_AT_ONCE; q++)
#pragma unroll
                for (int r = 0; r < RESIDUAL_PER_THREAD; r++) {
                    const int i = base + r * (int)blockDim.x + (int)threadIdx.x;
                    t[q][r] = i < dim && p + q < n_parts ? yr[(p + q) * part_stride + i] : 0.0f;
                }
#pragma unroll
            for (int q = 0; q < RESIDUAL_PARTS_AT_ONCE; q++)
#pragma unroll
                for (int r = 0; r < RESIDUAL_PER_THREAD; r++)
                    if (p + q < n_parts) v[r] += t[q][r];
        }
#pragma unroll
        for (int r = 0; r < RESIDUAL_PER_THREAD; r++) {
            const int i = base + r * (int)blockDim.x + (int)threadIdx.x;
            if (i >= dim) continue;
            xr[i] = v[r];
            ss += v[r] * v[r];
        }
    }
    if (!w) return;
    float *o = out + (size_t)blockIdx.x * dim;
    extern __shared__ float hs[]; /* with S.n: the normalized row, [dim] */
    if (dim <= step) { /* the row is still in v: the weights go out before the barrier, which orders y's reads */
        float wv[RESIDUAL_PER_THREAD];
#pragma unroll
        for (int r = 0; r < RESIDUAL_PER_THREAD; r++) {
            const int i = r * (int)blockDim.x + (int)threadIdx.x;
            wv[r] = i < dim ? load_elem(w, dtype, i) : 0.0f;
        }
        const float inv = rsqrtf(block_sum(ss) / dim + eps);
#pragma unroll
        for (int r = 0; r < RESIDUAL_PER_THREAD; r++) {
            const int i = r * (int)blockDim.x + (int)threadIdx.x;
            if (i >= dim) continue;
            const float h = wv[r] * (v[r] * inv);
            o[i] = h;
            if (S.n) hs[i] = h;
        }
    } else {
        /* block_sum's barrier puts every read of y before the writes of out, which may alias it */
        const float inv = rsqrtf(block_sum(ss) / dim + eps);
        for (int i = threadIdx.x; i < dim; i += blockDim.x) {
            const float h = load_elem(w, dtype, i) * (xr[i] * inv);
            o[i] = h;
            if (S.n) hs[i] = h;
        }
    }
    if (!S.n) return;
    /* the next GEMV's entries of this row (stage_ahead.cuh) */
    __syncthreads();
    for (int ord = 0; ord < S.n; ord++)
        for (int e = threadIdx.x; e < per_row; e += blockDim.x)
            stage_ahead_put(S, ord, e, blockIdx.x, hs,
                            ord == 0 && e == (int)threadIdx.x ? pre : stage_ahead_src(S, ord, e));
}

static int residual_threads(int dim) { return dim >= 4096 ? 1024 : dim >= 1024 ? 512 : 256; }

/* The residual pass of a decode row (1-8 rows) spread over a thread-block cluster of RC_BLOCKS blocks, one cluster
 * per row, on sm_90. residual_kernel's single block per row reads the whole row and its K-split parts through one
 * SM and writes all of the row's staged entries: 7.0-7.4 µs of the chain of dependent kernels, twice per layer of
 * the 8B model at batch 1; this kernel 5.5-6.2 µs (batch 1 +3.3 %; NOTES.md, stop 42). Here block r of a cluster
 * takes the slice [r · SL, r · SL + SL) of the row (SL: the row's width over RC_BLOCKS, rounded up to whole float4;
 * up to P float4 per thread): it adds the parts, writes the sum, and its sum of squares goes to the others through
 * distributed shared memory, where each block adds all RC_BLOCKS of them in rank order, so the whole cluster applies
 * the same factor; with S.n each block then writes its share of the next GEMV's staged entries, reading the four
 * values of an entry from whichever block's slice holds them. Values and sums are those of residual_kernel (the same
 * part order per element); only the sum of squares is added in another order. */
#define RC_BLOCKS  8
#define RC_THREADS 128

/* SL: the slice of a row of dim values that each block of the cluster takes (whole float4). */
__host__ __device__ __forceinline__ int rc_slice(int dim) { return ((dim + RC_BLOCKS - 1) / RC_BLOCKS + 3) & ~3; }

template <int P>
__global__ void __launch_bounds__(RC_THREADS)
    residual_cluster_kernel(float *x, const float *y, int n_parts, size_t part_stride, int ld, const __half *bias,
                            const void *w, int dtype, float eps, int dim, float *out,
                            const __grid_constant__ tsr_stage_ahead S)
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    namespace cg = cooperative_groups;
    __shared__ __align__(16) float hs[4 * P * RC_THREADS]; /* this block's slice of the normalized row */
    __shared__ float ss_block, inv_row;
    cg::cluster_group cluster = cg::this_cluster();
    const int rank = (int)cluster.block_rank(), row = (int)blockIdx.x / RC_BLOCKS, tid = threadIdx.x;
    const int SL = rc_slice(dim), c0 = rank * SL, c1 = min(dim, c0 + SL);
    /* before the wait, the constants: the norm's weights of the slice and the sources of the first staged entry */
    tsr_pdl_trigger();
    float wv[P][4];
#pragma unroll
    for (int p = 0; p < P; p++) {
        const int i = c0 + 4 * (p * RC_THREADS + tid);
#pragma unroll
        for (int j = 0; j < 4; j++) wv[p][j] = w && i < c1 ? load_elem(w, dtype, i + j) : 0.0f;
    }
    const int per_row = S.n_units * 8, e_per = (per_row + RC_BLOCKS - 1) / RC_BLOCKS, e0 = rank * e_per;
    const int4 pre =
        S.n && tid < e_per && e0 + tid < per_row ? stage_ahead_src(S, 0, e0 + tid) : make_int4(-1, -1, -1, -1);
    tsr_pdl_wait();

    float *xr = x + (size_t)row * dim;
    const float *yr = y + (size_t)row * ld;
    const float4 zero = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    float4 v[P];
#pragma unroll
    for (int p = 0; p < P; p++) {
        const int i = c0 + 4 * (p * RC_THREADS + tid);
        v[p] = i < c1 ? *(const float4 *)(xr + i) : zero;
        if (bias && i < c1) {
            v[p].x += __half2float(bias[i]), v[p].y += __half2float(bias[i + 1]);
            v[p].z += __half2float(bias[i + 2]), v[p].w += __half2float(bias[i + 3]);
        }
    }
    for (int q0 = 0; q0 < n_parts; q0 += RESIDUAL_PARTS_AT_ONCE) { /* in part order, as residual_kernel adds them */
        float4 t[RESIDUAL_PARTS_AT_ONCE][P];
#pragma unroll
        for (int q = 0; q < RESIDUAL_PARTS_AT_ONCE; q++)
#pragma unroll
            for (int p = 0; p < P; p++) {
                const int i = c0 + 4 * (p * RC_THREADS + tid);
                t[q][p] = q0 + q < n_parts && i < c1 ? *(const float4 *)(yr + (q0 + q) * part_stride + i) : zero;
            }
#pragma unroll
        for (int q = 0; q < RESIDUAL_PARTS_AT_ONCE; q++)
#pragma unroll
            for (int p = 0; p < P; p++)
                if (q0 + q < n_parts)
                    v[p].x += t[q][p].x, v[p].y += t[q][p].y, v[p].z += t[q][p].z, v[p].w += t[q][p].w;
    }
    float ss = 0.0f;
#pragma unroll
    for (int p = 0; p < P; p++) {
        const int i = c0 + 4 * (p * RC_THREADS + tid);
        if (i >= c1) continue;
        *(float4 *)(xr + i) = v[p];
        ss += v[p].x * v[p].x + v[p].y * v[p].y + v[p].z * v[p].z + v[p].w * v[p].w;
    }
    if (!w) return; /* uniform over the cluster: no block reads another's shared memory */

    const float b = block_sum(ss);
    if (tid == 0) ss_block = b;
    cluster.sync(); /* every block's ss_block written */
    if (tid < 32) {
        const float t = tid < RC_BLOCKS ? *cluster.map_shared_rank(&ss_block, tid) : 0.0f;
        float tot = 0.0f;
        for (int r = 0; r < RC_BLOCKS; r++) tot += __shfl_sync(0xffffffffu, t, r); /* rank order in every block */
        if (tid == 0) inv_row = rsqrtf(tot / dim + eps);
    }
    __syncthreads();
    const float inv = inv_row;
    float *o = out + (size_t)row * dim;
#pragma unroll
    for (int p = 0; p < P; p++) {
        const int l = 4 * (p * RC_THREADS + tid);
        if (c0 + l >= c1) continue;
        const float4 h = make_float4(wv[p][0] * (v[p].x * inv), wv[p][1] * (v[p].y * inv), wv[p][2] * (v[p].z * inv),
                                     wv[p][3] * (v[p].w * inv));
        *(float4 *)(o + c0 + l) = h;
        *(float4 *)(hs + l) = h;
    }
    cluster.sync(); /* every slice in shared memory, every ss_block read */
    if (!S.n) return;
    /* this block's share of the next GEMV's entries, each value from the slice that holds it */
    for (int ord = 0; ord < S.n; ord++)
        for (int e = e0 + tid; e < e0 + e_per && e < per_row; e += RC_THREADS) {
            const int4 src = ord == 0 && e == e0 + tid ? pre : stage_ahead_src(S, ord, e);
            const int at[4] = {src.x, src.y, src.z, src.w};
            float val[4];
#pragma unroll
            for (int j = 0; j < 4; j++)
                val[j] = at[j] >= 0 ? *cluster.map_shared_rank(hs + at[j] % SL, at[j] / SL) : 0.0f;
            stage_entry_store(S.xs[ord], stage_entry_index(e, row, S.M), S.exact, val);
        }
    cluster.sync(); /* no block leaves while another still reads its slice */
#endif
}

/* Whether residual_cluster_kernel takes these rows, and its P (float4 per thread: 1, 2 or 4); 0: residual_kernel.
 * It needs sm_90 paths, 1-8 rows, float4-aligned rows and parts. TSR_CUDA_RESIDUAL_CLUSTER=0 turns it off. */
static int residual_cluster_p(int rows, int dim, int ld, size_t part_stride, const void *x, const void *y,
                              const void *out)
{
    static const bool on = !tsr_cuda_env_off("TSR_CUDA_RESIDUAL_CLUSTER");
    if (!on || !tsr_cuda_sm90() || rows < 1 || rows > 8 || dim % 4 || ld % 4 || part_stride % 4 ||
        ((uintptr_t)x | (uintptr_t)y | (uintptr_t)out) % 16)
        return 0;
    const int p = (rc_slice(dim) + 4 * RC_THREADS - 1) / (4 * RC_THREADS);
    return p == 1 ? 1 : p == 2 ? 2 : p <= 4 ? 4 : 0;
}

template <int P>
static void residual_cluster_launch(int rows, float *x, const float *parts, int n_parts, size_t part_stride, int ld,
                                    const __half *bias, const tsr_dense *w, float eps, int dim, float *out,
                                    const tsr_stage_ahead &S)
{
    tsr_launch_cluster(residual_cluster_kernel<P>, dim3((unsigned)rows * RC_BLOCKS), dim3(RC_THREADS), 0, RC_BLOCKS, x,
                       parts, n_parts, part_stride, ld, bias, w ? w->dev : (const void *)NULL, w ? w->dtype : 0, eps,
                       dim, out, S);
}

void tsr_cuda_add_parts(float *x, const float *parts, int n_parts, size_t part_stride, int ld, const __half *bias,
                        const tsr_dense *w, float eps, int rows, int dim, float *out)
{
    if (rows <= 0) return;
    /* a norm whose output feeds decode GEMVs: their activations staged here (stage_ahead.cuh); the row in shared
     * memory for that */
    tsr_stage_ahead S = {};
    const tsr_linear_dev *R[TSR_GEMV_MAX_PARTS];
    const int readers = w ? tsr_cuda_norm_readers(w, R) : 0;
    const bool ahead = readers > 0 && R[0]->K == dim && (size_t)dim * sizeof(float) <= 48 * 1024 &&
                       tsr_cuda_gemv_stage_plan(R, readers, rows, &S);
    if (!ahead) S.n = 0;
    switch (residual_cluster_p(rows, dim, ld, part_stride, x, parts, out)) {
    case 1: residual_cluster_launch<1>(rows, x, parts, n_parts, part_stride, ld, bias, w, eps, dim, out, S); break;
    case 2: residual_cluster_launch<2>(rows, x, parts, n_parts, part_stride, ld, bias, w, eps, dim, out, S); break;
    case 4: residual_cluster_launch<4>(rows, x, parts, n_parts, part_stride, ld, bias, w, eps, dim, out, S); break;
    default:
        tsr_launch_smem(residual_kernel, dim3(rows), dim3(residual_threads(dim)), ahead ? dim * sizeof(float) : 0, x,
                        parts, n_parts, part_stride, ld, bias, w ? w->dev : NULL, w ? w->dtype : 0, eps, dim, out, S);
    }
    TSR_CUDA_LAUNCHED();
    if (ahead) tsr_cuda_gemv_stage_done(R, readers, out, &S);
}

void tsr_cuda_add_rmsnorm(float *x, const float *y, const tsr_dense *w, float eps, int rows, int dim, float *out)
{
    tsr_cuda_add_parts(x, y, 1, 0, dim, NULL, w, eps, rows, dim, out);
}

__global__ void rope_kernel(tsr_batch_layout b, float *x, int n_heads, int head_dim, int half)
{
    tsr_pdl_start();
    const size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < (size_t)b.n_rows * n_heads * half) tsr_rope_pair(b, x, n_heads, head_dim, half, i);
}

void tsr_cuda_rope(const tsr_batch_layout *b, float *x, int n_heads, int head_dim, int rot_dim)
{
    size_t total = (size_t)b->n_rows * n_heads * (rot_dim / 2);
    if (!total) return;
    tsr_launch(rope_kernel, dim3(tsr_div_up(total, 256)), dim3(256), *b, x, n_heads, head_dim, rot_dim / 2);
    TSR_CUDA_LAUNCHED();
}

template <typename T> __device__ __forceinline__ T from_float(float v);
template <> __device__ __forceinline__ __half from_float<__half>(float v) { return __float2half_rn(v); }
template <> __device__ __forceinline__ float from_float<float>(float v) { return v; }

template <typename T>
__global__ void kv_store_kernel(tsr_batch_layout b, T *kc, T *vc, int page_size, int width, const float *k,
                                const float *v)
{
    tsr_pdl_start();
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (size_t)b.n_rows * width) return;
    int row = (int)(i / width), e = (int)(i % width);
    int pos = b.positions[row];
    int page = b.page_tables[(size_t)b.row_seq[row] * b.max_pages + pos / page_size];
    size_t off = ((size_t)page * page_size + pos % page_size) * width + e;
    kc[off] = from_float<T>(k[i]);
    vc[off] = from_float<T>(v[i]);
}

void tsr_cuda_kv_store(const tsr_batch_layout *b, tsr_kv_cache *kv, int layer, const float *k, const float *v)
{
    if (tsr_kv_is_quant(kv->dtype)) { /* Q4/Q6/Q8: quantized per (token, head) in kv_store_quant.cu */
        tsr_cuda_kv_store_quant(b, kv, layer, k, v);
        return;
    }
    int width = kv->n_kv_heads * kv->head_dim;
    size_t total = (size_t)b->n_rows * width;
    if (!total) return;
    if (kv->dtype == TSR_F32)
        tsr_launch(kv_store_kernel<float>, dim3(tsr_div_up(total, 256)), dim3(256), *b, (float *)kv->k[layer],
                   (float *)kv->v[layer], kv->page_size, width, k, v);
    else
        tsr_launch(kv_store_kernel<__half>, dim3(tsr_div_up(total, 256)), dim3(256), *b, (__half *)kv->k[layer],
                   (__half *)kv->v[layer], kv->page_size, width, k, v);
    TSR_CUDA_LAUNCHED();
}

/* N neighbouring floats (N = 1 or 2: one float or one float2 access). */
template <int N> struct floats {
    float x[N];
};
template <int N> __device__ __forceinline__ floats<N> load_floats(const float *p)
{
    if constexpr (N == 2) {
        const float2 v = *(const float2 *)p;
        return {{v.x, v.y}};
    } else {
        return {{*p}};
    }
}
template <int N> __device__ __forceinline__ void store_floats(float *p, const floats<N> &v)
{
    if constexpr (N == 2) *(float2 *)p = make_float2(v.x[0], v.x[1]);
    else *p = v.x[0];
}
/* N floats stored into a cache row of T (fp16: one half2 store for N = 2). */
template <typename T, int N> __device__ __forceinline__ void store_cache(T *p, const floats<N> &v)
{
    if constexpr (N == 2 && std::is_same<T, __half>::value) *(__half2 *)p = __floats2half2_rn(v.x[0], v.x[1]);
    else if constexpr (N == 2) *(float2 *)p = make_float2(v.x[0], v.x[1]);
    else *p = from_float<T>(v.x[0]);
}

/* rope_store's items of a row are, in order, the rotary pairs of every q head, then those of every k head (rotated
 * in place and written to the cache), then the k dims past the rotary ones, then every v element (both to the
 * cache). One item of row `row` (sequence seq, position pos, cache slot `slot`) covers N neighbouring values: N
 * rotary pairs j .. j + N - 1, or N stored values (N = 2 where half and the unrotated dims are even and the rows
 * 8-byte aligned: half the requests, in float2 and half2). cs: the row's cos and sin per rotary pair index,
 * attention factor applied ([2][half]), or NULL (one value per item only) to compute them here. */
template <typename T, int N>
__device__ __forceinline__ void rope_store_item(const tsr_batch_layout &b, float *q, int n_heads, float *k,
                                                const float *v, T *kc, T *vc, int n_kv, int head_dim, int half, int row,
                                                int seq, int pos, size_t slot, int item, const float *cs)
{
    const int width = n_kv * head_dim, hn = half / N, q_items = n_heads * hn, k_items = n_kv * hn;
    const int rest = (head_dim - 2 * half) / N;
    if (item < q_items + k_items) {
        const int is_k = item >= q_items;
        if (is_k) item -= q_items;
        const int h = item / hn, j = N * (item % hn);
        float c[N], s[N];
#pragma unroll
        for (int e = 0; e < N; e++) {
            if (N == 2 || cs) { /* the pairs' kernel always passes them */
                c[e] = cs[j + e];
                s[e] = cs[half + j + e];
            } else {
                tsr_rope_cos_sin(b, seq, pos, half, j + e, c[e], s[e]);
            }
        }
        float *x = is_k ? k + ((size_t)row * n_kv + h) * head_dim : q + ((size_t)row * n_heads + h) * head_dim;
        const floats<N> p0 = load_floats<N>(x + j), p1 = load_floats<N>(x + j + half);
        floats<N> r0, r1;
#pragma unroll
        for (int e = 0; e < N; e++) tsr_rope_rotate(p0.x[e], p1.x[e], c[e], s[e], r0.x[e], r1.x[e]);
        store_floats<N>(x + j, r0);
        store_floats<N>(x + j + half, r1);
        if (is_k) {
            store_cache<T, N>(kc + slot + (size_t)h * head_dim + j, r0);
            store_cache<T, N>(kc + slot + (size_t)h * head_dim + j + half, r1);
        }
        return;
    }
    item -= q_items + k_items;
    if (item < n_kv * rest) { /* k dims past the rotary ones (partial rotary embeddings) */
        const int e = (item / rest) * head_dim + 2 * half + N * (item % rest);
        store_cache<T, N>(kc + slot + e, load_floats<N>(k + (size_t)row * width + e));
        return;
    }
    item = N * (item - n_kv * rest);
    store_cache<T, N>(vc + slot + item, load_floats<N>(v + (size_t)row * width + item));
}

__device__ __forceinline__ size_t rope_store_slot(const tsr_batch_layout &b, int seq, int pos, int page_size, int width)
{
    return ((size_t)b.page_tables[(size_t)seq * b.max_pages + pos / page_size] * page_size + pos % page_size) * width;
}

/* rope_store for few rows (decode): one thread per item. */
template <typename T>
__global__ void rope_store_kernel(tsr_batch_layout b, float *q, int n_heads, float *k, const float *v, T *kc, T *vc,
                                  int page_size, int n_kv, int head_dim, int half, int per_row)
{
    tsr_pdl_start();
    const size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (size_t)b.n_rows * per_row) return;
    const int row = (int)(i / per_row), seq = b.row_seq[row], pos = b.positions[row];
    rope_store_item<T, 1>(b, q, n_heads, k, v, kc, vc, n_kv, head_dim, half, row, seq, pos,
                          rope_store_slot(b, seq, pos, page_size, n_kv * head_dim), (int)(i % per_row), NULL);
}

/* rope_store for many rows (prefill): a block per row, which computes the row's cos and sin once per rotary pair
 * index (the per-item kernel computed them once per head: 40 times at 8B) and its cache slot once; pairs of values
 * per item where `pairs` (rope_store_item<T, 2>). */
template <typename T>
__global__ void rope_store_rows_kernel(tsr_batch_layout b, float *q, int n_heads, float *k, const float *v, T *kc,
                                       T *vc, int page_size, int n_kv, int head_dim, int half, int per_row, bool pairs)
{
    extern __shared__ float rs_cs[]; /* [2][half] */
    tsr_pdl_start();
    const int row = blockIdx.x, seq = b.row_seq[row], pos = b.positions[row];
    for (int j = threadIdx.x; j < half; j += blockDim.x)
        tsr_rope_cos_sin(b, seq, pos, half, j, rs_cs[j], rs_cs[half + j]);
    __syncthreads();
    const size_t slot = rope_store_slot(b, seq, pos, page_size, n_kv * head_dim);
    if (pairs) {
        for (int item = threadIdx.x; item < per_row / 2; item += blockDim.x)
            rope_store_item<T, 2>(b, q, n_heads, k, v, kc, vc, n_kv, head_dim, half, row, seq, pos, slot, item,
                                  rs_cs);
        return;
    }
    for (int item = threadIdx.x; item < per_row; item += blockDim.x)
        rope_store_item<T, 1>(b, q, n_heads, k, v, kc, vc, n_kv, head_dim, half, row, seq, pos, slot, item, rs_cs);
}

/* From this many rows rope_store takes a block per row (TSR_CUDA_ROPE_ROWS_MIN overrides; tests set 1). */
static int rope_store_rows_min(void)
{
    static int v = -1;
    if (v < 0)
        v = getenv("TSR_CUDA_ROPE_ROWS_MIN") && atoi(getenv("TSR_CUDA_ROPE_ROWS_MIN")) > 0
                ? atoi(getenv("TSR_CUDA_ROPE_ROWS_MIN"))
                : 64;
    return v;
}

void tsr_cuda_rope_store(const tsr_batch_layout *b, float *q, int n_heads, float *k, const float *v, tsr_kv_cache *kv,
                         int layer, int rot_dim)
{
    const int n_kv = kv->n_kv_heads, d = kv->head_dim, half = rot_dim / 2;
    if (tsr_kv_is_quant(kv->dtype)) { /* the quantized caches have their own store (kv_store_quant.cu) */
        tsr_cuda_rope_store_quant(b, q, n_heads, k, v, kv, layer, rot_dim);
        return;
    }
    const int per_row = (n_heads + n_kv) * half + n_kv * (d - 2 * half) + n_kv * d;
    const size_t total = (size_t)b->n_rows * per_row;
    if (!total) return;
    if (b->n_rows >= rope_store_rows_min()) {
        const size_t smem = 2 * (size_t)half * sizeof(float);
        /* pairs of values per item where every row and rotary half starts 8 bytes aligned */
        const bool pairs = half % 2 == 0 && d % 2 == 0 &&
                           (((uintptr_t)q | (uintptr_t)k | (uintptr_t)v | (uintptr_t)kv->k[layer] |
                             (uintptr_t)kv->v[layer]) & 7) == 0;
        if (kv->dtype == TSR_F32)
            tsr_launch_smem(rope_store_rows_kernel<float>, dim3(b->n_rows), dim3(256), smem, *b, q, n_heads, k, v,
                            (float *)kv->k[layer], (float *)kv->v[layer], kv->page_size, n_kv, d, half, per_row,
                            pairs);
        else
            tsr_launch_smem(rope_store_rows_kernel<__half>, dim3(b->n_rows), dim3(256), smem, *b, q, n_heads, k, v,
                            (__half *)kv->k[layer], (__half *)kv->v[layer], kv->page_size, n_kv, d, half, per_row,
                            pairs);
    } else if (kv->dtype == TSR_F32) {
        tsr_launch(rope_store_kernel<float>, dim3(tsr_div_up(total, 256)), dim3(256), *b, q, n_heads, k, v,
                   (float *)kv->k[layer], (float *)kv->v[layer], kv->page_size, n_kv, d, half, per_row);
    } else {
        tsr_launch(rope_store_kernel<__half>, dim3(tsr_div_up(total, 256)), dim3(256), *b, q, n_heads, k, v,
                   (__half *)kv->k[layer], (__half *)kv->v[layer], kv->page_size, n_kv, d, half, per_row);
    }
    TSR_CUDA_LAUNCHED();
}

__global__ void silu_mul_kernel(const float *gate, const float *up, size_t n, float *out)
{
    tsr_pdl_start();
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    float g = gate[i];
    out[i] = g / (1.0f + expf(-g)) * up[i];
}

void tsr_cuda_silu_mul(const float *gate, const float *up, size_t n, float *out)
{
    if (!n) return;
    tsr_launch(silu_mul_kernel, dim3(tsr_div_up(n, 256)), dim3(256), gate, up, n, out);
    TSR_CUDA_LAUNCHED();
}

/* silu_mul in place on gate, a thread per staged entry of down's GEMV (stage_ahead.cuh, one unit order): the entry's
 * four values silu(gate) · up, read through the permutation, also written back to gate (each row of gate belongs to
 * exactly one entry). The sources are read before the wait. */
__global__ void silu_stage_kernel(const __grid_constant__ tsr_stage_ahead S, float *gate, const float *up, int K)
{
    tsr_pdl_trigger();
    const int per_row = S.n_units * 8;
    const size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    const bool live = i < (size_t)per_row * S.M;
    const int tok = live ? (int)((i >> 2) % S.M) : 0; /* entry i is entry (i / 4 / M) · 4 + i % 4 of row tok */
    const int4 src = live ? stage_ahead_src(S, 0, (int)((i >> 2) / S.M) * 4 + (int)(i & 3)) : make_int4(-1, -1, -1, -1);
    tsr_pdl_wait();
    if (!live) return;
    float *g = gate + (size_t)tok * K;
    const float *u = up + (size_t)tok * K;
    const int s[4] = {src.x, src.y, src.z, src.w};
    float v[4];
#pragma unroll
    for (int j = 0; j < 4; j++) {
        const float gv = s[j] >= 0 ? g[s[j]] : 0.0f;
        v[j] = s[j] >= 0 ? gv / (1.0f + expf(-gv)) * u[s[j]] : 0.0f;
    }
#pragma unroll
    for (int j = 0; j < 4; j++)
        if (s[j] >= 0) g[s[j]] = v[j];
    stage_entry_store(S.xs[0], i, S.exact, v);
}

bool tsr_cuda_silu_stage(const tsr_linear_dev *L, float *gate, const float *up, int M)
{
    tsr_stage_ahead S;
    if (L->kind != TSR_LINEAR_EXL2 || !tsr_cuda_gemv_stage_plan(&L, 1, M, &S)) return false;
    const size_t entries = (size_t)S.n_units * 8 * M;
    tsr_launch(silu_stage_kernel, dim3(tsr_div_up(entries, 256)), dim3(256), S, gate, up, L->K);
    TSR_CUDA_LAUNCHED();
    tsr_cuda_gemv_stage_done(&L, 1, gate, &S);
    return true;
}

__global__ void add_kernel(float *x, const float *y, size_t n)
{
    tsr_pdl_start();
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] += y[i];
}

void tsr_cuda_add(float *x, const float *y, size_t n)
{
    if (!n) return;
    tsr_launch(add_kernel, dim3(tsr_div_up(n, 256)), dim3(256), x, y, n);
    TSR_CUDA_LAUNCHED();
}

__global__ void gather_rows_kernel(const float *x, const int32_t *index, int n, int dim, float *out)
{
    tsr_pdl_start();
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (size_t)n * dim) return;
    size_t r = i / dim, c = i % dim;
    out[i] = x[(size_t)index[r] * dim + c];
}

void tsr_cuda_gather_rows(const float *x, const int32_t *index, int n, int dim, float *out)
{
    size_t total = (size_t)n * dim;
    if (!total) return;
    /* out may alias x only when index is the identity prefix; the forward never asks for that */
    tsr_launch(gather_rows_kernel, dim3(tsr_div_up(total, 256)), dim3(256), x, index, n, dim, out);
    TSR_CUDA_LAUNCHED();
}
