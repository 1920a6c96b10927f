/* The kernel trace's device half (a diagnostic build: CMake -DTSR_CUDA_TRACE=ON; trace.cu is the host half).
 *
 * In such a build, thread 0 of block 0 of every kernel notes the global timer and its grid's shape the moment its
 * programmatic-launch wait returns (launch.cuh's tsr_pdl_wait), into one ring of events in device memory. That
 * moment is the kernel's release: its predecessor on the stream has finished. The time from one kernel's release to
 * the next one's is then what the kernel cost the step, its overlap with neighbours included, which no profiler's
 * per-kernel duration shows when kernels overlap by design.
 *
 * Without relocatable device code every translation unit has its own copy of a __device__ variable, so this header
 * gives each unit that includes it a static pointer to the ring and registers, at program load, a host function that
 * sets it (tsr_trace_register); trace.cu calls them all once it has allocated the ring. Until then, and when the
 * trace is off at run time, the pointer is null and kernels note nothing. In a normal build this header only defines
 * an empty tsr_trace_release. */
#ifndef TSR_CUDA_TRACE_CUH
#define TSR_CUDA_TRACE_CUH

#if TSR_CUDA_TRACE

#include <cuda_runtime.h>

#define TSR_TRACE_CAP (1u << 18) /* events in the ring; a step of an 8B model notes ~360 */

struct tsr_trace_event {
    unsigned long long t; /* %globaltimer, ns */
    unsigned grid[3];
    unsigned seq; /* the event's number, so that the host can tell a wrapped ring */
};

struct tsr_trace_ring {
    unsigned long long count; /* events noted so far; the next goes to ev[count % TSR_TRACE_CAP] */
    tsr_trace_event ev[TSR_TRACE_CAP];
};

/* Host half (trace.cu). tsr_trace_register: called at program load by every translation unit that includes this
 * header; keeps `bind` for tsr_trace_start (returns a value only so that it can initialize a variable).
 * tsr_trace_start: at device init, when TSR_CUDA_TRACE is set (1: each kernel of each recorded graph and a summary
 * by kernel, printed at exit; 2: the summary only), allocates the ring and binds it in every unit.
 * tsr_trace_launch: a kernel launched through launch.cuh; noted while a graph is being recorded.
 * tsr_trace_capture: the recording of graph `key` begins (begin = 1) or ends. tsr_trace_replay: replays a recorded
 * graph between two synchronizations and adds its events to that graph's figures (only the graph's own kernels run
 * in between, so the events are exactly its kernels', in launch order). tsr_trace_active: the trace is on. */
int tsr_trace_register(void (*bind)(tsr_trace_ring *ring));
void tsr_trace_start(void);
int tsr_trace_active(void);
void tsr_trace_launch(const void *kernel, dim3 grid);
void tsr_trace_capture(unsigned long long key, int begin);
void tsr_trace_replay(unsigned long long key, cudaGraphExec_t exec, cudaStream_t stream);

static __device__ tsr_trace_ring *tsr_trace_dev; /* this translation unit's pointer to the ring */

static void tsr_trace_bind_here(tsr_trace_ring *ring)
{
    cudaMemcpyToSymbol(tsr_trace_dev, &ring, sizeof ring);
}
[[maybe_unused]] static const int tsr_trace_registered_here = tsr_trace_register(tsr_trace_bind_here);

/* The calling kernel's release, noted by thread 0 of block 0 (tsr_pdl_wait calls it after the wait). */
__device__ __forceinline__ void tsr_trace_release(void)
{
    if ((threadIdx.x | threadIdx.y | threadIdx.z | blockIdx.x | blockIdx.y | blockIdx.z) != 0) return;
    tsr_trace_ring *ring = tsr_trace_dev;
    if (!ring) return;
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    const unsigned long long n = atomicAdd(&ring->count, 1ull);
    tsr_trace_event &e = ring->ev[n % TSR_TRACE_CAP];
    e.t = t;
    e.grid[0] = gridDim.x, e.grid[1] = gridDim.y, e.grid[2] = gridDim.z;
    e.seq = (unsigned)n;
}

#else
__device__ __forceinline__ void tsr_trace_release(void) {}
#endif

#endif
