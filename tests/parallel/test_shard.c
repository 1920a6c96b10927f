/* Tensor and layer splits in one process, against the whole model.
 *
 * Slices: every linear layer of the first and last layer (EXL2, GPTQ and dense fixtures) is cut along columns and
 * along rows at odd boundaries; the dequantized slice must equal the same block of the dequantized whole matrix bit
 * for bit (row slices re-pack EXL2 streams, so this is the check of that). Tensor split: two shards run by two
 * threads over the in-process comm produce logits within 1e-3 of the whole model's with an FP32 KV cache, and the
 * same argmax everywhere. Layer split: two stages run one after the other, the first stage's hidden state handed to
 * the second, produce exactly the whole model's logits. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include "parallel/comm_local.h"
#include "parallel/shard.h"
#include "runtime/engine.h"
#include "runtime/sampler.h"
#include "tests/common/fixtures.h"
#include "tests/common/golden.h"

#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *const models[] = {"tiny-llama-exl2-4.0bpw",    "tiny-llama-exl2-2.5bpw",
                                     "tiny-llama-exl2-8.0bpw",    "tiny-qwen2-exl2-4.65bpw",
                                     "tiny-llama-fp16",           "tiny-qwen2-fp16",
                                     "tiny-llama-gptq-4bit-g128", "tiny-qwen2-gptq-4bit-g128-actorder"};
#define N_MODELS (sizeof models / sizeof models[0])

static int model_dir(const char *name, char *dir, size_t cap)
{
    return tsr_fixture_model(dir, cap, name) != NULL;
}

/* ---- slices ---- */

/* Dequantized [K][N] of any linear layer (dense weights are stored [N][K]). */
static float *dequant(const tsr_linear *L)
{
    float *W = calloc((size_t)L->K * (size_t)(L->kind == TSR_LINEAR_EXL2 ? L->q.N : L->N), sizeof *W);
    if (L->kind == TSR_LINEAR_EXL2) {
        tsr_qmatrix_dequant_ref(&L->q, 0, W);
    } else {
        for (int n = 0; n < L->N; n++)
            for (int k = 0; k < L->K; k++)
                W[(size_t)k * L->N + n] = tsr_dense_get(L->w.dtype, L->w.data, (size_t)n * L->w.cols + k);
    }
    return W;
}

static int stride(const tsr_linear *L)
{
    return L->kind == TSR_LINEAR_EXL2 ? L->q.N : L->N;
}

static void check_slices(tsr_model *m, const tsr_linear *L, const char *what)
{
    float *W = dequant(L);
    const int ws = stride(L);
    /* columns [n0, n1) and rows [k0, k1) at boundaries that are not multiples of anything */
    const int n0 = L->N / 3 + 1, n1 = L->N - L->N / 5, k0 = L->K / 4 + 3, k1 = L->K - L->K / 7 - 1;
    tsr_linear C, R;
    if (tsr_slice_linear_cols(m, L, n0, n1, &C) != TSR_OK) fail_msg("%s cols: %s", what, tsr_last_error());
    if (tsr_slice_linear_rows(m, L, k0, k1, 1, &R) != TSR_OK) fail_msg("%s rows: %s", what, tsr_last_error());
    float *Wc = dequant(&C), *Wr = dequant(&R);
    long bad = 0;
    for (int k = 0; k < L->K; k++)
        for (int n = 0; n < n1 - n0; n++)
            bad += memcmp(&Wc[(size_t)k * stride(&C) + n], &W[(size_t)k * ws + n0 + n], sizeof(float)) != 0;
    for (int k = 0; k < k1 - k0; k++)
        for (int n = 0; n < L->N; n++)
            bad += memcmp(&Wr[(size_t)k * stride(&R) + n], &W[(size_t)(k0 + k) * ws + n], sizeof(float)) != 0;
    if (bad) fail_msg("%s: %ld sliced weights differ from the whole matrix", what, bad);
    if (L->kind == TSR_LINEAR_EXL2) {
        assert_int_equal(R.q.K, k1 - k0);
        int rows = 0;
        for (int g = 0; g < R.q.G; g++)
            rows += R.q.groups[g].rows;
        assert_int_equal(rows, k1 - k0);
    }
    tsr_qmatrix_free(&C.q);
    tsr_qmatrix_free(&R.q);
    free(W);
    free(Wc);
    free(Wr);
}

static void test_slices(void **state)
{
    (void)state;
    int tested = 0;
    for (size_t i = 0; i < N_MODELS; i++) {
        char dir[4096];
        if (!model_dir(models[i], dir, sizeof dir)) continue;
        tsr_model *m;
        if (tsr_model_load(dir, &m) != TSR_OK) fail_msg("%s: %s", dir, tsr_last_error());
        const int last = m->cfg.n_layers - 1;
        for (int l = 0; l <= last; l += last) {
            tsr_layer *ly = &m->layers[l];
            const tsr_linear *all[] = {&ly->q, &ly->k, &ly->v, &ly->o, &ly->gate, &ly->up, &ly->down};
            for (size_t k = 0; k < 7; k++) {
                char what[256];
                snprintf(what, sizeof what, "%s layer %d matrix %zu", models[i], l, k);
                check_slices(m, all[k], what);
            }
        }
        check_slices(m, &m->head, models[i]);
        tsr_model_free(m);
        tested++;
    }
    if (!tested) skip();
}

/* ---- runs ---- */

#define MAX_PROMPTS 8

/* Feeds every prompt in one batch through an engine; out[i] = logits [len_i][local vocab] (malloc'd). */
static tsr_status feed_all(tsr_engine *e, const prompts *p, float **out)
{
    const int vocab = e->model->local.vocab;
    tsr_seq seqs[MAX_PROMPTS] = {0};
    tsr_feed feeds[MAX_PROMPTS];
    for (int i = 0; i < p->n; i++) {
        out[i] = malloc((size_t)p->len[i] * vocab * sizeof(float));
        feeds[i] = (tsr_feed){&seqs[i], p->ids[i], p->len[i], TSR_LOGITS_ALL, out[i], NULL};
    }
    tsr_status st = tsr_engine_feed(e, feeds, p->n);
    for (int i = 0; i < p->n; i++)
        tsr_engine_seq_release(e, &seqs[i]);
    return st;
}

typedef struct {
    const char *dir;
    const prompts *p;
    int rank, size;
    tsr_comm *comm;
    float *out[MAX_PROMPTS];
    int v0, vocab;
    tsr_status st;
    char err[512];
} shard_job;

static tsr_status cut(void *ctx, tsr_model *m)
{
    shard_job *j = ctx;
    return tsr_shard_model(m, j->rank, j->size);
}

static tsr_status sum_hook(void *ctx, float *buf, size_t n)
{
    tsr_comm *c = ctx;
    return c->allreduce_sum(c, buf, n);
}

static void *shard_thread(void *arg)
{
    shard_job *j = arg;
    tsr_engine_opts o = {
        .max_tokens = 512, .page_size = 16, .kv_tokens = 1024, .kv_dtype = TSR_F32, .on_load = cut, .on_load_ctx = j};
    tsr_engine *e = NULL;
    j->st = tsr_engine_open(j->dir, &o, &e);
    if (j->st == TSR_OK) {
        tsr_forward_comm fc = {j->comm, sum_hook, 0};
        tsr_forward_set_comm(e->fwd, &fc);
        j->v0 = e->model->local.vocab0;
        j->vocab = e->model->local.vocab;
        j->st = feed_all(e, j->p, j->out);
    }
    if (j->st != TSR_OK) snprintf(j->err, sizeof j->err, "%s", tsr_last_error());
    tsr_engine_close(e);
    return NULL;
}

/* One model, tensor-split over S members in threads, against the whole model's logits. */
static void check_tensor_split(const char *name, const char *dir, const prompts *p, int S, int *tested)
{
    tsr_engine_opts o = {.max_tokens = 512, .page_size = 16, .kv_tokens = 1024, .kv_dtype = TSR_F32};
    tsr_engine *whole = NULL;
    if (tsr_engine_open(dir, &o, &whole) != TSR_OK) fail_msg("%s: %s", dir, tsr_last_error());
    const int vocab = whole->model->cfg.vocab_size;
    if (tsr_shard_check(&whole->model->cfg, S) != TSR_OK) {
        tsr_engine_close(whole);
        return;
    }
    float *ref[MAX_PROMPTS];
    if (feed_all(whole, p, ref) != TSR_OK) fail_msg("%s: %s", dir, tsr_last_error());
    tsr_engine_close(whole);

    enum { MAX_S = 4 };
    assert_true(S <= MAX_S);
    tsr_comm *comms[MAX_S];
    assert_int_equal(tsr_comm_local_group(S, 120, comms), TSR_OK);
    shard_job jobs[MAX_S];
    pthread_t th[MAX_S];
    for (int r = 0; r < S; r++) {
        jobs[r] = (shard_job){.dir = dir, .p = p, .rank = r, .size = S, .comm = comms[r]};
        assert_int_equal(pthread_create(&th[r], NULL, shard_thread, &jobs[r]), 0);
    }
    for (int r = 0; r < S; r++)
        pthread_join(th[r], NULL);
    for (int r = 0; r < S; r++)
        if (jobs[r].st != TSR_OK) fail_msg("%s shard %d: %s", name, r, jobs[r].err);
    double worst = 0;
    long disagree = 0;
    for (int k = 0; k < p->n; k++) {
        float *full = malloc((size_t)p->len[k] * vocab * sizeof(float));
        for (int r = 0; r < S; r++)
            for (int t = 0; t < p->len[k]; t++)
                memcpy(full + (size_t)t * vocab + jobs[r].v0, jobs[r].out[k] + (size_t)t * jobs[r].vocab,
                       (size_t)jobs[r].vocab * sizeof(float));
        tsr_logit_diff d = tsr_compare_logits(full, ref[k], p->len[k], vocab);
        if (d.max_abs > worst) worst = d.max_abs;
        for (int t = 0; t < p->len[k]; t++)
            disagree += tsr_argmax(full + (size_t)t * vocab, vocab) != tsr_argmax(ref[k] + (size_t)t * vocab, vocab);
        free(full);
        free(ref[k]);
        for (int r = 0; r < S; r++)
            free(jobs[r].out[k]);
    }
    for (int r = 0; r < S; r++)
        tsr_comm_free(comms[r]);
    printf("tensor split x%d %-36s max |diff| %.3g, argmax disagreements %ld\n", S, name, worst, disagree);
    if (worst > 1e-3) fail_msg("%s: tensor-split logits differ by %g", name, worst);
    assert_int_equal(disagree, 0);
    (*tested)++;
}

/* Two members split the KV heads; four (more than the fixtures' two KV heads) replicate them. */
static void test_tensor_split(void **state)
{
    (void)state;
    prompts p = load_prompts();
    int tested = 0;
    for (size_t i = 0; i < N_MODELS; i++) {
        char dir[4096];
        if (!model_dir(models[i], dir, sizeof dir)) continue;
        check_tensor_split(models[i], dir, &p, 2, &tested);
        check_tensor_split(models[i], dir, &p, 4, &tested);
    }
    free_prompts(&p);
    if (!tested) skip();
}

/* Layer split: stage 0 holds layers [0, cut) and the embedding, stage 1 the rest and the head. */
static void test_layer_split(void **state)
{
    (void)state;
    prompts p = load_prompts();
    int tested = 0;
    for (size_t i = 0; i < N_MODELS; i++) {
        char dir[4096];
        if (!model_dir(models[i], dir, sizeof dir)) continue;
        tsr_engine_opts o = {.max_tokens = 512, .page_size = 16, .kv_tokens = 1024, .kv_dtype = TSR_F16};
        tsr_engine *whole = NULL, *st0 = NULL, *st1 = NULL;
        if (tsr_engine_open(dir, &o, &whole) != TSR_OK) fail_msg("%s: %s", dir, tsr_last_error());
        const int L = whole->model->cfg.n_layers, H = whole->model->cfg.hidden, vocab = whole->model->cfg.vocab_size;
        tsr_model_part a = {0, L / 2, 1, 0, 0, 1}, b = {L / 2, L, 0, 1, 0, 1};
        o.part = &a;
        if (tsr_engine_open(dir, &o, &st0) != TSR_OK) fail_msg("%s: %s", dir, tsr_last_error());
        o.part = &b;
        if (tsr_engine_open(dir, &o, &st1) != TSR_OK) fail_msg("%s: %s", dir, tsr_last_error());
        assert_null(st0->model->final_norm.data);
        if (!st1->model->head_tied) assert_null(st1->model->embed.data);
        assert_int_equal(st1->kv.n_layers, L - L / 2);

        /* every prompt in one call, pages numbered in order */
        tsr_seq_input in[MAX_PROMPTS];
        int32_t *pages[MAX_PROMPTS];
        int next = 0, T = 0, rows = 0;
        for (int k = 0; k < p.n; k++) {
            int np = (p.len[k] + 15) / 16;
            pages[k] = malloc((size_t)np * sizeof(int32_t));
            for (int j = 0; j < np; j++)
                pages[k][j] = next++;
            in[k] = (tsr_seq_input){p.ids[k], p.len[k], 0, pages[k], np, TSR_LOGITS_ALL};
            T += p.len[k];
            rows += p.len[k];
        }
        float *ref = malloc((size_t)rows * vocab * sizeof(float)), *got = malloc((size_t)rows * vocab * sizeof(float));
        if (tsr_forward(whole->fwd, in, p.n, ref) != TSR_OK) fail_msg("whole: %s", tsr_last_error());
        if (tsr_forward(st0->fwd, in, p.n, NULL) != TSR_OK) fail_msg("stage 0: %s", tsr_last_error());
        memcpy(tsr_forward_hidden(st1->fwd), tsr_forward_hidden(st0->fwd), (size_t)T * H * sizeof(float));
        if (tsr_forward(st1->fwd, in, p.n, got) != TSR_OK) fail_msg("stage 1: %s", tsr_last_error());
        if (memcmp(ref, got, (size_t)rows * vocab * sizeof(float)))
            fail_msg("%s: layer-split logits are not bit-identical to the whole model's", models[i]);
        printf("layer split x2 %-36s bit-identical over %d rows\n", models[i], rows);
        for (int k = 0; k < p.n; k++)
            free(pages[k]);
        free(ref);
        free(got);
        tsr_engine_close(whole);
        tsr_engine_close(st0);
        tsr_engine_close(st1);
        tested++;
    }
    free_prompts(&p);
    if (!tested) skip();
}

static void test_uneven_shapes(void **state)
{
    (void)state;
    tsr_model_config c = {.n_heads = 8, .n_kv_heads = 2, .intermediate = 96, .vocab_size = 1000};
    assert_int_equal(tsr_shard_check(&c, 2), TSR_OK);
    assert_int_equal(tsr_shard_check(&c, 3), TSR_ERR_UNSUPPORTED); /* neither divides nor replicates the 2 KV heads */
    assert_non_null(strstr(tsr_last_error(), "key/value heads"));
    assert_int_equal(tsr_shard_check(&c, 16), TSR_ERR_UNSUPPORTED); /* replicates, but 8 query heads over 16 */
    assert_int_equal(tsr_shard_kv_heads(&c, 2), 1);
    /* 4 members over 2 KV heads: each KV head on two members, which take two of its four query heads each */
    assert_int_equal(tsr_shard_check(&c, 4), TSR_OK);
    assert_int_equal(tsr_shard_kv_heads(&c, 4), 1);
    const int want[4][4] = {{0, 1, 0, 2}, {0, 1, 2, 4}, {1, 2, 4, 6}, {1, 2, 6, 8}};
    for (int r = 0; r < 4; r++) {
        tsr_shard_range q;
        tsr_shard_range_of(&c, r, 4, &q);
        assert_int_equal(q.kv0, want[r][0]);
        assert_int_equal(q.kv1, want[r][1]);
        assert_int_equal(q.h0, want[r][2]);
        assert_int_equal(q.h1, want[r][3]);
    }
    c.n_kv_heads = 8;
    c.intermediate = 100;
    assert_int_equal(tsr_shard_check(&c, 8), TSR_ERR_UNSUPPORTED);
    assert_non_null(strstr(tsr_last_error(), "MLP"));
    c.intermediate = 96;
    tsr_shard_range r0, r1;
    tsr_shard_range_of(&c, 0, 2, &r0);
    tsr_shard_range_of(&c, 1, 2, &r1);
    assert_int_equal(r0.v1, r1.v0);
    assert_int_equal(r1.v1, 1000);
    assert_int_equal(r0.v1 % 32, 0);
    assert_int_equal(r0.h1, 4);
    assert_int_equal(r1.i0, 48);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_uneven_shapes),
        cmocka_unit_test(test_slices),
        cmocka_unit_test(test_layer_split),
        cmocka_unit_test(test_tensor_split),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
