/* Unit tests of the GPTQ side of runtime/synth.c (`tessera synth --format gptq`): tiny synthetic GPTQ models
 * are written, loaded with tsr_model_load, and every decoder linear layer's weights, as the loader sees them
 * (tsr_qmatrix_dequant_ref) and as the CPU kernel computes them (tsr_ops_cpu()->linear on an identity input),
 * are compared with a reference dequantization done here straight from the raw safetensors tensors by the
 * EXL2.md §8 definition: W[k][n] = (q(k,n) − (qzeros code(g,n) + 1)) · scales[g][n], g = g_idx[k], with q in
 * bits 4(k%8) of qweight[k/8][n] and the zero code in nibble n%8 of qzeros[g][n/8]. Covered: sequential groups
 * (with a short last group), act-order (random non-monotonic g_idx, shared by q/k/v and by gate/up), one group
 * per matrix (-1), symmetric zero points, Qwen2 biases; the config the loader parses; the magnitude of the
 * weights (std ≈ 1/sqrt(K)); determinism; sharding with model.safetensors.index.json; option errors. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
// cmocka must come after the headers above
#include <cmocka.h>

#include "kernels/ops.h"
#include "runtime/exl2.h"
#include "runtime/half.h"
#include "runtime/model.h"
#include "runtime/safetensors.h"
#include "runtime/synth.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static const char *const lin_names[7] = {"self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
                                         "mlp.gate_proj",    "mlp.up_proj",      "mlp.down_proj"};

static const tsr_st_tensor *raw(const tsr_st_set *set, int layer, const char *lin, const char *suffix, tsr_dtype dt,
                                int ndim, int64_t d0, int64_t d1)
{
    char name[256];
    snprintf(name, sizeof name, "model.layers.%d.%s.%s", layer, lin, suffix);
    const tsr_st_tensor *t = tsr_st_find(set, name);
    if (!t) fail_msg("tensor %s is missing", name);
    assert_int_equal(t->dtype, dt);
    assert_int_equal(t->ndim, ndim);
    assert_int_equal(t->shape[0], d0);
    if (ndim == 2) assert_int_equal(t->shape[1], d1);
    return t;
}

static void rm_dir(const char *dir)
{
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    assert_int_equal(system(cmd), 0);
}

static tsr_synth_opts tiny(tsr_arch arch, int group_size, int act_order, int sym)
{
    tsr_synth_opts o = {.arch = arch, .hidden = 128, .layers = 2, .heads = 4, .kv_heads = 2, .head_dim = 32,
                        .intermediate = 352, .vocab = 300, .format = TSR_SYNTH_GPTQ, .group_size = group_size,
                        .act_order = act_order, .sym = sym, .seed = 11, .max_pos = 256};
    return o;
}

/* Loads the model in `dir` written with `o` and checks every decoder linear layer against the raw tensors. */
static void check_model(const char *dir, const tsr_synth_opts *o, const tsr_synth_result *r)
{
    tsr_st_set *set;
    assert_int_equal(tsr_st_open_dir(dir, &set), TSR_OK);
    tsr_model *m;
    tsr_status st = tsr_model_load(dir, &m);
    if (st != TSR_OK) fail_msg("%s", tsr_last_error());
    const int gs_cfg = o->group_size ? o->group_size : 128;
    assert_string_equal(tsr_model_format(m), "gptq");
    assert_string_equal(m->cfg.quant.method, "gptq");
    assert_int_equal(m->cfg.quant.bits, 4);
    assert_int_equal(m->cfg.quant.group_size, gs_cfg);
    assert_int_equal(m->cfg.quant.desc_act, o->act_order);
    assert_int_equal(m->cfg.quant.sym, o->sym);
    assert_int_equal(m->cfg.quant.gptq_v2, 0);
    assert_int_equal(m->n_exl2, 7 * o->layers);
    assert_int_equal(m->head.kind, TSR_LINEAR_DENSE); /* fp16 lm_head */
    assert_int_equal(m->head.w.dtype, TSR_F16);
    assert_false(m->head_tied);

    double bits = 0, numel = 0;
    for (int l = 0; l < o->layers; l++) {
        const tsr_linear *L[7] = {&m->layers[l].q,    &m->layers[l].k,  &m->layers[l].v,   &m->layers[l].o,
                                  &m->layers[l].gate, &m->layers[l].up, &m->layers[l].down};
        const int32_t *gidx_of[7];
        for (int i = 0; i < 7; i++) {
            const int K = L[i]->K, N = L[i]->N;
            const int gs = gs_cfg == -1 ? K : gs_cfg, G = (K + gs - 1) / gs;
            assert_int_equal(L[i]->kind, TSR_LINEAR_EXL2);
            assert_int_equal(L[i]->q.kind, TSR_QMATRIX_GPTQ);
            const uint32_t *qw = raw(set, l, lin_names[i], "qweight", TSR_I32, 2, K / 8, N)->data;
            const uint32_t *qz = raw(set, l, lin_names[i], "qzeros", TSR_I32, 2, G, N / 8)->data;
            const uint16_t *sc = raw(set, l, lin_names[i], "scales", TSR_F16, 2, G, N)->data;
            const int32_t *gi = raw(set, l, lin_names[i], "g_idx", TSR_I32, 1, K, 0)->data;
            const uint16_t *bias = NULL;
            if (o->arch == TSR_ARCH_QWEN2 && i < 3) bias = raw(set, l, lin_names[i], "bias", TSR_F16, 1, N, 0)->data;
            gidx_of[i] = gi;

            /* g_idx: k / gs, or (act-order) a non-monotonic assignment with exactly gs rows per full group */
            int *count = calloc((size_t)G, sizeof *count), monotonic = 1;
            for (int k = 0; k < K; k++) {
                assert_true(gi[k] >= 0 && gi[k] < G);
                count[gi[k]]++;
                if (k && gi[k] < gi[k - 1]) monotonic = 0;
                if (!o->act_order || G == 1) assert_int_equal(gi[k], k / gs);
            }
            for (int g = 0; g < G; g++) assert_int_equal(count[g], g < G - 1 ? gs : K - (G - 1) * gs);
            free(count);
            if (o->act_order && G > 1) {
                assert_false(monotonic);
                assert_non_null(L[i]->q.q_weight_owned); /* the loader sorted and re-packed the rows */
            } else {
                /* sequential: qweight used in place from the model's own mapping */
                assert_null(L[i]->q.q_weight_owned);
                char name[256];
                snprintf(name, sizeof name, "model.layers.%d.%s.qweight", l, lin_names[i]);
                assert_true(L[i]->q.q_weight == tsr_st_find(m->st, name)->data);
            }

            /* zero points: v1 codes (zero − 1), 7 when symmetric, else 5..9 and varied */
            int zmin = 15, zmax = 0;
            for (int g = 0; g < G; g++)
                for (int n = 0; n < N; n++) {
                    const int z = (int)((qz[(size_t)g * (N / 8) + n / 8] >> (4 * (n % 8))) & 15);
                    zmin = z < zmin ? z : zmin;
                    zmax = z > zmax ? z : zmax;
                }
            if (o->sym) {
                assert_int_equal(zmin, 7);
                assert_int_equal(zmax, 7);
            } else {
                assert_int_equal(zmin, 5);
                assert_int_equal(zmax, 9);
            }

            /* the reference, from the raw tensors only */
            float *ref = malloc((size_t)K * N * sizeof(float)), *W = malloc((size_t)K * N * sizeof(float));
            double ss = 0;
            for (int k = 0; k < K; k++)
                for (int n = 0; n < N; n++) {
                    const int g = gi[k];
                    const int q = (int)((qw[(size_t)(k / 8) * N + n] >> (4 * (k % 8))) & 15);
                    const int zero = (int)((qz[(size_t)g * (N / 8) + n / 8] >> (4 * (n % 8))) & 15) + 1;
                    const float v = (float)(q - zero) * tsr_half_to_float(sc[(size_t)g * N + n]);
                    ref[(size_t)k * N + n] = v;
                    ss += (double)v * v;
                }
            const double sd = sqrt(ss / ((double)K * N)) * sqrt((double)K);
            if (!(sd > 0.85 && sd < 1.15)) fail_msg("layer %d %s: std * sqrt(K) = %g", l, lin_names[i], sd);

            tsr_qmatrix_dequant_ref(&L[i]->q, 0, W);
            for (size_t e = 0; e < (size_t)K * N; e++)
                if (W[e] != ref[e])
                    fail_msg("layer %d %s: W[%zu][%zu] = %g, reference %g", l, lin_names[i], e / (size_t)N,
                             e % (size_t)N, W[e], ref[e]);

            /* the CPU kernel on the identity: row k of the output is row k of W (plus the bias) */
            float *x = calloc((size_t)K * K, sizeof(float)), *y = malloc((size_t)K * N * sizeof(float));
            for (int k = 0; k < K; k++) x[(size_t)k * K + k] = 1.0f;
            tsr_ops_cpu()->linear(L[i], x, K, y);
            for (int k = 0; k < K; k++)
                for (int n = 0; n < N; n++) {
                    const double want = ref[(size_t)k * N + n] + (bias ? tsr_half_to_float(bias[n]) : 0.0);
                    const double got = y[(size_t)k * N + n];
                    if (!(fabs(got - want) <= 1e-6 * (1.0 + fabs(want))))
                        fail_msg("layer %d %s: kernel row %d col %d = %g, reference %g", l, lin_names[i], k, n, got,
                                 want);
                }
            free(x);
            free(y);
            free(ref);
            free(W);
            bits += tsr_qmatrix_bpw(&L[i]->q) * (double)K * N;
            numel += (double)K * N;
        }
        /* one desc_act order per input: q/k/v share g_idx, gate/up share another */
        assert_memory_equal(gidx_of[0], gidx_of[1], (size_t)L[0]->K * sizeof(int32_t));
        assert_memory_equal(gidx_of[0], gidx_of[2], (size_t)L[0]->K * sizeof(int32_t));
        assert_memory_equal(gidx_of[4], gidx_of[5], (size_t)L[4]->K * sizeof(int32_t));
        if (o->act_order && gs_cfg != -1 && gs_cfg < o->hidden)
            assert_memory_not_equal(gidx_of[0], gidx_of[4], (size_t)L[0]->K * sizeof(int32_t));
    }
    assert_true(fabs(bits / numel - r->layers_bpw) < 1e-9);
    assert_true(r->head_bpw == 16.0);
    tsr_model_free(m);
    tsr_st_set_free(set);
}

static void run_variant(tsr_arch arch, int group_size, int act_order, int sym)
{
    char base[] = "/tmp/tsr_test_synth_gptq_XXXXXX";
    assert_non_null(mkdtemp(base));
    tsr_synth_opts o = tiny(arch, group_size, act_order, sym);
    tsr_synth_result r;
    tsr_status st = tsr_synth_write(&o, base, &r);
    if (st != TSR_OK) fail_msg("%s", tsr_last_error());
    assert_int_equal(r.n_files, 1);
    check_model(base, &o, &r);
    rm_dir(base);
}

/* Sequential groups of 64: K = 352 leaves a last group of 32 rows. */
static void test_sequential(void **state)
{
    (void)state;
    run_variant(TSR_ARCH_LLAMA, 64, 0, 0);
}

/* Act-order, Qwen2 (q/k/v biases), the default group size 128 (K = 352: 128 + 128 + 96). */
static void test_act_order(void **state)
{
    (void)state;
    run_variant(TSR_ARCH_QWEN2, 0, 1, 0);
}

/* Act-order with small groups and symmetric zero points. */
static void test_act_order_sym(void **state)
{
    (void)state;
    run_variant(TSR_ARCH_LLAMA, 32, 1, 1);
}

/* One group per matrix (-1): g_idx all zeros, act-order or not. */
static void test_one_group(void **state)
{
    (void)state;
    run_variant(TSR_ARCH_MISTRAL, -1, 1, 0);
}

static int files_equal(const char *a, const char *b)
{
    FILE *fa = fopen(a, "rb"), *fb = fopen(b, "rb");
    int eq = fa && fb;
    while (eq) {
        int ca = fgetc(fa), cb = fgetc(fb);
        if (ca != cb) eq = 0;
        if (ca == EOF || cb == EOF) break;
    }
    if (fa) fclose(fa);
    if (fb) fclose(fb);
    return eq;
}

/* Same seed, same bytes; another seed differs; shards (with an index) hold the same tensor bytes and load. */
static void test_deterministic_and_sharded(void **state)
{
    (void)state;
    char base[] = "/tmp/tsr_test_synth_gptq_XXXXXX";
    assert_non_null(mkdtemp(base));
    char d[4][600], f[4][700];
    for (int i = 0; i < 4; i++) {
        snprintf(d[i], sizeof d[i], "%s/%c", base, 'a' + i);
        snprintf(f[i], sizeof f[i], "%s/%c/model.safetensors", base, 'a' + i);
    }
    tsr_synth_opts o = tiny(TSR_ARCH_LLAMA, 64, 1, 0);
    tsr_synth_result r;
    assert_int_equal(tsr_synth_write(&o, d[0], &r), TSR_OK);
    assert_int_equal(tsr_synth_write(&o, d[1], &r), TSR_OK);
    assert_true(files_equal(f[0], f[1]));
    o.seed = 12;
    assert_int_equal(tsr_synth_write(&o, d[2], &r), TSR_OK);
    assert_false(files_equal(f[0], f[2]));

    o.seed = 11;
    o.shard_bytes = 60000;
    assert_int_equal(tsr_synth_write(&o, d[3], &r), TSR_OK);
    assert_true(r.n_files > 2);
    char idx[700];
    snprintf(idx, sizeof idx, "%s/model.safetensors.index.json", d[3]);
    assert_int_equal(access(idx, R_OK), 0);
    snprintf(idx, sizeof idx, "%s/model-00001-of-%05d.safetensors", d[3], r.n_files);
    assert_int_equal(access(idx, R_OK), 0);
    tsr_st_set *s0, *s3;
    assert_int_equal(tsr_st_open_dir(d[0], &s0), TSR_OK);
    assert_int_equal(tsr_st_open_dir(d[3], &s3), TSR_OK);
    assert_int_equal(tsr_st_count(s0), tsr_st_count(s3));
    for (size_t i = 0; i < tsr_st_count(s3); i++) {
        const tsr_st_tensor *a = tsr_st_at(s3, i), *b = tsr_st_find(s0, a->name);
        assert_non_null(b);
        assert_int_equal(a->nbytes, b->nbytes);
        assert_memory_equal(a->data, b->data, a->nbytes);
    }
    tsr_st_set_free(s0);
    tsr_st_set_free(s3);
    check_model(d[3], &o, &r);
    rm_dir(base);
}

static void test_errors(void **state)
{
    (void)state;
    char base[] = "/tmp/tsr_test_synth_gptq_XXXXXX";
    assert_non_null(mkdtemp(base));
    char d[600];
    snprintf(d, sizeof d, "%s/x", base);
    tsr_synth_result r;
    const int bad_gs[] = {-2, 4, 100, 96, 131072};
    for (size_t i = 0; i < sizeof bad_gs / sizeof bad_gs[0]; i++) {
        tsr_synth_opts o = tiny(TSR_ARCH_LLAMA, bad_gs[i], 0, 0);
        assert_int_equal(tsr_synth_write(&o, d, &r), TSR_ERR_ARG);
        assert_non_null(strstr(tsr_last_error(), "group-size"));
    }
    /* widths that are not multiples of 8 (EXL2 would also need 32; GPTQ accepts 8) */
    tsr_synth_opts o = tiny(TSR_ARCH_LLAMA, 0, 0, 0);
    o.intermediate = 340;
    assert_int_equal(tsr_synth_write(&o, d, &r), TSR_ERR_ARG);
    assert_non_null(strstr(tsr_last_error(), "multiples of 8"));
    o = tiny(TSR_ARCH_LLAMA, 0, 0, 0);
    o.head_dim = 34; /* kv_heads * head_dim = 68 */
    assert_int_equal(tsr_synth_write(&o, d, &r), TSR_ERR_ARG);
    o = tiny(TSR_ARCH_LLAMA, 0, 0, 0);
    o.hidden = 136; /* a multiple of 8, not of 32: fine for GPTQ */
    o.heads = 4;
    o.head_dim = 34;
    o.kv_heads = 4;
    o.layers = 1;
    tsr_status st = tsr_synth_write(&o, d, &r);
    if (st != TSR_OK) fail_msg("%s", tsr_last_error());
    /* GPTQ options with the EXL2 format */
    tsr_synth_opts e = tiny(TSR_ARCH_LLAMA, 0, 1, 0);
    e.format = TSR_SYNTH_EXL2;
    e.bpw = 4.0;
    e.head_bits = 6;
    snprintf(d, sizeof d, "%s/y", base);
    assert_int_equal(tsr_synth_write(&e, d, &r), TSR_ERR_ARG);
    assert_non_null(strstr(tsr_last_error(), "GPTQ options"));
    e.format = (tsr_synth_format)7;
    assert_int_equal(tsr_synth_write(&e, d, &r), TSR_ERR_ARG);
    rm_dir(base);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_sequential),
        cmocka_unit_test(test_act_order),
        cmocka_unit_test(test_act_order_sym),
        cmocka_unit_test(test_one_group),
        cmocka_unit_test(test_deterministic_and_sharded),
        cmocka_unit_test(test_errors),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
