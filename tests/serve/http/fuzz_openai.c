/* Fuzz target: OpenAI request parsing and response building (launcher/openai.h), with the bundled model's
 * tokenizer and chat template. The first byte picks the endpoint ('C' or 'c' = chat, anything else completions),
 * the rest is the request body. A request that parses is then answered with fabricated events for every choice
 * (text, tokens and log-probabilities drawn from the input, every finish reason), both non-streaming and
 * streaming. Errors are fine; crashes, sanitizer reports and leaks are not. */
#include "launcher/openai.h"
#include "tests/fuzz/fuzz_oai_model.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void answer(const tsr_oai_request *rq, const uint8_t *data, size_t size)
{
    tsr_oai_result *r;
    if (tsr_oai_result_new(rq, tsr_fuzz_oai_model(), "cmpl-fuzz", 1, &r) != TSR_OK) return;
    json_decref(tsr_oai_stream_open(r));
    static const char *const texts[] = {"", "a", " there", "\xc3\xa9", "\n\n", "data: [DONE]"};
    for (int c = 0; c < rq->n_choices && c < 64; c++) {
        int steps = size ? data[c % size] % 4 : 1;
        for (int i = 0; i <= steps; i++) {
            uint8_t b = size ? data[(size_t)(c + i) % size] : 0;
            tsr_step_result res = {.token = b * 8, .logprob = -(float)b / 7.0f, .n_top = b % (TSR_MAX_LOGPROBS + 1)};
            for (int k = 0; k < res.n_top; k++) {
                res.top_ids[k] = (b + k * 31) % 2048;
                res.top_logprobs[k] = -(float)k;
            }
            tsr_finish_reason fin = i == steps ? (tsr_finish_reason)(1 + b % 5) : TSR_FINISH_NONE;
            const char *text = texts[b % 6];
            tsr_gen_event ev = {.id = 1, .text = text, .text_len = strlen(text), .token = fin ? -1 : res.token,
                                .result = fin ? NULL : &res, .finish = fin,
                                .error = fin == TSR_FINISH_ERROR ? "fuzz" : NULL, .n_prompt = 3,
                                .n_generated = i, .n_cached = b % 3};
            json_t *chunk = NULL;
            tsr_oai_result_add(r, c, &ev, rq->stream ? &chunk : NULL);
            char *s = chunk ? json_dumps(chunk, JSON_COMPACT) : NULL;
            free(s);
            json_decref(chunk);
        }
    }
    json_t *body = tsr_oai_response(r);
    char *s = body ? json_dumps(body, JSON_COMPACT) : NULL;
    free(s);
    json_decref(body);
    json_decref(tsr_oai_stream_usage(r));
    tsr_oai_result_free(r);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const tsr_oai_model *model = tsr_fuzz_oai_model();
    if (size == 0) return 0;
    tsr_oai_kind kind = (data[0] == 'C' || data[0] == 'c') ? (data[0] == 'C' ? TSR_OAI_CHAT : TSR_OAI_COMPLETIONS)
                                                           : (data[0] & 1 ? TSR_OAI_CHAT : TSR_OAI_COMPLETIONS);
    tsr_oai_request *rq = NULL;
    tsr_oai_error err;
    if (tsr_oai_parse_bytes(kind, (const char *)data + 1, size - 1, model, &rq, &err) == TSR_OK) {
        for (int c = 0; c < rq->n_choices; c++) {
            tsr_gen_request g;
            tsr_oai_gen_request(rq, c, &g);
        }
        answer(rq, data, size);
        tsr_oai_request_free(rq);
    } else {
        json_decref(tsr_oai_error_json(&err));
    }
    return 0;
}
