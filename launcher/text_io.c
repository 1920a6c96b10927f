/* Tokenizer + chat template + streaming detokenizer for the commands (see text_io.h). */
#include "launcher/text_io.h"

#include "runtime/text/chat_template.h"
#include "runtime/text/tokenizer.h"

#include <jansson.h>
#include <stdlib.h>
#include <string.h>

struct tsr_text {
    char *dir;
    tsr_tokenizer *tok;
    tsr_detokenizer *detok;
};

tsr_status tsr_text_open(const char *model_dir, tsr_text **out)
{
    tsr_text *t = calloc(1, sizeof *t);
    if (!t || !(t->dir = strdup(model_dir))) {
        free(t);
        return tsr_fail(TSR_ERR_NOMEM, "out of memory");
    }
    tsr_status st = tsr_tokenizer_load(model_dir, &t->tok);
    if (st != TSR_OK) {
        tsr_text_close(t);
        return st;
    }
    *out = t;
    return TSR_OK;
}

void tsr_text_close(tsr_text *t)
{
    if (!t) return;
    tsr_detokenizer_free(t->detok);
    tsr_tokenizer_free(t->tok);
    free(t->dir);
    free(t);
}

static tsr_status encode(tsr_text *t, const char *s, int add_special, int32_t **ids, int *n)
{
    size_t count = 0;
    TSR_TRY(tsr_tokenizer_encode(t->tok, s, strlen(s), add_special, ids, &count));
    if (count == 0 || count > (1u << 30)) {
        free(*ids);
        *ids = NULL;
        return tsr_fail(TSR_ERR_ARG, "the prompt encodes to no tokens");
    }
    *n = (int)count;
    return TSR_OK;
}

tsr_status tsr_text_encode_prompt(tsr_text *t, const char *prompt, int chat, int32_t **ids, int *n)
{
    if (!chat) return encode(t, prompt, 1, ids, n);
    tsr_chat_template *tpl = NULL;
    char *bos = NULL, *eos = NULL, *rendered = NULL;
    tsr_status st = tsr_chat_template_load_dir(t->dir, 0, &tpl, &bos, &eos);
    if (st == TSR_OK) {
        json_t *messages = json_pack("[{s:s, s:s}]", "role", "user", "content", prompt);
        if (!messages)
            st = tsr_fail(TSR_ERR_ARG, "the prompt is not valid UTF-8");
        else
            st = tsr_chat_template_render(tpl, messages, NULL, 1, bos, eos, NULL, &rendered);
        json_decref(messages);
    }
    if (st == TSR_OK) st = encode(t, rendered, 0, ids, n);
    free(rendered);
    free(bos);
    free(eos);
    tsr_chat_template_free(tpl);
    return st;
}

tsr_status tsr_text_stream_begin(tsr_text *t)
{
    tsr_detokenizer_free(t->detok);
    t->detok = NULL;
    return tsr_detokenizer_new(t->tok, 1, &t->detok);
}

static void emit(FILE *out, const char *s, size_t len)
{
    if (len) fwrite(s, 1, len, out);
}

tsr_status tsr_text_stream_push(tsr_text *t, int32_t id, FILE *out)
{
    char *s = NULL;
    size_t len = 0;
    TSR_TRY(tsr_detokenizer_push(t->detok, id, &s, &len));
    emit(out, s, len);
    return TSR_OK;
}

tsr_status tsr_text_stream_end(tsr_text *t, FILE *out)
{
    char *s = NULL;
    size_t len = 0;
    TSR_TRY(tsr_detokenizer_flush(t->detok, &s, &len));
    emit(out, s, len);
    return TSR_OK;
}
