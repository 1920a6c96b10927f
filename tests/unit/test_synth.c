/* Unit tests of runtime/synth.c: the EXL2 column packer against the EXL2.md §5.1 test vectors, layout planning
 * (§4.1 worked example, §9.2 head options), a packed matrix round trip through tsr_qmatrix_load and
 * tsr_qmatrix_dequant_ref, and a tiny synthetic model: loadable, on the bpw target, deterministic, and the same
 * tensors whether sharded or not. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
// cmocka must come after the headers above
#include <cmocka.h>

#include "runtime/exl2.h"
#include "runtime/half.h"
#include "runtime/model.h"
#include "runtime/safetensors.h"
#include "runtime/synth.h"
#include "tests/common/exl2_synth.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static void test_pack_vectors(void **state)
{
    (void)state;
    const exl2_pack_vector *vec = exl2_pack_vectors;
    for (size_t v = 0; v < sizeof exl2_pack_vectors / sizeof exl2_pack_vectors[0]; v++) {
        int b = vec[v].bits;
        uint8_t codes[32];
        uint32_t words[8];
        for (int j = 0; j < 32; j++) codes[j] = (uint8_t)((7 * j + 3) % (1 << b));
        tsr_synth_pack(codes, 32, b, 1, words);
        for (int w = 0; w < b; w++) assert_int_equal(words[w], vec[v].words[w]);
    }
}

static void test_pack_columns_independent(void **state)
{
    (void)state;
    /* 3 columns: each column's words equal the single-column packing of its codes */
    enum { N = 3, R = 64 };
    uint8_t codes[R * N], col[R];
    uint32_t words[R * 8 / 32 * N], one[R * 8 / 32]; /* room for the widest (8-bit) packing */
    for (int b = 2; b <= 8; b++) {
        if (b == 7) continue;
        for (int i = 0; i < R * N; i++) codes[i] = (uint8_t)((i * 37 + 11) % (1 << b));
        tsr_synth_pack(codes, R, b, N, words);
        for (int n = 0; n < N; n++) {
            for (int j = 0; j < R; j++) col[j] = codes[j * N + n];
            tsr_synth_pack(col, R, b, 1, one);
            for (int w = 0; w < R * b / 32; w++) assert_int_equal(words[w * N + n], one[w]);
        }
    }
}

static void test_plans(void **state)
{
    (void)state;
    /* EXL2.md §4.1 worked example: down_proj option [8,4,3] x [0.05,0.1,0.85], gs [32,128,128], K = 14336 */
    tsr_synth_qplan p;
    assert_int_equal(tsr_synth_qplan_props(14336, 4096, 3, (int[]){8, 4, 3}, (double[]){0.05, 0.1, 0.85},
                                           (int[]){32, 128, 128}, &p),
                     TSR_OK);
    assert_int_equal(p.rows[0], 736);
    assert_int_equal(p.rows[1], 1536);
    assert_int_equal(p.rows[2], 12064);
    assert_int_equal(p.G, 130);
    assert_int_equal(p.Q, 1507);
    int16_t *qg = malloc(2 * (size_t)p.G * sizeof *qg);
    tsr_synth_qplan_groups(&p, qg);
    assert_int_equal(qg[0], 8);
    assert_int_equal(qg[1], 0);
    assert_int_equal(qg[2 * 23], 4);
    assert_int_equal(qg[2 * 23 + 1], 184);
    assert_int_equal(qg[2 * 35], 3);
    assert_int_equal(qg[2 * 35 + 1], 376);
    assert_int_equal(qg[2 * 129 + 1], 1504);
    free(qg);

    /* head option -hb 6: 8 bits for 15 %, 6 bits for the rest, groups of 128; vocab padded to 32 */
    assert_int_equal(tsr_synth_head_plan(2048, 32001, 6, &p), TSR_OK);
    assert_int_equal(p.N, 32032);
    assert_int_equal(p.n_widths, 2);
    assert_int_equal(p.bits[0], 8);
    assert_int_equal(p.rows[0], 384);
    assert_int_equal(p.bits[1], 6);
    assert_int_equal(p.rows[1], 1664);
    assert_int_not_equal(tsr_synth_head_plan(2048, 32000, 7, &p), TSR_OK);
}

/* Packs a random matrix with a mixed layout, writes the EXL2 set, loads it with the engine's loader and checks
 * every code and the dequantized weights. */
static void test_round_trip(void **state)
{
    (void)state;
    const int K = 352, Nreal = 40;
    tsr_synth_qplan p;
    assert_int_equal(tsr_synth_qplan_props(K, Nreal, 4, (int[]){8, 6, 5, 3}, (double[]){0.1, 0.2, 0.2, 0.5},
                                           (int[]){32, 64, 32, 128}, &p),
                     TSR_OK);
    const int N = p.N;
    assert_int_equal(N, 64);
    uint8_t *codes = malloc((size_t)K * N);          /* stored-row order */
    uint32_t *qw = calloc((size_t)p.Q * N, 4);
    uint32_t *qs = malloc((size_t)p.G * N / 8 * 4);
    uint16_t *qsm = malloc((size_t)p.G * 2);
    int16_t *qg = malloc((size_t)p.G * 4);
    int32_t *inv = malloc((size_t)K * 4);
    int *bits_of_row = malloc((size_t)K * sizeof(int));
    int *group_of_row = malloc((size_t)K * sizeof(int));
    uint32_t x = 12345;
    for (int i = 0; i < K * N; i++) {
        x = x * 1664525u + 1013904223u;
        codes[i] = (uint8_t)(x >> 24);
    }
    for (int i = 0; i < p.G * N / 8; i++) {
        x = x * 1664525u + 1013904223u;
        qs[i] = x;
    }
    for (int g = 0; g < p.G; g++) qsm[g] = tsr_float_to_half(0.01f + 0.001f * (float)g);
    for (int k = 0; k < K; k++) inv[k] = (k * 97 + 5) % K; /* 97 is coprime with 352 */
    tsr_synth_qplan_groups(&p, qg);
    int row = 0, g = 0;
    for (int i = 0; i < p.n_widths; i++)
        for (int r0 = 0; r0 < p.rows[i]; r0 += p.group_size[i], g++) {
            int gr = p.rows[i] - r0 < p.group_size[i] ? p.rows[i] - r0 : p.group_size[i];
            for (int j = 0; j < gr; j++) {
                bits_of_row[row + j] = p.bits[i];
                group_of_row[row + j] = g;
                for (int n = 0; n < N; n++) codes[(size_t)(row + j) * N + n] &= (uint8_t)((1 << p.bits[i]) - 1);
            }
            tsr_synth_pack(codes + (size_t)row * N, gr, p.bits[i], N, qw + (size_t)qg[2 * g + 1] * N);
            row += gr;
        }
    assert_int_equal(row, K);

    char path[] = "/tmp/tsr_test_synth_XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    close(fd);
    tsr_st_writer *w;
    assert_int_equal(tsr_st_writer_open(path, &w), TSR_OK);
    assert_int_equal(tsr_st_writer_declare(w, "m.q_weight", TSR_I32, 2, (int64_t[]){p.Q, N}), TSR_OK);
    assert_int_equal(tsr_st_writer_declare(w, "m.q_invperm", TSR_I32, 1, (int64_t[]){K}), TSR_OK);
    assert_int_equal(tsr_st_writer_declare(w, "m.q_scale", TSR_I32, 2, (int64_t[]){p.G, N / 8}), TSR_OK);
    assert_int_equal(tsr_st_writer_declare(w, "m.q_scale_max", TSR_F16, 1, (int64_t[]){p.G}), TSR_OK);
    assert_int_equal(tsr_st_writer_declare(w, "m.q_groups", TSR_I16, 1, (int64_t[]){2 * p.G}), TSR_OK);
    assert_int_equal(tsr_st_writer_begin_data(w), TSR_OK);
    assert_int_equal(tsr_st_writer_write(w, qw, (size_t)p.Q * N * 4), TSR_OK);
    assert_int_equal(tsr_st_writer_write(w, inv, (size_t)K * 4), TSR_OK);
    assert_int_equal(tsr_st_writer_write(w, qs, (size_t)p.G * N / 8 * 4), TSR_OK);
    assert_int_equal(tsr_st_writer_write(w, qsm, (size_t)p.G * 2), TSR_OK);
    assert_int_equal(tsr_st_writer_write(w, qg, (size_t)p.G * 4), TSR_OK);
    assert_int_equal(tsr_st_writer_close(w), TSR_OK);

    tsr_st_set *set;
    assert_int_equal(tsr_st_open_file(path, &set), TSR_OK);
    tsr_qmatrix m;
    assert_int_equal(tsr_qmatrix_load(set, "m", K, Nreal, 0, 1.0f, &m), TSR_OK);
    assert_int_equal(m.G, p.G);
    assert_int_equal(m.Q, p.Q);
    assert_int_equal(m.N, N);
    /* bpw counted the same way */
    assert_true(fabs(tsr_qmatrix_bpw(&m) - (double)tsr_synth_qplan_bits(&p) / ((double)K * N)) < 1e-12);
    float *W = malloc((size_t)K * N * sizeof(float));
    tsr_qmatrix_dequant_ref(&m, 0, W);
    for (int i = 0; i < K; i++) {
        const tsr_qgroup *gr = &m.groups[group_of_row[i]];
        assert_int_equal(gr->bits, bits_of_row[i]);
        for (int n = 0; n < N; n++) {
            uint32_t c = codes[(size_t)i * N + n];
            assert_int_equal(tsr_qmatrix_code(&m, gr, i - gr->row0, n), c);
            /* independent dequantization (EXL2.md §6): original row k = perm[i] where inv[k] = i */
            int gi = group_of_row[i];
            int sc = (int)((qs[gi * (N / 8) + n / 8] >> (4 * (n % 8))) & 15);
            float mm = tsr_round_half(tsr_half_to_float(qsm[gi]) / 256.0f);
            float S = tsr_round_half((float)((sc + 1) * (sc + 1)) * mm);
            float want = (float)((int)c - (1 << (bits_of_row[i] - 1))) * S;
            int k = -1;
            for (int kk = 0; kk < K; kk++)
                if (inv[kk] == i) k = kk;
            assert_true(W[(size_t)k * N + n] == want);
        }
    }
    free(W);
    tsr_qmatrix_free(&m);
    tsr_st_set_free(set);
    remove(path);
    free(codes);
    free(qw);
    free(qs);
    free(qsm);
    free(qg);
    free(inv);
    free(bits_of_row);
    free(group_of_row);
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

static void rm_model(const char *dir)
{
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    assert_int_equal(system(cmd), 0);
}

static void test_tiny_model(void **state)
{
    (void)state;
    char base[] = "/tmp/tsr_test_synth_model_XXXXXX";
    assert_non_null(mkdtemp(base));
    char d1[512], d2[512], d3[512], d4[512];
    snprintf(d1, sizeof d1, "%s/a", base);
    snprintf(d2, sizeof d2, "%s/b", base);
    snprintf(d3, sizeof d3, "%s/c", base);
    snprintf(d4, sizeof d4, "%s/d", base);
    tsr_synth_opts o = {.arch = TSR_ARCH_QWEN2, .hidden = 128, .layers = 2, .heads = 4, .kv_heads = 2, .head_dim = 32,
                        .intermediate = 352, .vocab = 300, .bpw = 4.0, .head_bits = 6, .seed = 7, .max_pos = 256};
    tsr_synth_result r1, r2, r3;
    tsr_status st1 = tsr_synth_write(&o, d1, &r1);
    if (st1 != TSR_OK) fprintf(stderr, "%s\n", tsr_last_error());
    assert_int_equal(st1, TSR_OK);
    assert_int_equal(tsr_synth_write(&o, d2, &r2), TSR_OK);
    assert_int_equal(r1.n_files, 1);
    assert_true(fabs(r1.layers_bpw - 4.0) <= 0.05);
    char f1[600], f2[600];
    snprintf(f1, sizeof f1, "%s/output.safetensors", d1);
    snprintf(f2, sizeof f2, "%s/output.safetensors", d2);
    assert_true(files_equal(f1, f2)); /* deterministic */

    /* the engine's loader accepts it, and measures the same bpw */
    tsr_model *m;
    tsr_status stm = tsr_model_load(d1, &m);
    if (stm != TSR_OK) fprintf(stderr, "%s\n", tsr_last_error());
    assert_int_equal(stm, TSR_OK);
    assert_int_equal(m->cfg.arch, TSR_ARCH_QWEN2);
    assert_int_equal(m->n_exl2, 2 * 7 + 1);
    double bits = 0, numel = 0;
    for (int l = 0; l < m->cfg.n_layers; l++) {
        const tsr_linear *L[] = {&m->layers[l].q, &m->layers[l].k, &m->layers[l].v, &m->layers[l].o,
                                 &m->layers[l].gate, &m->layers[l].up, &m->layers[l].down};
        for (int i = 0; i < 7; i++) {
            assert_int_equal(L[i]->kind, TSR_LINEAR_EXL2);
            double kn = (double)L[i]->q.K * L[i]->q.N;
            bits += tsr_qmatrix_bpw(&L[i]->q) * kn;
            numel += kn;
        }
        assert_non_null(m->layers[l].q.q.bias);
    }
    assert_true(fabs(bits / numel - r1.layers_bpw) < 1e-9);
    assert_int_equal(m->head.q.N, 320);
    /* dequantized magnitude ~ 1/sqrt(K) */
    float *W = malloc((size_t)m->layers[0].down.q.K * m->layers[0].down.q.N * sizeof(float));
    tsr_qmatrix_dequant_ref(&m->layers[0].down.q, 0, W);
    double ss = 0;
    size_t cnt = (size_t)m->layers[0].down.q.K * m->layers[0].down.q.N;
    for (size_t i = 0; i < cnt; i++) ss += (double)W[i] * W[i];
    double sd = sqrt(ss / (double)cnt) * sqrt((double)m->layers[0].down.q.K);
    assert_true(sd > 0.7 && sd < 1.4);
    free(W);

    /* sharded: several files, the same tensor bytes */
    o.shard_bytes = 40000;
    assert_int_equal(tsr_synth_write(&o, d3, &r3), TSR_OK);
    assert_true(r3.n_files > 2);
    tsr_st_set *s3;
    assert_int_equal(tsr_st_open_dir(d3, &s3), TSR_OK);
    assert_int_equal(tsr_st_count(s3), tsr_st_count(m->st));
    for (size_t i = 0; i < tsr_st_count(s3); i++) {
        const tsr_st_tensor *a = tsr_st_at(s3, i), *b = tsr_st_find(m->st, a->name);
        assert_non_null(b);
        assert_int_equal(a->nbytes, b->nbytes);
        assert_memory_equal(a->data, b->data, a->nbytes);
    }
    tsr_st_set_free(s3);
    tsr_model_free(m);

    /* --group-size for EXL2: every group of every decoder matrix is 128 rows but the last of each width (the 8-bit
     * top slice of 32 rows, a width's remainder); other sizes than the converter's are refused */
    snprintf(d3, sizeof d3, "%s/g", base);
    o.group_size = 128;
    assert_int_equal(tsr_synth_write(&o, d3, &r3), TSR_OK);
    assert_int_equal(tsr_model_load(d3, &m), TSR_OK);
    for (int l = 0; l < m->cfg.n_layers; l++) {
        const tsr_linear *L[] = {&m->layers[l].q, &m->layers[l].k, &m->layers[l].v, &m->layers[l].o,
                                 &m->layers[l].gate, &m->layers[l].up, &m->layers[l].down};
        for (int i = 0; i < 7; i++)
            for (int g = 0; g < L[i]->q.G; g++) {
                const tsr_qgroup *q = &L[i]->q.groups[g];
                const int last = g == L[i]->q.G - 1 || q->bits != L[i]->q.groups[g + 1].bits;
                if (last) assert_true(q->rows <= 128); /* the top slice is the last (and only) 8-bit group */
                else assert_int_equal(q->rows, 128);
            }
    }
    tsr_model_free(m);
    o.group_size = 96;
    assert_int_equal(tsr_synth_write(&o, d4, &r3), TSR_ERR_ARG);
    assert_non_null(strstr(tsr_last_error(), "32, 64 and 128"));
    o.group_size = 0;

    /* unreachable target, bad geometry */
    o.bpw = 2.0;
    o.hidden = 64;
    o.shard_bytes = 0;
    assert_int_equal(tsr_synth_write(&o, d4, &r3), TSR_ERR_ARG);
    o.hidden = 100;
    assert_int_equal(tsr_synth_write(&o, d4, &r3), TSR_ERR_ARG);
    /* a directory holding other safetensors files is refused */
    o.hidden = 128;
    o.bpw = 4.0;
    assert_int_equal(tsr_synth_write(&o, d3, &r3), TSR_ERR_ARG);
    rm_model(base);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_pack_vectors),
        cmocka_unit_test(test_pack_columns_independent),
        cmocka_unit_test(test_plans),
        cmocka_unit_test(test_round_trip),
        cmocka_unit_test(test_tiny_model),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
