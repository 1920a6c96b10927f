/* Request admission under allocation failure, swept by fault_sweep() like model load (every allocation failed
 * in turn; a stride plus the first allocation of every call site only past TSR_FAULT_RUNS, default 4000):
 *  - OpenAI request parsing (launcher/openai.c): a completions body (two prompts, n = 2, stop strings, stop ids,
 *    logit bias, logprobs) and a chat body (rendered through the model's chat template), each followed by the
 *    response side: a result fed one event per choice and the non-streaming body built. A tolerated failure must
 *    give the same request and the same body;
 *  - the scheduler: a fresh scheduler taking two requests, driven to their ends with a fake executor (one is
 *    cancelled), then freed: each request must get the same tokens and ending whatever failed (a failure may
 *    put an admission off to a later step); and a long-lived scheduler taking one request and cancelling it,
 *    which must stay consistent (tsr_sched_check, run with failures suspended) and idle whatever failed;
 *  - the service: started over the bundled model's local executor; two chat requests parsed and submitted, a
 *    greedy one running to max_tokens (its tokens and text must not change) and one cancelled from its first
 *    token's callback; stopped. A refused submit must never call back; an accepted one gets exactly one final
 *    event: "length" and "cancelled" unless the request failed.
 * After each run nothing allocated during it may still be live. Service runs allocate on the loop thread and the
 * CPU thread pool as well; the allocation numbering then depends on timing, so the report counts the runs whose
 * failure was actually injected. TSR_FAULT_FILTER=<cmocka test name pattern> runs some of the tests. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include "launcher/openai.h"
#include "runtime/engine.h"
#include "tests/common/oai_model.h"
#include "tests/fault/fail_alloc.h"
#include "tests/fault/fault_sweep.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static long max_runs(void)
{
    const char *env = getenv("TSR_FAULT_RUNS");
    return env && atol(env) > 0 ? atol(env) : 4000;
}

static tsr_test_oai oai; /* the bundled model's tokenizer and chat template, stopping at its eos token */

static const char completions_body[] =
    "{\"model\":\"tiny\",\"prompt\":[\"Once upon a time\",\"The quick brown fox\"],\"n\":2,\"max_tokens\":4,"
    "\"stop\":[\"\\n\\n\",\"The end\"],\"stop_token_ids\":[7,9],\"logit_bias\":{\"5\":2.5,\"6\":-100},"
    "\"logprobs\":2,\"seed\":3,\"temperature\":0.7,\"top_k\":20}";
static const char chat_body[] =
    "{\"model\":\"tiny\",\"messages\":[{\"role\":\"system\",\"content\":\"Be brief.\"},"
    "{\"role\":\"user\",\"content\":\"Tell me a story.\"},{\"role\":\"assistant\",\"content\":\"Once\"},"
    "{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":\"Go on.\"}]}],"
    "\"max_tokens\":32,\"ignore_eos\":true,\"stop\":\"zzz\",\"logprobs\":true,\"top_logprobs\":2}";

/* Parses a body; a refusal becomes this thread's tsr message (the sweep wants one with every error). */
static tsr_status parse(tsr_oai_kind kind, const char *body, tsr_oai_request **rq)
{
    tsr_oai_error err;
    memset(&err, 0, sizeof err);
    tsr_status st = tsr_oai_parse_bytes(kind, body, strlen(body), &oai.model, rq, &err);
    if (st != TSR_OK) {
        assert_null(*rq);
        assert_true(err.status >= 400);
        assert_true(err.message[0] != '\0');
        return tsr_fail(st, "%d: %s", err.status, err.message);
    }
    return st;
}

/* ---- OpenAI mapping --------------------------------------------------------------------------------------------- */

static tsr_status respond(const tsr_oai_request *rq)
{
    tsr_oai_result *res = NULL;
    tsr_status st = tsr_oai_result_new(rq, &oai.model, "cmpl-fault", 1, &res);
    for (int c = 0; st == TSR_OK && c < rq->n_choices; c++) {
        tsr_step_result sr = {.token = 5, .logprob = -0.5f, .n_top = 2, .top_ids = {5, 6}, .top_logprobs = {-0.5f, -1}};
        tsr_gen_event ev = {.id = (uint64_t)c + 1, .text = "abc", .text_len = 3, .token = 5, .result = &sr,
                            .finish = TSR_FINISH_LENGTH, .n_prompt = rq->prompts[c / rq->n].n_ids, .n_generated = 1};
        json_t *chunk = NULL;
        st = tsr_oai_result_add(res, c, &ev, &chunk);
        if (st == TSR_OK && rq->stream && !chunk) st = tsr_fail(TSR_ERR_NOMEM, "no chunk for an event");
        json_decref(chunk);
    }
    if (st == TSR_OK) {
        assert_true(tsr_oai_result_done(res));
        json_t *body = tsr_oai_response(res);
        if (!body) st = tsr_fail(TSR_ERR_NOMEM, "no response body");
        fa_suspend(1);
        char *text = body ? json_dumps(body, JSON_SORT_KEYS | JSON_COMPACT) : NULL;
        fa_suspend(0);
        if (text) fault_result(text, strlen(text));
        free(text);
        json_decref(body);
    }
    tsr_oai_result_free(res);
    return st;
}

/* A parsed request's content, for the fingerprint. */
static void request_result(const tsr_oai_request *rq)
{
    int head[] = {rq->kind, rq->n_prompts, rq->n, rq->n_choices, rq->stream, rq->include_usage, rq->echo,
                  rq->logprobs, rq->top_logprobs, rq->has_seed, rq->n_stop, rq->n_stop_ids, rq->n_bias,
                  rq->params.max_tokens, rq->params.min_tokens, rq->params.ignore_eos, rq->params.n_logprobs};
    fault_result(head, sizeof head);
    fault_result(rq->model, strlen(rq->model));
    fault_result(&rq->params.sampling, sizeof rq->params.sampling);
    if (rq->has_seed) fault_result(&rq->params.seed, sizeof rq->params.seed);
    for (int i = 0; i < rq->n_prompts; i++) {
        fault_result(rq->prompts[i].ids, (size_t)rq->prompts[i].n_ids * sizeof *rq->prompts[i].ids);
        fault_result(rq->prompts[i].text ? rq->prompts[i].text : "", rq->prompts[i].text_len);
    }
    for (int i = 0; i < rq->n_stop; i++) fault_result(rq->stop[i], strlen(rq->stop[i]));
    fault_result(rq->stop_ids, (size_t)rq->n_stop_ids * sizeof *rq->stop_ids);
    fault_result(rq->bias, (size_t)rq->n_bias * sizeof *rq->bias);
}

static tsr_status oai_op(tsr_oai_kind kind, const char *body)
{
    tsr_oai_request *rq = NULL;
    tsr_status st = parse(kind, body, &rq);
    if (st == TSR_OK) request_result(rq);
    if (st == TSR_OK) st = respond(rq);
    tsr_oai_request_free(rq);
    return st;
}

static tsr_status completions_op(void *ctx)
{
    (void)ctx;
    return oai_op(TSR_OAI_COMPLETIONS, completions_body);
}

static tsr_status chat_op(void *ctx)
{
    (void)ctx;
    return oai_op(TSR_OAI_CHAT, chat_body);
}

static void test_parse_completions(void **state)
{
    (void)state;
    fault_sweep("openai.completions", completions_op, NULL, max_runs(), NULL);
}

static void test_parse_chat(void **state)
{
    (void)state;
    fault_sweep("openai.chat", chat_op, NULL, max_runs(), NULL);
}

/* ---- scheduler --------------------------------------------------------------------------------------------------- */

static const int32_t prompt_a[] = {1, 17, 23, 99, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20};
static const int32_t prompt_b[] = {1, 17, 23, 99, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 30, 31};
static const int32_t stop_ids[] = {2, 3};
static const tsr_logit_bias bias[] = {{5, 1.0f}, {6, -2.0f}};

static tsr_sched_opts sched_opts(void)
{
    return (tsr_sched_opts){.page_size = 4, .n_pages = 64, .max_step_tokens = 64, .max_context = 256,
                            .vocab = 2048};
}

static tsr_seq_params seq_params(void)
{
    tsr_seq_params p = {0};
    p.sampling = tsr_sampling_default();
    p.max_tokens = 8;
    p.stop_ids = stop_ids;
    p.n_stop_ids = 2;
    p.n_logprobs = 1;
    p.bias = bias;
    p.n_bias = 2;
    return p;
}

/* The check allocates; its allocations are not under test. */
static void check_sched(const tsr_sched *s)
{
    fa_suspend(1);
    tsr_status st = tsr_sched_check(s);
    fa_suspend(0);
    if (st != TSR_OK) fail_msg("scheduler inconsistent: %s", tsr_last_error());
}

/* Two requests on a fresh scheduler driven to the end with a fake executor (each sampled token is 100 + the
 * tokens its sequence generated before); the first is cancelled after two tokens, the second runs to max_tokens.
 * What each request received is the fingerprint: a failure may put an admission off to a later step, never
 * change a request's tokens or ending. */
typedef struct sched_run {
    uint64_t id[2];
    int n_tokens[2], finals[2];
    int32_t tokens[2][16];
    tsr_finish_reason reason[2];
} sched_run;

static void take_events(tsr_sched *s, sched_run *run)
{
    const tsr_sched_event *ev;
    int n = tsr_sched_drain_events(s, &ev);
    for (int i = 0; i < n; i++)
        for (int k = 0; k < 2; k++) {
            if (ev[i].id != run->id[k]) continue;
            if (run->finals[k]) fail_msg("sched.lifecycle, %s: an event after the final one", fault_current_run());
            if (ev[i].token >= 0 && run->n_tokens[k] < 16) run->tokens[k][run->n_tokens[k]++] = ev[i].token;
            if (ev[i].finish != TSR_FINISH_NONE) {
                run->finals[k]++;
                run->reason[k] = ev[i].finish;
            }
        }
}

static tsr_status sched_lifecycle_op(void *ctx)
{
    (void)ctx;
    tsr_sched_opts o = sched_opts();
    tsr_sched *s = NULL;
    TSR_TRY(tsr_sched_new(&o, &s));
    tsr_seq_params p = seq_params();
    sched_run run = {0};
    tsr_step step = {0};
    tsr_status st = tsr_sched_submit(s, prompt_a, 21, &p, 0, &run.id[0]);
    if (st == TSR_OK) st = tsr_sched_submit(s, prompt_b, 19, &p, 0, &run.id[1]);
    check_sched(s);
    for (int iter = 0; st == TSR_OK && !tsr_sched_idle(s) && iter < 64; iter++) {
        st = tsr_sched_plan(s, 0, &step);
        check_sched(s);
        if (st != TSR_OK || step.n_seqs == 0) {
            take_events(s, &run);
            continue;
        }
        tsr_step_result res[2] = {{0}};
        assert_true(step.n_seqs <= 2);
        for (int i = 0; i < step.n_seqs; i++) {
            int k = step.seqs[i].id == run.id[1];
            res[i].token = 100 + run.n_tokens[k];
        }
        st = tsr_sched_commit(s, &step, res, 0);
        check_sched(s);
        take_events(s, &run);
        if (run.n_tokens[0] == 2 && !run.finals[0]) tsr_sched_cancel(s, run.id[0]);
    }
    take_events(s, &run);
    if (st == TSR_OK) {
        if (!tsr_sched_idle(s)) fail_msg("sched.lifecycle, %s: requests never ended", fault_current_run());
        for (int k = 0; k < 2; k++) {
            if (run.finals[k] != 1)
                fail_msg("sched.lifecycle, %s: %d final events", fault_current_run(), run.finals[k]);
            fault_result(run.tokens[k], (size_t)run.n_tokens[k] * sizeof run.tokens[k][0]);
            fault_result(&run.reason[k], sizeof run.reason[k]);
        }
    }
    tsr_step_free(&step);
    tsr_sched_free(s);
    return st;
}

static void test_sched_lifecycle(void **state)
{
    (void)state;
    fault_sweep("sched.lifecycle", sched_lifecycle_op, NULL, max_runs(), NULL);
}

/* A long-lived scheduler: submit, cancel, plan (which reports the cancellation), drain; idle afterwards. */
static tsr_status sched_submit_op(void *ctx)
{
    tsr_sched *s = ctx;
    tsr_seq_params p = seq_params();
    uint64_t id = 0;
    tsr_step step = {0};
    tsr_status st = tsr_sched_submit(s, prompt_a, 21, &p, 0, &id);
    check_sched(s);
    if (st == TSR_OK) {
        tsr_sched_cancel(s, id);
        const tsr_sched_event *ev;
        int n = tsr_sched_drain_events(s, &ev);
        int finals = 0;
        for (int i = 0; i < n; i++) finals += ev[i].id == id && ev[i].finish == TSR_FINISH_CANCELLED;
        if (finals != 1) fail_msg("sched.submit: %d final events for a cancelled request", finals);
    }
    tsr_status plan = tsr_sched_plan(s, 0, &step);
    if (plan != TSR_OK) fail_msg("sched.submit: plan failed after the cancel: %s", tsr_last_error());
    assert_int_equal(step.n_seqs, 0);
    tsr_step_free(&step);
    const tsr_sched_event *ev;
    tsr_sched_drain_events(s, &ev);
    check_sched(s);
    assert_true(tsr_sched_idle(s));
    return st;
}

static void test_sched_submit(void **state)
{
    (void)state;
    tsr_sched_opts o = sched_opts();
    tsr_sched *s = NULL;
    assert_int_equal(tsr_sched_new(&o, &s), TSR_OK);
    fault_sweep("sched.submit", sched_submit_op, s, max_runs(), NULL);
    tsr_sched_free(s);
}

/* ---- service ----------------------------------------------------------------------------------------------------- */

/* What one request of the service op received. */
typedef struct svc_watch {
    pthread_mutex_t *mu;
    pthread_cond_t *cv;
    tsr_service *svc;
    int cancel_first;         /* cancel the request from its first token's callback */
    uint64_t id;              /* 0: refused */
    int events, finals, tokens;
    int32_t ids[64];
    char text[1024];
    size_t text_len;
    tsr_finish_reason reason;
} svc_watch;

static void on_event(const tsr_gen_event *ev, void *user)
{
    svc_watch *w = user;
    pthread_mutex_lock(w->mu);
    w->events++;
    int first_token = ev->token >= 0 && w->tokens == 0;
    if (ev->token >= 0 && w->tokens < 64) w->ids[w->tokens++] = ev->token;
    if (ev->text_len && w->text_len + ev->text_len < sizeof w->text) {
        memcpy(w->text + w->text_len, ev->text, ev->text_len);
        w->text_len += ev->text_len;
    }
    if (ev->finish != TSR_FINISH_NONE) {
        w->finals++;
        w->reason = ev->finish;
        pthread_cond_broadcast(w->cv);
    }
    pthread_mutex_unlock(w->mu);
    if (w->cancel_first && first_token && ev->finish == TSR_FINISH_NONE) tsr_service_cancel(w->svc, ev->id);
}

static const char greedy_body[] =
    "{\"model\":\"tiny\",\"messages\":[{\"role\":\"user\",\"content\":\"Tell me a story.\"}],"
    "\"max_tokens\":6,\"temperature\":0,\"ignore_eos\":true,\"stop\":[\"zzz\"]}";

/* Parses body and submits its one choice; the request's outcome lands in w. */
static tsr_status submit(tsr_service *svc, const char *body, svc_watch *w, tsr_oai_request **rq)
{
    tsr_status st = parse(TSR_OAI_CHAT, body, rq);
    if (st != TSR_OK) return st;
    tsr_gen_request gq;
    tsr_oai_gen_request(*rq, 0, &gq);
    return tsr_service_submit(svc, &gq, on_event, w, &w->id);
}

/* Starts a service, submits a greedy request that runs to max_tokens and one cancelled at its first token,
 * waits for both and stops. The greedy request's tokens and text and the other's tokens are the fingerprint. */
static tsr_status service_op(void *ctx)
{
    tsr_executor *x = ctx;
    tsr_service *svc = NULL;
    TSR_TRY(tsr_service_start(x, oai.tok, NULL, &svc));
    pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
    pthread_cond_t cv = PTHREAD_COND_INITIALIZER;
    svc_watch w[2] = {{.mu = &mu, .cv = &cv, .svc = svc}, {.mu = &mu, .cv = &cv, .svc = svc, .cancel_first = 1}};
    tsr_oai_request *rq[2] = {NULL, NULL};
    tsr_status st = submit(svc, greedy_body, &w[0], &rq[0]);
    if (st == TSR_OK) st = submit(svc, chat_body, &w[1], &rq[1]);
    pthread_mutex_lock(&mu);
    while ((w[0].id && !w[0].finals) || (w[1].id && !w[1].finals)) pthread_cond_wait(&cv, &mu);
    pthread_mutex_unlock(&mu);
    tsr_service_stop(svc, 0);
    for (int k = 0; k < 2; k++) {
        if (!w[k].id && w[k].events) fail_msg("service, %s: a refused submit called back", fault_current_run());
        if (w[k].id && w[k].finals != 1)
            fail_msg("service, %s: %d final events", fault_current_run(), w[k].finals);
        if (st == TSR_OK && w[k].reason == TSR_FINISH_ERROR)
            st = tsr_fail(TSR_ERR_NOMEM, "request %d ended with an error event", k);
    }
    if (st == TSR_OK) {
        if (w[0].reason != TSR_FINISH_LENGTH || w[1].reason != TSR_FINISH_CANCELLED)
            fail_msg("service, %s: requests ended with '%s' and '%s' (expected length and cancelled)",
                     fault_current_run(), tsr_finish_reason_str(w[0].reason), tsr_finish_reason_str(w[1].reason));
        fault_result(w[0].ids, (size_t)w[0].tokens * sizeof w[0].ids[0]);
        fault_result(w[0].text, w[0].text_len);
        fault_result(&w[1].tokens, sizeof w[1].tokens);
    }
    tsr_oai_request_free(rq[0]);
    tsr_oai_request_free(rq[1]);
    return st;
}

static void test_service(void **state)
{
    (void)state;
    tsr_engine_opts eo = {.kv_tokens = 512, .max_tokens = 64};
    tsr_engine *e = NULL;
    tsr_executor *x = NULL;
    assert_int_equal(tsr_engine_open(oai.dir, &eo, &e), TSR_OK);
    assert_int_equal(tsr_executor_local(e, &x), TSR_OK);
    fault_sweep("service.submit", service_op, x, max_runs(), NULL);
    x->close(x);
    tsr_engine_close(e);
}

/* ---- setup
 * ----------------------------------------------------------------------------------------------------------- */

static int setup(void **state)
{
    (void)state;
    return tsr_test_oai_open(&oai, "tiny-llama-exl2-4.0bpw", NULL, 0, 512);
}

static int teardown(void **state)
{
    (void)state;
    tsr_test_oai_close(&oai);
    return 0;
}

int main(void)
{
    fa_route_jansson();
    if (getenv("TSR_FAULT_FILTER")) cmocka_set_test_filter(getenv("TSR_FAULT_FILTER")); /* e.g. "test_service" */
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_parse_completions),
        cmocka_unit_test(test_parse_chat),
        cmocka_unit_test(test_sched_lifecycle),
        cmocka_unit_test(test_sched_submit),
        cmocka_unit_test(test_service),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
