/* CUDA backend core: device selection, stream and cuBLAS handle, memory, weight upload, and the ops table.
 *
 * prepare_model walks every linear layer and dense tensor of a tsr_model and uploads it once: EXL2 and GPTQ layers
 * have their codes rearranged into tensor-core fragment order (exl2_pack.cu) and keep their scale tables as stored,
 * plus (EXL2) a 16-entry fp16 table of column scales per group. Dense weights stay in their dtype. Mirrors are
 * recorded in the model's tsr_dense.dev / tsr_linear.dev fields and freed by release_model. Small host↔device copies
 * (the per-step batch layout, the logits) go through pinned staging buffers, so they are true asynchronous DMA instead
 * of the driver's synchronous pageable path. Profiling (TSR_CUDA_PROFILE): 1 = each op synchronized and timed on the
 * host; 2 = each op bracketed by device events while a spin kernel keeps the GPU ahead of the host, so the figures are
 * device time per op class without launch gaps (decode steps and prefill reported apart). TSR_CUDA_STEPTIME=1 reports
 * the device time of each replayed decode-step graph. A trace build (CMake -DTSR_CUDA_TRACE=ON, trace.cuh) reports,
 * with TSR_CUDA_TRACE=1, each kernel's share of a replayed graph. */
#include "kernels/cuda/cuda_common.cuh"
#include "kernels/cuda/cuda_kernels.cuh"
#include "kernels/cuda/exl2_pack.cuh"
#include "kernels/cuda/trace.cuh"

extern "C" {
#include "runtime/half.h"
#include "runtime/model.h"
}

#include <algorithm>
#include <map>
#include <string>
#include <string.h>
#include <time.h>
#include <unordered_map>
#include <vector>

static int g_device = -1;
static cudaStream_t g_stream;
static cublasHandle_t g_blas;
static size_t g_allocated, g_peak;
static std::unordered_map<void *, size_t> g_sizes;
static void *g_scratch[8]; /* by slot: 0 GEMV activations, 1-2 attention partials, 3 GEMV parts / fp16 slab,
                              4 argmax partials, 5-6 the fused MLP's staged input of down and partial sums,
                              7 a prefill's context of a quantized cache as fp16 (attention_kvq.cu) */
static size_t g_scratch_size[8];

extern "C" void tsr_cuda_fatal(const char *file, int line, const char *what)
{
    fprintf(stderr, "tessera: CUDA error at %s:%d: %s\n", file, line, what);
    abort();
}

extern "C" cudaStream_t tsr_cuda_stream(void) { return g_stream; }
unsigned long long tsr_cuda_launches;
extern "C" cublasHandle_t tsr_cuda_blas(void) { return g_blas; }

static int profile_mode(void)
{
    static int mode = -1;
    if (mode < 0) {
        const char *env = getenv("TSR_CUDA_PROFILE");
        mode = env && *env ? atoi(env) : 0;
        if (env && *env && mode == 0 && strcmp(env, "0") != 0) mode = 1;
    }
    return mode;
}

/* A kernel of this library, whose attributes tell which PTX architecture the device's code came from. */
__global__ void sm90_probe_kernel(void) {}

static int g_sm90 = -1; /* tsr_cuda_sm90: -1 until settled for the current device */
/* tsr_cuda_smem_block / _sm: the device's limits, asked once per bound device (every GEMV launch plans with them);
 * 0 until then */
static int g_smem_block, g_smem_sm;

/* The sm_90 paths (bulk copies, PDL) exist only in code compiled for sm_90. A build whose TSR_CUDA_ARCHS stop below
 * 90 still runs on an H100 or H200, by JIT-compiling its newest PTX, in which those paths are compiled out: taking
 * them there would hang the bulk GEMV and race every PDL launch, so such a device runs the sm_80 paths. */
bool tsr_cuda_sm90(void)
{
    static bool warned;
    if (g_sm90 >= 0) return g_sm90 > 0;
    int dev = 0, major = 0;
    cudaFuncAttributes a;
    if (cudaGetDevice(&dev) != cudaSuccess ||
        cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) != cudaSuccess ||
        cudaFuncGetAttributes(&a, sm90_probe_kernel) != cudaSuccess) {
        cudaGetLastError();
        return false; /* settled later, once a device answers */
    }
    g_sm90 = major >= 9 && a.ptxVersion >= 90;
    if (major >= 9 && !g_sm90 && !warned) {
        warned = true;
        fprintf(stderr,
                "tessera: this build has no sm_90 code (TSR_CUDA_ARCHS; its newest PTX is %d.%d): the GPU runs the "
                "sm_80 kernels, without bulk copies or programmatic launch\n",
                a.ptxVersion / 10, a.ptxVersion % 10);
    }
    return g_sm90 > 0;
}

/* Programmatic dependent launch (see launch.cuh): on by default with sm_90 code (tsr_cuda_sm90); TSR_CUDA_PDL=0
 * turns it off, and profiling turns it off. */
extern "C" int tsr_cuda_pdl(void)
{
    static int on = -1;
    if (on < 0) {
        const char *v = getenv("TSR_CUDA_PDL");
        on = tsr_cuda_sm90() && !(v && !strcmp(v, "0")) && profile_mode() == 0;
    }
    return on;
}

extern "C" int tsr_cuda_device_count(void)
{
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
        cudaGetLastError();
        return 0;
    }
    return n;
}

extern "C" tsr_status tsr_cuda_init(int device)
{
    if (g_device == device) return TSR_OK;
    if (g_device >= 0) return tsr_fail(TSR_ERR_ARG, "CUDA backend already bound to device %d", g_device);
    int n = tsr_cuda_device_count();
    if (device < 0 || device >= n)
        return tsr_fail(TSR_ERR_ARG, "CUDA device %d does not exist (%d visible)", device, n);
    cudaError_t e = cudaSetDevice(device);
    if (e == cudaSuccess) e = cudaStreamCreateWithFlags(&g_stream, cudaStreamNonBlocking);
    if (e != cudaSuccess) return tsr_fail(TSR_ERR_IO, "CUDA device %d: %s", device, cudaGetErrorString(e));
    if (cublasCreate(&g_blas) != CUBLAS_STATUS_SUCCESS) return tsr_fail(TSR_ERR_IO, "cuBLAS initialization failed");
    cublasSetStream(g_blas, g_stream);
    g_device = device;
    g_sm90 = -1, g_smem_block = g_smem_sm = 0; /* settled again for this device */
    (void)tsr_cuda_sm90();
#if TSR_CUDA_TRACE
    tsr_trace_start();
#endif
    return TSR_OK;
}

extern "C" void tsr_cuda_describe(char *buf, size_t cap)
{
    cudaDeviceProp p;
    if (g_device < 0 || cudaGetDeviceProperties(&p, g_device) != cudaSuccess) {
        snprintf(buf, cap, "no CUDA device");
        return;
    }
    snprintf(buf, cap, "%s (sm_%d%d, %d SMs, %.1f GiB%s)", p.name, p.major, p.minor, p.multiProcessorCount,
             (double)p.totalGlobalMem / (1024.0 * 1024 * 1024),
             p.major >= 9 && !tsr_cuda_sm90() ? "; no sm_90 code in this build: sm_80 kernels" : "");
}

extern "C" void tsr_cuda_memory(size_t *free_bytes, size_t *total_bytes)
{
    TSR_CUDA_CHECK(cudaMemGetInfo(free_bytes, total_bytes));
}

extern "C" size_t tsr_cuda_peak_allocated(void) { return g_peak; }

extern "C" void tsr_cuda_synchronize(void) { TSR_CUDA_CHECK(cudaStreamSynchronize(g_stream)); }

/* ---- memory ---- */

static void *cuda_alloc(size_t bytes)
{
    void *p = NULL;
    if (bytes == 0) bytes = 16;
    if (cudaMalloc(&p, bytes) != cudaSuccess) {
        cudaGetLastError();
        return NULL;
    }
    TSR_CUDA_CHECK(cudaMemsetAsync(p, 0, bytes, g_stream));
    g_sizes[p] = bytes;
    g_allocated += bytes;
    if (g_allocated > g_peak) g_peak = g_allocated;
    return p;
}

static void cuda_release(void *p)
{
    if (!p) return;
    TSR_CUDA_CHECK(cudaStreamSynchronize(g_stream));
    auto it = g_sizes.find(p);
    if (it != g_sizes.end()) {
        g_allocated -= it->second;
        g_sizes.erase(it);
    }
    TSR_CUDA_CHECK(cudaFree(p));
}

/* Pinned staging: copies up to PIN_SMALL bytes to the device are copied into a pinned ring and sent from there
 * (the caller may reuse its buffer at once, as before); the ring restarts after every synchronizing copy back,
 * or after a stream synchronization when it is full. Copies back of up to PIN_OUT bytes land in a pinned buffer
 * first. TSR_CUDA_PINNED=0 turns this off. */
#define PIN_RING ((size_t)16 << 20)
#define PIN_SMALL ((size_t)1 << 20)
#define PIN_OUT ((size_t)32 << 20)
static char *g_pin_in, *g_pin_out;
static size_t g_pin_off;
static int g_capturing;

static int pinned_enabled(void)
{
    static int on = -1;
    if (on < 0) {
        const char *v = getenv("TSR_CUDA_PINNED");
        on = !(v && !strcmp(v, "0"));
        if (on && (cudaMallocHost((void **)&g_pin_in, PIN_RING) != cudaSuccess ||
                   cudaMallocHost((void **)&g_pin_out, PIN_OUT) != cudaSuccess)) {
            cudaGetLastError();
            on = 0;
        }
    }
    return on;
}

static void prof_resolve(void);

static void cuda_to_device(void *dst, const void *src, size_t bytes)
{
    if (!bytes) return;
    if (bytes <= PIN_SMALL && !g_capturing && pinned_enabled()) {
        if (g_pin_off + bytes > PIN_RING) {
            TSR_CUDA_CHECK(cudaStreamSynchronize(g_stream));
            g_pin_off = 0;
        }
        memcpy(g_pin_in + g_pin_off, src, bytes);
        TSR_CUDA_CHECK(cudaMemcpyAsync(dst, g_pin_in + g_pin_off, bytes, cudaMemcpyHostToDevice, g_stream));
        g_pin_off += (bytes + 255) & ~(size_t)255;
        return;
    }
    TSR_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, g_stream));
}

static void cuda_to_host(void *dst, const void *src, size_t bytes)
{
    if (bytes && bytes <= PIN_OUT && pinned_enabled()) {
        TSR_CUDA_CHECK(cudaMemcpyAsync(g_pin_out, src, bytes, cudaMemcpyDeviceToHost, g_stream));
        TSR_CUDA_CHECK(cudaStreamSynchronize(g_stream));
        memcpy(dst, g_pin_out, bytes);
    } else {
        if (bytes) TSR_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, g_stream));
        TSR_CUDA_CHECK(cudaStreamSynchronize(g_stream));
    }
    g_pin_off = 0; /* the stream is idle: every staged copy is done */
    prof_resolve();
}

/* ---- replayable work (CUDA graphs) ---- */

struct cached_run {
    int seen;
    cudaGraphExec_t exec;
};
static std::unordered_map<uint64_t, cached_run> g_graphs;

/* Recorded graphs embed buffer addresses: any scratch reallocation invalidates them all. */
static void drop_graphs(void)
{
    for (auto &kv : g_graphs)
        if (kv.second.exec) cudaGraphExecDestroy(kv.second.exec);
    g_graphs.clear();
}

extern "C" void tsr_cuda_release_graphs(void)
{
    if (g_device < 0) return;
    TSR_CUDA_CHECK(cudaStreamSynchronize(g_stream));
    drop_graphs();
}

static int graphs_enabled(void)
{
    static int enabled = -1;
    if (enabled < 0) {
        const char *off = getenv("TSR_CUDA_GRAPHS");
        enabled = !(off && !strcmp(off, "0")) && profile_mode() == 0 && !tsr_cuda_dq_times();
    }
    return enabled;
}

/* TSR_CUDA_STEPTIME=1: device time of every graph replay, from events around the launch (printed at exit). */
static int g_steptime = -1;
static cudaEvent_t g_step_ev[2];
static int g_step_pending;
static double g_step_ms;
static long g_step_n;

static void step_report(void)
{
    if (g_step_n)
        fprintf(stderr, "CUDA graph replays: %ld, device time %.3f ms per replay\n", g_step_n, g_step_ms / g_step_n);
}

static void step_resolve(void)
{
    if (!g_step_pending) return;
    float ms = 0;
    TSR_CUDA_CHECK(cudaEventSynchronize(g_step_ev[1]));
    TSR_CUDA_CHECK(cudaEventElapsedTime(&ms, g_step_ev[0], g_step_ev[1]));
    g_step_ms += ms;
    g_step_n++;
    g_step_pending = 0;
}

static void graph_launch(cudaGraphExec_t exec)
{
    if (g_steptime < 0) {
        const char *v = getenv("TSR_CUDA_STEPTIME");
        g_steptime = v && *v && strcmp(v, "0") != 0;
        if (g_steptime) {
            TSR_CUDA_CHECK(cudaEventCreate(&g_step_ev[0]));
            TSR_CUDA_CHECK(cudaEventCreate(&g_step_ev[1]));
            atexit(step_report);
        }
    }
    if (!g_steptime) {
        TSR_CUDA_CHECK(cudaGraphLaunch(exec, g_stream));
        return;
    }
    step_resolve();
    TSR_CUDA_CHECK(cudaEventRecord(g_step_ev[0], g_stream));
    TSR_CUDA_CHECK(cudaGraphLaunch(exec, g_stream));
    TSR_CUDA_CHECK(cudaEventRecord(g_step_ev[1], g_stream));
    g_step_pending = 1;
}

/* First time a key is seen: run eagerly (scratch buffers reach their size). Second: record a graph and launch it.
 * Afterwards: launch the recording. */
static void cuda_run_cached(uint64_t key, void (*fn)(void *ctx), void *ctx)
{
    if (!key || !graphs_enabled()) {
        fn(ctx);
        return;
    }
    cached_run &r = g_graphs[key];
    if (r.exec) {
#if TSR_CUDA_TRACE
        if (tsr_trace_active()) return tsr_trace_replay(key, r.exec, g_stream);
#endif
        graph_launch(r.exec);
        return;
    }
    if (r.seen++ == 0) {
        fn(ctx);
        return;
    }
    cudaGraph_t graph;
    g_capturing = 1;
    TSR_CUDA_CHECK(cudaStreamBeginCapture(g_stream, cudaStreamCaptureModeThreadLocal));
#if TSR_CUDA_TRACE
    tsr_trace_capture(key, 1);
#endif
    fn(ctx);
#if TSR_CUDA_TRACE
    tsr_trace_capture(key, 0);
#endif
    TSR_CUDA_CHECK(cudaStreamEndCapture(g_stream, &graph));
    g_capturing = 0;
    TSR_CUDA_CHECK(cudaGraphInstantiate(&r.exec, graph, 0));
    TSR_CUDA_CHECK(cudaGraphDestroy(graph));
    TSR_CUDA_CHECK(cudaGraphLaunch(r.exec, g_stream));
}

extern "C" void *tsr_cuda_scratch_try(int slot, size_t bytes)
{
    if (g_scratch_size[slot] < bytes) {
        if (g_capturing) tsr_cuda_fatal(__FILE__, __LINE__, "scratch buffer growth while recording a graph");
        drop_graphs();
        if (g_scratch[slot]) cuda_release(g_scratch[slot]);
        g_scratch[slot] = cuda_alloc(bytes);
        g_scratch_size[slot] = g_scratch[slot] ? bytes : 0;
    }
    return g_scratch[slot];
}

extern "C" void *tsr_cuda_scratch(int slot, size_t bytes)
{
    void *p = tsr_cuda_scratch_try(slot, bytes);
    if (!p) tsr_cuda_fatal(__FILE__, __LINE__, "out of device memory for a scratch buffer");
    return p;
}

extern "C" double tsr_cuda_copy_bandwidth(size_t bytes)
{
    /* plain cudaMalloc: these buffers are not the backend's and stay out of its peak accounting */
    void *a = NULL, *b = NULL;
    if (cudaMalloc(&a, bytes) != cudaSuccess || cudaMalloc(&b, bytes) != cudaSuccess) {
        cudaGetLastError();
        if (a) cudaFree(a);
        return 0;
    }
    TSR_CUDA_CHECK(cudaMemsetAsync(a, 1, bytes, g_stream));
    cudaEvent_t e0, e1;
    cudaEventCreate(&e0);
    cudaEventCreate(&e1);
    float best = 1e30f;
    for (int i = 0; i < 6; i++) {
        cudaEventRecord(e0, g_stream);
        cudaMemcpyAsync(b, a, bytes, cudaMemcpyDeviceToDevice, g_stream);
        cudaEventRecord(e1, g_stream);
        cudaEventSynchronize(e1);
        float ms;
        cudaEventElapsedTime(&ms, e0, e1);
        if (i > 0 && ms < best) best = ms;
    }
    cudaEventDestroy(e0);
    cudaEventDestroy(e1);
    TSR_CUDA_CHECK(cudaFree(a));
    TSR_CUDA_CHECK(cudaFree(b));
    return 2.0 * (double)bytes / (best * 1e-3);
}

/* Values in [-1, 1) from a hash of their index: operands like a model's, not constants (which draw less power and
 * could let the clocks run higher than a real GEMM's). */
__global__ void gemm_fill_kernel(__half *p, size_t n, uint32_t seed)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        uint32_t h = (uint32_t)i * 0x9E3779B1u ^ seed;
        h ^= h >> 15, h *= 0x85EBCA77u, h ^= h >> 13;
        p[i] = __float2half((float)(h >> 8) * (2.0f / 16777216.0f) - 1.0f);
    }
}

extern "C" double tsr_cuda_gemm_rate(int n)
{
    /* plain cudaMalloc, as for the copy bandwidth: not the backend's memory */
    const size_t elems = (size_t)n * n;
    __half *a = NULL, *b = NULL, *c = NULL;
    if (cudaMalloc(&a, elems * sizeof *a) != cudaSuccess || cudaMalloc(&b, elems * sizeof *b) != cudaSuccess ||
        cudaMalloc(&c, elems * sizeof *c) != cudaSuccess) {
        cudaGetLastError();
        cudaFree(a), cudaFree(b);
        return 0;
    }
    gemm_fill_kernel<<<1024, 256, 0, g_stream>>>(a, elems, 1u);
    gemm_fill_kernel<<<1024, 256, 0, g_stream>>>(b, elems, 2u);
    TSR_CUDA_LAUNCHED();
    cudaEvent_t e0, e1;
    cudaEventCreate(&e0);
    cudaEventCreate(&e1);
    const float alpha = 1.0f, beta = 0.0f;
    float best = 1e30f;
    bool ok = true;
    for (int i = 0; i < 6 && ok; i++) { /* the first one warms up */
        cudaEventRecord(e0, g_stream);
        ok = cublasGemmEx(g_blas, CUBLAS_OP_N, CUBLAS_OP_N, n, n, n, &alpha, a, CUDA_R_16F, n, b, CUDA_R_16F, n, &beta,
                          c, CUDA_R_16F, n, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT) == CUBLAS_STATUS_SUCCESS;
        cudaEventRecord(e1, g_stream);
        cudaEventSynchronize(e1);
        float ms;
        cudaEventElapsedTime(&ms, e0, e1);
        if (ok && i > 0 && ms < best) best = ms;
    }
    cudaEventDestroy(e0);
    cudaEventDestroy(e1);
    TSR_CUDA_CHECK(cudaFree(a));
    TSR_CUDA_CHECK(cudaFree(b));
    TSR_CUDA_CHECK(cudaFree(c));
    return ok ? 2.0 * (double)n * n * n / (best * 1e-3) : 0;
}

/* ---- weights ---- */

static void *upload(const void *src, size_t bytes)
{
    void *d = cuda_alloc(bytes);
    if (d) cuda_to_device(d, src, bytes);
    return d;
}

static tsr_status upload_dense(tsr_dense *t)
{
    if (!t->data || t->dev) return TSR_OK;
    size_t bytes = (size_t)t->rows * t->cols * tsr_dtype_size(t->dtype);
    t->dev = upload(t->data, bytes);
    return t->dev ? TSR_OK : tsr_fail(TSR_ERR_NOMEM, "out of device memory uploading weights (%zu bytes)", bytes);
}

/* src's 4-bit fields (8 per word, field n % 8 of word n / 8 in each of G rows of N / 8 words) in the column order
 * cols. */
static std::vector<uint32_t> nibbles_in_order(const uint32_t *src, int G, int N, const int32_t *cols)
{
    const size_t row = (size_t)N / 8;
    std::vector<uint32_t> out((size_t)G * row, 0u);
    for (int g = 0; g < G; g++)
        for (int j = 0; j < N; j++) {
            const uint32_t v = (src[g * row + (size_t)cols[j] / 8] >> (4 * (cols[j] % 8))) & 15u;
            out[g * row + (size_t)j / 8] |= v << (4 * (j % 8));
        }
    return out;
}

/* Uploads L. Quantized matrices: cols (or NULL) reorders the output columns (device column j = file column
 * cols[j]); rows_in_order makes the device read its input in stored-row order (fold_mlp). */
static tsr_status upload_linear(tsr_linear *L, tsr_dense *embed, const int32_t *cols = NULL, int rows_in_order = 0)
{
    tsr_linear_dev *d = (tsr_linear_dev *)calloc(1, sizeof *d);
    if (!d) return tsr_fail(TSR_ERR_NOMEM, "out of memory");
    L->dev = d;
    d->kind = L->kind;
    d->K = L->K;
    d->N = L->N;
    if (L->kind == TSR_LINEAR_DENSE) {
        if (L->w.data == embed->data) {
            TSR_TRY(upload_dense(embed));
            L->w.dev = embed->dev;
        } else {
            TSR_TRY(upload_dense(&L->w));
        }
        d->w = L->w.dev;
        d->dtype = L->w.dtype;
        if (L->bias.data) {
            TSR_TRY(upload_dense(&L->bias));
            d->dense_bias = L->bias.dev;
            d->bias_dtype = L->bias.dtype;
        }
        d->Npad = L->N;
        return TSR_OK;
    }
    const tsr_qmatrix *q = &L->q;
    d->Npad = q->N;
    TSR_TRY(tsr_cuda_exl2_pack(q, cols, rows_in_order, d, cuda_alloc));
    /* EXL2 column scales take 16 values per group, one per scale code (fp16 values, kept as fp32) */
    std::vector<float> s_table((size_t)q->G * 16);
    if (q->kind == TSR_QMATRIX_EXL2)
        for (int g = 0; g < q->G; g++)
            for (uint32_t c = 0; c < 16; c++)
                s_table[(size_t)g * 16 + c] = tsr_round_half(tsr_qmatrix_code_scale(q, g, c));
    int scales_ok = 1;
    if (q->kind == TSR_QMATRIX_GPTQ) {
        /* GPTQ: fp16 scales per (group, column) (fp32 files rounded to fp16, as on the CPU) and the zero codes */
        std::vector<uint16_t> sc((size_t)q->G * q->N);
        for (int g = 0; g < q->G; g++)
            for (int n = 0; n < q->N; n++)
                sc[(size_t)g * q->N + n] = tsr_float_to_half(tsr_qmatrix_scale(q, g, cols ? cols[n] : n));
        d->gptq = 1;
        d->zero_add = q->zero_add;
        d->g_scales = (const __half *)upload(sc.data(), sc.size() * 2);
        std::vector<uint32_t> zeros;
        if (cols) zeros = nibbles_in_order(q->g_zeros, q->G, q->N, cols);
        d->g_zeros = (const uint32_t *)upload(cols ? zeros.data() : q->g_zeros, (size_t)q->G * (q->N / 8) * 4);
        scales_ok = d->g_scales && d->g_zeros;
    } else {
        std::vector<uint32_t> codes;
        if (cols) codes = nibbles_in_order(q->q_scale, q->G, q->N, cols);
        d->q_scale = (const uint32_t *)upload(cols ? codes.data() : q->q_scale, (size_t)q->G * (q->N / 8) * 4);
        scales_ok = d->q_scale != NULL;
    }
    d->s_table = (const float *)upload(s_table.data(), s_table.size() * sizeof(float));
    if (q->bias) {
        std::vector<uint16_t> bias;
        if (cols)
            for (int n = 0; n < q->N; n++)
                bias.push_back(q->bias[cols[n]]);
        d->bias = (const __half *)upload(cols ? bias.data() : q->bias, (size_t)q->N * 2);
    }
    if (!scales_ok || !d->s_table || (q->bias && !d->bias))
        return tsr_fail(TSR_ERR_NOMEM, "out of device memory uploading EXL2 weights");
    return TSR_OK;
}

/* The MLP's intermediate features in down's stored-row order on the device: gate's and up's columns are uploaded in
 * the order of down's permutation (device column j = file column perm[j]) and down reads its input as it comes, so
 * silu(gate) · up reaches down in the order down reads it (its uperm is the identity where its groups fill whole
 * units). Every product stays bit for bit what it was: only the order in which the intermediate features are held
 * changes, and down is their only reader. Taken where gate and up are quantized matrices of down's kind whose
 * columns are exactly down's rows (and down's permutation is a permutation of them); TSR_CUDA_MLP_FOLD=0 leaves
 * every layer in file order. Returns 0 when it did not apply; *st holds the uploads' status when it did. */
static int fold_mlp(tsr_layer *ly, tsr_dense *embed, tsr_status *st)
{
    static int off = -1;
    if (off < 0) off = tsr_cuda_env_off("TSR_CUDA_MLP_FOLD");
    const tsr_linear *g = &ly->gate, *u = &ly->up, *d = &ly->down;
    if (off || g->kind != TSR_LINEAR_EXL2 || u->kind != TSR_LINEAR_EXL2 || d->kind != TSR_LINEAR_EXL2) return 0;
    const int K = d->q.K;
    if (g->q.kind != d->q.kind || u->q.kind != d->q.kind || g->q.N != K || u->q.N != K || g->N != K || u->N != K ||
        d->K != K || !d->q.perm)
        return 0;
    std::vector<char> seen((size_t)K, 0);
    for (int k = 0; k < K; k++) {
        const int32_t p = d->q.perm[k];
        if (p < 0 || p >= K || seen[p]) return 0;
        seen[p] = 1;
    }
    *st = upload_linear(&ly->gate, embed, d->q.perm, 0);
    if (*st == TSR_OK) *st = upload_linear(&ly->up, embed, d->q.perm, 0);
    if (*st == TSR_OK) *st = upload_linear(&ly->down, embed, NULL, 1);
    return 1;
}

/* The matrices that read each norm's output, by the norm's device weights (tsr_cuda_norm_readers): the residual pass
 * that ends with that norm stages their activations ahead (stage_ahead.cuh). Registered at model preparation for
 * quantized q, k, v (attention norm) and gate, up (MLP norm); forgotten when the model is released. */
static std::map<const void *, std::vector<const tsr_linear_dev *>> g_norm_readers;

static void register_readers(const tsr_dense *norm, const tsr_linear *const *L, int n)
{
    std::vector<const tsr_linear_dev *> readers;
    for (int i = 0; i < n; i++) {
        const tsr_linear_dev *d = (const tsr_linear_dev *)L[i]->dev;
        if (!d || d->kind != TSR_LINEAR_EXL2) return;
        readers.push_back(d);
    }
    if (norm->dev) g_norm_readers[norm->dev] = readers;
}

/* The inverse of a quantized matrix's unit permutation (tsr_linear_dev.uinv), for o: the attention merge, whose
 * threads each own one input value of o, scatters them into o's staged activations through it. Only where the
 * units hold no padding rows (every entry then gets written) and uperm is a permutation of the K input rows;
 * otherwise o's GEMV stages its own activations as before. A download of uperm, at model preparation only. */
static tsr_status add_unit_inverse(tsr_linear *L)
{
    tsr_linear_dev *d = (tsr_linear_dev *)L->dev;
    if (!d || d->kind != TSR_LINEAR_EXL2 || (size_t)d->n_units * 32 != (size_t)d->K) return TSR_OK;
    std::vector<int32_t> uperm((size_t)d->K), inv((size_t)d->K, -1);
    TSR_CUDA_CHECK(cudaStreamSynchronize(g_stream)); /* the packing's upload of uperm */
    TSR_CUDA_CHECK(cudaMemcpy(uperm.data(), d->uperm, uperm.size() * 4, cudaMemcpyDeviceToHost));
    for (int p = 0; p < d->K; p++) {
        const int32_t k = uperm[p];
        if (k < 0 || k >= d->K || inv[k] >= 0) return TSR_OK;
        inv[k] = p;
    }
    d->uinv = (const int32_t *)upload(inv.data(), inv.size() * 4);
    return d->uinv ? TSR_OK : tsr_fail(TSR_ERR_NOMEM, "out of device memory uploading a unit permutation");
}

int tsr_cuda_norm_readers(const tsr_dense *w, const tsr_linear_dev **L)
{
    auto it = g_norm_readers.find(w->dev);
    if (it == g_norm_readers.end() || it->second.size() > TSR_GEMV_MAX_PARTS) return 0;
    for (size_t i = 0; i < it->second.size(); i++)
        L[i] = it->second[i];
    return (int)it->second.size();
}

static void release_linear(tsr_linear *L)
{
    tsr_linear_dev *d = (tsr_linear_dev *)L->dev;
    if (!d) return;
    if (d->kind == TSR_LINEAR_EXL2) {
        cuda_release((void *)d->fw);
        cuda_release((void *)d->units);
        tsr_cuda_forget_unit_order(d->uperm);
        cuda_release((void *)d->uperm);
        cuda_release((void *)d->uinv);
        cuda_release((void *)d->q_scale);
        cuda_release((void *)d->g_scales);
        cuda_release((void *)d->g_zeros);
        cuda_release((void *)d->s_table);
        cuda_release((void *)d->bias);
    }
    free(d);
    L->dev = NULL;
}

static void release_dense(tsr_dense *t)
{
    if (t->dev) g_norm_readers.erase(t->dev);
    if (t->dev) cuda_release((void *)t->dev);
    t->dev = NULL;
}

static void cuda_release_model(struct tsr_model *m)
{
    for (int l = 0; l < m->cfg.n_layers; l++) {
        tsr_layer *ly = &m->layers[l];
        tsr_linear *all[] = {&ly->q, &ly->k, &ly->v, &ly->o, &ly->gate, &ly->up, &ly->down};
        for (int i = 0; i < 7; i++) {
            if (all[i]->kind == TSR_LINEAR_DENSE) {
                release_dense(&all[i]->w);
                release_dense(&all[i]->bias);
            }
            release_linear(all[i]);
        }
        release_dense(&ly->attn_norm);
        release_dense(&ly->mlp_norm);
    }
    int tied = m->head.kind == TSR_LINEAR_DENSE && m->head.w.data == m->embed.data;
    if (m->head.kind == TSR_LINEAR_DENSE && !tied) {
        release_dense(&m->head.w);
        release_dense(&m->head.bias);
    }
    m->head.w.dev = NULL;
    release_linear(&m->head);
    release_dense(&m->final_norm);
    release_dense(&m->embed);
}

static size_t cuda_memory_free(void)
{
    size_t free_bytes = 0, total = 0;
    if (cudaMemGetInfo(&free_bytes, &total) != cudaSuccess) {
        cudaGetLastError();
        return 0;
    }
    return free_bytes;
}

static tsr_status cuda_prepare_model(struct tsr_model *m)
{
    if (g_device < 0) return tsr_fail(TSR_ERR_ARG, "CUDA backend used before tsr_cuda_init");
    tsr_status st = upload_dense(&m->embed);
    if (st == TSR_OK) st = upload_dense(&m->final_norm);
    for (int l = 0; st == TSR_OK && l < m->cfg.n_layers; l++) {
        tsr_layer *ly = &m->layers[l];
        tsr_linear *all[] = {&ly->q, &ly->k, &ly->v, &ly->o, &ly->gate, &ly->up, &ly->down};
        st = upload_dense(&ly->attn_norm);
        if (st == TSR_OK) st = upload_dense(&ly->mlp_norm);
        const int folded = st == TSR_OK && fold_mlp(ly, &m->embed, &st); /* keeps a norm's failure */
        for (int i = 0; st == TSR_OK && i < (folded ? 4 : 7); i++)
            st = upload_linear(all[i], &m->embed);
        if (st == TSR_OK) st = add_unit_inverse(&ly->o);
        if (st == TSR_OK) {
            register_readers(&ly->attn_norm, all, 3);
            register_readers(&ly->mlp_norm, all + 4, 2);
        }
    }
    if (st == TSR_OK) st = upload_linear(&m->head, &m->embed);
    if (st == TSR_OK) {
        /* the dequantize-and-cuBLAS path's buffer: the largest quantized layer matrix that the wgmma product
         * (gemm_dq_wgmma.cu, sm_90a) does not take */
        size_t dq = 0;
        for (int l = 0; l < m->cfg.n_layers; l++) {
            tsr_layer *ly = &m->layers[l];
            tsr_linear *all[] = {&ly->q, &ly->k, &ly->v, &ly->o, &ly->gate, &ly->up, &ly->down};
            for (int i = 0; i < 7; i++) {
                const tsr_linear_dev *d = (const tsr_linear_dev *)all[i]->dev;
                const size_t bytes = d && d->kind == TSR_LINEAR_EXL2 && !tsr_cuda_dq_wgmma_takes_all(d)
                                         ? (size_t)32 * d->n_units * d->Npad * 2
                                         : 0;
                if (bytes > dq) dq = bytes;
            }
        }
        /* the head runs in slabs of that buffer; a model whose head is its only quantized matrix gets up to
         * 128 MiB for it */
        const tsr_linear_dev *h = (const tsr_linear_dev *)m->head.dev;
        if (h && h->kind == TSR_LINEAR_EXL2 && !tsr_cuda_dq_wgmma_takes_all(h)) {
            size_t head = (size_t)32 * h->n_units * h->Npad * 2, cap = (size_t)128 << 20;
            if ((head < cap ? head : cap) > dq) dq = head < cap ? head : cap;
        }
        if (dq) tsr_cuda_dq_reserve(dq);
    }
    if (st == TSR_OK) TSR_CUDA_CHECK(cudaStreamSynchronize(g_stream));
    if (st != TSR_OK) cuda_release_model(m);
    return st;
}

static const tsr_ops cuda_ops = {
    "cuda",
    cuda_alloc,
    cuda_release,
    cuda_to_device,
    cuda_to_host,
    cuda_run_cached,
    cuda_memory_free,
    cuda_prepare_model,
    cuda_release_model,
    tsr_cuda_embed,
    tsr_cuda_rmsnorm,
    tsr_cuda_linear,
    tsr_cuda_rope,
    tsr_cuda_kv_store,
    tsr_cuda_attention,
    tsr_cuda_silu_mul,
    tsr_cuda_add,
    tsr_cuda_gather_rows,
    tsr_cuda_linear_many,
    tsr_cuda_add_rmsnorm,
    tsr_cuda_linear_add_norm,
    tsr_cuda_rope_store,
    tsr_cuda_argmax_rows,
    tsr_cuda_top_rows,
    tsr_cuda_silu_linear_add_norm,
    tsr_cuda_mlp_add_norm,
    tsr_cuda_peak_allocated,
};

/* ---- optional per-op profile (TSR_CUDA_PROFILE, see the top of this file). Mode 1 synchronizes around each op
 * and reads the host clock (includes launch latency). Mode 2 records a device event after each op; a spin kernel
 * at the start of each forward (the embedding op) holds the GPU for SPIN_NS so that the host queues the whole
 * forward before the GPU runs it, and the time between consecutive events is then the op's device time alone.
 * Forwards whose largest linear has M <= 32 count as decode steps, the rest as prefill; the first of each kind is
 * left out (lazy module loading made its linears several times slower). For attribution, not for throughput. ---- */

enum {
    P_EMBED, P_NORM, P_LINEAR, P_ROPE, P_KV, P_ATTN, P_SILU, P_ADD, P_GATHER, P_ADD_NORM, P_ROPE_STORE, P_ARGMAX,
    P_TOP, P_COUNT
};
static const char *p_names[P_COUNT] = {"embed", "rmsnorm", "linear", "rope", "kv_store", "attention", "silu_mul", "add",
                                       "gather_rows", "add_rmsnorm", "rope_store", "argmax_rows",
                                       "top_rows"};

/* op classes: the fixed ones above, then one per linear shape and kind ("linear KxN", "linear_many KxN+N+N",
 * "linear+add KxN") */
struct p_class {
    std::string name;
    double ms[2];  /* [decode, prefill] */
    long calls[2];
};
static std::vector<p_class> g_pc;
static std::unordered_map<uint64_t, int> g_linear_class;
static std::vector<cudaEvent_t> g_ev;
static std::vector<int> g_ev_cls;
static size_t g_ev_n;
static int g_win_maxM;
static long g_windows[2];
static int g_skipped[2]; /* whether the first window of each kind has been left out */
static double g_win_ms[2];

#define SPIN_NS 20000000ull

__global__ void spin_kernel(unsigned long long ns)
{
    unsigned long long t0, t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
    do {
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    } while (t - t0 < ns);
}

static double host_now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static void p_init_classes(void)
{
    if (!g_pc.empty()) return;
    for (int i = 0; i < P_COUNT; i++) g_pc.push_back(p_class{p_names[i], {0, 0}, {0, 0}});
}

/* The class of a linear op of kind `kind` (0 linear, 1 linear_many, 2 linear_add_norm, 3 silu_linear_add_norm, 4
 * mlp_add_norm) over n layers with input width K. */
static int linear_class(const tsr_linear *const *L, int n, int kind)
{
    p_init_classes();
    uint64_t key = (uint64_t)kind << 61 | (uint64_t)(uint32_t)L[0]->K << 32;
    char name[96];
    static const char *kinds[] = {"linear", "linear_many", "linear+add", "silu+linear+add", "mlp"};
    int len = snprintf(name, sizeof name, "%s %dx", kinds[kind], L[0]->K);
    for (int i = 0; i < n; i++) {
        key = key * 1000003u + (uint32_t)L[i]->N;
        len += snprintf(name + len, sizeof name - (size_t)len, i ? "+%d" : "%d", L[i]->N);
    }
    auto it = g_linear_class.find(key);
    if (it != g_linear_class.end()) return it->second;
    g_pc.push_back(p_class{name, {0, 0}, {0, 0}});
    return g_linear_class[key] = (int)g_pc.size() - 1;
}

static void ev_mark(int cls)
{
    if (g_ev_n == g_ev.size()) {
        cudaEvent_t e;
        TSR_CUDA_CHECK(cudaEventCreate(&e));
        g_ev.push_back(e);
        g_ev_cls.push_back(-1);
    }
    TSR_CUDA_CHECK(cudaEventRecord(g_ev[g_ev_n], g_stream));
    g_ev_cls[g_ev_n++] = cls;
}

static void prof_resolve(void)
{
    if (profile_mode() != 2 || g_ev_n < 2) {
        g_ev_n = 0;
        return;
    }
    TSR_CUDA_CHECK(cudaEventSynchronize(g_ev[g_ev_n - 1]));
    const int w = g_win_maxM > 32 ? 1 : 0;
    if (!g_skipped[w]) { /* the first forward of each kind loads its kernels (cuBLAS's above all) lazily */
        g_skipped[w] = 1;
        g_ev_n = 0;
        g_win_maxM = 0;
        return;
    }
    double total = 0;
    for (size_t i = 1; i < g_ev_n; i++) {
        if (g_ev_cls[i] < 0) continue;
        float ms = 0;
        TSR_CUDA_CHECK(cudaEventElapsedTime(&ms, g_ev[i - 1], g_ev[i]));
        g_pc[g_ev_cls[i]].ms[w] += ms;
        g_pc[g_ev_cls[i]].calls[w]++;
        total += ms;
    }
    g_windows[w]++;
    g_win_ms[w] += total;
    g_ev_n = 0;
    g_win_maxM = 0;
}

static double p_seconds[P_COUNT];
static long p_calls[P_COUNT];

static void p_report(void)
{
    if (profile_mode() == 2) {
        for (int w = 0; w < 2; w++) {
            if (!g_windows[w]) continue;
            fprintf(stderr,
                    "CUDA op profile, %s: %ld forwards (after the first), %.3f ms of device time per forward "
                    "(events, no gaps)\n",
                    w ? "prefill (M > 32)" : "decode (M <= 32)", g_windows[w], g_win_ms[w] / g_windows[w]);
            std::vector<int> order;
            for (size_t i = 0; i < g_pc.size(); i++)
                if (g_pc[i].calls[w]) order.push_back((int)i);
            std::sort(order.begin(), order.end(), [&](int a, int b) { return g_pc[a].ms[w] > g_pc[b].ms[w]; });
            for (int i : order)
                fprintf(stderr, "  %-22s %7.1f calls/fwd %9.3f ms/fwd %6.1f%% %9.2f us/call\n", g_pc[i].name.c_str(),
                        (double)g_pc[i].calls[w] / g_windows[w], g_pc[i].ms[w] / g_windows[w],
                        100.0 * g_pc[i].ms[w] / g_win_ms[w], 1e3 * g_pc[i].ms[w] / g_pc[i].calls[w]);
        }
        return;
    }
    double total = 0;
    for (int i = 0; i < P_COUNT; i++) total += p_seconds[i];
    fprintf(stderr, "CUDA op profile (synchronized per op):\n");
    for (int i = 0; i < P_COUNT; i++)
        if (p_calls[i])
            fprintf(stderr, "  %-12s %8ld calls %10.3f ms %6.1f%%  %8.1f us/call\n", p_names[i], p_calls[i],
                    1e3 * p_seconds[i], 100.0 * p_seconds[i] / total, 1e6 * p_seconds[i] / p_calls[i]);
}

struct p_scope {
    int op, cls;
    double t0;
    explicit p_scope(int o, int c = -1) : op(o), cls(c < 0 ? o : c)
    {
        if (profile_mode() == 2) {
            p_init_classes();
            return;
        }
        TSR_CUDA_CHECK(cudaStreamSynchronize(g_stream));
        t0 = host_now();
    }
    ~p_scope()
    {
        if (profile_mode() == 2) {
            ev_mark(cls);
            return;
        }
        TSR_CUDA_CHECK(cudaStreamSynchronize(g_stream));
        p_seconds[op] += host_now() - t0;
        p_calls[op]++;
    }
};

static void pf_embed(const tsr_dense *t, const int32_t *ids, int n, float *out)
{
    if (profile_mode() == 2) { /* start of a forward: hold the GPU so the host can queue the whole forward */
        prof_resolve();
        spin_kernel<<<1, 1, 0, g_stream>>>(SPIN_NS);
        TSR_CUDA_LAUNCHED();
        ev_mark(-1);
    }
    p_scope s(P_EMBED);
    tsr_cuda_embed(t, ids, n, out);
}
static void pf_norm(const float *x, const tsr_dense *w, float eps, int rows, int dim, float *out)
{
    p_scope s(P_NORM);
    tsr_cuda_rmsnorm(x, w, eps, rows, dim, out);
}
static void pf_linear(const tsr_linear *L, const float *x, int M, float *y)
{
    if (M > g_win_maxM) g_win_maxM = M;
    p_scope s(P_LINEAR, profile_mode() == 2 ? linear_class(&L, 1, 0) : -1);
    tsr_cuda_linear(L, x, M, y);
}
static void pf_linear_many(const tsr_linear *const *L, int n, const float *x, int M, float *const *y)
{
    if (M > g_win_maxM) g_win_maxM = M;
    p_scope s(P_LINEAR, profile_mode() == 2 ? linear_class(L, n, 1) : -1);
    tsr_cuda_linear_many(L, n, x, M, y);
}
static void pf_linear_add_norm(const tsr_linear *L, const float *a, int M, float *x, const tsr_dense *w, float eps,
                               float *out)
{
    if (M > g_win_maxM) g_win_maxM = M;
    p_scope s(P_LINEAR, profile_mode() == 2 ? linear_class(&L, 1, 2) : -1);
    tsr_cuda_linear_add_norm(L, a, M, x, w, eps, out);
}
static void pf_silu_linear_add_norm(const tsr_linear *L, float *gate, const float *up, int M, float *x,
                                    const tsr_dense *w, float eps, float *out)
{
    if (M > g_win_maxM) g_win_maxM = M;
    p_scope s(P_LINEAR, profile_mode() == 2 ? linear_class(&L, 1, 3) : -1);
    tsr_cuda_silu_linear_add_norm(L, gate, up, M, x, w, eps, out);
}
static int pf_mlp_add_norm(const tsr_linear *gate, const tsr_linear *up, const tsr_linear *down, const float *h, int M,
                           float *x, const tsr_dense *w, float eps, float *out, float *scratch_gate, float *scratch_up)
{
    if (M > g_win_maxM) g_win_maxM = M;
    const tsr_linear *three[3] = {gate, up, down};
    p_scope s(P_LINEAR, profile_mode() == 2 ? linear_class(three, 3, 4) : -1);
    return tsr_cuda_mlp_add_norm(gate, up, down, h, M, x, w, eps, out, scratch_gate, scratch_up);
}
static void pf_rope(const tsr_batch_layout *b, float *x, int nh, int hd, int rd)
{
    p_scope s(P_ROPE);
    tsr_cuda_rope(b, x, nh, hd, rd);
}
static void pf_kv(const tsr_batch_layout *b, tsr_kv_cache *kv, int layer, const float *k, const float *v)
{
    p_scope s(P_KV);
    tsr_cuda_kv_store(b, kv, layer, k, v);
}
static void pf_attn(const tsr_batch_layout *b, const tsr_attn_args *a, const tsr_kv_cache *kv, const float *q,
                    float *out)
{
    p_scope s(P_ATTN);
    tsr_cuda_attention(b, a, kv, q, out);
}
static void pf_silu(const float *g, const float *u, size_t n, float *out)
{
    p_scope s(P_SILU);
    tsr_cuda_silu_mul(g, u, n, out);
}
static void pf_add(float *x, const float *y, size_t n)
{
    p_scope s(P_ADD);
    tsr_cuda_add(x, y, n);
}
static void pf_gather(const float *x, const int32_t *index, int n, int dim, float *out)
{
    p_scope s(P_GATHER);
    tsr_cuda_gather_rows(x, index, n, dim, out);
}
static void pf_add_norm(float *x, const float *y, const tsr_dense *w, float eps, int rows, int dim, float *out)
{
    p_scope s(P_ADD_NORM);
    tsr_cuda_add_rmsnorm(x, y, w, eps, rows, dim, out);
}
static void pf_rope_store(const tsr_batch_layout *b, float *q, int nh, float *k, const float *v, tsr_kv_cache *kv,
                          int layer, int rd)
{
    p_scope s(P_ROPE_STORE);
    tsr_cuda_rope_store(b, q, nh, k, v, kv, layer, rd);
}
static void pf_argmax(const float *x, int rows, int n, int32_t *ids, float *vals)
{
    p_scope s(P_ARGMAX);
    tsr_cuda_argmax_rows(x, rows, n, ids, vals);
}
static void pf_top(const float *x, int rows, int n, int k, const float *inv_temp, int32_t *ids, float *vals, float *z)
{
    p_scope s(P_TOP);
    tsr_cuda_top_rows(x, rows, n, k, inv_temp, ids, vals, z);
}

static const tsr_ops cuda_ops_profiled = {
    "cuda",
    cuda_alloc,
    cuda_release,
    cuda_to_device,
    cuda_to_host,
    cuda_run_cached,
    cuda_memory_free,
    cuda_prepare_model,
    cuda_release_model,
    pf_embed,
    pf_norm,
    pf_linear,
    pf_rope,
    pf_kv,
    pf_attn,
    pf_silu,
    pf_add,
    pf_gather,
    pf_linear_many,
    pf_add_norm,
    pf_linear_add_norm,
    pf_rope_store,
    pf_argmax,
    pf_top,
    pf_silu_linear_add_norm,
    pf_mlp_add_norm,
    tsr_cuda_peak_allocated,
};

/* TSR_CUDA_SMEM_OPTIN when set to a positive number of bytes, else 0. */
static int smem_cap(void)
{
    static int cap = -1;
    if (cap < 0) {
        const char *e = getenv("TSR_CUDA_SMEM_OPTIN");
        cap = e && atoi(e) > 0 ? atoi(e) : 0;
    }
    return cap;
}

int tsr_cuda_smem_block(void)
{
    if (!g_smem_block) {
        const int dev = tsr_cuda_device_attr(cudaDevAttrMaxSharedMemoryPerBlockOptin, 48 * 1024);
        g_smem_block = smem_cap() && smem_cap() < dev ? smem_cap() : dev;
    }
    return g_smem_block;
}

int tsr_cuda_smem_sm(void)
{
    if (!g_smem_sm) {
        const int dev = tsr_cuda_device_attr(cudaDevAttrMaxSharedMemoryPerMultiprocessor, 64 * 1024);
        g_smem_sm = smem_cap() && smem_cap() + 1024 < dev ? smem_cap() + 1024 : dev;
    }
    return g_smem_sm;
}

int tsr_cuda_resident_blocks(const void *kernel, int threads, size_t smem)
{
    int occ = 0;
    TSR_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&occ, kernel, threads, smem));
    const int fit = tsr_cuda_smem_sm() / (int)(smem + 1024); /* a cap (TSR_CUDA_SMEM_OPTIN) plans as that device */
    if (fit < occ) occ = fit;
    return occ * tsr_cuda_device_attr(cudaDevAttrMultiProcessorCount, 0);
}

void tsr_cuda_allow_smem(const void *kernel, size_t bytes, const char *what)
{
    if (bytes > (size_t)tsr_cuda_smem_block()) {
        char msg[160];
        snprintf(msg, sizeof msg, "%s asks for %zu bytes of shared memory per block; the device allows %d", what, bytes,
                 tsr_cuda_smem_block());
        tsr_cuda_fatal(__FILE__, __LINE__, msg);
    }
    TSR_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)bytes));
}

int tsr_cuda_device_attr(cudaDeviceAttr attr, int fallback)
{
    int dev = 0, v = 0;
    if (cudaGetDevice(&dev) != cudaSuccess || cudaDeviceGetAttribute(&v, attr, dev) != cudaSuccess) {
        cudaGetLastError();
        return fallback;
    }
    return v;
}

bool tsr_cuda_env_off(const char *name)
{
    const char *v = getenv(name);
    return v && atoi(v) == 0;
}

bool tsr_cuda_env_on(const char *name)
{
    const char *v = getenv(name);
    return v && atoi(v) != 0;
}

extern "C" const tsr_ops *tsr_ops_cuda(void)
{
    static int profiled = -1;
    if (profiled < 0) {
        profiled = profile_mode() != 0;
        if (profiled) atexit(p_report);
    }
    const tsr_ops *base = profiled ? &cuda_ops_profiled : &cuda_ops;
    /* for comparisons: TSR_CUDA_LINEAR_ADD=0 leaves linear_add_norm and silu_linear_add_norm out (the product, its
     * reduction and the residual pass as separate launches), TSR_CUDA_SILU_FOLD=0 silu_linear_add_norm (silu_mul
     * as a launch of its own before the down projection), TSR_CUDA_ROPE_STORE=0 rope_store (rope of q, of k and the K/V
     * store as three launches), TSR_CUDA_ARGMAX=0 argmax_rows (greedy rows copied whole to the host and picked there),
     * TSR_CUDA_TOP=0 top_rows (sampled rows copied whole to the host), TSR_CUDA_MLP_FUSE=0 mlp_add_norm (a decode
     * row's MLP as the GEMV launches, silu_mul and the residual pass; prefill's gate and up in fp32) */
    static tsr_ops chosen;
    static int ready;
    if (!ready) {
        chosen = *base;
        if (tsr_cuda_env_off("TSR_CUDA_LINEAR_ADD")) chosen.linear_add_norm = NULL;
        if (!chosen.linear_add_norm || tsr_cuda_env_off("TSR_CUDA_SILU_FOLD")) chosen.silu_linear_add_norm = NULL;
        if (tsr_cuda_env_off("TSR_CUDA_ROPE_STORE")) chosen.rope_store = NULL;
        if (tsr_cuda_env_off("TSR_CUDA_ARGMAX")) chosen.argmax_rows = NULL;
        if (tsr_cuda_env_off("TSR_CUDA_TOP")) chosen.top_rows = NULL;
        if (!chosen.linear_add_norm || tsr_cuda_env_off("TSR_CUDA_MLP_FUSE")) chosen.mlp_add_norm = NULL;
        ready = 1;
    }
    return &chosen;
}
