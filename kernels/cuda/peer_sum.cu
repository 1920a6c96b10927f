/* The one-shot peer all-reduce (peer_sum.h): one area per member, one kernel per call and member.
 *
 * Area layout (bytes from the start): the receive slots, [size][2][cap] floats (source member, epoch parity); the
 * flags, [size][PS_MAX_BLOCKS] words (source member, block), each the last epoch that source's block raised here;
 * then the control words: the last finished epoch, the count of blocks done with the current call, the error word.
 * A block's slice of the buffer is the same on every member (same n, same grid), so block b only waits for the
 * peers' blocks b. Writes to peers are plain stores, ordered before the flag by a system-scope fence and the
 * flag's release store; the flag is read with system-scope acquire loads, and the slots the peers wrote are read
 * past the L1 cache. The kernel is launched without programmatic dependent launch: it starts when the kernel that
 * wrote the buffer is done, and the next one starts when it is done, which is what lets the last block advance the
 * epoch for the next call. */
#include "kernels/cuda/cuda_common.cuh"
#include "kernels/cuda/peer_sum.h"

#include <stdint.h>
#include <string.h>

#define PS_THREADS 256
#define PS_MAX_BLOCKS 64
#define PS_SLICE_MIN 1024 /* floats per block at least (a block's flag round trip costs more than its copy below) */
#define PS_BUS_ID_AT 64   /* where a member's exchange data holds its GPU's PCI bus id, after the IPC handle */

enum { PS_EPOCH, PS_DONE, PS_ERROR, PS_CTL_WORDS = 4 };

struct tsr_peer_sum {
    int rank, size;
    size_t cap;              /* floats per receive slot, a multiple of 32 */
    unsigned long long timeout_ns;
    char *area[TSR_PEER_MAX]; /* every member's area as this process addresses it */
    int opened[TSR_PEER_MAX]; /* 1 where area[q] was opened from an IPC handle (closed on free) */
    int owns;                 /* 1: area[rank] was allocated here (freed on free) */
};

struct ps_args {
    float *recv[TSR_PEER_MAX];     /* member q's receive slots */
    unsigned *flags[TSR_PEER_MAX]; /* member q's flags */
    unsigned *ctl;                 /* this member's control words */
    int me, size;
    unsigned cap;
    unsigned long long timeout_ns;
};

static size_t ps_flags_offset(int size, size_t cap) { return (size_t)size * 2 * cap * sizeof(float); }
static size_t ps_ctl_offset(int size, size_t cap)
{
    return ps_flags_offset(size, cap) + (size_t)size * PS_MAX_BLOCKS * sizeof(unsigned);
}
static size_t ps_area_bytes(int size, size_t cap) { return ps_ctl_offset(size, cap) + PS_CTL_WORDS * sizeof(unsigned); }

__device__ __forceinline__ unsigned ps_load_acquire(const unsigned *p)
{
    unsigned v;
    asm volatile("ld.acquire.sys.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
    return v;
}

__device__ __forceinline__ void ps_store_release(unsigned *p, unsigned v)
{
    asm volatile("st.release.sys.global.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}

__device__ __forceinline__ unsigned long long ps_now_ns(void)
{
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}

__global__ void __launch_bounds__(PS_THREADS) peer_sum_kernel(const ps_args a, float *buf, unsigned n, unsigned slice)
{
    __shared__ int give_up;
    const int tid = threadIdx.x, b = blockIdx.x;
    const unsigned epoch = *(volatile unsigned *)&a.ctl[PS_EPOCH] + 1;
    const int par = epoch & 1;
    const unsigned lo = b * slice, hi = min(n, lo + slice);
    if (tid == 0) give_up = *(volatile int *)&a.ctl[PS_ERROR];
    __syncthreads();
    if (!give_up) {
        /* this block's slice into every peer's slot [me][par] */
        for (int q = 0; q < a.size; q++) {
            if (q == a.me) continue;
            float *dst = a.recv[q] + ((size_t)a.me * 2 + par) * a.cap;
            for (unsigned i = lo + tid; i < hi; i += PS_THREADS) dst[i] = buf[i];
        }
        __threadfence_system();
        __syncthreads();
        if (tid < a.size && tid != a.me) ps_store_release(a.flags[tid] + a.me * PS_MAX_BLOCKS + b, epoch);
        /* thread q waits for member q's block b (a peer one call ahead already shows the next epoch) */
        if (tid < a.size && tid != a.me) {
            const unsigned *f = a.flags[a.me] + tid * PS_MAX_BLOCKS + b;
            const unsigned long long t0 = ps_now_ns();
            while ((int)(ps_load_acquire(f) - epoch) < 0) {
                if (ps_now_ns() - t0 > a.timeout_ns) {
                    atomicExch((int *)&a.ctl[PS_ERROR], 1);
                    give_up = 1;
                    break;
                }
                __nanosleep(64);
            }
        }
        __syncthreads();
        if (!give_up) {
            const float *mine = a.recv[a.me];
            for (unsigned i = lo + tid; i < hi; i += PS_THREADS) {
                float s = 0.0f;
                for (int m = 0; m < a.size; m++)
                    s += m == a.me ? buf[i] : __ldcg(mine + ((size_t)m * 2 + par) * a.cap + i);
                buf[i] = s;
            }
        }
    }
    /* the call's last block makes its epoch the last finished one */
    __syncthreads();
    if (tid == 0) {
        __threadfence();
        if (atomicAdd(&a.ctl[PS_DONE], 1u) == gridDim.x - 1) {
            a.ctl[PS_DONE] = 0;
            a.ctl[PS_EPOCH] = epoch;
            __threadfence();
        }
    }
}

static unsigned long long ps_timeout_ns(double timeout_s)
{
    return timeout_s > 0 && timeout_s < 1e9 ? (unsigned long long)(timeout_s * 1e9) : ~0ull;
}

static tsr_status ps_cuda_fail(const char *what, cudaError_t e)
{
    cudaGetLastError();
    return tsr_fail(TSR_ERR_IO, "peer sums: %s: %s", what, cudaGetErrorString(e));
}

/* A zeroed area for a group of `size` members. */
static tsr_status ps_alloc_area(int size, size_t cap, char **out)
{
    void *p = NULL;
    const size_t bytes = ps_area_bytes(size, cap);
    cudaError_t e = cudaMalloc(&p, bytes);
    if (e != cudaSuccess) return ps_cuda_fail("allocating the exchange area", e);
    if ((e = cudaMemset(p, 0, bytes)) != cudaSuccess || (e = cudaDeviceSynchronize()) != cudaSuccess) {
        cudaFree(p);
        return ps_cuda_fail("clearing the exchange area", e);
    }
    *out = (char *)p;
    return TSR_OK;
}

static tsr_status ps_make(int rank, int size, size_t cap, double timeout_s, tsr_peer_sum **out)
{
    if (size < 2 || size > TSR_PEER_MAX || rank < 0 || rank >= size || cap == 0 || cap > 0x40000000u)
        return tsr_fail(TSR_ERR_ARG, "peer sums: %d members (at most %d), member %d, %zu floats", size,
                        TSR_PEER_MAX, rank, cap);
    tsr_peer_sum *p = (tsr_peer_sum *)calloc(1, sizeof *p);
    if (!p) return tsr_fail(TSR_ERR_NOMEM, "out of memory");
    p->rank = rank;
    p->size = size;
    p->cap = (cap + 31) / 32 * 32;
    p->timeout_ns = ps_timeout_ns(timeout_s);
    *out = p;
    return TSR_OK;
}

extern "C" tsr_status tsr_peer_sum_new(int rank, int size, size_t cap, double timeout_s, void *handle,
                                       tsr_peer_sum **out)
{
    tsr_peer_sum *p;
    TSR_TRY(ps_make(rank, size, cap, timeout_s, &p));
    tsr_status st = ps_alloc_area(size, p->cap, &p->area[rank]);
    if (st != TSR_OK) {
        free(p);
        return st;
    }
    p->owns = 1;
    cudaIpcMemHandle_t h;
    int dev = 0;
    char *bytes = (char *)handle;
    memset(bytes, 0, TSR_PEER_HANDLE_BYTES);
    cudaError_t e = cudaIpcGetMemHandle(&h, p->area[rank]);
    if (e == cudaSuccess && (e = cudaGetDevice(&dev)) == cudaSuccess)
        e = cudaDeviceGetPCIBusId(bytes + PS_BUS_ID_AT, TSR_PEER_HANDLE_BYTES - PS_BUS_ID_AT - 1, dev);
    if (e != cudaSuccess) {
        st = ps_cuda_fail("exporting the exchange area", e);
        tsr_peer_sum_free(p);
        return st;
    }
    static_assert(sizeof h <= PS_BUS_ID_AT, "cudaIpcMemHandle_t size");
    memcpy(bytes, &h, sizeof h);
    *out = p;
    return TSR_OK;
}

/* Whether this process's GPU can access the memory of the GPU with PCI bus id `bus` (the same GPU counts). */
static tsr_status ps_reachable(int rank, int q, const char *bus)
{
    int mine = 0, theirs = 0, can = 0;
    cudaError_t e = cudaGetDevice(&mine);
    if (e == cudaSuccess) e = cudaDeviceGetByPCIBusId(&theirs, bus);
    if (e == cudaSuccess) {
        if (theirs == mine)
            can = 1;
        else
            e = cudaDeviceCanAccessPeer(&can, mine, theirs);
    }
    if (e != cudaSuccess) {
        cudaGetLastError();
        return tsr_fail(TSR_ERR_UNSUPPORTED, "peer sums: member %d does not see member %d's GPU %s (%s)", rank, q,
                        bus, cudaGetErrorString(e));
    }
    if (!can)
        return tsr_fail(TSR_ERR_UNSUPPORTED, "peer sums: member %d's GPU cannot access member %d's GPU %s", rank, q,
                        bus);
    return TSR_OK;
}

extern "C" tsr_status tsr_peer_sum_connect(tsr_peer_sum *p, const void *handles)
{
    for (int q = 0; q < p->size; q++) {
        if (q == p->rank || p->area[q]) continue;
        const char *entry = (const char *)handles + (size_t)q * TSR_PEER_HANDLE_BYTES;
        char bus[TSR_PEER_HANDLE_BYTES - PS_BUS_ID_AT];
        memcpy(bus, entry + PS_BUS_ID_AT, sizeof bus);
        bus[sizeof bus - 1] = 0;
        TSR_TRY(ps_reachable(p->rank, q, bus));
        cudaIpcMemHandle_t h;
        memcpy(&h, entry, sizeof h);
        void *ptr = NULL;
        const cudaError_t e = cudaIpcOpenMemHandle(&ptr, h, cudaIpcMemLazyEnablePeerAccess);
        if (e != cudaSuccess) {
            cudaGetLastError();
            return tsr_fail(TSR_ERR_UNSUPPORTED, "peer sums: member %d cannot map member %d's GPU memory (%s)",
                            p->rank, q, cudaGetErrorString(e));
        }
        p->area[q] = (char *)ptr;
        p->opened[q] = 1;
    }
    return TSR_OK;
}

extern "C" tsr_status tsr_peer_sum_new_local(int size, size_t cap, double timeout_s, tsr_peer_sum **out)
{
    for (int i = 0; i < size; i++) out[i] = NULL;
    tsr_status st = TSR_OK;
    for (int i = 0; i < size && st == TSR_OK; i++) {
        st = ps_make(i, size, cap, timeout_s, &out[i]);
        if (st == TSR_OK) st = ps_alloc_area(size, out[i]->cap, &out[i]->area[i]);
        if (st == TSR_OK) out[i]->owns = 1;
    }
    for (int i = 0; i < size && st == TSR_OK; i++)
        for (int q = 0; q < size; q++) out[i]->area[q] = out[q]->area[q];
    if (st != TSR_OK)
        for (int i = 0; i < size; i++) {
            if (out[i]) {
                for (int q = 0; q < size; q++)
                    if (q != i) out[i]->area[q] = NULL; /* borrowed */
                tsr_peer_sum_free(out[i]);
            }
            out[i] = NULL;
        }
    return st;
}

extern "C" size_t tsr_peer_sum_cap(const tsr_peer_sum *p) { return p->cap; }

extern "C" void tsr_peer_sum_run(tsr_peer_sum *p, float *buf, size_t n, void *stream)
{
    if (n == 0) return;
    if (n > p->cap) tsr_cuda_fatal(__FILE__, __LINE__, "peer sum larger than its slots");
    ps_args a;
    memset(&a, 0, sizeof a);
    for (int q = 0; q < p->size; q++) {
        a.recv[q] = (float *)p->area[q];
        a.flags[q] = (unsigned *)(p->area[q] + ps_flags_offset(p->size, p->cap));
    }
    a.ctl = (unsigned *)(p->area[p->rank] + ps_ctl_offset(p->size, p->cap));
    a.me = p->rank;
    a.size = p->size;
    a.cap = (unsigned)p->cap;
    a.timeout_ns = p->timeout_ns;
    unsigned blocks = tsr_div_up(n, PS_SLICE_MIN);
    if (blocks > PS_MAX_BLOCKS) blocks = PS_MAX_BLOCKS;
    const unsigned slice = tsr_div_up(tsr_div_up(n, blocks), 32) * 32;
    blocks = tsr_div_up(n, slice);
    cudaStream_t s = stream ? (cudaStream_t)stream : tsr_cuda_stream();
    peer_sum_kernel<<<blocks, PS_THREADS, 0, s>>>(a, buf, (unsigned)n, slice);
    TSR_CUDA_LAUNCHED();
}

extern "C" int tsr_peer_sum_failed(tsr_peer_sum *p)
{
    unsigned err = 0;
    const char *ctl = p->area[p->rank] + ps_ctl_offset(p->size, p->cap);
    if (cudaMemcpy(&err, ctl + PS_ERROR * sizeof(unsigned), sizeof err, cudaMemcpyDeviceToHost) != cudaSuccess) {
        cudaGetLastError();
        return 1;
    }
    return err != 0;
}

extern "C" void tsr_peer_sum_free(tsr_peer_sum *p)
{
    if (!p) return;
    for (int q = 0; q < p->size; q++)
        if (p->opened[q]) cudaIpcCloseMemHandle(p->area[q]);
    if (p->owns && p->area[p->rank]) cudaFree(p->area[p->rank]);
    free(p);
}
