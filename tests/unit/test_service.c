/* The service loop end to end: the bundled model through scheduler + local executor must give each request the
 * same greedy tokens as running it alone on an engine (batch invariance), whatever else shares the steps; and with
 * a scripted fake executor: exactly one final event per request through cancellation, stop strings, a failing and
 * a broken executor, and shutdown. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include "runtime/engine.h"
#include "runtime/service.h"
#include "tests/common/fixtures.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define MAX_REQ 64
#define MAX_GEN 64

typedef struct collected {
    pthread_mutex_t mu;
    int32_t tokens[MAX_REQ][MAX_GEN];
    int n_tokens[MAX_REQ];
    char text[MAX_REQ][4096];
    size_t text_len[MAX_REQ];
    int finals[MAX_REQ];
    tsr_finish_reason reason[MAX_REQ];
    int n_generated[MAX_REQ];
    int n_cached[MAX_REQ];
    uint64_t ids[MAX_REQ];
    int events_after_final;
    tsr_service *svc;
    int cancel_after; /* with cancel_index: cancel that request after this many tokens */
    int cancel_index;
} collected;

typedef struct slot {
    collected *c;
    int index;
} slot;

static void on_event(const tsr_gen_event *ev, void *user)
{
    slot *sl = user;
    collected *c = sl->c;
    int i = sl->index;
    pthread_mutex_lock(&c->mu);
    if (c->finals[i]) c->events_after_final++;
    if (ev->token >= 0 && c->n_tokens[i] < MAX_GEN) c->tokens[i][c->n_tokens[i]++] = ev->token;
    if (ev->text_len && c->text_len[i] + ev->text_len < sizeof c->text[i]) {
        memcpy(c->text[i] + c->text_len[i], ev->text, ev->text_len);
        c->text_len[i] += ev->text_len;
    }
    if (ev->finish != TSR_FINISH_NONE) {
        c->finals[i]++;
        c->reason[i] = ev->finish;
        c->n_generated[i] = ev->n_generated;
        c->n_cached[i] = ev->n_cached;
    }
    int cancel = c->cancel_after && i == c->cancel_index && c->n_tokens[i] == c->cancel_after;
    pthread_mutex_unlock(&c->mu);
    if (cancel) tsr_service_cancel(c->svc, ev->id);
}

static char model_dir[4096];

static tsr_tokenizer *load_tokenizer(void)
{
    char path[4200];
    snprintf(path, sizeof path, "%s/tokenizer.json", model_dir);
    tsr_tokenizer *tok = NULL;
    assert_int_equal(tsr_tokenizer_load(path, &tok), TSR_OK);
    return tok;
}

static tsr_seq_params greedy(int max_tokens)
{
    tsr_seq_params p = {0};
    p.sampling = tsr_sampling_default();
    p.sampling.temperature = 0;
    p.max_tokens = max_tokens;
    p.ignore_eos = 1;
    p.n_logprobs = -1;
    return p;
}

/* Prompts of different lengths, some sharing a long prefix. */
static int make_prompt(int i, int32_t *out, int vocab)
{
    int n = 5 + (i * 37) % 90;
    for (int t = 0; t < n; t++) out[t] = (int32_t)((t < 40 && i % 3 == 0) ? 11 + t : (i * 131 + t * 17) % vocab);
    return n;
}

static void test_batch_invariance(void **state)
{
    (void)state;
    tsr_engine_opts eo = {.kv_tokens = 8192, .max_tokens = 256, .kv_dtype = TSR_F32};
    tsr_engine *e = NULL;
    assert_int_equal(tsr_engine_open(model_dir, &eo, &e), TSR_OK);
    const int vocab = e->model->cfg.vocab_size, n_req = 24, n_gen = 12;
    int32_t prompts[24][128];
    int n_prompt[24];
    int32_t want[24][16];
    float *logits = malloc((size_t)vocab * sizeof *logits);
    for (int i = 0; i < n_req; i++) {
        n_prompt[i] = make_prompt(i, prompts[i], vocab);
        tsr_seq seq = {0};
        int32_t tok = 0;
        tsr_feed f = {&seq, prompts[i], n_prompt[i], TSR_LOGITS_LAST, logits, NULL};
        for (int g = 0; g < n_gen; g++) {
            assert_int_equal(tsr_engine_feed(e, &f, 1), TSR_OK);
            tok = tsr_argmax(logits, vocab);
            want[i][g] = tok;
            f = (tsr_feed){&seq, &want[i][g], 1, TSR_LOGITS_LAST, logits, NULL};
        }
        tsr_engine_seq_release(e, &seq);
    }
    free(logits);

    tsr_tokenizer *tok = load_tokenizer();
    tsr_executor *x = NULL;
    assert_int_equal(tsr_executor_local(e, &x), TSR_OK);
    tsr_service_opts so = {.sched = {.max_running = 8, .max_step_tokens = 64}};
    tsr_service *svc = NULL;
    assert_int_equal(tsr_service_start(x, tok, &so, &svc), TSR_OK);
    collected *c = calloc(1, sizeof *c);
    pthread_mutex_init(&c->mu, NULL);
    slot slots[24];
    for (int i = 0; i < n_req; i++) {
        slots[i] = (slot){c, i};
        tsr_gen_request q = {prompts[i], n_prompt[i], greedy(n_gen), NULL, 0};
        assert_int_equal(tsr_service_submit(svc, &q, on_event, &slots[i], &c->ids[i]), TSR_OK);
    }
    tsr_service_wait_idle(svc);
    for (int i = 0; i < n_req; i++) {
        assert_int_equal(c->finals[i], 1);
        assert_int_equal(c->reason[i], TSR_FINISH_LENGTH);
        assert_int_equal(c->n_tokens[i], n_gen);
        for (int g = 0; g < n_gen; g++) assert_int_equal(c->tokens[i][g], want[i][g]);
    }
    assert_int_equal(c->events_after_final, 0);
    tsr_service_stats st;
    tsr_service_get_stats(svc, &st);
    assert_int_equal((int)st.requests_finished, n_req);
    /* every third prompt shares a 40-token prefix: with 16-token pages, two full pages can be shared */
    assert_true(st.sched.prefix_hits > 0);
    tsr_service_stop(svc, 0);
    x->close(x);
    tsr_tokenizer_free(tok);
    tsr_engine_close(e);
    pthread_mutex_destroy(&c->mu);
    free(c);
}

/* ---- a scripted executor ---- */

typedef struct fake {
    _Atomic int steps, fail_at, break_at, paused;
    int32_t abc[3]; /* the tokens spelling "a", "b", "c" */
} fake;

static void fake_init(fake *f, const tsr_tokenizer *tok)
{
    memset(f, 0, sizeof *f);
    for (int i = 0; i < 3; i++) {
        char letter[2] = {(char)('a' + i), 0};
        int32_t *ids = NULL;
        size_t n = 0;
        assert_int_equal(tsr_tokenizer_encode(tok, letter, 1, 0, &ids, &n), TSR_OK);
        assert_int_equal((int)n, 1);
        f->abc[i] = ids[0];
        free(ids);
    }
}

static tsr_status fake_run(tsr_executor *x, const tsr_step *step, tsr_step_result *res, float *logits)
{
    (void)logits;
    fake *f = x->impl;
    while (f->paused) nanosleep(&(struct timespec){0, 1000000}, NULL);
    f->steps++;
    if (f->break_at && f->steps >= f->break_at) {
        x->broken = 1;
        return tsr_fail(TSR_ERR_REMOTE, "rank 2 died");
    }
    if (f->fail_at && f->steps == f->fail_at) return tsr_fail(TSR_ERR_INTERNAL, "step %d failed", f->steps);
    for (int i = 0; i < step->n_seqs; i++) {
        const tsr_step_seq *q = &step->seqs[i];
        int32_t last = step->tokens[q->token0 + q->n_tokens - 1], next = f->abc[0];
        for (int k = 0; k < 3; k++)
            if (last == f->abc[k]) next = f->abc[(k + 1) % 3]; /* spells "...abcabc" */
        res[i] = (tsr_step_result){.token = q->sample ? next : -1};
    }
    return TSR_OK;
}

static void fake_close(tsr_executor *x) { (void)x; }

static tsr_executor fake_executor(fake *f)
{
    tsr_executor x = {.vocab = 1000, .page_size = 4, .n_pages = 64, .max_step_tokens = 32, .max_context = 256};
    x.run = fake_run;
    x.close = fake_close;
    x.impl = f;
    return x;
}

static void test_events_and_failures(void **state)
{
    (void)state;
    tsr_tokenizer *tok = load_tokenizer();
    fake f;
    fake_init(&f, tok);
    tsr_executor x = fake_executor(&f);
    tsr_service *svc = NULL;
    assert_int_equal(tsr_service_start(&x, tok, NULL, &svc), TSR_OK);
    collected *c = calloc(1, sizeof *c);
    pthread_mutex_init(&c->mu, NULL);
    c->svc = svc;
    c->cancel_index = 1;
    c->cancel_after = 3;
    slot slots[4];
    int32_t prompt[6] = {1, 7, 8, 9, f.abc[0], f.abc[1]};
    const char *stops[] = {"cab"};
    for (int i = 0; i < 4; i++) {
        slots[i] = (slot){c, i};
        tsr_gen_request q = {prompt, 6, greedy(20), i == 2 ? stops : NULL, i == 2};
        assert_int_equal(tsr_service_submit(svc, &q, on_event, &slots[i], &c->ids[i]), TSR_OK);
    }
    tsr_service_wait_idle(svc);
    assert_int_equal(c->reason[0], TSR_FINISH_LENGTH);
    assert_int_equal(c->n_tokens[0], 20);
    assert_string_equal(c->text[0], "cabcabcabcabcabcabca");
    assert_int_equal(c->reason[1], TSR_FINISH_CANCELLED);
    assert_true(c->n_tokens[1] >= 3 && c->n_tokens[1] <= 4);
    /* the stop string never reaches the text */
    assert_int_equal(c->reason[2], TSR_FINISH_STOP);
    assert_string_equal(c->text[2], "");
    for (int i = 0; i < 4; i++) assert_int_equal(c->finals[i], 1);

    /* invalid requests are refused at submit, with no callback */
    uint64_t id;
    tsr_gen_request bad = {prompt, 6, greedy(251), NULL, 0};
    assert_int_equal(tsr_service_submit(svc, &bad, on_event, &slots[3], &id), TSR_ERR_ARG);
    assert_non_null(strstr(tsr_last_error(), "256"));
    int32_t bad_tok = 5000;
    bad = (tsr_gen_request){&bad_tok, 1, greedy(4), NULL, 0};
    assert_int_equal(tsr_service_submit(svc, &bad, on_event, &slots[3], &id), TSR_ERR_ARG);

    /* a failing step fails its sequences only; a broken executor fails everything and refuses new work */
    memset(c->finals, 0, sizeof c->finals);
    f.fail_at = f.steps + 1;
    tsr_gen_request q = {prompt, 6, greedy(5), NULL, 0};
    assert_int_equal(tsr_service_submit(svc, &q, on_event, &slots[0], &c->ids[0]), TSR_OK);
    tsr_service_wait_idle(svc);
    assert_int_equal(c->reason[0], TSR_FINISH_ERROR);
    assert_int_equal(tsr_service_submit(svc, &q, on_event, &slots[1], &c->ids[1]), TSR_OK);
    tsr_service_wait_idle(svc);
    assert_int_equal(c->reason[1], TSR_FINISH_LENGTH);
    /* hold the loop inside a step while the second request queues, then break on the step after */
    f.paused = 1;
    q.params.max_tokens = 50;
    assert_int_equal(tsr_service_submit(svc, &q, on_event, &slots[2], &c->ids[2]), TSR_OK);
    assert_int_equal(tsr_service_submit(svc, &q, on_event, &slots[3], &c->ids[3]), TSR_OK);
    f.break_at = f.steps + 2;
    f.paused = 0;
    tsr_service_wait_idle(svc);
    assert_int_equal(c->reason[2], TSR_FINISH_ERROR);
    assert_int_equal(c->reason[3], TSR_FINISH_ERROR);
    assert_int_equal(tsr_service_submit(svc, &q, on_event, &slots[0], &id), TSR_ERR_REMOTE);
    tsr_service_stats st;
    tsr_service_get_stats(svc, &st);
    assert_int_equal(st.executor_broken, 1);
    for (int i = 0; i < 4; i++) assert_int_equal(c->finals[i], 1);
    assert_int_equal(c->events_after_final, 0);
    tsr_service_stop(svc, 0);
    tsr_tokenizer_free(tok);
    pthread_mutex_destroy(&c->mu);
    free(c);
}

/* Shutdown with requests in flight: each still gets exactly one final event. */
static void test_shutdown(void **state)
{
    (void)state;
    tsr_tokenizer *tok = load_tokenizer();
    fake f;
    fake_init(&f, tok);
    tsr_executor x = fake_executor(&f);
    tsr_service *svc = NULL;
    assert_int_equal(tsr_service_start(&x, tok, NULL, &svc), TSR_OK);
    collected *c = calloc(1, sizeof *c);
    pthread_mutex_init(&c->mu, NULL);
    slot slots[MAX_REQ];
    int32_t prompt[3] = {1, f.abc[0], f.abc[1]};
    for (int i = 0; i < MAX_REQ; i++) {
        slots[i] = (slot){c, i};
        tsr_gen_request q = {prompt, 3, greedy(200), NULL, 0};
        assert_int_equal(tsr_service_submit(svc, &q, on_event, &slots[i], &c->ids[i]), TSR_OK);
    }
    tsr_service_stop(svc, 0.01);
    for (int i = 0; i < MAX_REQ; i++) assert_int_equal(c->finals[i], 1);
    assert_int_equal(c->events_after_final, 0);
    tsr_tokenizer_free(tok);
    pthread_mutex_destroy(&c->mu);
    free(c);
}

int main(void)
{
    if (!tsr_fixture_model(model_dir, sizeof model_dir, "tiny-llama-exl2-4.0bpw")) {
        fprintf(stderr, "bundled model not found\n");
        return 1;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_events_and_failures),
        cmocka_unit_test(test_shutdown),
        cmocka_unit_test(test_batch_invariance),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
