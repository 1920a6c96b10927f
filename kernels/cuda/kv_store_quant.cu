/* The store into a quantized KV cache (Q4/Q6/Q8, runtime/kv_cache.h; EXL2.md 11.3): kv_store, and rope_store's
 * rope of q and k fused with it.
 *
 * One warp per (row, KV head) holds the head's K and V, lane j elements 64c + 2j and 64c + 2j + 1 of each 64-element
 * chunk c: per chunk and parity the 32-point Hadamard butterflies are warp shuffles, every step rounded to fp16
 * exactly as the CPU quantizer (tsr_kv_quantize) rounds it, so the codes and scales match the CPU's byte for byte on
 * the same input. The fp16 K/V of the call's first TSR_KV_STAGE_ROWS rows also go to the staging area with their
 * (layer, slot) keys, for the exact attention to the call's own rows.
 *
 * rope_store over a quantized cache is one launch: the first blocks rotate q's rotary pairs (a thread per pair, the
 * arithmetic of elementwise.cu's rope kernels), the rest are the store's warps, which rotate K's pairs first (the
 * same arithmetic, so the codes are those of rope, then kv_store) and write the rotated K back over k, as rope_store
 * does, once every lane of the warp has read the head. It used to be three launches (rope of q, rope of k, the
 * store), the last one without programmatic launch, so that the decode attention after it could not start early.
 * Launched with programmatic dependent launch, triggering at once as the small kernels do (launch.cuh). */
#include "kernels/cuda/cuda_common.cuh"
#include "kernels/cuda/cuda_kernels.cuh"
#include "kernels/cuda/kvq_tile.cuh"
#include "kernels/cuda/launch.cuh"
#include "kernels/cuda/rope.cuh"

#define KVQ_THREADS    128
#define KVQ_MAX_CHUNKS 4 /* head_dim up to 256 */

__device__ __forceinline__ float round_half(float x)
{
    return __half2float(__float2half_rn(x));
}

/* One code, exactly as tsr_kv_quantize computes it (fp16 division, one fp16 fma, round half to even, clamp). */
__device__ __forceinline__ int quant_code(float v, float amax, int bits)
{
    const float m = bits == 4 ? 8.0f : 128.0f, top = 2.0f * m - 1.0f;
    if (!(amax > 0.0f)) return (int)m;
    float y = round_half(fmaf(round_half(__fdiv_rn(v, amax)), m, m));
    if (!(y >= 0.0f)) y = 0.0f;
    if (y > top) y = top;
    return (int)rintf(y);
}

/* Lane j holds elements 2j, 2j+1 of a 64-element chunk starting at element e0 of the layer's storage. */
template <int BITS>
__device__ __forceinline__ void quantize_chunk(float x0, float x1, int lane, uint8_t *codes, __half *scales, size_t e0)
{
    x0 = round_half(x0), x1 = round_half(x1);
#pragma unroll
    for (int s = 1; s < 32; s <<= 1) {
        const float y0 = __shfl_xor_sync(0xffffffffu, x0, s), y1 = __shfl_xor_sync(0xffffffffu, x1, s);
        if (lane & s)
            x0 = round_half(y0 - x0), x1 = round_half(y1 - x1);
        else
            x0 = round_half(x0 + y0), x1 = round_half(x1 + y1);
    }
    float amax = fmaxf(fabsf(x0), fabsf(x1));
#pragma unroll
    for (int o = 8; o > 0; o >>= 1)
        amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o)); /* 16-lane halves */
    const int q0 = quant_code(x0, amax, BITS), q1 = quant_code(x1, amax, BITS);
    if (BITS == 4) {
        codes[e0 / 2 + lane] = (uint8_t)(q0 | q1 << 4);
    } else {
        codes[e0 + 2 * lane] = (uint8_t)q0;
        codes[e0 + 2 * lane + 1] = (uint8_t)q1;
    }
    if ((lane & 15) == 0) scales[e0 / 32 + lane / 16] = __float2half_rn(amax * (BITS == 4 ? 0.125f : 1.0f / 128.0f));
}

/* Where the store writes: one layer of the cache and the staging area. */
struct kvq_dest {
    uint8_t *kc, *vc;
    __half *ks, *vs, *stage_k, *stage_v;
    int64_t *stage_key;
    int stage_rows, layer, page_size, nkv, d;
};

/* Blocks [0, q_blocks): q's rotary pairs, a thread each (only with half > 0). The others: a warp per (row, KV head)
 * rotates K's first 2 half dims (half > 0), writes them back to k, and stores K and V. */
template <int KB, int VB>
__global__ void __launch_bounds__(KVQ_THREADS) kvq_store_kernel(tsr_batch_layout b, kvq_dest o, float *q, int n_heads,
                                                                float *k, const float *v, int half, unsigned q_blocks)
{
    tsr_pdl_start();
    const int d = o.d, width = o.nkv * d, lane = threadIdx.x & 31;
    if (blockIdx.x < q_blocks) { /* as rope_kernel */
        const size_t i = (size_t)blockIdx.x * KVQ_THREADS + threadIdx.x;
        if (i < (size_t)b.n_rows * n_heads * half) tsr_rope_pair(b, q, n_heads, d, half, i);
        return;
    }
    const size_t warp = ((size_t)(blockIdx.x - q_blocks) * KVQ_THREADS + threadIdx.x) >> 5;
    if (warp >= (size_t)b.n_rows * o.nkv) return; /* whole warps: the shuffles below see all 32 lanes */
    const int row = (int)(warp / o.nkv), h = (int)(warp % o.nkv), chunks = d / 64;
    const int seq = b.row_seq[row], pos = b.positions[row];
    const int64_t slot =
        (int64_t)b.page_tables[(size_t)seq * b.max_pages + pos / o.page_size] * o.page_size + pos % o.page_size;
    float *kh = k + (size_t)row * width + (size_t)h * d;
    const float *vh = v + (size_t)row * width + (size_t)h * d;
    float kx[KVQ_MAX_CHUNKS][2], vx[KVQ_MAX_CHUNKS][2];
#pragma unroll
    for (int c = 0; c < KVQ_MAX_CHUNKS; c++)
#pragma unroll
        for (int t = 0; t < 2; t++)
            if (c < chunks) kx[c][t] = kh[64 * c + 2 * lane + t], vx[c][t] = vh[64 * c + 2 * lane + t];
    if (half > 0) {
        float pk[KVQ_MAX_CHUNKS][2]; /* each rotary value's partner, e + half or e - half */
#pragma unroll
        for (int c = 0; c < KVQ_MAX_CHUNKS; c++)
#pragma unroll
            for (int t = 0; t < 2; t++) {
                const int e = 64 * c + 2 * lane + t;
                if (c < chunks && e < 2 * half) pk[c][t] = kh[e < half ? e + half : e - half];
            }
        __syncwarp(); /* every lane has read the head before any lane writes it back */
#pragma unroll
        for (int c = 0; c < KVQ_MAX_CHUNKS; c++)
#pragma unroll
            for (int t = 0; t < 2; t++) {
                const int e = 64 * c + 2 * lane + t;
                if (c >= chunks || e >= 2 * half) continue;
                float cs, sn, mine, partner;
                tsr_rope_cos_sin(b, seq, pos, half, e < half ? e : e - half, cs, sn);
                if (e < half) tsr_rope_rotate(kx[c][t], pk[c][t], cs, sn, mine, partner);
                else tsr_rope_rotate(pk[c][t], kx[c][t], cs, sn, partner, mine);
                kx[c][t] = mine;
                kh[e] = mine;
            }
    }
    const size_t stage = (size_t)row * width + (size_t)h * d;
#pragma unroll
    for (int c = 0; c < KVQ_MAX_CHUNKS; c++) {
        if (c >= chunks) break;
        const size_t e0 = (size_t)slot * width + (size_t)h * d + 64 * c, in = stage + 64 * c + 2 * lane;
        quantize_chunk<KB>(kx[c][0], kx[c][1], lane, o.kc, o.ks, e0);
        quantize_chunk<VB>(vx[c][0], vx[c][1], lane, o.vc, o.vs, e0);
        if (row < o.stage_rows) {
            o.stage_k[in] = __float2half_rn(kx[c][0]), o.stage_k[in + 1] = __float2half_rn(kx[c][1]);
            o.stage_v[in] = __float2half_rn(vx[c][0]), o.stage_v[in + 1] = __float2half_rn(vx[c][1]);
        }
    }
    if (row < o.stage_rows && h == 0 && lane == 0) o.stage_key[row] = tsr_kv_stage_key(o.layer, slot);
    if (warp == 0 && lane == 0) o.stage_key[o.stage_rows] = min(b.n_rows, o.stage_rows);
}

/* The store, after the rope of q and k (rot_dim > 0) or alone (rot_dim = 0, q unused). */
static void kvq_store(const tsr_batch_layout *b, tsr_kv_cache *kv, int layer, float *q, int n_heads, float *k,
                      const float *v, int rot_dim)
{
    const int d = kv->head_dim, half = rot_dim / 2;
    if (d % 64 || d > 64 * KVQ_MAX_CHUNKS)
        tsr_cuda_fatal(__FILE__, __LINE__, "quantized KV caches need head_dim % 64 == 0 up to 256");
    const size_t warps = (size_t)b->n_rows * kv->n_kv_heads;
    if (!warps) return;
    const unsigned q_blocks = half > 0 ? tsr_div_up((size_t)b->n_rows * n_heads * half, KVQ_THREADS) : 0;
    const unsigned blocks = q_blocks + tsr_div_up(warps * 32, KVQ_THREADS);
    const kvq_dest o = {(uint8_t *)kv->k[layer],
                        (uint8_t *)kv->v[layer],
                        (__half *)kv->k_scale[layer],
                        (__half *)kv->v_scale[layer],
                        (__half *)kv->stage_k,
                        (__half *)kv->stage_v,
                        kv->stage_key,
                        kv->stage_rows,
                        layer,
                        kv->page_size,
                        kv->n_kv_heads,
                        d};
    kvq_with_bits(kv->k_bits, kv->v_bits, [&](auto kb, auto vb) {
        tsr_launch(kvq_store_kernel<decltype(kb)::value, decltype(vb)::value>, dim3(blocks), dim3(KVQ_THREADS), *b, o,
                   q, n_heads, k, v, half, q_blocks);
    });
    TSR_CUDA_LAUNCHED();
}

void tsr_cuda_kv_store_quant(const tsr_batch_layout *b, tsr_kv_cache *kv, int layer, const float *k, const float *v)
{
    kvq_store(b, kv, layer, NULL, 0, (float *)k, v, 0); /* k is only read without a rope */
}

void tsr_cuda_rope_store_quant(const tsr_batch_layout *b, float *q, int n_heads, float *k, const float *v,
                               tsr_kv_cache *kv, int layer, int rot_dim)
{
    kvq_store(b, kv, layer, q, n_heads, k, v, rot_dim);
}
