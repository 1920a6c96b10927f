/* What bounds the wgmma product's words' copies at few rows (kernels/cuda/NOTES.md, stops 66-68: alone they stream at
 * ~1 TB/s, with 8 or 16 stages in flight alike, while the memory system idles): the number of bulk copies, the bytes
 * in flight, or where the pieces lie? Each block has one issuing lane, as the product's producer warp, and a ring of
 * SLOTS slots of PIECE bytes in shared memory, each with an mbarrier; it copies its pieces with cp.async.bulk, and
 * before reusing a slot waits for the copy that last filled it (no consumers: the copies alone, as the product's
 * copywords diagnostic). The same 1 GiB is read under each setting, a fresh region each run (L2 holds none of it):
 *   layout 0 (the product's): piece i of block b at (i · NB + b) · PIECE, so that the blocks' i-th pieces lie side by
 *            side, as the column tiles' words of one unit do (gate at 96 rows: 112 blocks, 2 KB pieces);
 *   layout 1: each block's pieces one contiguous stretch (words stored by column tile, a layout tessera lacks);
 * pieces of 2-32 KB, 2-64 slots, 112 or 132 blocks; stop 69's first call ran every piece and slot count with one
 * lane (2 KB: 0.97 TB/s at 112 blocks whatever the slots, 4 KB 1.92, 8 KB 3.1); stop 71's first call found the rate
 * grows with the issuing warps (2 KB: 0.73, 1.45, 2.57 TB/s from 1, 2, 4 warps of a block) and the blocks per SM,
 * tensor copies alike; its second, the table below, that lanes of one warp scale almost as well (0.72, 1.30, 2.11,
 * 2.97 TB/s from 1, 2, 4, 8 lanes). Printed: TB/s (bytes read / time, best of 5 runs) per setting.
 *
 * Build and run on the GPU machine: nvcc -std=c++17 -O3 -arch=sm_90 -o build-probe/bulk scripts/bulk-probe.cu &&
 * build-probe/bulk */
#include "probe_check.cuh"
#include "../kernels/cuda/bulk.cuh" /* the mbarrier and bulk-copy wrappers the GEMV uses */

#include <cuda.h>
#include <cuda_runtime.h>

#include <stdint.h>
#include <stdio.h>

#define TOTAL_BYTES ((size_t)1 << 30)

/* Block b's issuer q (lane q % L of warp q / L: W warps of L issuing lanes each) copies pieces q, q + W L, ... of the
 * block's n, each issuer with slots / (W L) slots of its own; its copies are bulk copies, or with `tensor` 2D tensor
 * copies of the piece as rows of 512 bytes (tensor_map). The lanes of a warp issue in the same instructions. */
__global__ void __launch_bounds__(128) copy_kernel(const unsigned char *src, const __grid_constant__ CUtensorMap map,
                                                   int tensor, int layout, uint32_t piece, int slots, int lanes,
                                                   long long n, unsigned *sink)
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    extern __shared__ __align__(1024) unsigned char smem[];
    const int issuers = (int)blockDim.x / 32 * lanes, ws = slots / issuers;
    if ((int)threadIdx.x % 32 >= lanes) return;
    const int q = (int)threadIdx.x / 32 * lanes + (int)threadIdx.x % 32;
    unsigned char *ring = smem + (size_t)(q * ws) * piece;
    uint64_t *bars = (uint64_t *)(smem + (size_t)slots * piece) + q * ws;
    const int b = (int)blockIdx.x, nb = (int)gridDim.x;
    for (int s = 0; s < ws; s++) mbar_init(&bars[s], 1);
    mbar_init_fence();
    long long k = 0; /* the issuer's copies so far */
    for (long long i = q; i < n; i += issuers, k++) {
        const int s = (int)(k % ws);
        if (k >= ws) mbar_wait(&bars[s], (unsigned)((k / ws - 1) & 1));
        const size_t at = layout == 0 ? ((size_t)i * nb + b) * piece : ((size_t)b * n + i) * piece;
        mbar_expect_tx(&bars[s], piece);
        if (tensor)
            asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, "
                         "{%2, %3}], [%4];" ::"r"(smem_addr(ring + (size_t)s * piece)),
                         "l"((uint64_t)&map), "r"(0), "r"((int)(at / 512)), "r"(smem_addr(&bars[s]))
                         : "memory");
        else
            bulk_copy(ring + (size_t)s * piece, src + at, piece, &bars[s]);
    }
    for (long long j = k > ws ? k - ws : 0; j < k; j++) mbar_wait(&bars[(int)(j % ws)], (unsigned)((j / ws) & 1));
    if (smem[0] == 0xfe && smem[1] == 0xfe) atomicAdd(sink, 1u); /* keeps the copies' destination live */
#endif
}

/* The region as rows of 512 bytes (uint32), read in boxes of piece / 512 rows: one tensor copy a piece. */
typedef CUresult (*encode_fn)(CUtensorMap *, CUtensorMapDataType, cuuint32_t, void *, const cuuint64_t *,
                              const cuuint64_t *, const cuuint32_t *, const cuuint32_t *, CUtensorMapInterleave,
                              CUtensorMapSwizzle, CUtensorMapL2promotion, CUtensorMapFloatOOBfill);
static int tensor_map(CUtensorMap *map, const void *base, size_t bytes, uint32_t piece)
{
    static encode_fn fn;
    if (!fn) {
        void *p = NULL;
        cudaDriverEntryPointQueryResult q;
        CHECK(cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &p, 12000, cudaEnableDefault, &q));
        fn = (encode_fn)p;
    }
    const cuuint64_t dims[2] = {128, (cuuint64_t)(bytes / 512)}, strides[1] = {512};
    const cuuint32_t box[2] = {128, piece / 512}, step[2] = {1, 1};
    if (fn(map, CU_TENSOR_MAP_DATA_TYPE_UINT32, 2, (void *)base, dims, strides, box, step,
           CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_NONE, CU_TENSOR_MAP_L2_PROMOTION_NONE,
           CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) != CUDA_SUCCESS) {
        fprintf(stderr, "tensor map refused\n");
        return 1;
    }
    return 0;
}

static int measure(const unsigned char *buf, size_t buf_bytes, int tensor, int layout, uint32_t piece, int slots,
                   int nb, int warps, int lanes, unsigned *sink, double *tbs)
{
    const long long n = (long long)(TOTAL_BYTES / piece / nb);
    const size_t bytes = (size_t)n * nb * piece;
    const size_t smem = (size_t)slots * piece + 8 * (size_t)slots + 1024;
    CHECK(cudaFuncSetAttribute(copy_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
    cudaEvent_t a, z;
    CHECK(cudaEventCreate(&a));
    CHECK(cudaEventCreate(&z));
    float best = 1e30f;
    static size_t region;
    for (int r = 0; r < 5; r++) {
        region = (region + bytes) % (buf_bytes - bytes + 1); /* a region L2 has not seen lately */
        region &= ~(size_t)4095;
        CHECK(cudaEventRecord(a));
        CUtensorMap map;
        if (tensor && tensor_map(&map, buf + region, bytes, piece)) return 1;
        copy_kernel<<<nb, 32 * warps, smem>>>(buf + region, map, tensor, layout, piece, slots, lanes, n, sink);
        CHECK(cudaEventRecord(z));
        CHECK(cudaEventSynchronize(z));
        CHECK(cudaGetLastError());
        float ms;
        CHECK(cudaEventElapsedTime(&ms, a, z));
        if (ms < best) best = ms;
    }
    *tbs = (double)bytes / (best * 1e-3) / 1e12;
    return 0;
}

int main(void)
{
    const size_t buf_bytes = (size_t)4 << 30;
    unsigned char *buf;
    unsigned *sink;
    CHECK(cudaMalloc(&buf, buf_bytes));
    CHECK(cudaMemset(buf, 1, buf_bytes));
    CHECK(cudaMalloc(&sink, sizeof(unsigned)));
    printf("kind   blocks warps lanes layout piece_KB slots in_flight_KB  TB/s\n");
    struct setting { int tensor, nb, warps, layout; uint32_t piece; int slots, lanes; };
    const setting settings[] = {
        /* 2 KB copies from one lane, then from 2, 4 and 8 lanes of one warp (one instruction issues them all), and
         * from 2 and 4 warps (stop 71's call: 0.73, 1.45 and 2.57 TB/s at 1, 2 and 4 warps) */
        {0, 112, 1, 0, 2048, 8, 1}, {0, 112, 1, 0, 2048, 8, 2}, {0, 112, 1, 0, 2048, 8, 4}, {0, 112, 1, 0, 2048, 16, 8},
        {0, 112, 2, 0, 2048, 8, 1}, {0, 112, 4, 0, 2048, 8, 1}, {0, 112, 4, 0, 2048, 16, 4},
        /* the same with tensor copies, and 8 KB pieces */
        {1, 112, 1, 0, 2048, 8, 4}, {0, 112, 1, 0, 8192, 8, 2}, {0, 112, 2, 0, 8192, 8, 1},
    };
    for (const setting &t : settings) {
        double tbs;
        if (measure(buf, buf_bytes, t.tensor, t.layout, t.piece, t.slots, t.nb, t.warps, t.lanes, sink, &tbs)) return 1;
        printf("%-6s %6d %5d %5d %6d %8u %5d %12u  %.3f\n", t.tensor ? "tensor" : "bulk", t.nb, t.warps, t.lanes,
               t.layout, t.piece / 1024, t.slots, t.slots * t.piece / 1024, tbs);
    }
    return 0;
}
