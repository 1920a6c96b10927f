/* Public chat-template API (see chat_template.h): parsing, rendering with the variables transformers passes,
 * and loading the template and special tokens from a tokenizer folder.
 *
 * Every entry point arms a jinja_err (setjmp) for the interpreter, so all interpreter errors come back here as a
 * status with the arena freed. Messages get the same preprocessing as transformers' render_jinja_template:
 * they must be objects, and reasoning given as reasoning_content/thinking/reasoning is copied under
 * "thinking" (first) and "reasoning_content" (last). */
#include "runtime/text/chat_template.h"

#include "runtime/text/jinja_eval.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct tsr_chat_template {
    jinja_arena arena;
    jnodes body;
};

static size_t g_max_bytes = (size_t)1 << 30;
static uint64_t g_max_steps = 200000000ull;

void tsr_chat_template_set_limits(size_t max_bytes, uint64_t max_steps)
{
    g_max_bytes = max_bytes ? max_bytes : (size_t)1 << 30;
    g_max_steps = max_steps ? max_steps : 200000000ull;
}

tsr_status tsr_chat_template_parse(const char *source, tsr_chat_template **out)
{
    *out = NULL;
    if (!source) return tsr_fail(TSR_ERR_ARG, "chat template: no source");
    tsr_chat_template *t = calloc(1, sizeof *t);
    if (!t) return tsr_fail(TSR_ERR_NOMEM, "chat template: out of memory");
    jinja_err err;
    t->arena.err = &err;
    if (setjmp(err.jb)) {
        ja_free_all(&t->arena);
        free(t);
        return err.status;
    }
    jinja_parse(&t->arena, source, strlen(source), &t->body);
    t->arena.err = NULL;
    *out = t;
    return TSR_OK;
}

void tsr_chat_template_free(tsr_chat_template *t)
{
    if (!t) return;
    ja_free_all(&t->arena);
    free(t);
}

/* transformers' _alias_reasoning_fields */
static jv alias_reasoning(jinja_arena *a, jv msg)
{
    static const char *const fields[] = {"reasoning_content", "thinking", "reasoning"};
    jv *r = NULL;
    for (int i = 0; i < 3 && !r; i++) {
        jv *v = jv_dict_find(msg, fields[i], strlen(fields[i]));
        if (v && v->t != JV_NONE) r = v;
    }
    if (!r) return msg;
    jv val = *r;
    jv out = jv_dict_new(a, msg.u.d->n + 2);
    jv_dict_set(a, out, jv_cstr("thinking"), val);
    for (size_t i = 0; i < msg.u.d->n; i++) jv_dict_set(a, out, msg.u.d->k[i], msg.u.d->v[i]);
    jv_dict_set(a, out, jv_cstr("reasoning_content"), val);
    return out;
}

static char *render_into(const tsr_chat_template *t, jinja_arena *arena, jinja_err *err, const json_t *messages,
                         const json_t *tools, int add_generation_prompt, const char *bos_token, const char *eos_token,
                         const json_t *extra)
{
    jctx c = {.a = arena, .err = err, .max_steps = g_max_steps};
    jscope *root = ja_alloc(arena, sizeof *root);
    root->vars = jv_dict_new(arena, 16);
    c.cur = root;
    jv msgs = jv_from_json(arena, messages);
    for (size_t i = 0; i < msgs.u.l->n; i++) msgs.u.l->v[i] = alias_reasoning(arena, msgs.u.l->v[i]);
    jv vars = root->vars;
    jv_dict_set(arena, vars, jv_cstr("messages"), msgs);
    jv_dict_set(arena, vars, jv_cstr("tools"), tools && !json_is_null(tools) ? jv_from_json(arena, tools) : jv_none());
    jv_dict_set(arena, vars, jv_cstr("documents"), jv_none());
    jv_dict_set(arena, vars, jv_cstr("add_generation_prompt"), jv_bool(add_generation_prompt));
    if (bos_token) jv_dict_set(arena, vars, jv_cstr("bos_token"), jv_cstr(bos_token));
    if (eos_token) jv_dict_set(arena, vars, jv_cstr("eos_token"), jv_cstr(eos_token));
    if (extra) {
        const char *k;
        json_t *v;
        json_object_foreach((json_t *)extra, k, v) {
            jv_dict_set(arena, vars, jv_str(ja_strdup(arena, k, strlen(k)), strlen(k)), jv_from_json(arena, v));
        }
    }
    jbuf buf = {.a = arena};
    c.out = &buf;
    jinja_exec(&c, &t->body);
    char *res = malloc(buf.n + 1);
    if (!res) return NULL;
    if (buf.n) memcpy(res, buf.p, buf.n);
    res[buf.n] = '\0';
    return res;
}

tsr_status tsr_chat_template_render(const tsr_chat_template *t, const json_t *messages, const json_t *tools,
                                    int add_generation_prompt, const char *bos_token, const char *eos_token,
                                    const json_t *extra, char **out)
{
    *out = NULL;
    if (!t) return tsr_fail(TSR_ERR_ARG, "chat template: no template");
    if (!messages || !json_is_array(messages))
        return tsr_fail(TSR_ERR_ARG, "chat template: messages must be a JSON array");
    for (size_t i = 0; i < json_array_size(messages); i++)
        if (!json_is_object(json_array_get(messages, i)))
            return tsr_fail(TSR_ERR_ARG, "chat template: message %zu is not a JSON object", i);
    if (tools && !json_is_null(tools) && !json_is_array(tools))
        return tsr_fail(TSR_ERR_ARG, "chat template: tools must be a JSON array");
    if (extra && !json_is_object(extra))
        return tsr_fail(TSR_ERR_ARG, "chat template: extra variables must be a JSON object");

    jinja_arena *arena = calloc(1, sizeof *arena);
    jinja_err *err = malloc(sizeof *err);
    if (!arena || !err) {
        free(arena);
        free(err);
        return tsr_fail(TSR_ERR_NOMEM, "chat template: out of memory");
    }
    arena->err = err;
    arena->limit = g_max_bytes;
    if (setjmp(err->jb)) {
        tsr_status st = err->status;
        ja_free_all(arena);
        free(arena);
        free(err);
        return st;
    }
    *out = render_into(t, arena, err, messages, tools, add_generation_prompt, bos_token, eos_token, extra);
    ja_free_all(arena);
    free(arena);
    free(err);
    if (!*out) return tsr_fail(TSR_ERR_NOMEM, "chat template: out of memory");
    return TSR_OK;
}

/* A special token of tokenizer_config.json ("<s>" or {"content": "<s>", ...}): *out receives a malloc'd copy,
 * or NULL when the entry is absent. */
static tsr_status token_string(const json_t *v, char **out)
{
    *out = NULL;
    if (json_is_object(v)) v = json_object_get(v, "content");
    if (!json_is_string(v)) return TSR_OK;
    if (!(*out = strdup(json_string_value(v)))) return tsr_fail(TSR_ERR_NOMEM, "chat template: out of memory");
    return TSR_OK;
}

static tsr_status read_text_file(const char *path, char **out)
{
    *out = NULL;
    FILE *f = fopen(path, "rb");
    if (!f) return tsr_fail(TSR_ERR_IO, "cannot open %s", path);
    size_t cap = 4096, n = 0;
    char *buf = malloc(cap);
    for (;;) {
        if (!buf) {
            fclose(f);
            return tsr_fail(TSR_ERR_NOMEM, "out of memory reading %s", path);
        }
        size_t r = fread(buf + n, 1, cap - n - 1, f);
        n += r;
        if (n < cap - 1) break;
        cap *= 2;
        char *nb = realloc(buf, cap);
        if (!nb) free(buf);
        buf = nb;
    }
    int bad = ferror(f);
    fclose(f);
    if (bad) {
        free(buf);
        return tsr_fail(TSR_ERR_IO, "error reading %s", path);
    }
    buf[n] = '\0';
    *out = buf;
    return TSR_OK;
}

tsr_status tsr_chat_template_load_dir(const char *dir, int want_tools, tsr_chat_template **out, char **bos_token,
                                      char **eos_token)
{
    *out = NULL;
    if (bos_token) *bos_token = NULL;
    if (eos_token) *eos_token = NULL;
    char path[4096];
    snprintf(path, sizeof path, "%s/tokenizer_config.json", dir);
    json_error_t jerr;
    json_t *cfg = json_load_file(path, JSON_DECODE_INT_AS_REAL, &jerr); /* configs hold huge integers */
    if (!cfg) {
        FILE *f = fopen(path, "rb");
        if (!f) return tsr_fail(TSR_ERR_IO, "cannot open %s", path);
        fclose(f);
        return tsr_fail(TSR_ERR_FORMAT, "%s: invalid JSON at line %d: %s", path, jerr.line, jerr.text);
    }
    if (!json_is_object(cfg)) {
        json_decref(cfg);
        return tsr_fail(TSR_ERR_FORMAT, "%s: not a JSON object", path);
    }
    const json_t *ct = json_object_get(cfg, "chat_template");
    const char *src = NULL;
    char *file_src = NULL;
    if (json_is_string(ct))
        src = json_string_value(ct);
    else if (json_is_array(ct)) {
        const char *dflt = NULL, *tool = NULL;
        for (size_t i = 0; i < json_array_size(ct); i++) {
            const json_t *e = json_array_get(ct, i);
            const char *nm = json_string_value(json_object_get(e, "name"));
            const char *tp = json_string_value(json_object_get(e, "template"));
            if (!nm || !tp) {
                json_decref(cfg);
                return tsr_fail(TSR_ERR_FORMAT, "%s: chat_template entry %zu needs string 'name' and 'template'", path,
                                i);
            }
            if (!strcmp(nm, "default")) dflt = tp;
            if (!strcmp(nm, "tool_use")) tool = tp;
        }
        src = want_tools && tool ? tool : dflt;
        if (!src) {
            json_decref(cfg);
            return tsr_fail(TSR_ERR_MISSING, "%s: chat_template list has no 'default' template", path);
        }
    } else if (ct && !json_is_null(ct)) {
        json_decref(cfg);
        return tsr_fail(TSR_ERR_FORMAT, "%s: chat_template must be a string or a list", path);
    } else {
        char jpath[4096];
        snprintf(jpath, sizeof jpath, "%s/chat_template.jinja", dir);
        FILE *f = fopen(jpath, "rb");
        if (!f) {
            json_decref(cfg);
            return tsr_fail(TSR_ERR_MISSING, "%s has no chat_template (and there is no chat_template.jinja)", path);
        }
        fclose(f);
        tsr_status st = read_text_file(jpath, &file_src);
        if (st) {
            json_decref(cfg);
            return st;
        }
        src = file_src;
    }
    tsr_chat_template *t;
    tsr_status st = tsr_chat_template_parse(src, &t);
    free(file_src);
    if (st) {
        json_decref(cfg);
        return tsr_fail_context(st, "%s", path);
    }
    if (bos_token) st = token_string(json_object_get(cfg, "bos_token"), bos_token);
    if (st == TSR_OK && eos_token) st = token_string(json_object_get(cfg, "eos_token"), eos_token);
    json_decref(cfg);
    if (st != TSR_OK) {
        tsr_chat_template_free(t);
        if (bos_token) {
            free(*bos_token);
            *bos_token = NULL;
        }
        return st;
    }
    *out = t;
    return TSR_OK;
}
