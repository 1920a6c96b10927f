/* Unit tests of the OpenAI request/response mapping (launcher/openai.h) with the bundled model's tokenizer and
 * chat template and no model or service: requests become the expected token ids and parameters, bad requests
 * the expected OpenAI-style errors, and fabricated service events the expected response bodies and stream
 * chunks. */
#include "launcher/openai.h"
#include "tests/common/oai_model.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

static const int32_t eos_ids[] = {1, 4};
static tsr_test_oai oai;

static int setup(void **state)
{
    (void)state;
    return tsr_test_oai_open(&oai, "tiny-llama-exl2-4.0bpw", eos_ids, 2, 128);
}

static int teardown(void **state)
{
    (void)state;
    tsr_test_oai_close(&oai);
    return 0;
}

static tsr_status parse(tsr_oai_kind kind, const char *body, tsr_oai_request **rq, tsr_oai_error *err)
{
    memset(err, 0, sizeof *err);
    return tsr_oai_parse_bytes(kind, body, strlen(body), &oai.model, rq, err);
}

/* Parses a request that must fail; checks status, param and (when given) a piece of the message. */
static void expect_error(tsr_oai_kind kind, const char *body, int status, const char *param, const char *needle)
{
    tsr_oai_request *rq = NULL;
    tsr_oai_error err;
    tsr_status st = parse(kind, body, &rq, &err);
    if (st == TSR_OK) fail_msg("accepted: %s", body);
    assert_null(rq);
    if (err.status != status) fail_msg("%s: status %d, expected %d (%s)", body, err.status, status, err.message);
    if (param) assert_string_equal(err.param, param);
    if (needle && !strstr(err.message, needle)) fail_msg("%s: message '%s' lacks '%s'", body, err.message, needle);
    json_t *j = tsr_oai_error_json(&err);
    assert_non_null(j);
    json_t *e = json_object_get(j, "error");
    assert_true(json_is_string(json_object_get(e, "message")));
    assert_true(json_is_string(json_object_get(e, "type")));
    assert_non_null(json_object_get(e, "param"));
    assert_non_null(json_object_get(e, "code"));
    json_decref(j);
}

static void test_completions_fields(void **state)
{
    (void)state;
    tsr_oai_request *rq;
    tsr_oai_error err;
    assert_int_equal(parse(TSR_OAI_COMPLETIONS,
                           "{\"model\":\"tiny\",\"prompt\":\"Once upon a time\",\"max_tokens\":5,\"temperature\":0,"
                           "\"top_p\":0.9,\"top_k\":40,\"min_p\":0.05,\"typical_p\":0.95,\"repetition_penalty\":1.1,"
                           "\"frequency_penalty\":0.5,\"presence_penalty\":-0.5,\"seed\":7,\"n\":3,"
                           "\"stop\":[\"\\n\",\"end\"],\"logit_bias\":{\"12\":-100,\"7\":2.5},\"logprobs\":2,"
                           "\"ignore_eos\":true,\"min_tokens\":2,\"stop_token_ids\":[9],\"user\":\"x\"}",
                           &rq, &err),
                     TSR_OK);
    size_t n_ids = 0;
    int32_t *ids = NULL;
    assert_int_equal(tsr_tokenizer_encode(oai.tok, "Once upon a time", 16, 1, &ids, &n_ids), TSR_OK);
    assert_int_equal(rq->n_prompts, 1);
    assert_int_equal(rq->prompts[0].n_ids, (int)n_ids);
    assert_memory_equal(rq->prompts[0].ids, ids, n_ids * sizeof *ids);
    free(ids);
    assert_int_equal(rq->n, 3);
    assert_int_equal(rq->n_choices, 3);
    const tsr_seq_params *p = &rq->params;
    assert_true(p->sampling.temperature == 0.0f);
    assert_true(p->sampling.top_p == 0.9f);
    assert_int_equal(p->sampling.top_k, 40);
    assert_true(p->sampling.min_p == 0.05f);
    assert_true(p->sampling.typical_p == 0.95f);
    assert_true(p->sampling.repetition_penalty == 1.1f);
    assert_true(p->sampling.frequency_penalty == 0.5f);
    assert_true(p->sampling.presence_penalty == -0.5f);
    assert_int_equal(p->max_tokens, 5);
    assert_int_equal(p->min_tokens, 2);
    assert_int_equal(p->ignore_eos, 1);
    assert_int_equal(p->n_logprobs, 2);
    assert_int_equal(rq->logprobs, 1);
    assert_int_equal(rq->n_stop, 2);
    assert_string_equal(rq->stop[1], "end");
    assert_int_equal(p->n_stop_ids, 3);
    assert_int_equal(p->stop_ids[0], 1);
    assert_int_equal(p->stop_ids[1], 4);
    assert_int_equal(p->stop_ids[2], 9);
    assert_int_equal(p->n_bias, 2);
    int saw12 = 0;
    for (int i = 0; i < p->n_bias; i++)
        if (p->bias[i].token == 12) saw12 = p->bias[i].bias == -100.0f;
    assert_true(saw12);
    tsr_gen_request g;
    tsr_oai_gen_request(rq, 2, &g);
    assert_int_equal(g.params.seed, 9);
    assert_int_equal(g.n_stop, 2);
    assert_ptr_equal(g.prompt, rq->prompts[0].ids);
    tsr_oai_request_free(rq);
}

static void test_completions_defaults_and_prompt_forms(void **state)
{
    (void)state;
    tsr_oai_request *rq;
    tsr_oai_error err;
    assert_int_equal(parse(TSR_OAI_COMPLETIONS, "{\"prompt\":\"Hi\"}", &rq, &err), TSR_OK);
    assert_string_equal(rq->model, "tiny");
    assert_int_equal(rq->params.max_tokens, 16); /* OpenAI's default for completions */
    assert_true(rq->params.sampling.temperature == 1.0f);
    assert_int_equal(rq->params.n_logprobs, -1);
    assert_int_equal(rq->stream, 0);
    tsr_oai_request_free(rq);

    assert_int_equal(parse(TSR_OAI_COMPLETIONS, "{\"prompt\":[0,5,9],\"echo\":true,\"max_tokens\":3}", &rq, &err),
                     TSR_OK);
    assert_int_equal(rq->prompts[0].n_ids, 3);
    assert_int_equal(rq->prompts[0].ids[2], 9);
    assert_non_null(rq->prompts[0].text);
    tsr_oai_request_free(rq);

    assert_int_equal(parse(TSR_OAI_COMPLETIONS, "{\"prompt\":[\"a\",\"b c\"],\"n\":2,\"max_tokens\":1}", &rq, &err),
                     TSR_OK);
    assert_int_equal(rq->n_prompts, 2);
    assert_int_equal(rq->n_choices, 4);
    tsr_gen_request g;
    tsr_oai_gen_request(rq, 3, &g);
    assert_ptr_equal(g.prompt, rq->prompts[1].ids);
    tsr_oai_request_free(rq);

    assert_int_equal(parse(TSR_OAI_COMPLETIONS, "{\"prompt\":[[1,2],[3]],\"max_tokens\":1,\"stream\":true,"
                                                "\"stream_options\":{\"include_usage\":true}}",
                           &rq, &err),
                     TSR_OK);
    assert_int_equal(rq->n_prompts, 2);
    assert_int_equal(rq->prompts[1].n_ids, 1);
    assert_int_equal(rq->stream, 1);
    assert_int_equal(rq->include_usage, 1);
    tsr_oai_request_free(rq);
}

static void test_chat_prompt(void **state)
{
    (void)state;
    tsr_oai_request *rq;
    tsr_oai_error err;
    assert_int_equal(parse(TSR_OAI_CHAT,
                           "{\"messages\":[{\"role\":\"developer\",\"content\":\"Be brief.\"},"
                           "{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":\"Hello\"}]}],"
                           "\"max_completion_tokens\":4,\"logprobs\":true,\"top_logprobs\":3}",
                           &rq, &err),
                     TSR_OK);
    json_t *msgs = json_loads("[{\"role\":\"system\",\"content\":\"Be brief.\"},{\"role\":\"user\",\"content\":"
                              "\"Hello\"}]",
                              0, NULL);
    char *text = NULL;
    assert_int_equal(tsr_chat_template_render(oai.tpl, msgs, NULL, 1, oai.bos, oai.eos, NULL, &text), TSR_OK);
    int32_t *ids = NULL;
    size_t n = 0;
    assert_int_equal(tsr_tokenizer_encode(oai.tok, text, strlen(text), 0, &ids, &n), TSR_OK);
    assert_int_equal(rq->prompts[0].n_ids, (int)n);
    assert_memory_equal(rq->prompts[0].ids, ids, n * sizeof *ids);
    assert_int_equal(rq->params.max_tokens, 4);
    assert_int_equal(rq->params.n_logprobs, 3);
    free(ids);
    free(text);
    json_decref(msgs);
    tsr_oai_request_free(rq);

    /* without max tokens a chat completion may fill the context */
    assert_int_equal(parse(TSR_OAI_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"Hi\"}]}", &rq, &err), TSR_OK);
    assert_int_equal(rq->params.max_tokens, 128 - rq->prompts[0].n_ids);
    tsr_oai_request_free(rq);
}

static void test_errors(void **state)
{
    (void)state;
    expect_error(TSR_OAI_COMPLETIONS, "{\"prompt\":", 400, "", "invalid JSON");
    expect_error(TSR_OAI_COMPLETIONS, "[1,2]", 400, "", "JSON object");
    expect_error(TSR_OAI_COMPLETIONS, "{}", 400, "prompt", NULL);
    expect_error(TSR_OAI_COMPLETIONS, "{\"prompt\":\"x\",\"model\":\"gpt-4\"}", 404, "model", "gpt-4");
    expect_error(TSR_OAI_COMPLETIONS, "{\"prompt\":\"x\",\"temperature\":\"hot\"}", 400, "temperature", NULL);
    expect_error(TSR_OAI_COMPLETIONS, "{\"prompt\":\"x\",\"temperature\":-1}", 400, "temperature", NULL);
    expect_error(TSR_OAI_COMPLETIONS, "{\"prompt\":\"x\",\"top_p\":0}", 400, "top_p", NULL);
    expect_error(TSR_OAI_COMPLETIONS, "{\"prompt\":\"x\",\"n\":0}", 400, "n", NULL);
    expect_error(TSR_OAI_COMPLETIONS, "{\"prompt\":\"x\",\"max_tokens\":0}", 400, "max_tokens", NULL);
    expect_error(TSR_OAI_COMPLETIONS, "{\"prompt\":\"x\",\"max_tokens\":1.5}", 400, "max_tokens", NULL);
    expect_error(TSR_OAI_COMPLETIONS, "{\"prompt\":\"x\",\"max_tokens\":500}", 400, "max_tokens", "128");
    expect_error(TSR_OAI_COMPLETIONS, "{\"prompt\":\"x\",\"max_tokens\":500}", 400, "max_tokens", "500 in the");
    expect_error(TSR_OAI_COMPLETIONS, "{\"prompt\":[5,99999]}", 400, "prompt", NULL);
    expect_error(TSR_OAI_COMPLETIONS, "{\"prompt\":[]}", 400, "prompt", NULL);
    expect_error(TSR_OAI_COMPLETIONS, "{\"prompt\":{}}", 400, "prompt", NULL);
    expect_error(TSR_OAI_COMPLETIONS, "{\"prompt\":\"x\",\"stop\":5}", 400, "stop", NULL);
    expect_error(TSR_OAI_COMPLETIONS,
                 "{\"prompt\":\"x\",\"stop\":[\"1\",\"2\",\"3\",\"4\",\"5\",\"6\",\"7\",\"8\",\"9\",\"10\",\"11\","
                 "\"12\",\"13\",\"14\",\"15\",\"16\",\"17\"]}",
                 400, "stop", NULL);
    expect_error(TSR_OAI_COMPLETIONS, "{\"prompt\":\"x\",\"logit_bias\":{\"abc\":1}}", 400, "logit_bias", NULL);
    expect_error(TSR_OAI_COMPLETIONS, "{\"prompt\":\"x\",\"logit_bias\":{\"5\":101}}", 400, "logit_bias", NULL);
    expect_error(TSR_OAI_COMPLETIONS, "{\"prompt\":\"x\",\"logprobs\":true}", 400, "logprobs", NULL);
    expect_error(TSR_OAI_COMPLETIONS, "{\"prompt\":\"x\",\"logprobs\":21}", 400, "logprobs", NULL);
    expect_error(TSR_OAI_COMPLETIONS, "{\"prompt\":\"x\",\"echo\":true,\"logprobs\":1}", 400, "echo", NULL);
    expect_error(TSR_OAI_COMPLETIONS, "{\"prompt\":\"x\",\"suffix\":\"y\"}", 400, "suffix", NULL);
    expect_error(TSR_OAI_COMPLETIONS, "{\"prompt\":\"x\",\"best_of\":3}", 400, "best_of", NULL);
    expect_error(TSR_OAI_COMPLETIONS, "{\"prompt\":\"x\",\"stream\":\"yes\"}", 400, "stream", NULL);
    expect_error(TSR_OAI_COMPLETIONS, "{\"prompt\":\"x\",\"min_tokens\":20,\"max_tokens\":2}", 400, "min_tokens", NULL);
    expect_error(TSR_OAI_COMPLETIONS, "{\"prompt\":\"x\",\"stop_token_ids\":[-1]}", 400, "stop_token_ids", NULL);
    expect_error(TSR_OAI_CHAT, "{\"messages\":[]}", 400, "messages", NULL);
    expect_error(TSR_OAI_CHAT, "{\"messages\":[{\"content\":\"x\"}]}", 400, "messages", NULL);
    expect_error(TSR_OAI_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"image_url\"}]}]}", 400,
                 "messages", "text");
    expect_error(TSR_OAI_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"top_logprobs\":2}", 400,
                 "top_logprobs", NULL);
    expect_error(TSR_OAI_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"response_format\":"
                               "{\"type\":\"json_object\"}}",
                 400, "response_format", NULL);
    /* the prompt alone fills the context */
    char big[4096] = "{\"prompt\":\"";
    for (int i = 0; i < 300; i++) strcat(big, "word ");
    strcat(big, "\"}");
    expect_error(TSR_OAI_COMPLETIONS, big, 400, "prompt", "maximum context length is 128");
}

static void test_error_mapping(void **state)
{
    (void)state;
    tsr_oai_error e;
    tsr_oai_error_from_status(&e, TSR_ERR_BUSY, "queue full");
    assert_int_equal(e.status, 429);
    assert_string_equal(e.code, "rate_limit_exceeded");
    tsr_oai_error_from_status(&e, TSR_ERR_REMOTE, "rank 2 died");
    assert_int_equal(e.status, 503);
    tsr_oai_error_from_status(&e, TSR_ERR_ARG, "bad");
    assert_int_equal(e.status, 400);
    assert_string_equal(e.type, "invalid_request_error");
    tsr_oai_error_set(&e, 401, NULL, "invalid_api_key", "no");
    json_t *j = tsr_oai_error_json(&e);
    assert_string_equal(json_string_value(json_object_get(json_object_get(j, "error"), "type")),
                        "authentication_error");
    assert_true(json_is_null(json_object_get(json_object_get(j, "error"), "param")));
    json_decref(j);
}

static tsr_gen_event event(const char *text, int32_t token, const tsr_step_result *res, tsr_finish_reason fin,
                           int n_prompt, int n_gen)
{
    return (tsr_gen_event){.id = 1, .text = text, .text_len = strlen(text), .token = token, .result = res,
                           .finish = fin, .n_prompt = n_prompt, .n_generated = n_gen, .n_cached = 0};
}

static void test_response_completions(void **state)
{
    (void)state;
    tsr_oai_request *rq;
    tsr_oai_error err;
    assert_int_equal(parse(TSR_OAI_COMPLETIONS, "{\"prompt\":\"Hi\",\"n\":2,\"max_tokens\":3,\"logprobs\":1}", &rq,
                           &err),
                     TSR_OK);
    int np = rq->prompts[0].n_ids;
    tsr_oai_result *r;
    assert_int_equal(tsr_oai_result_new(rq, &oai.model, "cmpl-1", 42, &r), TSR_OK);
    tsr_step_result res = {.token = 300, .logprob = -0.5f, .n_top = 1, .top_ids = {300}, .top_logprobs = {-0.5f}};
    tsr_gen_event ev = event(" there", 300, &res, TSR_FINISH_NONE, np, 1);
    assert_int_equal(tsr_oai_result_add(r, 0, &ev, NULL), TSR_OK);
    ev = event("", -1, NULL, TSR_FINISH_LENGTH, np, 1);
    assert_int_equal(tsr_oai_result_add(r, 0, &ev, NULL), TSR_OK);
    assert_false(tsr_oai_result_done(r));
    tsr_step_result eos_res = {.token = 4, .logprob = -0.1f};
    ev = event("", 4, &eos_res, TSR_FINISH_NONE, np, 1); /* the end-of-sequence token: no text, no logprob */
    assert_int_equal(tsr_oai_result_add(r, 1, &ev, NULL), TSR_OK);
    ev = event("", -1, NULL, TSR_FINISH_STOP, np, 1);
    assert_int_equal(tsr_oai_result_add(r, 1, &ev, NULL), TSR_OK);
    assert_true(tsr_oai_result_done(r));
    assert_int_not_equal(tsr_oai_result_add(r, 1, &ev, NULL), TSR_OK); /* after the final one */
    json_t *body = tsr_oai_response(r);
    assert_non_null(body);
    assert_string_equal(json_string_value(json_object_get(body, "object")), "text_completion");
    assert_string_equal(json_string_value(json_object_get(body, "id")), "cmpl-1");
    assert_int_equal(json_integer_value(json_object_get(body, "created")), 42);
    json_t *c0 = json_array_get(json_object_get(body, "choices"), 0);
    json_t *c1 = json_array_get(json_object_get(body, "choices"), 1);
    assert_string_equal(json_string_value(json_object_get(c0, "text")), " there");
    assert_string_equal(json_string_value(json_object_get(c0, "finish_reason")), "length");
    assert_string_equal(json_string_value(json_object_get(c1, "finish_reason")), "stop");
    json_t *lp = json_object_get(c0, "logprobs");
    assert_int_equal(json_array_size(json_object_get(lp, "tokens")), 1);
    assert_true(json_real_value(json_array_get(json_object_get(lp, "token_logprobs"), 0)) == -0.5);
    assert_int_equal(json_object_size(json_array_get(json_object_get(lp, "top_logprobs"), 0)), 1);
    assert_int_equal(json_array_size(json_object_get(json_object_get(c1, "logprobs"), "tokens")), 0);
    json_t *usage = json_object_get(body, "usage");
    assert_int_equal(json_integer_value(json_object_get(usage, "prompt_tokens")), np);
    assert_int_equal(json_integer_value(json_object_get(usage, "completion_tokens")), 2);
    assert_int_equal(json_integer_value(json_object_get(usage, "total_tokens")), np + 2);
    assert_int_equal(json_integer_value(json_object_get(json_object_get(usage, "prompt_tokens_details"),
                                                        "cached_tokens")),
                     0);
    json_decref(body);
    tsr_oai_result_free(r);
    tsr_oai_request_free(rq);
}

static void test_stream_chat(void **state)
{
    (void)state;
    tsr_oai_request *rq;
    tsr_oai_error err;
    assert_int_equal(parse(TSR_OAI_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"Hi\"}],\"stream\":true,"
                                         "\"stream_options\":{\"include_usage\":true},\"logprobs\":true,"
                                         "\"top_logprobs\":1,\"max_tokens\":2}",
                           &rq, &err),
                     TSR_OK);
    tsr_oai_result *r;
    assert_int_equal(tsr_oai_result_new(rq, &oai.model, "chatcmpl-1", 1, &r), TSR_OK);
    json_t *open = tsr_oai_stream_open(r);
    assert_int_equal(json_array_size(open), 1);
    json_t *first = json_array_get(open, 0);
    assert_string_equal(json_string_value(json_object_get(first, "object")), "chat.completion.chunk");
    json_t *delta = json_object_get(json_array_get(json_object_get(first, "choices"), 0), "delta");
    assert_string_equal(json_string_value(json_object_get(delta, "role")), "assistant");
    assert_true(json_is_null(json_object_get(first, "usage")));
    json_decref(open);

    tsr_step_result res = {.token = 300, .logprob = -1.0f, .n_top = 2, .top_ids = {300, 301}, .top_logprobs = {-1, -2}};
    tsr_gen_event ev = event("Hel", 300, &res, TSR_FINISH_NONE, 10, 1);
    json_t *chunk = NULL;
    assert_int_equal(tsr_oai_result_add(r, 0, &ev, &chunk), TSR_OK);
    assert_non_null(chunk);
    json_t *ch = json_array_get(json_object_get(chunk, "choices"), 0);
    assert_string_equal(json_string_value(json_object_get(json_object_get(ch, "delta"), "content")), "Hel");
    assert_true(json_is_null(json_object_get(ch, "finish_reason")));
    json_t *content = json_object_get(json_object_get(ch, "logprobs"), "content");
    assert_int_equal(json_array_size(content), 1);
    assert_int_equal(json_array_size(json_object_get(json_array_get(content, 0), "top_logprobs")), 1);
    assert_true(json_is_array(json_object_get(json_array_get(content, 0), "bytes")));
    json_decref(chunk);

    ev = event("", -1, NULL, TSR_FINISH_NONE, 10, 1); /* nothing to say: no chunk */
    assert_int_equal(tsr_oai_result_add(r, 0, &ev, &chunk), TSR_OK);
    assert_null(chunk);

    ev = event("lo", -1, NULL, TSR_FINISH_LENGTH, 10, 2);
    assert_int_equal(tsr_oai_result_add(r, 0, &ev, &chunk), TSR_OK);
    ch = json_array_get(json_object_get(chunk, "choices"), 0);
    assert_string_equal(json_string_value(json_object_get(ch, "finish_reason")), "length");
    assert_string_equal(json_string_value(json_object_get(json_object_get(ch, "delta"), "content")), "lo");
    json_decref(chunk);

    json_t *usage = tsr_oai_stream_usage(r);
    assert_non_null(usage);
    assert_int_equal(json_array_size(json_object_get(usage, "choices")), 0);
    assert_int_equal(json_integer_value(json_object_get(json_object_get(usage, "usage"), "completion_tokens")), 2);
    json_decref(usage);
    tsr_oai_result_free(r);
    tsr_oai_request_free(rq);
}

static void test_response_chat_error_and_echo(void **state)
{
    (void)state;
    tsr_oai_request *rq;
    tsr_oai_error err;
    assert_int_equal(parse(TSR_OAI_COMPLETIONS, "{\"prompt\":\"Hi\",\"echo\":true,\"max_tokens\":2}", &rq, &err),
                     TSR_OK);
    tsr_oai_result *r;
    assert_int_equal(tsr_oai_result_new(rq, &oai.model, "cmpl-2", 1, &r), TSR_OK);
    tsr_gen_event ev = event("!", 5, NULL, TSR_FINISH_NONE, 2, 1);
    assert_int_equal(tsr_oai_result_add(r, 0, &ev, NULL), TSR_OK);
    ev = event("", -1, NULL, TSR_FINISH_ERROR, 2, 1);
    ev.error = "boom";
    assert_int_equal(tsr_oai_result_add(r, 0, &ev, NULL), TSR_OK);
    assert_string_equal(tsr_oai_result_error(r), "boom");
    json_t *body = tsr_oai_response(r);
    assert_string_equal(json_string_value(json_object_get(json_array_get(json_object_get(body, "choices"), 0), "text")),
                        "Hi!");
    json_decref(body);
    tsr_oai_result_free(r);
    tsr_oai_request_free(rq);

    json_t *models = tsr_oai_models_json(&oai.model);
    assert_string_equal(json_string_value(json_object_get(json_array_get(json_object_get(models, "data"), 0), "id")),
                        "tiny");
    json_decref(models);
    char id[64];
    tsr_oai_make_id(TSR_OAI_CHAT, id, sizeof id);
    assert_true(!strncmp(id, "chatcmpl-", 9));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_completions_fields),
        cmocka_unit_test(test_completions_defaults_and_prompt_forms),
        cmocka_unit_test(test_chat_prompt),
        cmocka_unit_test(test_errors),
        cmocka_unit_test(test_error_mapping),
        cmocka_unit_test(test_response_completions),
        cmocka_unit_test(test_stream_chat),
        cmocka_unit_test(test_response_chat_error_and_echo),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
