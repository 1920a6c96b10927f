/* GPU tests: every CUDA op against the CPU op (quantized products against a double-precision sum over the
 * dequantized weights, ref_linear) on fresh random inputs (outputs poisoned with NaN first, sizes that
 * are not multiples of the tiles, every EXL2 bit width, decode and prefill shapes, FP16, FP32 and the quantized
 * Q4/Q6/Q8 KV modes), then whole-model logits and greedy tokens of every fixture model on the GPU against the CPU
 * backend and the references (with quantized caches too). Exits 77 (skipped) where no GPU is present. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <cuda_runtime_api.h>

#include "kernels/cpu/cpu_kernels.h"
#include "kernels/cuda/ops_cuda.h"
#include "kernels/cuda/peer_sum.h"
#include "runtime/engine.h"
#include "runtime/half.h"
#include "runtime/sampler.h"
#include "tests/common/exl2_synth.h"
#include "tests/common/fixtures.h"
#include "tests/common/forward_slices.h"
#include "tests/common/step_top.h"

#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const tsr_ops *cpu, *gpu;

static float frand(void)
{
    return (float)((double)rnd() / 4294967296.0 * 2.0 - 1.0);
}

static float *rand_host(size_t n, float scale)
{
    float *p = malloc(n * sizeof(float));
    for (size_t i = 0; i < n; i++)
        p[i] = frand() * scale;
    return p;
}

/* device copy of a host array */
static void *dev_copy(const void *h, size_t bytes)
{
    void *d = gpu->alloc(bytes);
    assert_non_null(d);
    gpu->to_device(d, h, bytes);
    return d;
}

/* a device buffer filled with NaN (0xFF bytes) */
static float *dev_poisoned(size_t n)
{
    float *h = malloc(n * sizeof(float));
    memset(h, 0xff, n * sizeof(float));
    float *d = dev_copy(h, n * sizeof(float));
    free(h);
    return d;
}

static float *to_host(const float *d, size_t n)
{
    float *h = malloc(n * sizeof(float));
    gpu->to_host(h, d, n * sizeof(float));
    return h;
}

/* Whether the environment turns a CUDA path off (NAME=0, as the CTest variants set it), read as the backend reads
 * it (backend.cu tsr_cuda_env_off: any value atoi takes for 0). */
static int env_off(const char *name)
{
    const char *v = getenv(name);
    return v && atoi(v) == 0;
}

/* relative error ||a-b|| / ||b||, failing on any NaN */
static double rel_err(const float *a, const float *b, size_t n)
{
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        if (!isfinite(a[i])) return INFINITY;
        num += ((double)a[i] - b[i]) * ((double)a[i] - b[i]);
        den += (double)b[i] * b[i];
    }
    return sqrt(num / (den > 0 ? den : 1));
}

static void expect_close(const char *what, const float *got, const float *want, size_t n, double tol)
{
    double e = rel_err(got, want, n);
    print_message("  %-40s rel err %.2e\n", what, e);
    if (!(e <= tol)) fail_msg("%s: relative error %.3e above %.1e", what, e, tol);
}

/* A random fp16 RMSNorm weight of n entries near 1: host is the CPU's view, dev the same with its device copy. */
typedef struct {
    tsr_dense host, dev;
} norm_weight;

static norm_weight norm_weight_new(int n)
{
    uint16_t *w16 = malloc((size_t)n * sizeof *w16);
    for (int i = 0; i < n; i++) w16[i] = tsr_float_to_half(1.0f + 0.3f * frand());
    norm_weight w = {{TSR_F16, 1, n, w16, NULL}, {TSR_F16, 1, n, w16, NULL}};
    w.dev.dev = dev_copy(w16, (size_t)n * sizeof *w16);
    return w;
}

static void norm_weight_free(norm_weight *w)
{
    free((void *)w->host.data);
    gpu->release((void *)w->dev.dev);
}

/* rmsnorm of rows × dim against the CPU (in place: out = x); the widths pick the GPU's kernels: 256-thread blocks
 * with float4 rows up to 4096 and 8192 wide, and the general one (a width that is not a multiple of 4, or wider). */
static void check_rmsnorm(int rows, int dim, int in_place)
{
    const size_t n = (size_t)rows * dim;
    float *x = rand_host(n, 3.0f), *want = malloc(n * sizeof(float));
    norm_weight w = norm_weight_new(dim);
    cpu->rmsnorm(x, &w.host, 1e-5f, rows, dim, want);
    float *dx = dev_copy(x, n * 4), *dout = in_place ? dx : dev_poisoned(n);
    gpu->rmsnorm(dx, &w.dev, 1e-5f, rows, dim, dout);
    float *got = to_host(dout, n);
    char what[64];
    snprintf(what, sizeof what, "rmsnorm %dx%d%s", rows, dim, in_place ? " in place" : "");
    expect_close(what, got, want, n, 1e-6);
    free(got), free(x), free(want);
    gpu->release(dx);
    if (!in_place) gpu->release(dout);
    norm_weight_free(&w);
}

/* add_rmsnorm (x += y, out = rmsnorm(x), out aliasing y as the forward pass uses it) against the CPU: on sm_90 rows of
 * 1-8 go through the residual pass of a cluster of eight blocks, each taking a slice of the row (elementwise.cu),
 * wider rows with more float4 per thread, a width that leaves the last blocks empty, and 9 rows through the
 * single-block kernel. */
static void check_add_rmsnorm(int rows, int dim)
{
    const size_t n = (size_t)rows * dim;
    float *x = rand_host(n, 3.0f), *y = rand_host(n, 2.0f), *want = malloc(n * sizeof(float)),
          *normed = malloc(n * sizeof(float));
    norm_weight w = norm_weight_new(dim);
    memcpy(want, x, n * 4);
    cpu->add(want, y, n);
    cpu->rmsnorm(want, &w.host, 1e-5f, rows, dim, normed);
    float *dx = dev_copy(x, n * 4), *dy = dev_copy(y, n * 4);
    gpu->add_rmsnorm(dx, dy, &w.dev, 1e-5f, rows, dim, dy);
    char what[64];
    float *got = to_host(dx, n);
    snprintf(what, sizeof what, "add_rmsnorm %dx%d: the sum", rows, dim);
    expect_close(what, got, want, n, 0);
    free(got);
    got = to_host(dy, n);
    snprintf(what, sizeof what, "add_rmsnorm %dx%d: the norm", rows, dim);
    expect_close(what, got, normed, n, 1e-6);
    free(got), free(x), free(y), free(want), free(normed);
    gpu->release(dx), gpu->release(dy);
    norm_weight_free(&w);
}

static void test_elementwise(void **state)
{
    (void)state;
    const int rows = 7, dim = 1000;
    float *x = rand_host((size_t)rows * dim, 3.0f);
    norm_weight nw = norm_weight_new(dim);
    const tsr_dense w = nw.host, wd = nw.dev;
    float *want = malloc((size_t)rows * dim * sizeof(float));
    cpu->rmsnorm(x, &w, 1e-5f, rows, dim, want);
    float *dx = dev_copy(x, (size_t)rows * dim * 4), *dout = dev_poisoned((size_t)rows * dim);
    gpu->rmsnorm(dx, &wd, 1e-5f, rows, dim, dout);
    float *got = to_host(dout, (size_t)rows * dim);
    expect_close("rmsnorm 7x1000", got, want, (size_t)rows * dim, 1e-6);
    free(got);
    check_rmsnorm(5, 8192, 0);
    check_rmsnorm(3, 4096, 1);
    check_rmsnorm(3, 1002, 0);
    check_rmsnorm(2, 8200, 1);
    check_add_rmsnorm(1, 4096);
    check_add_rmsnorm(3, 8192);
    check_add_rmsnorm(8, 12288);
    check_add_rmsnorm(2, 24);
    check_add_rmsnorm(9, 4096);

    /* silu_mul, add, gather */
    float *y = rand_host((size_t)rows * dim, 2.0f), *dy = dev_copy(y, (size_t)rows * dim * 4);
    cpu->silu_mul(x, y, (size_t)rows * dim, want);
    gpu->silu_mul(dx, dy, (size_t)rows * dim, dout);
    got = to_host(dout, (size_t)rows * dim);
    expect_close("silu_mul", got, want, (size_t)rows * dim, 1e-6);
    free(got);
    memcpy(want, x, (size_t)rows * dim * 4);
    cpu->add(want, y, (size_t)rows * dim);
    gpu->add(dx, dy, (size_t)rows * dim);
    got = to_host(dx, (size_t)rows * dim);
    expect_close("add", got, want, (size_t)rows * dim, 0);
    int32_t idx[3] = {6, 0, 3};
    int32_t *didx = dev_copy(idx, sizeof idx);
    gpu->gather_rows(dx, didx, 3, dim, dout);
    float *gathered = malloc((size_t)3 * dim * sizeof(float));
    cpu->gather_rows(want, idx, 3, dim, gathered);
    got = to_host(dout, (size_t)3 * dim);
    expect_close("gather_rows", got, gathered, (size_t)3 * dim, 0);
    free(got), free(gathered);

    /* add_rmsnorm: x += y, then out = rmsnorm(x), with out aliasing y as the forward pass uses it */
    float *dy2 = dev_copy(y, (size_t)rows * dim * 4), *normed = malloc((size_t)rows * dim * sizeof(float));
    cpu->add(want, y, (size_t)rows * dim);
    cpu->rmsnorm(want, &w, 1e-5f, rows, dim, normed);
    gpu->add_rmsnorm(dx, dy2, &wd, 1e-5f, rows, dim, dy2);
    got = to_host(dx, (size_t)rows * dim);
    expect_close("add_rmsnorm: the sum", got, want, (size_t)rows * dim, 0);
    free(got);
    got = to_host(dy2, (size_t)rows * dim);
    expect_close("add_rmsnorm: the norm", got, normed, (size_t)rows * dim, 1e-6);
    free(got), free(normed);
    gpu->release(dy2);

    /* embed, all table dtypes */
    const int vocab = 50;
    int32_t ids[5] = {49, 0, 7, 7, 31};
    int32_t *dids = dev_copy(ids, sizeof ids);
    tsr_dtype types[] = {TSR_F16, TSR_BF16, TSR_F32};
    for (int t = 0; t < 3; t++) {
        size_t es = tsr_dtype_size(types[t]);
        unsigned char *table = malloc((size_t)vocab * dim * es);
        for (size_t i = 0; i < (size_t)vocab * dim; i++) {
            float v = frand();
            if (types[t] == TSR_F16) ((uint16_t *)table)[i] = tsr_float_to_half(v);
            if (types[t] == TSR_BF16) ((uint16_t *)table)[i] = tsr_float_to_bf16(v);
            if (types[t] == TSR_F32) ((float *)table)[i] = v;
        }
        tsr_dense tb = {types[t], vocab, dim, table, NULL};
        cpu->embed(&tb, ids, 5, want);
        tb.dev = dev_copy(table, (size_t)vocab * dim * es);
        gpu->embed(&tb, dids, 5, dout);
        got = to_host(dout, (size_t)5 * dim);
        expect_close(tsr_dtype_name(types[t]), got, want, (size_t)5 * dim, 0);
        free(got);
        gpu->release((void *)tb.dev);
        free(table);
    }
    gpu->release(dx), gpu->release(dy), gpu->release(dout), gpu->release(didx), gpu->release(dids);
    norm_weight_free(&nw);
    free(x), free(y), free(want);
}

/* argmax_rows against the CPU op: rows wider and narrower than the slicing, ties (the first maximum wins), NaNs
 * (skipped), a row of NaN only, a row with +inf, a row of -inf and NaN. */
/* The two rates tessera bench measures on the device: each within what any CUDA card of the targets gives (more
 * than 10 GB/s of copy, more than 1 TFLOP/s of fp16 GEMM at 1024^3) and under what none reaches (20 TB/s, 5 PFLOP/s
 * dense), and the device memory they took given back. */
static void test_bench_rates(void **state)
{
    (void)state;
    size_t free0, free1, total;
    tsr_cuda_memory(&free0, &total);
    const double copy = tsr_cuda_copy_bandwidth((size_t)64 << 20), gemm = tsr_cuda_gemm_rate(1024);
    tsr_cuda_memory(&free1, &total);
    printf("copy %.1f GB/s, fp16 GEMM %.1f TFLOP/s at 1024^3\n", copy / 1e9, gemm / 1e12);
    assert_true(copy > 1e10 && copy < 2e13);
    assert_true(gemm > 1e12 && gemm < 5e15);
    assert_true(free1 + ((size_t)64 << 20) >= free0); /* room for a cuBLAS workspace made on first use */
}

static void test_argmax_rows(void **state)
{
    (void)state;
    const int widths[] = {128256, 4097, 1000, 3};
    const int counts[] = {1, 5, 40};
    for (int w = 0; w < 4; w++)
        for (int c = 0; c < 3; c++) {
            const int n = widths[w], rows = counts[c];
            float *x = rand_host((size_t)rows * n, 5.0f);
            for (int r = 0; r < rows; r++) {
                float *row = x + (size_t)r * n;
                const int a = (int)((unsigned)(r * 7919 + 13) % (unsigned)n);
                const int b = (int)((unsigned)(r * 104729) % (unsigned)n);
                switch (r % 7) {
                case 0: row[a] = row[b] = 9.0f; break;                /* a tie: the lower index */
                case 1: row[a] = NAN, row[b] = 8.0f; break;           /* NaN skipped */
                case 2: for (int i = 0; i < n; i++) row[i] = NAN; break;
                case 3: row[b] = INFINITY; break;
                case 4: for (int i = 0; i < n; i++) row[i] = i % 2 ? -INFINITY : NAN; break;
                case 5: row[n - 1] = 50.0f; break;                   /* the last element */
                default: /* -0 before +0: a tie, the first wins */
                    for (int i = 0; i < n; i++) row[i] = -1.0f;
                    row[a < b ? a : b] = -0.0f, row[a < b ? b : a] = 0.0f;
                    break;
                }
            }
            int32_t *want_ids = malloc((size_t)rows * sizeof *want_ids), *got_ids = malloc((size_t)rows * 4);
            float *want_vals = malloc((size_t)rows * sizeof *want_vals), *got_vals = malloc((size_t)rows * 4);
            cpu->argmax_rows(x, rows, n, want_ids, want_vals);
            float *dx = dev_copy(x, (size_t)rows * n * sizeof(float)), *dv = dev_poisoned((size_t)rows);
            int32_t *di = (int32_t *)dev_poisoned((size_t)rows);
            gpu->argmax_rows(dx, rows, n, di, dv);
            gpu->to_host(got_ids, di, (size_t)rows * 4);
            gpu->to_host(got_vals, dv, (size_t)rows * 4);
            for (int r = 0; r < rows; r++) {
                const int same_val = isnan(want_vals[r]) ? isnan(got_vals[r]) : got_vals[r] == want_vals[r];
                if (got_ids[r] != want_ids[r] || !same_val)
                    fail_msg("argmax_rows %d x %d, row %d: got %d (%g), want %d (%g)", rows, n, r, got_ids[r],
                             got_vals[r], want_ids[r], want_vals[r]);
            }
            gpu->release(dx), gpu->release(dv), gpu->release(di);
            free(x), free(want_ids), free(got_ids), free(want_vals), free(got_vals);
        }
}

/* top_rows against the CPU reference: the same candidates in the same order (ties, NaN, -inf, -0 below +0, rows
 * with fewer valid entries than candidates), z within 1e-4 relative (float sums on the device). */
static void test_top_rows(void **state)
{
    (void)state;
    const int widths[] = {128256, 4097, 1000, 40};
    const int counts[] = {1, 7, 33};
    for (int w = 0; w < 4; w++)
        for (int c = 0; c < 3; c++) {
            const int n = widths[w], rows = counts[c], k = TSR_TOP_MAX;
            float *x = rand_host((size_t)rows * n, 5.0f);
            float *inv = malloc((size_t)rows * sizeof *inv);
            for (int r = 0; r < rows; r++) {
                float *row = x + (size_t)r * n;
                inv[r] = r % 3 == 0 ? 1.0f : r % 3 == 1 ? 1.0f / 0.7f : 4.0f;
                const int a = (int)((unsigned)(r * 7919 + 13) % (unsigned)n);
                const int b = (int)((unsigned)(r * 104729) % (unsigned)n);
                switch (r % 6) {
                case 0: for (int i = 0; i < n; i += 3) row[i] = 2.5f; break; /* many ties across the threshold */
                case 1: row[a] = NAN, row[b] = 8.0f; break;
                case 2: for (int i = 0; i < n; i++) row[i] = i % 5 ? NAN : (float)(i % 11); break;
                case 3: row[b] = -INFINITY, row[a] = -0.0f, row[(a + 1) % n] = 0.0f; break;
                case 4: for (int i = 0; i < n; i++) row[i] = i % 2 ? -INFINITY : NAN; break;
                default: break;
                }
            }
            const size_t cand = (size_t)rows * k;
            int32_t *want_ids = malloc(cand * 4), *got_ids = malloc(cand * 4);
            float *want_v = malloc(cand * 4), *got_v = malloc(cand * 4), *want_z = malloc((size_t)rows * 4),
                  *got_z = malloc((size_t)rows * 4);
            tsr_cpu_top_rows(x, rows, n, k, inv, want_ids, want_v, want_z);
            float *dx = dev_copy(x, (size_t)rows * n * sizeof(float)), *dinv = dev_copy(inv, (size_t)rows * 4);
            float *dv = dev_poisoned(cand), *dz = dev_poisoned((size_t)rows);
            int32_t *di = (int32_t *)dev_poisoned(cand);
            gpu->top_rows(dx, rows, n, k, dinv, di, dv, dz);
            gpu->to_host(got_ids, di, cand * 4);
            gpu->to_host(got_v, dv, cand * 4);
            gpu->to_host(got_z, dz, (size_t)rows * 4);
            for (int r = 0; r < rows; r++) {
                for (int j = 0; j < k; j++) {
                    const size_t at = (size_t)r * k + j;
                    const int same = isnan(want_v[at]) ? isnan(got_v[at]) : !memcmp(&got_v[at], &want_v[at], 4);
                    if (got_ids[at] != want_ids[at] || !same)
                        fail_msg("top_rows %d x %d, row %d, candidate %d: got %d (%g), want %d (%g)", rows, n, r, j,
                                 got_ids[at], got_v[at], want_ids[at], want_v[at]);
                }
                if (fabsf(got_z[r] - want_z[r]) > 1e-4f * fabsf(want_z[r]))
                    fail_msg("top_rows %d x %d, row %d: z %.9g, want %.9g", rows, n, r, got_z[r], want_z[r]);
            }
            gpu->release(dx), gpu->release(dinv), gpu->release(dv), gpu->release(dz), gpu->release(di);
            free(x), free(inv), free(want_ids), free(got_ids), free(want_v), free(got_v), free(want_z), free(got_z);
        }
}

/* Sampled decoding through the step path: candidates read back against whole rows (tests/common/step_top.h). */
static void test_step_top(void **state)
{
    (void)state;
    tsr_ops whole = *gpu;
    whole.top_rows = NULL;
    static const char *models[] = {"tiny-llama-exl2-4.0bpw", "tiny-qwen2-exl2-4.65bpw"};
    int checked = 0;
    for (size_t i = 0; i < sizeof models / sizeof models[0]; i++) {
        char dir[1024], err[512];
        if (!tsr_fixture_model(dir, sizeof dir, models[i])) continue;
        tsr_step_top_stats st;
        if (tsr_check_step_top(dir, gpu, &whole, 24, &st, err, sizeof err) != 0) fail_msg("%s: %s", models[i], err);
        print_message("%s: %d tokens equal, %d forward calls read candidates\n", models[i], st.tokens, st.top_calls);
        assert_true(st.top_calls >= 3); /* the prefill, then a decode step run and recorded (replays call nothing) */
        checked++;
    }
    assert_true(checked > 0);
}

/* A decode batch of TSR_HEAD_ROWS + 72 rows, past the rows of one head call: picks and candidates reduced slice
 * by slice inside the recorded step, against the GPU's own whole rows reduced on the host
 * (tests/common/forward_slices.h). */
static void test_forward_slices(void **state)
{
    (void)state;
    char dir[1024], err[512];
    if (!tsr_fixture_model(dir, sizeof dir, "tiny-llama-exl2-4.0bpw")) fail_msg("fixture model not found");
    if (tsr_check_forward_slices(dir, gpu, TSR_HEAD_ROWS + 72, 1e-4f, err, sizeof err) != 0) fail_msg("%s", err);
    print_message("%d rows: picks, candidates and fetched rows equal the whole rows' (recorded and replayed)\n",
                  TSR_HEAD_ROWS + 72);
}

/* A batch of sequences: rows [row0, row0+n) of seq s at positions pos0.. ; page tables are scrambled. */
typedef struct {
    int n_seqs, n_rows, max_pages, half;
    int32_t row_seq[2048], positions[2048], seq_row0[17], tables[16 * 256];
    float inv_freq[16 * 64], attn_factor[16];
} host_layout;

static void make_layout(host_layout *h, int n_seqs, const int *pos0, const int *n, int page, int n_pages, int half)
{
    memset(h, 0, sizeof *h);
    h->n_seqs = n_seqs;
    h->half = half;
    h->max_pages = 256;
    int next_page = 0;
    for (int s = 0; s < n_seqs; s++) {
        h->seq_row0[s] = h->n_rows;
        int pages = (pos0[s] + n[s] + page - 1) / page;
        for (int p = 0; p < pages; p++)
            h->tables[s * 256 + p] = (next_page++ * 7919) % n_pages; /* scattered */
        for (int t = 0; t < n[s]; t++) {
            h->row_seq[h->n_rows] = s;
            h->positions[h->n_rows++] = pos0[s] + t;
        }
        for (int i = 0; i < half; i++)
            h->inv_freq[s * 64 + i] = powf(10000.0f + 1000.0f * s, -2.0f * i / (2 * half));
        h->attn_factor[s] = 1.0f + 0.1f * s;
    }
    h->seq_row0[n_seqs] = h->n_rows;
    assert_true(next_page <= n_pages);
}

static tsr_batch_layout view(host_layout *h, int on_gpu, int max_position)
{
    tsr_batch_layout b = {h->n_seqs,    h->n_rows,   h->max_pages, max_position, h->row_seq,
                          h->positions, h->seq_row0, h->tables,    NULL,         NULL, 0, NULL, NULL};
    /* inv_freq with a stride of 64 per sequence: compact it to [n_seqs][half] */
    static float compact[16 * 64];
    for (int s = 0; s < h->n_seqs; s++)
        memcpy(compact + s * h->half, h->inv_freq + s * 64, (size_t)h->half * 4);
    b.inv_freq = compact;
    b.attn_factor = h->attn_factor;
    for (int r = 0; r < h->n_rows; r++) b.attended += h->positions[r] + 1; /* as runtime/forward.c */
    b.host_seq_row0 = h->seq_row0, b.host_positions = h->positions;
    if (!on_gpu) return b;
    b.row_seq = dev_copy(h->row_seq, (size_t)h->n_rows * 4);
    b.positions = dev_copy(h->positions, (size_t)h->n_rows * 4);
    b.seq_row0 = dev_copy(h->seq_row0, (size_t)(h->n_seqs + 1) * 4);
    b.page_tables = dev_copy(h->tables, sizeof h->tables);
    b.inv_freq = dev_copy(compact, (size_t)h->n_seqs * h->half * 4);
    b.attn_factor = dev_copy(h->attn_factor, (size_t)h->n_seqs * 4);
    return b;
}

static void free_view(tsr_batch_layout *b)
{
    gpu->release((void *)b->row_seq), gpu->release((void *)b->positions), gpu->release((void *)b->seq_row0);
    gpu->release((void *)b->page_tables), gpu->release((void *)b->inv_freq), gpu->release((void *)b->attn_factor);
}

/* The test batches: decode (1) 4 sequences, one new row each, long contexts; prefill (0) 3 sequences with chunks;
 * mixed (2) a decode row with a long context beside two prefill chunks, as chunked prefill batches them. Returns
 * the largest position of any row. */
static int test_batch(host_layout *h, int kind, int page, int n_pages, int half)
{
    int pos0_dec[] = {1700, 3, 950, 0}, n_dec[] = {1, 1, 1, 1};
    int pos0_pre[] = {0, 40, 0}, n_pre[] = {70, 33, 129};
    int pos0_mix[] = {1700, 0, 40}, n_mix[] = {1, 129, 33};
    /* decode rows whose contexts make a copy of the whole batch too large: before the chunks (as the scheduler plans
     * a step, a one-token chunk last; attention_kvq.cu splits the batch) and after them (kept whole, the decode
     * kernel) */
    int pos0_split[] = {1700, 1500, 1200, 0, 40, 60}, n_split[] = {1, 1, 1, 129, 33, 1};
    int pos0_split2[] = {0, 40, 1700, 1500, 1200}, n_split2[] = {129, 33, 1, 1, 1};
    /* chunks deep into their contexts (for a window: each sequence's copy starts at its first row's window start) */
    int pos0_deep[] = {600, 300, 0}, n_deep[] = {129, 33, 70};
    if (kind == 1)
        make_layout(h, 4, pos0_dec, n_dec, page, n_pages, half);
    else if (kind == 2)
        make_layout(h, 3, pos0_mix, n_mix, page, n_pages, half);
    else if (kind == 3)
        make_layout(h, 6, pos0_split, n_split, page, n_pages, half);
    else if (kind == 4)
        make_layout(h, 5, pos0_split2, n_split2, page, n_pages, half);
    else if (kind == 5)
        make_layout(h, 3, pos0_deep, n_deep, page, n_pages, half);
    else
        make_layout(h, 3, pos0_pre, n_pre, page, n_pages, half);
    int max_pos = 0;
    for (int r = 0; r < h->n_rows; r++)
        if (h->positions[r] > max_pos) max_pos = h->positions[r];
    return max_pos;
}

/* Fills every sequence's whole history 0..last of h with random K/V through kv_store on both backends (layer 0). */
static void fill_history(const host_layout *h, tsr_kv_cache *kc, tsr_kv_cache *kg, int nkv, int d, int page,
                         int n_pages)
{
    for (int s = 0; s < h->n_seqs; s++) {
        int last = h->positions[h->seq_row0[s + 1] - 1];
        host_layout hist;
        int zero = 0, len = last + 1;
        make_layout(&hist, 1, &zero, &len, page, n_pages, d / 2);
        memcpy(hist.tables, h->tables + s * 256, 256 * 4);
        float *k = rand_host((size_t)len * nkv * d, 1.0f), *v = rand_host((size_t)len * nkv * d, 1.0f);
        tsr_batch_layout bc = view(&hist, 0, last), bg = view(&hist, 1, last);
        cpu->kv_store(&bc, kc, 0, k, v);
        float *dk = dev_copy(k, (size_t)len * nkv * d * 4), *dv = dev_copy(v, (size_t)len * nkv * d * 4);
        gpu->kv_store(&bg, kg, 0, dk, dv);
        gpu->release(dk), gpu->release(dv);
        free_view(&bg);
        free(k), free(v);
    }
}

static void check_attention_heads(int d, tsr_dtype kv_dtype, int window, int decode, int nh, int nkv, int page)
{
    const int n_pages = 1024;
    host_layout h;
    const int max_pos = test_batch(&h, decode, page, n_pages, d / 2);
    tsr_kv_cache kc, kg;
    assert_int_equal(tsr_kv_init(&kc, cpu, 1, nkv, d, page, n_pages, kv_dtype), TSR_OK);
    assert_int_equal(tsr_kv_init(&kg, gpu, 1, nkv, d, page, n_pages, kv_dtype), TSR_OK);
    fill_history(&h, &kc, &kg, nkv, d, page, n_pages);
    size_t n = (size_t)h.n_rows * nh * d;
    float *q = rand_host(n, 1.0f), *want = malloc(n * 4);
    tsr_attn_args a = {nh, nkv, d, 1.0f / sqrtf((float)d), window, 0, NULL};
    tsr_batch_layout bc = view(&h, 0, max_pos), bg = view(&h, 1, max_pos);
    cpu->attention(&bc, &a, &kc, q, want);
    float *dq = dev_copy(q, n * 4), *dout = dev_poisoned(n);
    gpu->attention(&bg, &a, &kg, dq, dout);
    float *got = to_host(dout, n);
    char what[96];
    snprintf(what, sizeof what, "attention d%d %s %s window %d, %d/%d heads, page %d", d, tsr_dtype_name(kv_dtype),
             decode == 1   ? "decode"
             : decode == 2 ? "mixed"
                           : "prefill",
             window, nh, nkv, page);
    /* batches with prefill rows over an fp16 cache take the tensor-core kernel (fp16 queries and probabilities) */
    const int tensor_core = decode != 1 && kv_dtype == TSR_F16 && (d == 64 || d == 128);
    expect_close(what, got, want, n, tensor_core ? 4e-3 : 2e-5);

    /* rope on the same layout */
    float *xr = rand_host(n, 1.0f);
    float *dxr = dev_copy(xr, n * 4);
    cpu->rope(&bc, xr, nh, d, d);
    gpu->rope(&bg, dxr, nh, d, d);
    free(got);
    got = to_host(dxr, n);
    expect_close("rope", got, xr, n, 2e-6);
    free(got), free(q), free(want), free(xr);
    gpu->release(dq), gpu->release(dout), gpu->release(dxr);
    free_view(&bg);
    tsr_kv_free(&kc);
    tsr_kv_free(&kg);
}

/* Eight query heads over two KV heads (groups of four). */
static void check_attention(int d, tsr_dtype kv_dtype, int window, int decode)
{
    check_attention_heads(d, kv_dtype, window, decode, 8, 2, 16);
}

static void test_attention(void **state)
{
    (void)state;
    check_attention(64, TSR_F16, 0, 1);
    check_attention(128, TSR_F16, 0, 1);
    check_attention(128, TSR_F32, 0, 1);
    check_attention(64, TSR_F16, 0, 0);
    check_attention(128, TSR_F32, 40, 0);
    check_attention(96, TSR_F16, 300, 1);
    check_attention(64, TSR_F16, 300, 1); /* attention_decode.cu with a window */
    check_attention(128, TSR_F16, 600, 1); /* 10 splits of 64 positions, some empty (rows at positions 0 and 3) */
    check_attention(128, TSR_F16, 0, 0);
    check_attention(128, TSR_F16, 40, 0);
    check_attention(64, TSR_F16, 100, 2);
    check_attention(128, TSR_F16, 0, 2);
    check_attention(96, TSR_F16, 0, 0); /* no tensor-core kernel for d96: the general one */
    check_attention(256, TSR_F16, 0, 1); /* the general kernel's splits, merged by item (8 values per lane) */
    /* attention_decode.cu's tensor-core path by group size: 8 heads per KV head (two n-tiles), 1 and 3 (padded
     * columns), 12 (the scalar path) */
    check_attention_heads(128, TSR_F16, 0, 1, 16, 2, 16);
    check_attention_heads(64, TSR_F16, 300, 1, 16, 2, 16);
    check_attention_heads(128, TSR_F16, 600, 1, 2, 2, 16);
    check_attention_heads(64, TSR_F16, 0, 1, 6, 2, 16);
    check_attention_heads(128, TSR_F16, 0, 1, 24, 2, 16);
    /* pages of 24 positions: the K/V tile copies find pages by division instead of a shift */
    check_attention_heads(128, TSR_F16, 0, 0, 8, 2, 24);
    check_attention_heads(128, TSR_F16, 0, 1, 8, 2, 24);
}

/* Bytes of one backend array, on the host. */
static void *host_bytes(const tsr_ops *ops, const void *p, size_t bytes)
{
    void *h = malloc(bytes);
    ops->to_host(h, p, bytes);
    return h;
}

/* rope_store into a quantized cache kg (one launch) against rope, rope and kv_store on the GPU into a second cache:
 * q, k, the codes, the scales, the staged rows and their keys must be the same bytes. q, k: the inputs on the device
 * (rotated here in place); dq, dk: rope_store's outputs; dv its v. */
static void check_rope_store_quant(const host_layout *h, const tsr_batch_layout *bg, const tsr_kv_cache *kg, int d,
                                   int rot_dim, float *q, float *k, const float *dq, const float *dk,
                                   const float *dv)
{
    const int nh = 8, nkv = kg->n_kv_heads;
    const size_t nq = (size_t)h->n_rows * nh * d, nk = (size_t)h->n_rows * nkv * d;
    tsr_kv_cache kr;
    assert_int_equal(tsr_kv_init(&kr, gpu, 1, nkv, d, kg->page_size, kg->n_pages, kg->dtype), TSR_OK);
    gpu->rope(bg, q, nh, d, rot_dim);
    gpu->rope(bg, k, nkv, d, rot_dim);
    gpu->kv_store(bg, &kr, 0, k, dv);
    const size_t elems = (size_t)kg->n_pages * kg->page_size * nkv * d;
    const void *got[] = {dq, dk, kg->k[0], kg->v[0], kg->k_scale[0], kg->v_scale[0], kg->stage_k, kg->stage_v,
                         kg->stage_key};
    const void *ref[] = {q, k, kr.k[0], kr.v[0], kr.k_scale[0], kr.v_scale[0], kr.stage_k, kr.stage_v, kr.stage_key};
    const size_t bytes[] = {nq * 4, nk * 4, elems * kg->k_bits / 8, elems * kg->v_bits / 8, elems / 32 * 2,
                            elems / 32 * 2, (size_t)kg->stage_rows * nkv * d * 2, (size_t)kg->stage_rows * nkv * d * 2,
                            ((size_t)kg->stage_rows + 1) * 8};
    static const char *names[] = {"q", "k", "K codes", "V codes", "K scales", "V scales", "staged K", "staged V",
                                  "stage keys"};
    for (int i = 0; i < 9; i++) {
        unsigned char *a = host_bytes(gpu, got[i], bytes[i]), *b = host_bytes(gpu, ref[i], bytes[i]);
        size_t diff = 0;
        for (size_t j = 0; j < bytes[i]; j++) diff += a[j] != b[j];
        if (diff)
            fail_msg("rope_store %s d%d rot %d: %s differ from rope + kv_store's in %zu of %zu bytes",
                     tsr_kv_dtype_name(kg->dtype), d, rot_dim, names[i], diff, bytes[i]);
        free(a), free(b);
    }
    print_message("  rope_store %s d%d rot %d: the same bytes as rope, rope and kv_store\n",
                  tsr_kv_dtype_name(kg->dtype), d, rot_dim);
    tsr_kv_free(&kr);
}

/* rope_store against the CPU's rope of q, rope of k and kv_store: the rotated q and k, and the whole cache. */
static void check_rope_store(int d, tsr_dtype kv_dtype, int rot_dim, int decode)
{
    const int nh = 8, nkv = 2, page = 16, n_pages = 256;
    host_layout h;
    const int max_pos = test_batch(&h, decode ? 1 : 0, page, n_pages, rot_dim / 2);
    tsr_kv_cache kc, kg;
    assert_int_equal(tsr_kv_init(&kc, cpu, 1, nkv, d, page, n_pages, kv_dtype), TSR_OK);
    assert_int_equal(tsr_kv_init(&kg, gpu, 1, nkv, d, page, n_pages, kv_dtype), TSR_OK);
    const size_t nq = (size_t)h.n_rows * nh * d, nk = (size_t)h.n_rows * nkv * d;
    float *q = rand_host(nq, 1.0f), *k = rand_host(nk, 1.0f), *v = rand_host(nk, 1.0f);
    float *dq = dev_copy(q, nq * 4), *dk = dev_copy(k, nk * 4), *dv = dev_copy(v, nk * 4);
    float *q_in = dev_copy(q, nq * 4), *k_in = dev_copy(k, nk * 4); /* before the CPU's rope turns q and k */
    tsr_batch_layout bc = view(&h, 0, max_pos), bg = view(&h, 1, max_pos);
    cpu->rope(&bc, q, nh, d, rot_dim);
    cpu->rope(&bc, k, nkv, d, rot_dim);
    cpu->kv_store(&bc, &kc, 0, k, v);
    gpu->rope_store(&bg, dq, nh, dk, dv, &kg, 0, rot_dim);
    char what[96];
    snprintf(what, sizeof what, "rope_store d%d rot %d %s %s", d, rot_dim, tsr_dtype_name(kv_dtype),
             decode ? "decode" : "prefill");
    float *got = to_host(dq, nq);
    expect_close(what, got, q, nq, 2e-6);
    free(got);
    got = to_host(dk, nk);
    expect_close("  its k", got, k, nk, 2e-6);
    free(got);
    if (tsr_kv_is_quant(kv_dtype)) { /* the quantized store: as rope, rope, kv_store on the GPU, byte for byte */
        check_rope_store_quant(&h, &bg, &kg, d, rot_dim, q_in, k_in, dq, dk, dv);
    } else { /* the caches, as floats */
        const size_t elems = (size_t)n_pages * page * nkv * d, es = tsr_dtype_size(kv_dtype);
        for (int which = 0; which < 2; which++) {
            const void *src = which ? kg.v[0] : kg.k[0];
            unsigned char *raw = host_bytes(gpu, src, elems * es);
            const unsigned char *ref = which ? kc.v[0] : kc.k[0];
            float *a = malloc(elems * 4), *b = malloc(elems * 4);
            for (size_t i = 0; i < elems; i++) {
                a[i] = kv_dtype == TSR_F16 ? tsr_half_to_float(((uint16_t *)raw)[i]) : ((float *)raw)[i];
                b[i] = kv_dtype == TSR_F16 ? tsr_half_to_float(((const uint16_t *)ref)[i]) : ((const float *)ref)[i];
            }
            expect_close(which ? "  its V cache" : "  its K cache", a, b, elems, kv_dtype == TSR_F16 ? 1e-3 : 2e-6);
            free(a), free(b), free(raw);
        }
    }
    gpu->release(dq), gpu->release(dk), gpu->release(dv), gpu->release(q_in), gpu->release(k_in);
    free(q), free(k), free(v);
    free_view(&bg);
    tsr_kv_free(&kc);
    tsr_kv_free(&kg);
}

static void test_rope_store(void **state)
{
    (void)state;
    check_rope_store(128, TSR_F16, 128, 1);
    check_rope_store(128, TSR_F16, 128, 0);
    check_rope_store(64, TSR_F32, 64, 1);
    check_rope_store(128, TSR_F16, 64, 0); /* partial rotary: dims past 64 stored as they are */
    check_rope_store(96, TSR_F32, 32, 1);
    check_rope_store(96, TSR_F32, 32, 0); /* 232 rows: from 64 a block per row, pairs of values per item */
    check_rope_store(96, TSR_F16, 30, 0); /* an odd count of rotary pairs: one value per item */
    /* quantized caches: rope of q and k and the store in one launch (kv_store_quant.cu) */
    check_rope_store(128, TSR_KV_Q4, 128, 1);
    check_rope_store(128, TSR_KV_Q6, 128, 0);
    check_rope_store(64, TSR_KV_Q8, 64, 0);
    check_rope_store(128, TSR_KV_Q4, 64, 0); /* partial rotary: partners in the same chunk */
    check_rope_store(256, TSR_KV_Q8, 96, 1);
}

/* ---- quantized KV caches (Q4/Q6/Q8) ---- */

/* Whether the GPU attends over a quantized cache with rebuilt fp16 rows (kvq_tile.cuh: the decode kernel's tiles, a
 * prefill's expanded context) rather than in the codes' rotated domain as the CPU does; `prefill`: the batch has
 * prefill rows (the tensor-core prefill kernel), else the decode kernel (at most 16 query heads per KV head). */
static int kvq_rebuilt(int d, int prefill)
{
    const int flash = !env_off("TSR_CUDA_FLASH"), decode_kernel = !env_off("TSR_CUDA_ATTN_DECODE");
    if (env_off("TSR_CUDA_ATTN_KVQ") || (d != 64 && d != 128)) return 0;
    return prefill ? flash || decode_kernel : decode_kernel; /* without the prefill kernel, the decode kernel */
}

/* The CPU's attention over the same K/V as fp16 plain-domain rows, which is what the GPU's fast paths compute from
 * a quantized cache: each history position dequantized (tsr_kv_read) and rounded to fp16, the chunk's own rows
 * (staged exactly) rounded to fp16, in an F16 cache with the same pages. */
static float *attention_rebuilt(const host_layout *h, const tsr_batch_layout *bc, const tsr_attn_args *a,
                                const tsr_kv_cache *kq, const float *chunk_k, const float *chunk_v, const float *q)
{
    tsr_kv_cache kf;
    assert_int_equal(tsr_kv_init(&kf, cpu, kq->n_layers, kq->n_kv_heads, kq->head_dim, kq->page_size, kq->n_pages,
                                 TSR_F16),
                     TSR_OK);
    const int w = kq->n_kv_heads * kq->head_dim;
    float *k = malloc((size_t)w * 4), *v = malloc((size_t)w * 4);
    for (int s = 0; s < h->n_seqs; s++) {
        const int32_t *table = h->tables + s * 256;
        const int r0 = h->seq_row0[s], p0 = h->positions[r0];
        for (int t = 0; t <= h->positions[h->seq_row0[s + 1] - 1]; t++) {
            if (t < p0)
                tsr_kv_read(kq, a->layer, table, t, k, v);
            else
                memcpy(k, chunk_k + (size_t)(r0 + t - p0) * w, (size_t)w * 4),
                    memcpy(v, chunk_v + (size_t)(r0 + t - p0) * w, (size_t)w * 4);
            const size_t off = tsr_kv_slot_offset(&kf, table, t);
            for (int i = 0; i < w; i++) {
                ((uint16_t *)kf.k[a->layer])[off + i] = tsr_float_to_half(k[i]);
                ((uint16_t *)kf.v[a->layer])[off + i] = tsr_float_to_half(v[i]);
            }
        }
    }
    const size_t n = (size_t)h->n_rows * a->n_heads * a->head_dim;
    float *out = malloc(n * 4);
    cpu->attention(bc, a, &kf, q, out);
    free(k), free(v);
    tsr_kv_free(&kf);
    return out;
}

/* Both backends store the same history and then a chunk per sequence (the chunk with the attention call's own
 * layout, as the forward pass does); codes, scales and staged rows must be identical byte for byte (the GPU
 * quantizer mirrors the CPU one's fp16 arithmetic), and attention must agree: the chunk read exactly from the
 * staging area, the history decoded from the codes, over several splits for the long decode contexts. Where the
 * GPU rebuilds fp16 rows (kvq_rebuilt) it must match the CPU over those rows, and stay within the fp16 rounding's
 * reach of the CPU's own attention. kind: test_batch's (0 prefill, 1 decode, 2 both in one batch, 3 decode rows with
 * long contexts, then chunks, a batch the GPU splits, 4 the same in the other order). */
static void check_attention_quant(int d, tsr_dtype mode, int window, int kind)
{
    const int nh = 8, nkv = 2, page = 16, n_pages = 1024, decode = kind == 1;
    host_layout h;
    const int max_pos = test_batch(&h, kind, page, n_pages, d / 2);
    tsr_kv_cache kc, kg;
    assert_int_equal(tsr_kv_init(&kc, cpu, 2, nkv, d, page, n_pages, mode), TSR_OK);
    assert_int_equal(tsr_kv_init(&kg, gpu, 2, nkv, d, page, n_pages, mode), TSR_OK);
    const int layer = 1;
    const size_t w = (size_t)nkv * d;
    /* history [0, first row's position) of every sequence, one store per sequence */
    for (int s = 0; s < h.n_seqs; s++) {
        int len = h.positions[h.seq_row0[s]];
        if (len == 0) continue;
        host_layout hist;
        int zero = 0;
        make_layout(&hist, 1, &zero, &len, page, n_pages, d / 2);
        memcpy(hist.tables, h.tables + s * 256, 256 * 4);
        float *k = rand_host((size_t)len * w, 2.0f), *v = rand_host((size_t)len * w, 1.0f);
        tsr_batch_layout bc = view(&hist, 0, len - 1), bg = view(&hist, 1, len - 1);
        cpu->kv_store(&bc, &kc, layer, k, v);
        float *dk = dev_copy(k, (size_t)len * w * 4), *dv = dev_copy(v, (size_t)len * w * 4);
        gpu->kv_store(&bg, &kg, layer, dk, dv);
        gpu->release(dk), gpu->release(dv);
        free_view(&bg);
        free(k), free(v);
    }
    /* the chunk rows, stored with the attention layout */
    tsr_batch_layout bc = view(&h, 0, max_pos), bg = view(&h, 1, max_pos);
    float *k = rand_host((size_t)h.n_rows * w, 2.0f), *v = rand_host((size_t)h.n_rows * w, 1.0f);
    /* a few all-zero head vectors and one saturating outlier */
    memset(k, 0, w * 4);
    v[3] = 30.0f;
    cpu->kv_store(&bc, &kc, layer, k, v);
    float *dk = dev_copy(k, (size_t)h.n_rows * w * 4), *dv = dev_copy(v, (size_t)h.n_rows * w * 4);
    gpu->kv_store(&bg, &kg, layer, dk, dv);
    /* storage, byte for byte */
    const size_t elems = (size_t)n_pages * page * w;
    const void *cpu_arr[] = {kc.k[layer], kc.v[layer], kc.k_scale[layer], kc.v_scale[layer], kc.stage_k, kc.stage_v,
                             kc.stage_key};
    const void *gpu_arr[] = {kg.k[layer], kg.v[layer], kg.k_scale[layer], kg.v_scale[layer], kg.stage_k, kg.stage_v,
                             kg.stage_key};
    const size_t bytes[] = {elems * kc.k_bits / 8, elems * kc.v_bits / 8, elems / 32 * 2, elems / 32 * 2,
                            (size_t)kc.stage_rows * w * 2, (size_t)kc.stage_rows * w * 2,
                            ((size_t)kc.stage_rows + 1) * 8};
    static const char *names[] = {"K codes", "V codes", "K scales", "V scales", "staged K", "staged V", "stage keys"};
    for (int i = 0; i < 7; i++) {
        unsigned char *hc = host_bytes(cpu, cpu_arr[i], bytes[i]), *hg = host_bytes(gpu, gpu_arr[i], bytes[i]);
        size_t diff = 0, first = 0;
        for (size_t j = 0; j < bytes[i]; j++)
            if (hc[j] != hg[j] && !diff++) first = j;
        if (diff)
            fail_msg("kv_store %s d%d: %s differ from the CPU's in %zu of %zu bytes (first at %zu: %u vs %u)",
                     tsr_kv_dtype_name(mode), d, names[i], diff, bytes[i], first, hg[first], hc[first]);
        free(hc), free(hg);
    }
    size_t n = (size_t)h.n_rows * nh * d;
    float *q = rand_host(n, 1.0f), *want = malloc(n * 4);
    tsr_attn_args a = {nh, nkv, d, 1.0f / sqrtf((float)d), window, layer, NULL};
    cpu->attention(&bc, &a, &kc, q, want);
    float *dq = dev_copy(q, n * 4), *dout = dev_poisoned(n);
    gpu->attention(&bg, &a, &kg, dq, dout);
    float *got = to_host(dout, n);
    char what[96];
    static const char *kinds[] = {"prefill", "decode", "mixed", "split", "chunks, then decode", "deep chunks"};
    snprintf(what, sizeof what, "attention d%d kv %s %s window %d", d, tsr_kv_dtype_name(mode), kinds[kind], window);
    if (kvq_rebuilt(d, !decode)) {
        float *want16 = attention_rebuilt(&h, &bc, &a, &kc, k, v, q);
        /* the prefill kernel's queries and probabilities are fp16 (check_attention_heads), the decode kernel's
         * hi + lo pairs are as exact as fp32; on the H200 3e-7 (decode) and 2e-5 (prefill) against these rows, and
         * 2e-5 to 6e-5 against the CPU's rotated domain */
        expect_close(what, got, want16, n, decode ? 1e-5 : 1e-3);
        expect_close("  against the rotated-domain CPU", got, want, n, 1e-3);
        if (kind == 3 && !env_off("TSR_CUDA_FLASH")) {
            /* the split: decode rows as exact as the decode kernel's, chunks with fp16 probabilities */
            const size_t cut = (size_t)h.seq_row0[3] * nh * d;
            expect_close("  its decode rows (the decode kernel)", got, want16, cut, 1e-5);
            const double e = rel_err(got + cut, want16 + cut, n - cut);
            print_message("  %-40s rel err %.2e\n", "  its chunks (over a copy)", e);
            if (!(e >= 2e-6)) fail_msg("%s: the chunks' rows are exact (%.2e): the copy did not run", what, e);
        }
        free(want16);
    } else {
        expect_close(what, got, want, n, 2e-5);
    }
    free(got), free(q), free(want), free(k), free(v);
    gpu->release(dq), gpu->release(dout), gpu->release(dk), gpu->release(dv);
    free_view(&bg);
    tsr_kv_free(&kc);
    tsr_kv_free(&kg);
}

static void test_attention_kv_quant(void **state)
{
    (void)state;
    const tsr_dtype modes[] = {TSR_KV_Q4, TSR_KV_Q6, TSR_KV_Q8};
    for (int m = 0; m < 3; m++) {
        check_attention_quant(64, modes[m], 0, 1);
        check_attention_quant(128, modes[m], 0, 1);
        check_attention_quant(128, modes[m], 0, 0);
        check_attention_quant(64, modes[m], 40, 0);
        check_attention_quant(128, modes[m], 0, 2);
        check_attention_quant(128, modes[m], 0, 3);
        check_attention_quant(64, modes[m], 0, 4);
        check_attention_quant(64, modes[m], 100, 1);
        check_attention_quant(192, modes[m], 300, 1);
        check_attention_quant(256, modes[m], 0, 0);
        check_attention_quant(64, modes[m], 100, 5);  /* the copy from each sequence's window start */
        check_attention_quant(128, modes[m], 250, 5);
        check_attention_quant(128, modes[m], 0, 5);
    }
}

/* A GPU op that adds its product to the residual x and, with w, writes out = rmsnorm(x) · w (linear_add_norm and
 * silu_linear_add_norm), with what it needs besides. */
typedef struct {
    void (*run)(const void *ctx, float *dx, const tsr_dense *w, float *dout);
    const void *ctx;
} residual_op;

/* The reference for a product of L: for quantized layers qmatrix_ref_product (tests/common/exl2_synth.h: double
 * over the exactly dequantized weights). The CPU op takes a group's zero point off as zero · Σx after Σ code · x
 * (kernels/cpu/matmul_exl2.c), and that cancellation leaves up to ~1e-5 of relative error at these sizes, all of
 * quant_tol's margin below 5 rows (stop 51: 1.1e-5 on one draw of the MLP test's data). Dense layers go to the CPU
 * op. */
static void ref_linear(const tsr_linear *L, const float *x, int M, float *y)
{
    if (L->kind != TSR_LINEAR_EXL2)
        cpu->linear(L, x, M, y);
    else
        qmatrix_ref_product(&L->q, x, M, L->N, y);
}

/* The tolerance of a quantized product of M rows against ref_linear: as exact as fp32 up to 4 rows (activations as
 * fp16 hi + lo halves), fp16 activations above (5-8 rows in sm_90's bulk GEMV, 9 and more in every kernel). */
static double quant_tol(int M)
{
    return M <= 4 ? 1e-5 : 2e-3;
}

/* The op against the CPU's add and rmsnorm of its product prod (M rows of N): the sum, the norm, and the plain add
 * when w is NULL; label names the case. */
static void check_residual(const residual_op *op, const float *prod, int M, int N, const char *label)
{
    norm_weight w = norm_weight_new(N);
    float *res = rand_host((size_t)M * N, 1.0f), *want = malloc((size_t)M * N * 4), *normed = malloc((size_t)M * N * 4);
    memcpy(want, res, (size_t)M * N * 4);
    cpu->add(want, prod, (size_t)M * N);
    cpu->rmsnorm(want, &w.host, 1e-5f, M, N, normed);
    const double tol = quant_tol(M);
    for (int with_norm = 1; with_norm >= 0; with_norm--) {
        float *dres = dev_copy(res, (size_t)M * N * 4), *dout = dev_poisoned((size_t)M * N);
        op->run(op->ctx, dres, with_norm ? &w.dev : NULL, dout);
        float *got = to_host(dres, (size_t)M * N);
        char what[96];
        snprintf(what, sizeof what, "%s: the sum%s", label, with_norm ? "" : " (no norm)");
        expect_close(what, got, want, (size_t)M * N, tol);
        free(got);
        if (with_norm) {
            got = to_host(dout, (size_t)M * N);
            snprintf(what, sizeof what, "%s: the norm", label);
            expect_close(what, got, normed, (size_t)M * N, tol);
            free(got);
        }
        gpu->release(dres), gpu->release(dout);
    }
    free(res), free(want), free(normed);
    norm_weight_free(&w);
}

typedef struct {
    const tsr_linear *L;
    const float *da;
    int M;
} lan_ctx;

static void run_linear_add_norm(const void *ctx, float *dx, const tsr_dense *w, float *dout)
{
    const lan_ctx *c = ctx;
    gpu->linear_add_norm(c->L, c->da, c->M, dx, w, 1e-5f, dout);
}

/* linear_add_norm against the CPU's linear, add and rmsnorm: the residual x += a · W (the GEMV's K-split parts
 * added in the residual pass), then out = rmsnorm(x) · w, and the plain add when w is NULL. da: a on the device;
 * prod: the CPU product a · W of M rows. */
static void check_linear_add_norm(const tsr_linear *Lc, const tsr_linear *Lg, const float *da, const float *prod, int M)
{
    const lan_ctx c = {Lg, da, M};
    const residual_op op = {run_linear_add_norm, &c};
    char label[64];
    snprintf(label, sizeof label, "linear_add_norm M=%d", M);
    check_residual(&op, prod, M, Lc->N, label);
}

typedef struct {
    const tsr_linear *L;
    const float *gate; /* host: the op overwrites its device copy, made afresh per call */
    const float *dup;
    size_t n;
    int offset, M;
} silu_ctx;

static void run_silu_linear_add_norm(const void *ctx, float *dx, const tsr_dense *w, float *dout)
{
    const silu_ctx *c = ctx;
    float *dgate = dev_copy(c->gate, c->n * 4);
    gpu->silu_linear_add_norm(c->L, dgate + c->offset, c->dup + c->offset, c->M, dx, w, 1e-5f, dout);
    gpu->release(dgate);
}

/* silu_linear_add_norm against the CPU's silu_mul, linear, add and rmsnorm, at M rows of random gate and up (from
 * the dequantize path's rows, the gating folded into its input pass; below, silu_mul and linear_add_norm), and with
 * x NULL (the product alone, as a tensor shard runs it). With
 * `offset`, gate and up start one float past their allocation, off the 16-byte alignment of the pass's float4
 * loads, so that its scalar loop runs. */
static void check_silu_linear_add_norm(const tsr_linear *Lc, const tsr_linear *Lg, int M, int offset)
{
    const int K = Lc->K, N = Lc->N;
    const size_t nk = (size_t)M * K + (size_t)offset;
    float *gate = rand_host(nk, 2.0f), *up = rand_host(nk, 1.0f), *act = malloc(nk * 4),
          *prod = malloc((size_t)M * N * 4);
    cpu->silu_mul(gate + offset, up + offset, (size_t)M * K, act);
    ref_linear(Lc, act, M, prod);
    float *dup = dev_copy(up, nk * 4);
    const silu_ctx c = {Lg, gate, dup, nk, offset, M};
    const residual_op op = {run_silu_linear_add_norm, &c};
    char label[64];
    snprintf(label, sizeof label, "silu_linear_add_norm M=%d%s", M, offset ? " unaligned" : "");
    check_residual(&op, prod, M, N, label);
    /* x NULL (a tensor shard): the product alone */
    float *dgate = dev_copy(gate, nk * 4), *dout = dev_poisoned((size_t)M * N);
    gpu->silu_linear_add_norm(Lg, dgate + offset, dup + offset, M, NULL, NULL, 1e-5f, dout);
    float *got = to_host(dout, (size_t)M * N);
    snprintf(label, sizeof label, "silu_linear_add_norm M=%d%s: the product alone", M, offset ? " unaligned" : "");
    expect_close(label, got, prod, (size_t)M * N, quant_tol(M));
    free(got);
    gpu->release(dgate), gpu->release(dout);
    gpu->release(dup);
    free(gate), free(up), free(act), free(prod);
}

/* A random EXL2 matrix of N columns (the first `used` of them in use) and the given groups, loaded, and uploaded as
 * the head of a host model shell with no layers, so that prepare_model uploads that one matrix. */
typedef struct {
    synth_matrix m;
    tsr_st_set *set;
    tsr_linear L;     /* host view (the CPU reference) */
    tsr_model shell;  /* shell.head: the device view */
} gpu_head;

static int g_rows_in_order; /* gpu_head_open: the matrix's rows stored in input order (no act-order permutation) */

static void gpu_head_open(gpu_head *h, int N, int used, int G, const int *bits, const int *rows)
{
    static uint16_t one[8]; /* the shell's 1 × 8 embedding and final norm, never read */
    make_matrix(&h->m, N, G, bits, rows, 1);
    for (int k = 0; g_rows_in_order && k < h->m.K; k++) h->m.invperm[k] = k;
    tsr_qmatrix q;
    assert_int_equal(load(&h->m, NULL, &h->set, &q), TSR_OK);
    h->L = (tsr_linear){.kind = TSR_LINEAR_EXL2, .K = q.K, .N = used, .q = q};
    memset(&h->shell, 0, sizeof h->shell);
    h->shell.embed = (tsr_dense){TSR_F16, 1, 8, one, NULL};
    h->shell.final_norm = h->shell.embed;
    h->shell.head = h->L;
    assert_int_equal(gpu->prepare_model(&h->shell), TSR_OK);
}

static void gpu_head_close(gpu_head *h)
{
    gpu->release_model(&h->shell);
    tsr_qmatrix_free(&h->L.q);
    tsr_st_set_free(h->set);
    free_matrix(&h->m);
}

/* h's matrix at M rows (dx on the device, want from the CPU) through linear, then `parts` copies of it through
 * linear_many (one grouped launch up to 32 rows, with its own output and partial-sum stretch per part), each
 * within tol; label names the path. */
static void check_linear(gpu_head *h, const float *dx, const float *want, int M, int parts, double tol,
                         const char *label)
{
    const size_t n = (size_t)M * h->L.N;
    char what[80];
    float *dy = dev_poisoned(n);
    gpu->linear(&h->shell.head, dx, M, dy);
    float *got = to_host(dy, n);
    snprintf(what, sizeof what, "EXL2 linear M=%d (%s)", M, label);
    expect_close(what, got, want, n, tol);
    free(got);
    gpu->release(dy);
    float *dys[3];
    const tsr_linear *same[3];
    assert_true(parts <= 3); /* q/k/v: the most matrices the engine groups */
    for (int i = 0; i < parts; i++) dys[i] = dev_poisoned(n), same[i] = &h->shell.head;
    gpu->linear_many(same, parts, dx, M, dys);
    for (int i = 0; i < parts; i++) {
        got = to_host(dys[i], n);
        snprintf(what, sizeof what, "EXL2 linear_many part %d/%d M=%d (%s)", i, parts, M, label);
        expect_close(what, got, want, n, tol);
        free(got);
        gpu->release(dys[i]);
    }
}

static void test_linear_exl2(void **state)
{
    (void)state;
    const int bits[] = {8, 6, 5, 4, 3, 2};
    const int rows[] = {32, 64, 96, 160, 256, 48};
    gpu_head h;
    gpu_head_open(&h, 352, 341, 6, bits, rows);
    const tsr_linear L = h.L;
    const int Ms[] = {1, 2, 3, 4, 5, 8, 9, 17, 32, 33, 40, 56, 57, 64, 65, 100, 150, 180, 200, 300};
    for (size_t t = 0; t < sizeof Ms / sizeof Ms[0]; t++) {
        int M = Ms[t];
        float *x = rand_host((size_t)M * L.K, 1.0f), *want = malloc((size_t)M * L.N * 4);
        ref_linear(&L, x, M, want);
        float *dx = dev_copy(x, (size_t)M * L.K * 4);
        /* above 4 rows the GEMV rounds activations to fp16 (above 8 off sm_90; 33-64 rows: chunks of 32 on sm_90), and
         * from TSR_CUDA_DQ_MIN_M rows (65 on sm_90, else 33) the dequantized cuBLAS GEMM rounds activations and weights
         * to fp16 */
        check_linear(&h, dx, want, M, 3, quant_tol(M),
                     M <= 8    ? "GEMV"
                     : M <= 32 ? "GEMV, fp16 activations"
                     : M <= 64 ? "sm_90: GEMV chunks"
                               : "GEMM");
        check_linear_add_norm(&L, &h.shell.head, dx, want, M);
        check_silu_linear_add_norm(&L, &h.shell.head, M, 0);
        free(x), free(want);
        gpu->release(dx);
    }
    check_silu_linear_add_norm(&L, &h.shell.head, 100, 1);
    gpu_head_close(&h);
}

/* linear_add_norm over a long K (3072 rows: 96 units), so that the residual pass adds more K-split parts than it
 * loads at once (8): 8 parts at one row, 12 from 2 rows on sm_90 (the bulk kernel's plan), i.e. a full group of
 * eight and a partial one. At 100 and 200 rows, where the wgmma product takes them, it splits K (a few column tiles,
 * 48 stages) and its reduction adds the partial sums before the norm, for 341 columns and for 512 (every column a
 * vector store of the product's staged epilogue); silu_linear_add_norm the same. */
static void test_linear_add_norm_splits(void **state)
{
    (void)state;
    const int bits[] = {8, 6, 6, 5, 5, 4, 4, 4, 3, 3, 2, 2}; /* widths never increase (EXL2.md; the loader checks) */
    const int rows[] = {256, 256, 256, 256, 256, 256, 256, 256, 256, 256, 256, 256};
    const int shapes[2][2] = {{352, 341}, {512, 512}}; /* columns, of which in use */
    const int Ms[] = {1, 2, 8, 100, 200};
    for (int sh = 0; sh < 2; sh++) {
        gpu_head h;
        gpu_head_open(&h, shapes[sh][0], shapes[sh][1], 12, bits, rows);
        const tsr_linear L = h.L;
        for (size_t t = 0; t < sizeof Ms / sizeof Ms[0]; t++) {
            const int M = Ms[t];
            float *x = rand_host((size_t)M * L.K, 1.0f), *want = malloc((size_t)M * L.N * 4);
            ref_linear(&L, x, M, want);
            float *dx = dev_copy(x, (size_t)M * L.K * 4);
            check_linear_add_norm(&L, &h.shell.head, dx, want, M);
            if (M > 8) check_silu_linear_add_norm(&L, &h.shell.head, M, 0);
            free(x), free(want);
            gpu->release(dx);
        }
        gpu_head_close(&h);
    }
}

/* A matrix of N columns (the first `used` in use) and the given groups against the CPU at each of the nM row counts,
 * alone and as two parts of one launch (check_linear); label names the case. */
static void check_linear_rows(int N, int used, int G, const int *bits, const int *rows, const int *Ms, int nM,
                              const char *label)
{
    gpu_head h;
    gpu_head_open(&h, N, used, G, bits, rows);
    const tsr_linear L = h.L;
    for (int t = 0; t < nM; t++) {
        const int M = Ms[t];
        float *x = rand_host((size_t)M * L.K, 1.0f), *want = malloc((size_t)M * L.N * 4);
        ref_linear(&L, x, M, want);
        float *dx = dev_copy(x, (size_t)M * L.K * 4);
        check_linear(&h, dx, want, M, 2, quant_tol(M), label);
        free(x), free(want);
        gpu->release(dx);
    }
    gpu_head_close(&h);
}

/* A padded unit in the middle of K (an 8-bit group of 36 rows, then 3-bit of 32: K = 68, 96 unit rows) through the
 * GEMV at one row and the dequantize path at 100 rows, where the activations' permutation writes zeros on the
 * padding rows (matmul.cu); then at 100 rows again with the input 4 bytes past 16-byte alignment, which that pass
 * reads one value at a time. (Every EXL2 width packs whole 32-bit words only from 4 rows, so K is always a multiple
 * of 4.) */
static void test_linear_padded_k(void **state)
{
    (void)state;
    const int bits[] = {8, 3}, rows[] = {36, 32};
    const struct {
        int M, off; /* rows; the input's offset in floats from its 16-byte aligned allocation */
    } cases[] = {{1, 0}, {100, 0}, {100, 1}};
    gpu_head h;
    gpu_head_open(&h, 160, 150, 2, bits, rows);
    const tsr_linear L = h.L;
    assert_int_equal(L.K, 68);
    for (size_t t = 0; t < sizeof cases / sizeof cases[0]; t++) {
        const int M = cases[t].M, off = cases[t].off;
        float *x = rand_host((size_t)M * L.K + 1, 1.0f), *want = malloc((size_t)M * L.N * 4);
        ref_linear(&L, x + off, M, want);
        float *dx = dev_copy(x, ((size_t)M * L.K + 1) * 4);
        check_linear(&h, dx + off, want, M, 2, quant_tol(M), off ? "K = 68, unaligned input" : "K = 68");
        free(x), free(want);
        gpu->release(dx);
    }
    gpu_head_close(&h);
}

/* A matrix wider than one wave of GEMV blocks (313 column groups of 128, more than two per SM on any current GPU),
 * so that the one-row GEMV splits K to balance its waves (fg_plan), alone and as two parts of one launch (as 70B's
 * gate and up), against the CPU; from 2 rows sm_90 takes the bulk kernel and its own plan. */
static void test_linear_waves(void **state)
{
    (void)state;
    const int bits[] = {6, 4, 4, 3}, rows[] = {256, 256, 256, 256}, Ms[] = {1, 4};
    check_linear_rows(40064, 40000, 4, bits, rows, Ms, 2, "40000 columns");
}

/* 4-bit groups of 1024 and 2080 rows in a matrix of 16384 columns, so that at one row each warp of the GEMV streams
 * a dozen units of one group over several ring steps and the integer path (with TSR_CUDA_GEMV_IMMA=1, as
 * test_cuda_imma runs: gemv_imma.cuh) flushes its int sums inside a group (every 4 units) as well as at group ends, K
 * split over two blocks. */
static void test_linear_long_groups(void **state)
{
    (void)state;
    const int bits[] = {6, 4, 4, 3}, rows[] = {64, 1024, 2080, 96}, Ms[] = {1, 2};
    check_linear_rows(16384, 16000, 4, bits, rows, Ms, 2, "long 4-bit groups");
}

/* A matrix stored in input order whose groups fill whole units, so that its unit order is its input's
 * (uperm_identity): from 65 rows (sm_90; 33 elsewhere) matmul.cu converts its input straight instead of through the
 * permutation, alone and as two parts of one launch; under TSR_CUDA_CONVERT=0 (test_cuda_convertoff) through the
 * permutation. */
static void test_linear_in_order(void **state)
{
    (void)state;
    const int bits[] = {6, 4, 3}, rows[] = {64, 256, 96}, Ms[] = {100, 40, 1};
    g_rows_in_order = 1;
    check_linear_rows(256, 250, 3, bits, rows, Ms, 3, "rows in input order");
    g_rows_in_order = 0;
}

/* 48 groups of 32 rows (K = 1536: 48 units) at 300 rows and 512 columns, every width: with TSR_CUDA_DQ_WGMMA=1 (as
 * test_cuda_dqwgmma runs: kernels/cuda/gemm_dq_wgmma.cu) the groups' parameters arrive in three batches of 16 groups
 * and the ring's two halves are each refilled; then 40 rows (the GEMV's chunks). */
static void test_linear_many_groups(void **state)
{
    (void)state;
    int bits[48], rows[48];
    const int widths[] = {8, 6, 5, 4, 3, 2};
    for (int g = 0; g < 48; g++) bits[g] = widths[g / 8], rows[g] = 32; /* widths never increase */
    const int Ms[] = {300, 150, 40};
    check_linear_rows(512, 500, 48, bits, rows, Ms, 3, "48 groups of 32 rows");
}

/* K split into ranges whose even shares start at stages that straddle two batches of 16 groups' parameters: a group
 * of 64 rows, then 46 of 32 (48 units, 24 stages; group 16 starts at unit 17, group 32 at unit 33). With
 * TSR_CUDA_DQ_WGMMA=1 and TSR_CUDA_DW_SPLITS=3 (test_cuda_dwsplit3) the wgmma product's ranges would start at stages
 * 8 and 16, each of whose two units lie in two batches; they start one stage later (gemm_dq_wgmma.cu,
 * dw_split_start). Elsewhere the same product through whichever path takes it. */
static void test_linear_split_straddle(void **state)
{
    (void)state;
    int bits[47], rows[47];
    const int widths[] = {8, 6, 5, 4, 3, 2};
    for (int g = 0; g < 47; g++) bits[g] = widths[g / 8], rows[g] = g ? 32 : 64;
    const int Ms[] = {300, 150, 70};
    check_linear_rows(512, 500, 47, bits, rows, Ms, 3, "ranges past a straddling stage");
}

/* Whether a decode GEMV of M rows takes activations staged ahead by the launch before it (stage_ahead.cuh): not with
 * TSR_CUDA_STAGE_AHEAD=0, nor for exact rows (up to 4) with TSR_CUDA_GEMV_PRESTAGE=0, where its blocks gather
 * theirs; never above 8 rows. */
static int staged_ahead(int M)
{
    if (env_off("TSR_CUDA_STAGE_AHEAD") || M > 8) return 0;
    return M > 4 || !env_off("TSR_CUDA_GEMV_PRESTAGE");
}

/* Gate, up and down as layer 0 of a host model shell, so that prepare_model uploads them as a model's MLP: gate's
 * and up's columns in down's stored-row order (backend.cu, fold_mlp). */
typedef struct {
    gpu_head g, u, d; /* the matrices (each also uploaded alone as a head, unused) and their host views */
    tsr_layer layer;
    tsr_model shell;
} gpu_mlp;

static void gpu_mlp_open(gpu_mlp *m, int H, int I, int gn, const int *gbits, const int *grows, int un, const int *ubits,
                         const int *urows, int dn, const int *dbits, const int *drows, const tsr_dense *mlp_norm)
{
    static uint16_t one[8];
    gpu_head_open(&m->g, I, I, gn, gbits, grows);
    gpu_head_open(&m->u, I, I, un, ubits, urows);
    gpu_head_open(&m->d, H, H, dn, dbits, drows);
    assert_int_equal(m->g.L.K, H);
    assert_int_equal(m->d.L.K, I);
    memset(&m->layer, 0, sizeof m->layer);
    m->layer.gate = m->g.L, m->layer.up = m->u.L, m->layer.down = m->d.L;
    if (mlp_norm) m->layer.mlp_norm = *mlp_norm; /* its readers, gate and up, registered by prepare_model */
    memset(&m->shell, 0, sizeof m->shell);
    m->shell.cfg.n_layers = 1;
    m->shell.layers = &m->layer;
    m->shell.embed = (tsr_dense){TSR_F16, 1, 8, one, NULL};
    m->shell.final_norm = m->shell.embed;
    assert_int_equal(gpu->prepare_model(&m->shell), TSR_OK);
}

static void gpu_mlp_close(gpu_mlp *m)
{
    gpu->release_model(&m->shell);
    gpu_head_close(&m->d), gpu_head_close(&m->u), gpu_head_close(&m->g);
}

/* The CPU's MLP product of M rows of h: (silu(h · gate) ⊙ (h · up)) · down. */
static float *mlp_product(const gpu_mlp *m, const float *h, int M)
{
    const int I = m->g.L.N;
    float *gv = malloc((size_t)M * I * 4), *uv = malloc((size_t)M * I * 4), *prod = malloc((size_t)M * m->d.L.N * 4);
    ref_linear(&m->g.L, h, M, gv);
    ref_linear(&m->u.L, h, M, uv);
    cpu->silu_mul(gv, uv, (size_t)M * I, gv);
    ref_linear(&m->d.L, gv, M, prod);
    free(gv), free(uv);
    return prod;
}

typedef struct {
    const tsr_layer *ly;
    const float *dh;
    int M;
} mlp_ctx;

/* mlp_add_norm with poisoned scratch buffers for gate's and up's products */
static void run_mlp_add_norm(const void *ctx, float *dx, const tsr_dense *w, float *dout)
{
    const mlp_ctx *c = ctx;
    const size_t n = (size_t)c->M * c->ly->gate.N;
    float *sg = dev_poisoned(n), *su = dev_poisoned(n);
    assert_int_equal(gpu->mlp_add_norm(&c->ly->gate, &c->ly->up, &c->ly->down, c->dh, c->M, dx, w, 1e-5f, dout, sg, su),
                     1);
    gpu->release(sg), gpu->release(su);
}

/* The MLP as forward.c runs it without mlp_add_norm: linear_many on gate and up, then silu_linear_add_norm. */
static void run_mlp_separate(const void *ctx, float *dx, const tsr_dense *w, float *dout)
{
    const mlp_ctx *c = ctx;
    const size_t n = (size_t)c->M * c->ly->gate.N;
    float *dg = dev_poisoned(n), *du = dev_poisoned(n);
    const tsr_linear *gu[2] = {&c->ly->gate, &c->ly->up};
    float *ys[2] = {dg, du};
    gpu->linear_many(gu, 2, c->dh, c->M, ys);
    const unsigned long long taken = tsr_cuda_staged_taken();
    gpu->silu_linear_add_norm(&c->ly->down, dg, du, c->M, dx, w, 1e-5f, dout);
    /* silu_mul staged down's activations ahead */
    assert_int_equal(tsr_cuda_staged_taken() - taken, staged_ahead(c->M));
    gpu->release(dg), gpu->release(du);
}

/* A folded MLP (gate's and up's columns in down's stored-row order) through the separate launches at 1, 3 and 100
 * rows (one-row GEMV, bulk GEMV, dequantize path) and, where the backend has mlp_add_norm, through it at one row
 * (the persistent launch) and at 100 (gate and up in fp16, unless TSR_CUDA_MLP_HALF=0 leaves that out). */
static void check_mlp(const gpu_mlp *m, const char *label)
{
    const int H = m->g.L.K, Ms[] = {1, 3, 100};
    for (size_t t = 0; t < sizeof Ms / sizeof Ms[0]; t++) {
        const int M = Ms[t];
        float *h = rand_host((size_t)M * H, 1.0f), *prod = mlp_product(m, h, M), *dh = dev_copy(h, (size_t)M * H * 4);
        const mlp_ctx c = {&m->layer, dh, M};
        char what[96];
        snprintf(what, sizeof what, "%s, separate launches M=%d", label, M);
        const residual_op sep = {run_mlp_separate, &c};
        check_residual(&sep, prod, M, m->d.L.N, what);
        /* the fp16 MLP is left out under either switch (matmul.cu tsr_cuda_mlp_half) */
        const int half_on = !env_off("TSR_CUDA_MLP_HALF") && !env_off("TSR_CUDA_SILU_FOLD");
        if (gpu->mlp_add_norm && (M == 1 || (M == 100 && half_on))) {
            snprintf(what, sizeof what, "%s, mlp_add_norm M=%d", label, M);
            const residual_op op = {run_mlp_add_norm, &c};
            check_residual(&op, prod, M, m->d.L.N, what);
        }
        gpu->release(dh);
        free(h), free(prod);
    }
}

/* The fused MLP of one row takes gate's and up's activations as the residual pass that wrote its input staged them
 * (add_rmsnorm with the layer's MLP norm, whose readers gate and up are) instead of staging its own: x + y normed,
 * then the MLP's product added to a residual, against the CPU. */
static void check_mlp_takes_staged(gpu_mlp *m)
{
    if (!gpu->mlp_add_norm) return;
    const int H = m->g.L.K, N = m->d.L.N;
    float *x = rand_host(H, 1.0f), *y = rand_host(H, 1.0f), *res = rand_host(N, 1.0f), *h = malloc((size_t)H * 4);
    float *dx = dev_copy(x, (size_t)H * 4), *dy = dev_copy(y, (size_t)H * 4), *dres = dev_copy(res, (size_t)N * 4);
    float *dh = dev_poisoned(H), *sg = dev_poisoned(m->g.L.N), *su = dev_poisoned(m->g.L.N);
    cpu->add(x, y, H);
    cpu->rmsnorm(x, &m->layer.mlp_norm, 1e-5f, 1, H, h);
    float *prod = mlp_product(m, h, 1);
    cpu->add(res, prod, N);
    gpu->add_rmsnorm(dx, dy, &m->layer.mlp_norm, 1e-5f, 1, H, dh);
    const unsigned long long taken = tsr_cuda_staged_taken();
    assert_int_equal(gpu->mlp_add_norm(&m->layer.gate, &m->layer.up, &m->layer.down, dh, 1, dres, NULL, 1e-5f, NULL,
                                       sg, su),
                     1);
    assert_int_equal(tsr_cuda_staged_taken() - taken, staged_ahead(1));
    float *got = to_host(dres, N);
    expect_close("fused MLP on entries staged ahead: the sum", got, res, N, quant_tol(1));
    free(got), free(x), free(y), free(res), free(h), free(prod);
    gpu->release(dx), gpu->release(dy), gpu->release(dres), gpu->release(dh), gpu->release(sg), gpu->release(su);
}

/* Prefill products that take their input from the norm before them (matmul.cu, prefill's hand-off): one for M rows
 * whose q/k/v products run on the dequantize path (q's; k shares its unit order and its converted input, v converts
 * its own), none when TSR_CUDA_DQ_HANDOFF=0 or for decode rows. */
static unsigned long long handed_off(int M)
{
    return !env_off("TSR_CUDA_DQ_HANDOFF") && M >= 100 ? 1 : 0;
}

/* Batched k/v products on the dequantize path for one q/k/v of 100 rows whose k and v share a shape and a unit order:
 * one, none with TSR_CUDA_DQ_PAIR=0, or where the wgmma product takes q, k and v at 100 rows (TSR_CUDA_DQ_WGMMA=1,
 * or its default rows). */
static unsigned long long kv_paired(void)
{
    return env_off("TSR_CUDA_DQ_PAIR") || tsr_cuda_dq_wgmma_rows(100) ? 0 : 1;
}

/* Prefill's hand-off into the MLP (matmul.cu): the MLP norm over 100 rows (the dequantize path) writes gate's input
 * converted, and the MLP that follows (mlp_add_norm, or as forward.c runs it without: linear_many on gate and up,
 * then silu_linear_add_norm) must take it once (gate; up shares its order or converts its own): x normed, then the
 * MLP's product added to a residual, against the CPU. */
static void check_mlp_takes_handoff(gpu_mlp *m)
{
    const int M = 100, H = m->g.L.K, N = m->d.L.N, I = m->g.L.N;
    float *x = rand_host((size_t)M * H, 1.0f), *res = rand_host((size_t)M * N, 1.0f), *h = malloc((size_t)M * H * 4);
    float *dx = dev_copy(x, (size_t)M * H * 4), *dres = dev_copy(res, (size_t)M * N * 4);
    float *dh = dev_poisoned((size_t)M * H);
    float *sg = dev_poisoned((size_t)M * I), *su = dev_poisoned((size_t)M * I);
    cpu->rmsnorm(x, &m->layer.mlp_norm, 1e-5f, M, H, h);
    float *prod = mlp_product(m, h, M);
    cpu->add(res, prod, (size_t)M * N);
    const unsigned long long handed = tsr_cuda_dq_handoffs_taken();
    gpu->rmsnorm(dx, &m->layer.mlp_norm, 1e-5f, M, H, dh);
    if (!gpu->mlp_add_norm ||
        !gpu->mlp_add_norm(&m->layer.gate, &m->layer.up, &m->layer.down, dh, M, dres, NULL, 1e-5f, NULL, sg, su)) {
        const tsr_linear *gu[2] = {&m->layer.gate, &m->layer.up};
        float *ys[2] = {sg, su};
        gpu->linear_many(gu, 2, dh, M, ys);
        gpu->silu_linear_add_norm(&m->layer.down, sg, su, M, dres, NULL, 1e-5f, NULL);
    }
    assert_int_equal(tsr_cuda_dq_handoffs_taken() - handed, handed_off(M));
    float *got = to_host(dres, (size_t)M * N);
    expect_close("MLP on the norm's hand-off: the sum", got, res, (size_t)M * N, quant_tol(M));
    free(got), free(x), free(res), free(h), free(prod);
    gpu->release(dx), gpu->release(dres), gpu->release(dh), gpu->release(sg), gpu->release(su);
}

/* The MLP of a layer against the CPU's linear, silu_mul, linear, add and rmsnorm. Gate and up differ in their groups'
 * widths, every matrix has a bias, and the 480 columns of down and 2208 of gate and up end in half a column pair.
 * First down's groups fill whole units (69 of them: more than a warp's 64 records, with TSR_CUDA_MLP_BLOCKS=1 as
 * test_cuda_mlp_grid runs it), then down has padded units (groups of 1072 and 656 rows). main() asks for the fused
 * launch (mlp_add_norm, mlp_decode.cu) at every shape (TSR_CUDA_MLP_FUSE=1, so that test_models decodes through it
 * too); with TSR_CUDA_MLP_FUSE=0 the backend leaves the op out and only the separate launches are checked; with
 * TSR_CUDA_MLP_FOLD=0 the layer keeps the file's column order. */
static void test_mlp_fused(void **state)
{
    (void)state;
    const int H = 480, I = 2208;
    const int gate_bits[] = {6, 5, 4, 4, 3, 2}, gate_rows[] = {64, 96, 128, 96, 64, 32};
    const int up_bits[] = {8, 4, 4, 3}, up_rows[] = {32, 160, 224, 64};
    const int down_bits[] = {6, 5, 4, 3, 2}, whole_rows[] = {96, 288, 1056, 96, 672},
              padded_rows[] = {96, 288, 1072, 96, 656};
    if (!gpu->mlp_add_norm) printf("mlp_add_norm left out (TSR_CUDA_MLP_FUSE=0)\n");
    gpu_mlp m;
    norm_weight wn = norm_weight_new(H);
    gpu_mlp_open(&m, H, I, 6, gate_bits, gate_rows, 4, up_bits, up_rows, 5, down_bits, whole_rows, &wn.host);
    check_mlp(&m, "MLP, down in whole units");
    check_mlp_takes_staged(&m);
    check_mlp_takes_handoff(&m);
    gpu_mlp_close(&m);
    gpu_mlp_open(&m, H, I, 6, gate_bits, gate_rows, 4, up_bits, up_rows, 5, down_bits, padded_rows, NULL);
    check_mlp(&m, "MLP, down with padded units");
    gpu_mlp_close(&m);
    norm_weight_free(&wn);
}

/* A host model shell of one layer (and a 1 × 8 embedding and final norm, never read), prepared on the GPU, so that
 * prepare_model uploads the layer's matrices as a model's (norm readers, o's inverse permutation). */
static void prepare_layer_shell(tsr_model *shell, tsr_layer *layer)
{
    static uint16_t one[8];
    memset(shell, 0, sizeof *shell);
    shell->cfg.n_layers = 1;
    shell->layers = layer;
    shell->embed = (tsr_dense){TSR_F16, 1, 8, one, NULL};
    shell->final_norm = shell->embed;
    assert_int_equal(gpu->prepare_model(shell), TSR_OK);
}

/* One case of test_stage_ahead: o's product over M rows added to x and normed with w (linear_add_norm), then the
 * layer's q/k/v (linear_many) on the norm's output, against the CPU; the counters as expected, `pairs` being the
 * batched k/v products the dequantize path must have run. */
static void stage_ahead_case(tsr_layer *layer, gpu_head *o, norm_weight *w, int H, int M, int pairs)
{
    const tsr_linear *qkv[3] = {&layer->q, &layer->k, &layer->v};
    const int Ko = o->L.K;
    float *a = rand_host((size_t)M * Ko, 1.0f), *x = rand_host((size_t)M * H, 1.0f);
    float *want_x = malloc((size_t)M * H * 4), *want_h = malloc((size_t)M * H * 4), *want[3];
    ref_linear(&o->L, a, M, want_x);
    cpu->add(want_x, x, (size_t)M * H);
    cpu->rmsnorm(want_x, &w->host, 1e-5f, M, H, want_h);
    float *da = dev_copy(a, (size_t)M * Ko * 4), *dx = dev_copy(x, (size_t)M * H * 4);
    float *dh = dev_poisoned((size_t)M * H), *dy[3];
    for (int i = 0; i < 3; i++) {
        want[i] = malloc((size_t)M * qkv[i]->N * 4);
        ref_linear(qkv[i], want_h, M, want[i]);
        dy[i] = dev_poisoned((size_t)M * qkv[i]->N);
    }
    const unsigned long long taken = tsr_cuda_staged_taken(), handed = tsr_cuda_dq_handoffs_taken();
    const unsigned long long paired = tsr_cuda_dq_pairs_run();
    gpu->linear_add_norm(&o->shell.head, da, M, dx, &layer->attn_norm, 1e-5f, dh);
    gpu->linear_many(qkv, 3, dh, M, dy);
    assert_int_equal(tsr_cuda_staged_taken() - taken, staged_ahead(M));
    assert_int_equal(tsr_cuda_dq_handoffs_taken() - handed, handed_off(M));
    assert_int_equal(tsr_cuda_dq_pairs_run() - paired, pairs);
    char what[96];
    float *got = to_host(dx, (size_t)M * H);
    snprintf(what, sizeof what, "stage ahead M=%d: the sum", M);
    expect_close(what, got, want_x, (size_t)M * H, quant_tol(M));
    free(got);
    got = to_host(dh, (size_t)M * H);
    snprintf(what, sizeof what, "stage ahead M=%d: the norm", M);
    expect_close(what, got, want_h, (size_t)M * H, quant_tol(M));
    free(got);
    for (int i = 0; i < 3; i++) {
        got = to_host(dy[i], (size_t)M * qkv[i]->N);
        snprintf(what, sizeof what, "stage ahead M=%d%s: %c", M, pairs ? " (k and v paired)" : "", "qkv"[i]);
        expect_close(what, got, want[i], (size_t)M * qkv[i]->N, quant_tol(M));
        free(got), free(want[i]);
        gpu->release(dy[i]);
    }
    gpu->release(da), gpu->release(dx), gpu->release(dh);
    free(a), free(x), free(want_x), free(want_h);
}

/* Activations staged ahead (kernels/cuda/stage_ahead.cuh): the residual pass after o that ends with a layer's
 * attention norm also writes the entries of that layer's q/k/v GEMV, q and k sharing one unit order and v with
 * its own, at 1, 3 and 6 rows (fp16 hi + lo entries up to 4 rows, fp16 above); at 100 rows (the dequantize path)
 * the norm after o's product hands q and k their converted input instead (handed_off). Against the CPU's o product,
 * add, rmsnorm and q/k/v products, and the GEMV must have taken the entries where it takes any (staged_ahead). Then
 * at 100 rows once more with v in k's unit order too (k and v of one shape, different widths): the dequantize path
 * runs them as one batched product (TSR_CUDA_DQ_PAIR=0: one each). */
static void test_stage_ahead(void **state)
{
    (void)state;
    if (!gpu->linear_add_norm) {
        printf("linear_add_norm left out: nothing to stage ahead\n");
        return;
    }
    const int H = 480;
    const int q_bits[] = {6, 4, 3}, q_rows[] = {96, 256, 128}, k_bits[] = {5, 4}, k_rows[] = {160, 320};
    const int v_bits[] = {8, 2}, v_rows[] = {224, 256}, o_bits[] = {6, 4}, o_rows[] = {96, 256};
    gpu_head q, k, v, o;
    gpu_head_open(&q, 320, 320, 3, q_bits, q_rows);
    gpu_head_open(&k, 96, 96, 2, k_bits, k_rows);
    gpu_head_open(&v, 96, 96, 2, v_bits, v_rows);
    gpu_head_open(&o, H, H, 2, o_bits, o_rows);
    assert_non_null(q.L.q.perm);
    norm_weight w = norm_weight_new(H);
    for (int kv_one = 0; kv_one < 2; kv_one++) {
        tsr_layer layer;
        memset(&layer, 0, sizeof layer);
        layer.q = q.L, layer.k = k.L, layer.v = v.L;
        layer.k.q.perm = q.L.q.perm; /* q and k read their input in one order */
        if (kv_one) layer.v.q.perm = q.L.q.perm;
        layer.attn_norm = w.host;
        tsr_model shell;
        prepare_layer_shell(&shell, &layer);
        if (!kv_one) {
            const int Ms[] = {1, 3, 6, 100};
            for (size_t t = 0; t < sizeof Ms / sizeof Ms[0]; t++) stage_ahead_case(&layer, &o, &w, H, Ms[t], 0);
        } else {
            stage_ahead_case(&layer, &o, &w, H, 100, kv_paired());
        }
        gpu->release_model(&shell);
    }
    norm_weight_free(&w);
    gpu_head_close(&o), gpu_head_close(&v), gpu_head_close(&k), gpu_head_close(&q);
}

/* The attention merge staging o's decode GEMV activations (attention.cu, through o's inverse unit permutation):
 * decode rows over long contexts (several splits, some empty) at 1, 4 and 7 sequences, the attention against the
 * CPU, then o's product (o the reader in tsr_attn_args, uploaded as a layer's o) against the CPU's product of the
 * GPU's attention output, and o's GEMV must have taken the entries where it takes any. An o whose groups leave
 * padding rows in its units gets no inverse permutation: its GEMV stages its own (nothing taken), same result. */
static void test_merge_stage(void **state)
{
    (void)state;
    const int nh = 8, nkv = 2, d = 64, page = 16, n_pages = 1024, K = nh * d, N = 96;
    const int full_bits[] = {6, 4, 3}, full_rows[] = {64, 192, 256}, pad_bits[] = {6, 4}, pad_rows[] = {112, 400};
    for (int padded = 0; padded < 2; padded++) {
        gpu_head o;
        gpu_head_open(&o, N, N, padded ? 2 : 3, padded ? pad_bits : full_bits, padded ? pad_rows : full_rows);
        assert_int_equal(o.L.K, K);
        tsr_layer layer;
        memset(&layer, 0, sizeof layer);
        layer.o = o.L;
        tsr_model shell;
        prepare_layer_shell(&shell, &layer);
        const int n_seqs[] = {1, 4, 7};
        for (size_t t = 0; t < sizeof n_seqs / sizeof n_seqs[0]; t++) {
            const int M = n_seqs[t];
            int pos0[7] = {1700, 3, 950, 0, 640, 1100, 64}, ones[7] = {1, 1, 1, 1, 1, 1, 1};
            host_layout h;
            make_layout(&h, M, pos0, ones, page, n_pages, d / 2);
            int max_pos = 0;
            for (int r = 0; r < M; r++)
                if (h.positions[r] > max_pos) max_pos = h.positions[r];
            tsr_kv_cache kc, kg;
            assert_int_equal(tsr_kv_init(&kc, cpu, 1, nkv, d, page, n_pages, TSR_F16), TSR_OK);
            assert_int_equal(tsr_kv_init(&kg, gpu, 1, nkv, d, page, n_pages, TSR_F16), TSR_OK);
            fill_history(&h, &kc, &kg, nkv, d, page, n_pages);
            const size_t n = (size_t)M * K;
            float *q = rand_host(n, 1.0f), *want = malloc(n * 4), *want_y = malloc((size_t)M * N * 4);
            tsr_attn_args a = {nh, nkv, d, 1.0f / sqrtf((float)d), 0, 0, &layer.o};
            tsr_batch_layout bc = view(&h, 0, max_pos), bg = view(&h, 1, max_pos);
            cpu->attention(&bc, &a, &kc, q, want);
            float *dq = dev_copy(q, n * 4), *dout = dev_poisoned(n), *dy = dev_poisoned((size_t)M * N);
            const unsigned long long taken = tsr_cuda_staged_taken();
            gpu->attention(&bg, &a, &kg, dq, dout);
            gpu->linear(&layer.o, dout, M, dy);
            assert_int_equal(tsr_cuda_staged_taken() - taken, padded ? 0 : staged_ahead(M));
            char what[96];
            float *got = to_host(dout, n);
            snprintf(what, sizeof what, "merge stage M=%d%s: attention", M, padded ? " (padded o)" : "");
            expect_close(what, got, want, n, 2e-5);
            ref_linear(&o.L, got, M, want_y);
            free(got);
            got = to_host(dy, (size_t)M * N);
            snprintf(what, sizeof what, "merge stage M=%d%s: o", M, padded ? " (padded o)" : "");
            expect_close(what, got, want_y, (size_t)M * N, quant_tol(M));
            free(got), free(q), free(want), free(want_y);
            gpu->release(dq), gpu->release(dout), gpu->release(dy);
            free_view(&bg);
            tsr_kv_free(&kc);
            tsr_kv_free(&kg);
        }
        gpu->release_model(&shell);
        gpu_head_close(&o);
    }
}

static void test_linear_dense(void **state)
{
    (void)state;
    const int K = 300, N = 77;
    tsr_dtype types[] = {TSR_F16, TSR_BF16, TSR_F32};
    for (int t = 0; t < 3; t++) {
        size_t es = tsr_dtype_size(types[t]);
        unsigned char *w = malloc((size_t)K * N * es);
        uint16_t bias[77];
        for (size_t i = 0; i < (size_t)K * N; i++) {
            float v = frand() * 0.1f;
            if (types[t] == TSR_F16) ((uint16_t *)w)[i] = tsr_float_to_half(v);
            if (types[t] == TSR_BF16) ((uint16_t *)w)[i] = tsr_float_to_bf16(v);
            if (types[t] == TSR_F32) ((float *)w)[i] = v;
        }
        for (int i = 0; i < N; i++)
            bias[i] = tsr_float_to_half(frand());
        tsr_linear L = {.kind = TSR_LINEAR_DENSE, .K = K, .N = N};
        L.w = (tsr_dense){types[t], N, K, w, NULL};
        L.bias = (tsr_dense){TSR_F16, 1, N, bias, NULL};
        tsr_model shell = {0};
        uint16_t one[8] = {0};
        shell.embed = (tsr_dense){TSR_F16, 1, 8, one, NULL};
        shell.final_norm = shell.embed;
        shell.head = L;
        assert_int_equal(gpu->prepare_model(&shell), TSR_OK);
        const int Ms[] = {1, 4, 8, 9, 40};
        for (size_t i = 0; i < 5; i++) {
            int M = Ms[i];
            float *x = rand_host((size_t)M * K, 1.0f), *want = malloc((size_t)M * N * 4);
            cpu->linear(&L, x, M, want);
            float *dx = dev_copy(x, (size_t)M * K * 4), *dy = dev_poisoned((size_t)M * N);
            gpu->linear(&shell.head, dx, M, dy);
            float *got = to_host(dy, (size_t)M * N);
            char what[64];
            snprintf(what, sizeof what, "dense %s linear M=%d", tsr_dtype_name(types[t]), M);
            expect_close(what, got, want, (size_t)M * N, M <= 8 || types[t] == TSR_F32 ? 1e-5 : 4e-3);
            free(x), free(want), free(got);
            gpu->release(dx), gpu->release(dy);
        }
        gpu->release_model(&shell);
        free(w);
    }
}

/* ---- whole models ---- */

static void run_model(const char *name, tsr_dtype kv, const tsr_ops *ops, int32_t **ids, int *lens, int n, float **out)
{
    char dir[4096];
    if (!tsr_fixture_model(dir, sizeof dir, name)) fail_msg("model %s not found", name);
    tsr_engine_opts o = {.max_tokens = 512, .kv_tokens = 4096, .kv_dtype = kv, .ops = ops};
    tsr_engine *e;
    if (tsr_engine_open(dir, &o, &e) != TSR_OK) fail_msg("%s: %s", dir, tsr_last_error());
    const int vocab = e->model->cfg.vocab_size;
    tsr_seq seqs[8] = {0};
    tsr_feed feeds[8];
    for (int i = 0; i < n; i++) {
        out[i] = malloc((size_t)lens[i] * vocab * 4);
        feeds[i] = (tsr_feed){&seqs[i], ids[i], lens[i], TSR_LOGITS_ALL, out[i], NULL};
    }
    assert_int_equal(tsr_engine_feed(e, feeds, n), TSR_OK);
    for (int i = 0; i < n; i++)
        tsr_engine_seq_release(e, &seqs[i]);
    /* greedy 48 tokens after prompt 0, decoded one step at a time: returned after the logits. Odd steps take the
     * backend's pick (tsr_feed.pick: argmax_rows on the GPU), even ones the row, picked here. */
    float *logits = malloc((size_t)vocab * 4);
    tsr_seq seq = {0};
    tsr_pick pick = {-1, 0.0f};
    tsr_feed f = {&seq, ids[0], lens[0], TSR_LOGITS_LAST, logits, NULL};
    int32_t *toks = malloc(48 * sizeof(int32_t));
    for (int i = 0; i < 48; i++) {
        assert_int_equal(tsr_engine_feed(e, &f, 1), TSR_OK);
        toks[i] = i % 2 ? pick.id : tsr_argmax(logits, vocab);
        f = (tsr_feed){&seq, &toks[i], 1, TSR_LOGITS_LAST, i % 2 ? logits : NULL, i % 2 ? NULL : &pick};
    }
    out[n] = (float *)toks;
    tsr_engine_seq_release(e, &seq);
    free(logits);
    tsr_engine_close(e);
}

static void test_models(void **state)
{
    (void)state;
    char path[4096];
    assert_non_null(tsr_fixture_path(path, sizeof path, "reference/prompts.json"));
    json_t *root = json_load_file(path, 0, NULL), *arr = json_object_get(root, "ids");
    int n = (int)json_array_size(arr), lens[8];
    int32_t *ids[8];
    for (int i = 0; i < n; i++) {
        json_t *a = json_array_get(arr, (size_t)i);
        lens[i] = (int)json_array_size(a);
        ids[i] = malloc((size_t)lens[i] * 4);
        for (int k = 0; k < lens[i]; k++)
            ids[i][k] = (int32_t)json_integer_value(json_array_get(a, (size_t)k));
    }
    json_decref(root);
    /* quantized models against ExLlamaV2: EXL2 (.exl2-ref) and GPTQ (.exllamav2-ref) */
    static const char *suffixes[] = {".exl2-ref.safetensors", ".exllamav2-ref.safetensors"};
    char **refs;
    int n_refs = 0;
    for (int sfx = 0; sfx < 2; sfx++) {
        n_refs = tsr_fixture_list_refs(suffixes[sfx], &refs);
        assert_true(n_refs > 0);
        for (int r = 0; r < n_refs; r++) {
            float *g[9], *c[9];
            run_model(refs[r], TSR_F16, gpu, ids, lens, n, g);
            run_model(refs[r], TSR_F16, cpu, ids, lens, n, c);
            char refname[600];
            snprintf(refname, sizeof refname, "reference/%s%s", refs[r], suffixes[sfx]);
            assert_non_null(tsr_fixture_path(path, sizeof path, refname));
            tsr_st_set *ref;
            assert_int_equal(tsr_st_open_file(path, &ref), TSR_OK);
            for (int i = 0; i < n; i++) {
                char name[32];
                snprintf(name, sizeof name, "logits.%d", i);
                const tsr_st_tensor *t = tsr_st_find(ref, name);
                long rows = t->shape[0], vocab = t->shape[1];
                const float *gg = g[i] + (size_t)(lens[i] - rows) * vocab,
                            *cc = c[i] + (size_t)(lens[i] - rows) * vocab;
                tsr_logit_diff vs_ref = tsr_compare_logits(gg, t->data, rows, vocab);
                tsr_logit_diff vs_cpu = tsr_compare_logits(gg, cc, rows, vocab);
                print_message(
                    "  %s prompt %d: GPU vs ExLlamaV2 max %.4f mean %.5f (argmax %ld), GPU vs CPU max %.4f mean %.5f\n",
                    refs[r], i, vs_ref.max_abs, vs_ref.mean_abs, vs_ref.argmax_disagree, vs_cpu.max_abs,
                    vs_cpu.mean_abs);
                if (vs_ref.max_abs > 0.25 || vs_ref.mean_abs > 0.02 || vs_ref.argmax_disagree)
                    fail_msg("%s prompt %d: GPU logits out of tolerance against the reference", refs[r], i);
                if (vs_cpu.max_abs > 0.25 || vs_cpu.mean_abs > 0.02)
                    fail_msg("%s prompt %d: GPU far from CPU", refs[r], i);
            }
            const int32_t *want = tsr_st_find(ref, "greedy.0")->data, *gt = (const int32_t *)g[n],
                          *ct = (const int32_t *)c[n];
            int agree = 0, agree_cpu = 0;
            while (agree < 48 && gt[agree] == want[agree])
                agree++;
            while (agree_cpu < 48 && gt[agree_cpu] == ct[agree_cpu])
                agree_cpu++;
            print_message("  %s greedy: GPU agrees with ExLlamaV2 for %d of 48 tokens, with the CPU for %d\n", refs[r],
                          agree, agree_cpu);
            if (agree < 48) fail_msg("%s: GPU greedy tokens diverge from the reference at %d", refs[r], agree);
            for (int i = 0; i <= n; i++)
                free(g[i]), free(c[i]);
            tsr_st_set_free(ref);
        }
        tsr_fixture_free_list(refs, n_refs);
    }
    /* FP16 models on the GPU against HF (FP32 KV; fp32 GEMV, cuBLAS with fp16 operands for prefill) */
    n_refs = tsr_fixture_list_refs(".hf-ref.safetensors", &refs);
    for (int r = 0; r < n_refs; r++) {
        char model[600], refname[600];
        snprintf(model, sizeof model, "%s-fp16", refs[r]);
        snprintf(refname, sizeof refname, "reference/%s.hf-ref.safetensors", refs[r]);
        float *g[9];
        run_model(model, TSR_F32, gpu, ids, lens, n, g);
        assert_non_null(tsr_fixture_path(path, sizeof path, refname));
        tsr_st_set *ref;
        assert_int_equal(tsr_st_open_file(path, &ref), TSR_OK);
        for (int i = 0; i < n; i++) {
            char name[32];
            snprintf(name, sizeof name, "logits.%d", i);
            const tsr_st_tensor *t = tsr_st_find(ref, name);
            long rows = t->shape[0], vocab = t->shape[1];
            tsr_logit_diff d = tsr_compare_logits(g[i] + (size_t)(lens[i] - rows) * vocab, t->data, rows, vocab);
            print_message("  %s prompt %d: GPU vs HF max %.4f mean %.5f (argmax %ld)\n", model, i, d.max_abs,
                          d.mean_abs, d.argmax_disagree);
            if (d.max_abs > 0.1 || d.mean_abs > 0.01 || d.argmax_disagree)
                fail_msg("%s: GPU logits far from HF", model);
        }
        for (int i = 0; i <= n; i++)
            free(g[i]);
        tsr_st_set_free(ref);
    }
    tsr_fixture_free_list(refs, n_refs);
    for (int i = 0; i < n; i++)
        free(ids[i]);
}

/* Prefill of prompt tokens [0, start), then [start, start + rows) in one call (as the decode_*cache references
 * were made), then `steps` one-token decode steps (CUDA graphs replay these) re-feeding the same tokens on a
 * second sequence: logits [rows + steps][vocab]. */
static float *run_kvq(const char *name, tsr_dtype kv, const tsr_ops *ops, const int32_t *ids, int start, int rows,
                      int steps)
{
    char dir[4096];
    if (!tsr_fixture_model(dir, sizeof dir, name)) fail_msg("model %s not found", name);
    tsr_engine_opts o = {.max_tokens = 512, .kv_tokens = 2048, .kv_dtype = kv, .ops = ops};
    tsr_engine *e;
    if (tsr_engine_open(dir, &o, &e) != TSR_OK) fail_msg("%s: %s", dir, tsr_last_error());
    const int vocab = e->model->cfg.vocab_size;
    float *out = malloc((size_t)(rows + steps) * vocab * 4);
    tsr_seq seq = {0}, seq2 = {0};
    tsr_feed f = {&seq, ids, start, TSR_LOGITS_NONE, NULL, NULL};
    assert_int_equal(tsr_engine_feed(e, &f, 1), TSR_OK);
    f = (tsr_feed){&seq, ids + start, rows, TSR_LOGITS_ALL, out, NULL};
    assert_int_equal(tsr_engine_feed(e, &f, 1), TSR_OK);
    f = (tsr_feed){&seq2, ids, start, TSR_LOGITS_NONE, NULL, NULL};
    assert_int_equal(tsr_engine_feed(e, &f, 1), TSR_OK);
    for (int i = 0; i < steps; i++) {
        f = (tsr_feed){&seq2, ids + start + i, 1, TSR_LOGITS_LAST, out + (size_t)(rows + i) * vocab, NULL};
        assert_int_equal(tsr_engine_feed(e, &f, 1), TSR_OK);
    }
    tsr_engine_seq_release(e, &seq);
    tsr_engine_seq_release(e, &seq2);
    tsr_engine_close(e);
    return out;
}

/* Whole models with quantized caches on the GPU: against ExLlamaV2's decode_{q4,q6,q8}cache.3 with the golden
 * test's tolerances (tests/golden/test_golden_kvq.c), and against the CPU backend, chunk and decode steps. */
static void test_models_kv_quant(void **state)
{
    (void)state;
    char path[4096];
    assert_non_null(tsr_fixture_path(path, sizeof path, "reference/prompts.json"));
    json_t *root = json_load_file(path, 0, NULL), *arr = json_array_get(json_object_get(root, "ids"), 3);
    assert_non_null(arr);
    const int len = (int)json_array_size(arr);
    int32_t *ids = malloc((size_t)len * 4);
    for (int k = 0; k < len; k++)
        ids[k] = (int32_t)json_integer_value(json_array_get(arr, (size_t)k));
    json_decref(root);
    const tsr_dtype modes[] = {TSR_KV_Q4, TSR_KV_Q6, TSR_KV_Q8};
    const char *keys[] = {"decode_q4cache.3", "decode_q6cache.3", "decode_q8cache.3"};
    char **refs;
    int n_refs = tsr_fixture_list_refs(".exl2-ref.safetensors", &refs), checked = 0;
    for (int r = 0; r < n_refs; r++) {
        char refname[600];
        snprintf(refname, sizeof refname, "reference/%s.exl2-ref.safetensors", refs[r]);
        assert_non_null(tsr_fixture_path(path, sizeof path, refname));
        tsr_st_set *ref;
        assert_int_equal(tsr_st_open_file(path, &ref), TSR_OK);
        const tsr_st_tensor *fp16 = tsr_st_find(ref, "decode_fp16cache.3");
        if (!fp16) {
            tsr_st_set_free(ref);
            continue;
        }
        const int rows = (int)fp16->shape[0], vocab = (int)fp16->shape[1], start = len - rows, steps = 8;
        for (int m = 0; m < 3; m++) {
            const tsr_st_tensor *t = tsr_st_find(ref, keys[m]);
            assert_non_null(t);
            float *g = run_kvq(refs[r], modes[m], gpu, ids, start, rows, steps);
            float *c = run_kvq(refs[r], modes[m], cpu, ids, start, rows, steps);
            tsr_logit_diff vs_ref = tsr_compare_logits(g, t->data, rows, vocab);
            tsr_logit_diff moved = tsr_compare_logits(t->data, fp16->data, rows, vocab);
            tsr_logit_diff vs_cpu = tsr_compare_logits(g, c, rows + steps, vocab);
            print_message(
                "  %s kv %s: GPU vs ExLlamaV2 max %.4f mean %.5f (argmax %ld; the mode moves it max %.4f mean "
                "%.5f), GPU vs CPU max %.4f mean %.5f\n",
                refs[r], tsr_kv_dtype_name(modes[m]), vs_ref.max_abs, vs_ref.mean_abs, vs_ref.argmax_disagree,
                moved.max_abs, moved.mean_abs, vs_cpu.max_abs, vs_cpu.mean_abs);
            if (vs_ref.max_abs > 0.2 + 0.5 * moved.max_abs || vs_ref.mean_abs > 0.015 + 0.25 * moved.mean_abs ||
                vs_ref.argmax_disagree > rows / 10)
                fail_msg("%s kv %s: GPU logits out of tolerance against the reference", refs[r],
                         tsr_kv_dtype_name(modes[m]));
            /* two implementations of the quantizer differ in which codes flip (K/V arrive with fp32 rounding
             * differences from the GEMVs), and each flip moves the logits by up to the mode's own effect: on the
             * H200, q4 on the 2.5 bpw model put GPU and CPU 0.054 apart on average, as far as each is from
             * ExLlamaV2 (0.055), while every op agrees to 6e-7 on the same inputs (test_attention_kv_quant) */
            if (vs_cpu.max_abs > 0.25 + 0.5 * moved.max_abs || vs_cpu.mean_abs > 0.02 + 0.25 * moved.mean_abs)
                fail_msg("%s kv %s: GPU far from CPU", refs[r], tsr_kv_dtype_name(modes[m]));
            free(g), free(c);
            checked++;
        }
        tsr_st_set_free(ref);
    }
    tsr_fixture_free_list(refs, n_refs);
    free(ids);
    assert_true(checked > 0);
}

/* With no KV size given, the pool takes most of the device memory the weights left. */
static void test_kv_pool_from_free_memory(void **state)
{
    (void)state;
    char dir[4096];
    assert_non_null(tsr_fixture_model(dir, sizeof dir, "tiny-llama-exl2-4.0bpw"));
    size_t free0, total;
    tsr_cuda_memory(&free0, &total);
    tsr_engine_opts o = {.ops = gpu, .kv_fraction = 0.05};
    tsr_engine *e;
    assert_int_equal(tsr_engine_open(dir, &o, &e), TSR_OK);
    const tsr_model_config *c = &e->model->cfg;
    double pool = (double)e->kv_pool_tokens * tsr_kv_bytes_per_token(c->n_layers, c->n_kv_heads, c->head_dim, TSR_F16);
    print_message("  KV pool from free memory: %ld tokens, %.1f GiB of %.1f GiB free\n", e->kv_pool_tokens,
                  pool / (1 << 30), (double)free0 / (1 << 30));
    assert_true(pool > 0.02 * (double)free0 && pool < 0.06 * (double)free0);
    assert_int_equal(e->kv.expand_positions, 0);
    tsr_engine_close(e);
    /* a Q4 cache: the pool leaves room for the fp16 rebuild of a step's context, and tells attention how much */
    o.kv_dtype = TSR_KV_Q4;
    assert_int_equal(tsr_engine_open(dir, &o, &e), TSR_OK);
    const long pool_tokens = e->kv_pool_tokens, max_pos = e->model->cfg.rope.max_pos;
    const long context = max_pos < pool_tokens ? max_pos : pool_tokens;
    assert_true(e->kv.expand_positions >= tsr_kv_expand_positions(TSR_STEP_TOKENS_DEFAULT, 0, 16));
    assert_true(e->kv.expand_positions <= tsr_kv_expand_positions(TSR_STEP_TOKENS_DEFAULT, context, 16));
    print_message("  the same with a Q4 cache: %ld tokens, rebuild room %ld positions\n", pool_tokens,
                  e->kv.expand_positions);
    tsr_engine_close(e);
}

/* One call of the one-shot peer sum (kernels/cuda/peer_sum.h) by `size` members that share this GPU, each on its
 * own stream so that their kernels run side by side as on separate GPUs; with replays > 0 each member's call (after
 * a copy of its input) is captured into a CUDA graph and the graphs are launched `replays` times. Every member must
 * end with the members' values added in member order, bit for bit. */
static void peer_round(tsr_peer_sum **p, int size, cudaStream_t *st, size_t n, int replays)
{
    float *h[TSR_PEER_MAX], *want = malloc(n * sizeof(float)), *got = malloc(n * sizeof(float));
    float *src[TSR_PEER_MAX], *buf[TSR_PEER_MAX];
    for (int m = 0; m < size; m++) {
        h[m] = rand_host(n, 1.0f);
        assert_int_equal(cudaMalloc((void **)&src[m], n * sizeof(float)), cudaSuccess);
        assert_int_equal(cudaMalloc((void **)&buf[m], n * sizeof(float)), cudaSuccess);
        assert_int_equal(cudaMemcpy(src[m], h[m], n * sizeof(float), cudaMemcpyHostToDevice), cudaSuccess);
    }
    for (size_t i = 0; i < n; i++) {
        float v = 0.0f;
        for (int m = 0; m < size; m++) v += h[m][i];
        want[i] = v;
    }
    cudaGraphExec_t exec[TSR_PEER_MAX];
    if (replays > 0)
        for (int m = 0; m < size; m++) {
            cudaGraph_t g;
            assert_int_equal(cudaStreamBeginCapture(st[m], cudaStreamCaptureModeThreadLocal), cudaSuccess);
            cudaMemcpyAsync(buf[m], src[m], n * sizeof(float), cudaMemcpyDeviceToDevice, st[m]);
            tsr_peer_sum_run(p[m], buf[m], n, st[m]);
            assert_int_equal(cudaStreamEndCapture(st[m], &g), cudaSuccess);
            assert_int_equal(cudaGraphInstantiate(&exec[m], g, 0), cudaSuccess);
            cudaGraphDestroy(g);
        }
    for (int r = 0; r < (replays > 0 ? replays : 1); r++) {
        for (int m = 0; m < size; m++) {
            if (replays > 0) {
                assert_int_equal(cudaGraphLaunch(exec[m], st[m]), cudaSuccess);
            } else {
                cudaMemcpyAsync(buf[m], src[m], n * sizeof(float), cudaMemcpyDeviceToDevice, st[m]);
                tsr_peer_sum_run(p[m], buf[m], n, st[m]);
            }
        }
        for (int m = 0; m < size; m++) assert_int_equal(cudaStreamSynchronize(st[m]), cudaSuccess);
        for (int m = 0; m < size; m++) {
            assert_int_equal(tsr_peer_sum_failed(p[m]), 0);
            assert_int_equal(cudaMemcpy(got, buf[m], n * sizeof(float), cudaMemcpyDeviceToHost), cudaSuccess);
            if (memcmp(got, want, n * sizeof(float)))
                fail_msg("peer sum of %d members, %zu floats, %s %d: member %d differs", size, n,
                         replays ? "replay" : "call", r, m);
        }
    }
    for (int m = 0; m < size; m++) {
        if (replays > 0) cudaGraphExecDestroy(exec[m]);
        cudaFree(src[m]), cudaFree(buf[m]);
        free(h[m]);
    }
    free(want), free(got);
}

/* The one-shot peer sum with 2, 3 and 4 members in this process (tsr_peer_sum_new_local): calls whose sizes change
 * the block count (1 to 64 blocks; the epochs and the receive slots' parity must stay in step), calls replayed
 * from CUDA graphs, and a member left alone, which must give up after its timeout, report it, and return at once
 * from later calls. The IPC set-up between processes (tsr_peer_sum_new/connect) runs under mpirun only. */
static void test_peer_sum(void **state)
{
    (void)state;
    const size_t sizes[] = {1, 31, 1000, 1024, 1025, 8192, 70001, 3 * 1024, 65536 + 7, 8192};
    cudaStream_t st[TSR_PEER_MAX];
    for (int m = 0; m < 4; m++) assert_int_equal(cudaStreamCreateWithFlags(&st[m], cudaStreamNonBlocking), cudaSuccess);
    for (int size = 2; size <= 4; size++) {
        tsr_peer_sum *p[TSR_PEER_MAX];
        assert_int_equal(tsr_peer_sum_new_local(size, 70001, 30.0, p), TSR_OK);
        for (size_t t = 0; t < sizeof sizes / sizeof sizes[0]; t++) peer_round(p, size, st, sizes[t], 0);
        peer_round(p, size, st, 8192, 3);
        peer_round(p, size, st, 40000, 3);
        peer_round(p, size, st, 5, 0); /* after the graphs, plain calls again */
        for (int m = 0; m < size; m++) tsr_peer_sum_free(p[m]);
        print_message("peer sum, %d members: calls of 1-70001 floats and graph replays equal the host's sums\n",
                      size);
    }
    /* member 1 never joins: member 0 gives up after 0.2 s */
    tsr_peer_sum *p[2];
    assert_int_equal(tsr_peer_sum_new_local(2, 4096, 0.2, p), TSR_OK);
    float *buf;
    assert_int_equal(cudaMalloc((void **)&buf, 4096 * sizeof(float)), cudaSuccess);
    tsr_peer_sum_run(p[0], buf, 4096, st[0]);
    assert_int_equal(cudaStreamSynchronize(st[0]), cudaSuccess);
    assert_int_equal(tsr_peer_sum_failed(p[0]), 1);
    assert_int_equal(tsr_peer_sum_failed(p[1]), 0);
    tsr_peer_sum_run(p[0], buf, 4096, st[0]); /* returns at once: no second wait */
    assert_int_equal(cudaStreamSynchronize(st[0]), cudaSuccess);
    assert_int_equal(tsr_peer_sum_failed(p[0]), 1);
    cudaFree(buf);
    tsr_peer_sum_free(p[0]), tsr_peer_sum_free(p[1]);
    for (int m = 0; m < 4; m++) cudaStreamDestroy(st[m]);
}

int main(void)
{
    if (tsr_cuda_device_count() == 0) {
        printf("no CUDA device: skipped\n");
        return 77;
    }
    if (tsr_cuda_init(0) != TSR_OK) {
        printf("CUDA init failed: %s\n", tsr_last_error());
        return 1;
    }
    /* several 128-column slabs of the dequantize-and-cuBLAS path even on the small test matrices */
    setenv("TSR_CUDA_DQ_SLAB_COLS", "128", 0);
    /* the fused decode MLP for every shape (by default only where a warp's share of gate and up is long) */
    setenv("TSR_CUDA_MLP_FUSE", "1", 0);
    cpu = tsr_ops_cpu();
    gpu = tsr_ops_cuda();
    char desc[256];
    tsr_cuda_describe(desc, sizeof desc);
    printf("device: %s\n", desc);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_elementwise),
        cmocka_unit_test(test_attention),
        cmocka_unit_test(test_linear_exl2),
        cmocka_unit_test(test_linear_add_norm_splits),
        cmocka_unit_test(test_linear_padded_k),
        cmocka_unit_test(test_linear_waves),
        cmocka_unit_test(test_linear_long_groups),
        cmocka_unit_test(test_linear_many_groups),
        cmocka_unit_test(test_linear_split_straddle),
        cmocka_unit_test(test_linear_in_order),
        cmocka_unit_test(test_mlp_fused),
        cmocka_unit_test(test_stage_ahead),
        cmocka_unit_test(test_merge_stage),
        cmocka_unit_test(test_peer_sum),
        cmocka_unit_test(test_linear_dense),
        cmocka_unit_test(test_models),
        cmocka_unit_test(test_kv_pool_from_free_memory),
        cmocka_unit_test(test_attention_kv_quant),
        cmocka_unit_test(test_models_kv_quant),
        cmocka_unit_test(test_argmax_rows),
        cmocka_unit_test(test_bench_rates),
        cmocka_unit_test(test_rope_store),
        cmocka_unit_test(test_top_rows),
        cmocka_unit_test(test_step_top),
        cmocka_unit_test(test_forward_slices),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
