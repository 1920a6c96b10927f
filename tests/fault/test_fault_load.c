/* Model load under allocation failure: opening and closing an engine on the bundled EXL2 model and on the two GPTQ
 * fixtures (act-order among them), loading the bundled model's tokenizer and the Llama 2 fixture tokenizer (then
 * encoding and decoding a string with each) and the model's chat template. fault_sweep() fails every allocation
 * of each operation in turn (a few hundred per engine open; JSON parsing counts once per document, see
 * fail_alloc.h), plus the first allocation of each call site when an operation has more than TSR_FAULT_RUNS
 * (default 4000) and the sweep takes a stride. Each run must end in an error with a message, or in the same
 * result as a clean run (the engine's configuration and the logits of a short prompt; the tokenizer's
 * vocabulary, encoding and decoding; the rendered template), never a crash, with nothing allocated left live
 * after it. Model weights are mmap'd, not allocated. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include "runtime/engine.h"
#include "runtime/text/chat_template.h"
#include "runtime/text/tokenizer.h"
#include "tests/common/fixtures.h"
#include "tests/fault/fail_alloc.h"
#include "tests/fault/fault_sweep.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The harness itself: counting, failing the n-th allocation or a site, and seeing a leak. */
static void *probe;

static tsr_status five_allocs_op(void *ctx)
{
    (void)ctx;
    char *a = malloc(10), *b = strdup("x");
    void *c = calloc(2, 8);
    json_t *j = json_object();
    tsr_status st = a && b && c && j ? TSR_OK : tsr_fail(TSR_ERR_NOMEM, "out of memory");
    free(a);
    free(b);
    free(c);
    json_decref(j);
    return st;
}

static void test_allocator(void **state)
{
    (void)state;
    fa_count_start();
    assert_int_equal(five_allocs_op(NULL), TSR_OK);
    assert_int_equal(fa_stop(), 5); /* json_object() allocates the object and its hashtable */
    const void *const *sites;
    assert_true(fa_sites(&sites) >= 4);
    for (long i = 1; i <= 5; i++) {
        fa_fail_nth(i);
        errno = 0;
        assert_int_equal(five_allocs_op(NULL), TSR_ERR_NOMEM);
        fa_stop();
        assert_true(fa_injected());
    }
    fa_fail_site(sites[1]);
    assert_int_equal(five_allocs_op(NULL), TSR_ERR_NOMEM);
    fa_stop();
    assert_ptr_equal(fa_injected_site(), sites[1]);
    errno = 0;
    fa_fail_nth(1);
    assert_null(malloc(1));
    fa_stop();
    assert_int_equal(errno, ENOMEM);

    uint64_t mark = fa_mark();
    probe = realloc(NULL, 100);
    probe = realloc(probe, 5000);
    assert_int_equal(fa_live_since(mark, 0), 1);
    free(probe);
    assert_int_equal(fa_live_since(mark, 0), 0);
    fault_sweep("allocator self-test", five_allocs_op, NULL, 100, NULL);
}

/* Failing runs per operation before the sweep takes a stride: TSR_FAULT_RUNS, else `dflt`. */
static long max_runs(long dflt)
{
    const char *env = getenv("TSR_FAULT_RUNS");
    return env && atol(env) > 0 ? atol(env) : dflt;
}

/* What an opened engine computes: its configuration and the logits of a short prompt (run with failures
 * suspended: only the open is under test). */
static void engine_result(tsr_engine *e)
{
    fa_suspend(1);
    const tsr_model_config *cfg = &e->model->cfg;
    fault_result(cfg, sizeof *cfg);
    fault_result(&e->kv_pool_tokens, sizeof e->kv_pool_tokens);
    static const int32_t prompt[] = {1, 450, 1996, 17};
    float *logits = malloc((size_t)cfg->vocab_size * sizeof *logits);
    assert_non_null(logits);
    tsr_seq seq = {0};
    tsr_feed f = {&seq, prompt, 4, TSR_LOGITS_LAST, logits, NULL};
    tsr_status st = tsr_engine_feed(e, &f, 1);
    if (st != TSR_OK) fail_msg("%s: the opened engine cannot run: %s", fault_current_run(), tsr_last_error());
    fault_result(logits, (size_t)cfg->vocab_size * sizeof *logits);
    tsr_engine_seq_release(e, &seq);
    free(logits);
    fa_suspend(0);
}

static tsr_status open_close_engine(void *ctx)
{
    tsr_engine_opts o = {.kv_tokens = 256, .max_tokens = 64};
    tsr_engine *e = NULL;
    tsr_status st = tsr_engine_open(ctx, &o, &e);
    if (st == TSR_OK) {
        assert_non_null(e);
        engine_result(e);
    }
    tsr_engine_close(e);
    return st;
}

static tsr_status load_tokenizer(void *ctx)
{
    tsr_tokenizer *tok = NULL;
    tsr_status st = tsr_tokenizer_load(ctx, &tok);
    if (st == TSR_OK) {
        int32_t *ids = NULL;
        size_t n = 0;
        static const char sample[] = "Once upon a time, in 1999: naïve café ☕";
        st = tsr_tokenizer_encode(tok, sample, strlen(sample), 1, &ids, &n);
        char *text = NULL;
        size_t len = 0;
        if (st == TSR_OK) st = tsr_tokenizer_decode(tok, ids, n, 0, &text, &len);
        if (st == TSR_OK) {
            fault_result(ids, n * sizeof *ids);
            fault_result(text, len);
            size_t vocab = tsr_tokenizer_vocab_size(tok);
            fault_result(&vocab, sizeof vocab);
            for (size_t i = 0; i < vocab; i++) {
                const char *piece = tsr_tokenizer_token_str(tok, (int32_t)i);
                int special = tsr_tokenizer_is_special(tok, (int32_t)i);
                fault_result(piece ? piece : "", piece ? strlen(piece) : 0);
                fault_result(&special, sizeof special);
            }
            const char *bos = tsr_tokenizer_bos_token(tok), *eos = tsr_tokenizer_eos_token(tok);
            fault_result(bos ? bos : "-", bos ? strlen(bos) : 1);
            fault_result(eos ? eos : "-", eos ? strlen(eos) : 1);
        }
        free(text);
        free(ids);
    }
    tsr_tokenizer_free(tok);
    return st;
}

static tsr_status load_template(void *ctx)
{
    tsr_chat_template *tpl = NULL;
    char *bos = NULL, *eos = NULL;
    tsr_status st = tsr_chat_template_load_dir(ctx, 0, &tpl, &bos, &eos);
    if (st == TSR_OK) {
        fa_suspend(1);
        json_t *msgs = json_pack("[{s:s, s:s}, {s:s, s:s}]", "role", "user", "content", "Hello", "role",
                                 "assistant", "content", "Hi there");
        char *text = NULL;
        if (tsr_chat_template_render(tpl, msgs, NULL, 1, bos, eos, NULL, &text) != TSR_OK)
            fail_msg("%s: the loaded template cannot render: %s", fault_current_run(), tsr_last_error());
        fault_result(text, strlen(text));
        fault_result(bos ? bos : "-", bos ? strlen(bos) : 1);
        fault_result(eos ? eos : "-", eos ? strlen(eos) : 1);
        free(text);
        json_decref(msgs);
        fa_suspend(0);
    }
    tsr_chat_template_free(tpl);
    free(bos);
    free(eos);
    return st;
}

static void sweep_model(const char *what, const char *model, fault_op_fn op, long runs)
{
    char dir[4096], name[128];
    if (!tsr_fixture_model(dir, sizeof dir, model)) fail_msg("fixture model %s not found", model);
    snprintf(name, sizeof name, "%s %s", what, model);
    fault_sweep(name, op, dir, max_runs(runs), NULL);
}

static void test_engine_exl2(void **state)
{
    (void)state;
    sweep_model("engine", "tiny-llama-exl2-4.0bpw", open_close_engine, 4000);
}

static void test_engine_gptq(void **state)
{
    (void)state;
    sweep_model("engine", "tiny-llama-gptq-4bit-g128", open_close_engine, 4000);
}

static void test_engine_gptq_actorder(void **state)
{
    (void)state;
    sweep_model("engine", "tiny-qwen2-gptq-4bit-g128-actorder", open_close_engine, 4000);
}

static void test_tokenizer(void **state)
{
    (void)state;
    sweep_model("tokenizer", "tiny-llama-exl2-4.0bpw", load_tokenizer, 4000);
}

/* The Llama 2 tokenizer (SentencePiece-style: Prepend/Replace normalizers, Metaspace, ByteFallback, Fuse,
 * Strip decoders), 1.8 MB: only the first allocation of each call site fails, to keep the time down. */
static void test_tokenizer_llama2(void **state)
{
    (void)state;
    char path[4096];
    if (!tsr_fixture_path(path, sizeof path, "tokenizers/llama2/tokenizer.json"))
        fail_msg("fixture tokenizers/llama2/tokenizer.json not found");
    fault_sweep("tokenizer llama2", load_tokenizer, path, max_runs(4000), NULL);
}

static void test_chat_template(void **state)
{
    (void)state;
    sweep_model("template", "tiny-llama-exl2-4.0bpw", load_template, 4000);
}

int main(void)
{
    fa_route_jansson();
    if (getenv("TSR_FAULT_FILTER")) cmocka_set_test_filter(getenv("TSR_FAULT_FILTER")); /* e.g. "test_service" */
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_allocator),
        cmocka_unit_test(test_engine_exl2),
        cmocka_unit_test(test_engine_gptq),
        cmocka_unit_test(test_engine_gptq_actorder),
        cmocka_unit_test(test_tokenizer),
        cmocka_unit_test(test_tokenizer_llama2),
        cmocka_unit_test(test_chat_template),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
