/* Prefill attention over a quantized KV cache (Q4/Q6/Q8): the positions the batch's rows can see are rebuilt as an
 * fp16 cache in a scratch buffer, and the tensor-core prefill kernels of the fp16 cache run over that copy.
 *
 * A prefill row attends to every position of its sequence up to its own, so each (position, KV head) vector is read
 * by hundreds or thousands of rows: rebuilding it once (a warp per vector, kvq_tile.cuh) and reading fp16 from then
 * on costs a pass over the context, where attention.cu's exact kernel decodes every code again for every row and
 * head with scalar arithmetic (8.6x slower than the fp16 cache's prefill on the 8B shape, stop 47). This is what
 * ExLlamaV2 does too: it dequantizes the cache into fp16 tensors before flash attention. The rows the call stored
 * itself come from the staging area, exact, as in every attention over a quantized cache (runtime/kv_cache.h).
 *
 * The copy gives sequence s the pages s · P .. s · P + P - 1 of its own (P = pages of the longest span copied), so
 * its page table is the run of those numbers; the buffer holds the tables, then K, then V (scratch slot 7, n_seqs · P
 * · page_size · width fp16 values each for K and V). Under a sliding window a sequence's copy starts at the page of
 * its first row's window start (tsr_kv_copy_first_page): the prefill kernels read a block's positions from its first
 * row's window start on, so a chunk deep into a long context copies about window + chunk positions, not the whole
 * context; the table's entries before that page point at the copy's first page and are never read. Where the device
 * has no room for it the caller passes the batch on (attention.cu: the decode kernel). Prefill calls are never
 * recorded into CUDA graphs (only decode steps are), so the buffer may grow here. The copy stays within the positions
 * the KV pool's sizing left room for (tsr_kv_cache.expand_positions, runtime/kv_cache.h: 32 per row of the longest
 * step, or one sequence's whole context), and is made only where its rebuilt positions serve at least two row visits
 * each. A step of long-context decode rows followed by prompt chunks (as the scheduler plans one) whose copy as a
 * whole would not pay or fit is split: its decode rows to the decode kernel, which rebuilds each row's positions in
 * its tiles, its chunks over a copy of their own sequences' contexts. Other such batches go to the decode kernel
 * whole. */
#include "kernels/cuda/cuda_common.cuh"
#include "kernels/cuda/cuda_kernels.cuh"
#include "kernels/cuda/kvq_tile.cuh"
#include "kernels/kv_copy_plan.h"

#define KX_WARPS 8 /* positions per block of the rebuild */

/* Block (x, kvh, s): warp w rebuilds position 8x + w of sequence s's copied span (from its first copied page,
 * tsr_kv_copy_first_page: its first row's window start under a window, else 0), KV head kvh, K and V, into the fp16
 * copy; block (0, 0, s) also writes s's page table of the copy (pages before the first copied one, which no kernel
 * reads, point at its first). */
template <int D, int KB, int VB>
__global__ void __launch_bounds__(KX_WARPS * 32)
    kvq_expand_kernel(tsr_batch_layout b, kvq_view c, int layer, int page_size, int width, int copy_pages, int window,
                      __half *ok, __half *ov, int32_t *tables)
{
    const int s = blockIdx.z, kvh = blockIdx.y, lane = threadIdx.x & 31;
    const int r0 = b.seq_row0[s], r1 = b.seq_row0[s + 1];
    const int p0 = b.positions[r0], span = b.positions[r1 - 1] + 1;
    const int first = tsr_kv_copy_first_page(p0, window, page_size);
    if (blockIdx.x == 0 && kvh == 0)
        for (int i = threadIdx.x; i < first + copy_pages && i < b.max_pages; i += blockDim.x)
            tables[(size_t)s * b.max_pages + i] = s * copy_pages + (i < first ? 0 : i - first);
    const int rel = blockIdx.x * KX_WARPS + (threadIdx.x >> 5), t = first * page_size + rel;
    if (t >= span) return;
    const int32_t *table = b.page_tables + (size_t)s * b.max_pages;
    const int64_t slot = (int64_t)table[t / page_size] * page_size + t % page_size;
    const size_t dst = (((size_t)s * copy_pages * page_size) + rel) * width + (size_t)kvh * D;
    const int64_t fr = t >= p0 ? (int64_t)r0 + (t - p0) : -1;
    kvq_row_pair<D, KB, VB>(c, slot, kvh, width, fr, layer, lane, ok + dst, ov + dst);
}

template <int D, int KB, int VB>
static void expand(const tsr_batch_layout *b, const kvq_view &c, int layer, const tsr_kv_cache *kv, int copy_pages,
                   int window, __half *ok, __half *ov, int32_t *tables)
{
    const dim3 grid(tsr_div_up((size_t)copy_pages * kv->page_size, KX_WARPS), (unsigned)kv->n_kv_heads,
                    (unsigned)b->n_seqs);
    kvq_expand_kernel<D, KB, VB><<<grid, KX_WARPS * 32, 0, tsr_cuda_stream()>>>(
        *b, c, layer, kv->page_size, kv->n_kv_heads * D, copy_pages, window, ok, ov, tables);
    TSR_CUDA_LAUNCHED();
}

template <int D>
static void expand_mode(const tsr_batch_layout *b, const kvq_view &c, int layer, const tsr_kv_cache *kv, int copy_pages,
                        int window, __half *ok, __half *ov, int32_t *tables)
{
    kvq_with_bits(kv->k_bits, kv->v_bits, [&](auto kb, auto vb) {
        expand<D, decltype(kb)::value, decltype(vb)::value>(b, c, layer, kv, copy_pages, window, ok, ov, tables);
    });
}

/* The copy's buffer: rounded up to a power of two (at least 16 MiB) so that growing prompts do not reallocate it,
 * and every growth drops the recorded decode graphs, at every call; the exact size where that does not fit. */
static void *copy_buffer(size_t bytes)
{
    size_t want = (size_t)16 << 20;
    while (want < bytes)
        want <<= 1;
    void *p = tsr_cuda_scratch_try(7, want);
    return p ? p : tsr_cuda_scratch_try(7, bytes);
}

/* The batch over a copy of its context, where the copy pays and fits (1), else nothing launched (0). */
static int copy_attend(const tsr_batch_layout *b, const tsr_attn_args *a, const tsr_kv_cache *kv, const float *q,
                       float *out)
{
    const int D = a->head_dim, copy_pages = tsr_kv_copy_pages(b, a->window, kv);
    if (!copy_pages) return 0;
    const int window = tsr_kv_copy_window(b, a->window);
    const size_t width = (size_t)kv->n_kv_heads * D;
    const size_t table_bytes = ((size_t)b->n_seqs * b->max_pages * sizeof(int32_t) + 255) & ~(size_t)255;
    const size_t halves = (size_t)b->n_seqs * copy_pages * kv->page_size * width;
    char *base = (char *)copy_buffer(table_bytes + 2 * halves * sizeof(__half));
    if (!base) return 0;
    int32_t *tables = (int32_t *)base;
    __half *ok = (__half *)(base + table_bytes), *ov = ok + halves;

    const int l = a->layer;
    kvq_view c = {(const uint8_t *)kv->k[l],
                  (const uint8_t *)kv->v[l],
                  (const __half *)kv->k_scale[l],
                  (const __half *)kv->v_scale[l],
                  (const __half *)kv->stage_k,
                  (const __half *)kv->stage_v,
                  kv->stage_key,
                  kv->stage_rows,
                  kv->k_bits,
                  kv->v_bits};
    if (D == 64)
        expand_mode<64>(b, c, l, kv, copy_pages, window, ok, ov, tables);
    else
        expand_mode<128>(b, c, l, kv, copy_pages, window, ok, ov, tables);

    /* the copy as a one-layer fp16 cache with its own page tables */
    tsr_batch_layout fb = *b;
    fb.page_tables = tables;
    void *kp = ok, *vp = ov;
    tsr_kv_cache fkv = *kv;
    fkv.dtype = TSR_F16, fkv.k_bits = fkv.v_bits = 0;
    fkv.k = &kp, fkv.v = &vp;
    tsr_attn_args fa = *a;
    fa.layer = 0;
    return tsr_cuda_attention_prefill(&fb, &fa, &fkv, q, out);
}

/* A batch that starts with one-row sequences (decode tokens, which the scheduler plans first) and goes on with
 * prompt chunks, whose copy as a whole does not pay or fit: the leading one-row sequences to the decode kernel as a
 * batch of the first rows, the rest over a copy of their own sequences' contexts where that pays and fits
 * (tsr_kv_copy_split). 1 when done, 0 when nothing was launched. (Chunks before decode rows would need the decode
 * kernel's rows offset: such batches stay whole.) */
static int split_attend(const tsr_batch_layout *b, const tsr_attn_args *a, const tsr_kv_cache *kv, const float *q,
                        float *out)
{
    tsr_batch_layout dec, chunks;
    if (!tsr_kv_copy_split(b, a->window, kv, &dec, &chunks)) return 0;
    /* the decode rows go first, so that a kernel that declines them (more than 8 query heads per KV head) leaves the
     * whole batch to the caller */
    if (!tsr_cuda_attention_decode(&dec, a, kv, q, out)) return 0;
    if (copy_attend(&chunks, a, kv, q, out)) return 1;
    /* no device memory for the copy after all: the chunks' rows to the decode kernel too, as the whole batch would
     * have gone (its first rows computed again) */
    if (!tsr_cuda_attention_decode(b, a, kv, q, out))
        tsr_cuda_fatal(__FILE__, __LINE__, "the decode attention declined a batch after taking its first rows");
    return 1;
}

int tsr_cuda_attention_prefill_kvq(const tsr_batch_layout *b, const tsr_attn_args *a, const tsr_kv_cache *kv,
                                   const float *q, float *out)
{
    const int D = a->head_dim;
    if (!tsr_kv_is_quant(kv->dtype) || (D != 64 && D != 128) || a->n_heads % a->n_kv_heads || b->n_seqs <= 0) return 0;
    return copy_attend(b, a, kv, q, out) || split_attend(b, a, kv, q, out);
}
