/* The planner (parallel/plan.h): spec parsing, layer ranges by actual bytes and by memory, the fit check, KV pool
 * sizing, tensor groups, and the checks a received plan goes through. Models are described in memory (their layers'
 * byte counts are what the planner reads), plus one real fixture model. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include "parallel/plan.h"
#include "runtime/kv_cache.h"
#include "tests/common/fixtures.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static void test_parse(void **state)
{
    (void)state;
    tsr_split_spec s;
    assert_int_equal(tsr_split_parse("layers:0.45,0.55", &s), TSR_OK);
    assert_int_equal(s.kind, TSR_SPLIT_LAYERS);
    assert_int_equal(s.n_ratios, 2);
    assert_true(s.ratios[1] > 0.549 && s.ratios[1] < 0.551);
    assert_int_equal(tsr_split_parse("tensor", &s), TSR_OK);
    assert_int_equal(s.kind, TSR_SPLIT_TENSOR);
    assert_int_equal(tsr_split_parse("layers", &s), TSR_OK);
    assert_int_equal(s.n_ratios, 0);
    assert_int_equal(tsr_split_parse("layers:", &s), TSR_ERR_ARG);
    assert_int_equal(tsr_split_parse("layers:1,-2", &s), TSR_ERR_ARG);
    assert_int_equal(tsr_split_parse("rows", &s), TSR_ERR_ARG);
    uint64_t b;
    assert_int_equal(tsr_size_parse("24GiB", &b), TSR_OK);
    assert_true(b == 24ull << 30);
    assert_int_equal(tsr_size_parse("24G", &b), TSR_OK);
    assert_true(b == 24ull << 30);
    assert_int_equal(tsr_size_parse("20GB", &b), TSR_OK);
    assert_true(b == 20000000000ull);
    assert_int_equal(tsr_size_parse("1536mib", &b), TSR_OK);
    assert_true(b == 1536ull << 20);
    assert_int_equal(tsr_size_parse("12 parsecs", &b), TSR_ERR_ARG);
    assert_int_equal(tsr_size_parse("GiB", &b), TSR_ERR_ARG);
    uint64_t v[4];
    int n;
    assert_int_equal(tsr_sizes_parse("24GiB,20GiB", v, 4, &n), TSR_OK);
    assert_int_equal(n, 2);
    assert_true(v[1] == 20ull << 30);
    assert_int_equal(tsr_sizes_parse("1,2,3,4,5", v, 4, &n), TSR_ERR_ARG);
}

/* A model description whose layer l stores bytes[l] bytes (all in q_proj), with a 1 MiB embedding and head. */
typedef struct {
    tsr_model m;
    tsr_layer layers[64];
    uint16_t dummy;
} fake;

static fake *make(const uint64_t *bytes, int L)
{
    fake *f = calloc(1, sizeof *f);
    tsr_model_config *c = &f->m.cfg;
    c->n_layers = L;
    c->hidden = 256;
    c->n_heads = 8;
    c->n_kv_heads = 4;
    c->head_dim = 32;
    c->intermediate = 512;
    c->vocab_size = 2048;
    c->rope.max_pos = 4096;
    f->m.layers = f->layers;
    for (int l = 0; l < L; l++) {
        f->layers[l].q.kind = TSR_LINEAR_EXL2;
        f->layers[l].q.q.bytes = bytes[l];
    }
    f->m.embed = (tsr_dense){TSR_F16, 2048, 256, &f->dummy, NULL};
    f->m.head.kind = TSR_LINEAR_EXL2;
    f->m.head.q.bytes = 1 << 20;
    f->m.final_norm = (tsr_dense){TSR_F16, 1, 256, &f->dummy, NULL};
    return f;
}

static tsr_plan_input input(int workers, tsr_split_kind kind)
{
    tsr_plan_input in;
    memset(&in, 0, sizeof in);
    in.n_workers = workers;
    in.split.kind = kind;
    in.page_size = 16;
    in.max_tokens = 256;
    in.kv_dtype = TSR_F16;
    in.kv_tokens = 1024;
    return in;
}

static uint64_t stage_bytes(const tsr_model *m, const tsr_plan *p, int s)
{
    uint64_t b = 0;
    for (int l = p->w[s * p->tp].layer0; l < p->w[s * p->tp].layer1; l++)
        b += tsr_model_layer_bytes(m, l);
    return b;
}

static void check_cover(const tsr_plan *p, int L)
{
    assert_int_equal(tsr_plan_check(p, L), TSR_OK);
    int next = 0;
    for (int s = 0; s < p->n_stages; s++) {
        const tsr_plan_worker *x = &p->w[s * p->tp];
        assert_int_equal(x->layer0, next);
        assert_true(x->layer1 > x->layer0);
        assert_int_equal(x->embed, s == 0);
        assert_int_equal(x->head, s == p->n_stages - 1);
        next = x->layer1;
    }
    assert_int_equal(next, L);
}

static void test_layers_by_bytes(void **state)
{
    (void)state;
    /* layers of very different sizes, as in EXL2 models with mixed bit widths: the cut follows the bytes */
    const uint64_t MB = 1 << 20;
    uint64_t bytes[12] = {8 * MB, 8 * MB, 8 * MB, 8 * MB, 2 * MB, 2 * MB,
                          2 * MB, 2 * MB, 2 * MB, 2 * MB, 2 * MB, 2 * MB};
    fake *f = make(bytes, 12);
    tsr_plan p;
    tsr_plan_input in = input(2, TSR_SPLIT_LAYERS);
    assert_int_equal(tsr_plan_make(&f->m, &in, &p), TSR_OK);
    check_cover(&p, 12);
    /* 48 MiB of layers + 1 + 1: each stage near 25 MiB with its fixed tensors, so stage 0 takes 3 big layers */
    assert_int_equal(p.w[0].layer1, 3);
    uint64_t a = stage_bytes(&f->m, &p, 0) + (1 << 20), b = stage_bytes(&f->m, &p, 1) + (1 << 20);
    assert_true(a > b ? a - b <= 8 * MB : b - a <= 8 * MB);
    /* explicit shares */
    assert_int_equal(tsr_split_parse("layers:0.25,0.75", &in.split), TSR_OK);
    assert_int_equal(tsr_plan_make(&f->m, &in, &p), TSR_OK);
    check_cover(&p, 12);
    assert_int_equal(p.w[0].layer1, 1);
    /* shares from memory: the worker with three times the memory gets about three times the bytes */
    in.split.n_ratios = 0;
    in.capacity[0] = 3ull << 30;
    in.capacity[1] = 1ull << 30;
    assert_int_equal(tsr_plan_make(&f->m, &in, &p), TSR_OK);
    check_cover(&p, 12);
    assert_true(stage_bytes(&f->m, &p, 0) > 2 * stage_bytes(&f->m, &p, 1));
    /* a ratio count that does not match the stages */
    assert_int_equal(tsr_split_parse("layers:1,1,1", &in.split), TSR_OK);
    assert_int_equal(tsr_plan_make(&f->m, &in, &p), TSR_ERR_ARG);
    /* more stages than layers */
    in = input(13, TSR_SPLIT_LAYERS);
    assert_int_equal(tsr_plan_make(&f->m, &in, &p), TSR_ERR_ARG);
    /* every stage gets a layer even when the bytes would give it none */
    in = input(4, TSR_SPLIT_LAYERS);
    assert_int_equal(tsr_plan_make(&f->m, &in, &p), TSR_OK);
    check_cover(&p, 12);
    free(f);
}

static void test_fit_and_kv(void **state)
{
    (void)state;
    const uint64_t MB = 1 << 20;
    uint64_t bytes[8];
    for (int l = 0; l < 8; l++)
        bytes[l] = 100 * MB;
    fake *f = make(bytes, 8);
    tsr_plan p;
    tsr_plan_input in = input(2, TSR_SPLIT_LAYERS);
    in.gpu = 1;
    in.capacity[0] = in.capacity[1] = 800 * MB; /* 401 MiB weights + ~520 MiB workspace: too small */
    assert_int_equal(tsr_plan_make(&f->m, &in, &p), TSR_ERR_NOMEM);
    assert_non_null(strstr(tsr_last_error(), "worker 0"));
    in.capacity[0] = in.capacity[1] = 2048 * MB;
    in.kv_tokens = 0; /* as much as fits */
    assert_int_equal(tsr_plan_make(&f->m, &in, &p), TSR_OK);
    for (int w = 0; w < 2; w++) {
        uint64_t total = p.w[w].weight_bytes + p.w[w].kv_bytes + p.w[w].work_bytes;
        assert_true(total <= in.capacity[w]);
        assert_true(total > in.capacity[w] / 2);
    }
    /* the same page count everywhere, and a pool too big for the cap is refused */
    in.kv_tokens = (long)p.n_pages * p.page_size * 4;
    assert_int_equal(tsr_plan_make(&f->m, &in, &p), TSR_ERR_NOMEM);
    assert_non_null(strstr(tsr_last_error(), "KV pool"));
    /* a quantized cache on GPUs: the workspace also holds the fp16 rebuild of the context for attention */
    in.kv_tokens = 1024;
    assert_int_equal(tsr_plan_make(&f->m, &in, &p), TSR_OK);
    const uint64_t work_f16 = p.w[0].work_bytes;
    in.kv_dtype = TSR_KV_Q4;
    assert_int_equal(tsr_plan_make(&f->m, &in, &p), TSR_OK);
    assert_int_equal(p.w[0].work_bytes - work_f16,
                     tsr_kv_expand_bytes(f->m.cfg.n_kv_heads, f->m.cfg.head_dim, TSR_KV_Q4,
                                         tsr_kv_expand_positions(in.max_tokens, f->m.cfg.rope.max_pos, in.page_size)));
    assert_int_equal(p.max_context, f->m.cfg.rope.max_pos);
    /* a context cap sizes that rebuild (and is what the plan carries to the workers); past the model's: refused */
    in.max_context = 1000;
    assert_int_equal(tsr_plan_make(&f->m, &in, &p), TSR_OK);
    assert_int_equal(p.max_context, 1000);
    assert_int_equal(p.w[0].work_bytes - work_f16,
                     tsr_kv_expand_bytes(f->m.cfg.n_kv_heads, f->m.cfg.head_dim, TSR_KV_Q4,
                                         tsr_kv_expand_positions(in.max_tokens, 1000, in.page_size)));
    in.max_context = f->m.cfg.rope.max_pos + 1;
    assert_int_equal(tsr_plan_make(&f->m, &in, &p), TSR_ERR_ARG);
    assert_non_null(strstr(tsr_last_error(), "beyond the model's"));
    /* as much as fits, by a share of what weights and workspace leave (default 0.95) */
    in.max_context = 0, in.kv_tokens = 0, in.kv_dtype = TSR_F16;
    assert_int_equal(tsr_plan_make(&f->m, &in, &p), TSR_OK);
    const int pages95 = p.n_pages;
    in.kv_fraction = 0.5;
    assert_int_equal(tsr_plan_make(&f->m, &in, &p), TSR_OK);
    assert_true(fabs((double)p.n_pages / pages95 - 0.5 / 0.95) < 0.01);
    /* a share of memory that no worker limits or reports (CPU workers without --gpu-memory) is refused */
    in.capacity[0] = in.capacity[1] = 0;
    assert_int_equal(tsr_plan_make(&f->m, &in, &p), TSR_ERR_ARG);
    assert_non_null(strstr(tsr_last_error(), "--kv-fraction"));
    free(f);
}

static void test_tensor_and_hybrid(void **state)
{
    (void)state;
    const uint64_t MB = 1 << 20;
    uint64_t bytes[8];
    for (int l = 0; l < 8; l++)
        bytes[l] = 64 * MB;
    fake *f = make(bytes, 8);
    tsr_plan p;
    tsr_plan_input in = input(4, TSR_SPLIT_TENSOR);
    assert_int_equal(tsr_plan_make(&f->m, &in, &p), TSR_OK);
    assert_int_equal(p.n_stages, 1);
    assert_int_equal(p.tp, 4);
    for (int w = 0; w < 4; w++) {
        assert_int_equal(p.w[w].layer0, 0);
        assert_int_equal(p.w[w].layer1, 8);
        assert_int_equal(p.w[w].tp_rank, w);
        assert_true(p.w[w].weight_bytes < 8 * 64 * MB / 4 + 3 * MB);
    }
    /* KV heads that neither split nor replicate evenly (3 workers, 4 KV heads; 16 workers, 8 query heads) */
    in = input(3, TSR_SPLIT_TENSOR);
    assert_int_equal(tsr_plan_make(&f->m, &in, &p), TSR_ERR_UNSUPPORTED);
    in = input(16, TSR_SPLIT_TENSOR);
    assert_int_equal(tsr_plan_make(&f->m, &in, &p), TSR_ERR_UNSUPPORTED);
    /* 8 workers over 4 KV heads: each holds one, replicated on two workers, and its KV pool counts one head */
    in = input(8, TSR_SPLIT_TENSOR);
    assert_int_equal(tsr_plan_make(&f->m, &in, &p), TSR_OK);
    assert_int_equal(p.tp, 8);
    tsr_plan p4;
    in = input(4, TSR_SPLIT_TENSOR);
    assert_int_equal(tsr_plan_make(&f->m, &in, &p4), TSR_OK);
    assert_true(p.w[0].kv_bytes == p4.w[0].kv_bytes); /* one KV head per worker in both */
    /* two stages of two-way tensor groups */
    in = input(4, TSR_SPLIT_LAYERS);
    in.tp = 2;
    assert_int_equal(tsr_plan_make(&f->m, &in, &p), TSR_OK);
    assert_int_equal(p.n_stages, 2);
    check_cover(&p, 8);
    assert_int_equal(p.w[1].stage, 0);
    assert_int_equal(p.w[1].tp_rank, 1);
    assert_int_equal(p.w[2].layer0, p.w[3].layer0);
    in.tp = 3;
    assert_int_equal(tsr_plan_make(&f->m, &in, &p), TSR_ERR_ARG);
    /* a corrupted plan is refused */
    in.tp = 2;
    assert_int_equal(tsr_plan_make(&f->m, &in, &p), TSR_OK);
    p.w[3].layer1 = 99;
    assert_int_equal(tsr_plan_check(&p, 8), TSR_ERR_FORMAT);
    p.w[3].layer1 = 8;
    p.version = 77;
    assert_int_equal(tsr_plan_check(&p, 8), TSR_ERR_FORMAT);
    free(f);
}

static void test_fixture_model(void **state)
{
    (void)state;
    char dir[4096];
    if (!tsr_fixture_model(dir, sizeof dir, "tiny-llama-exl2-4.0bpw")) skip();
    tsr_model *m;
    assert_int_equal(tsr_model_load(dir, &m), TSR_OK);
    tsr_plan p;
    tsr_plan_input in = input(2, TSR_SPLIT_LAYERS);
    assert_int_equal(tsr_plan_make(m, &in, &p), TSR_OK);
    check_cover(&p, m->cfg.n_layers);
    uint64_t sum = 0;
    for (int l = 0; l < m->cfg.n_layers; l++)
        sum += tsr_model_layer_bytes(m, l);
    assert_true(sum > 0 && sum < m->file_bytes);
    assert_int_equal(p.w[1].kv_bytes, tsr_kv_bytes_per_token(p.w[1].layer1 - p.w[1].layer0, m->cfg.n_kv_heads,
                                                             m->cfg.head_dim, TSR_F16) *
                                          (uint64_t)p.n_pages * 16);
    FILE *devnull = fopen("/dev/null", "w");
    tsr_plan_print(devnull, &p, m);
    fclose(devnull);
    tsr_model_free(m);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_parse),         cmocka_unit_test(test_layers_by_bytes),
        cmocka_unit_test(test_fit_and_kv),    cmocka_unit_test(test_tensor_and_hybrid),
        cmocka_unit_test(test_fixture_model),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
