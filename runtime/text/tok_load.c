/* Reading tokenizer.json (and tokenizer_config.json) into the flat tsr_tokenizer description.
 *
 * Parses with jansson; every malformed or unknown field fails with a message naming the file and the JSON path
 * (e.g. "tokenizer.json: pre_tokenizer.pretokenizers[0].type: unsupported pre-tokenizer type 'BertPreTokenizer'").
 * Malformed JSON reports jansson's line and column. The BPE vocab keys are copied into one arena; merges are resolved
 * to (left id, right id) → (rank, merged id) at load time, like tokenizers does. */
#include "runtime/text/tok_internal.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    const char *file;
    tsr_tokenizer *t;
} ctx;

static const char *base_name(const char *p)
{
    const char *s = strrchr(p, '/');
    return s ? s + 1 : p;
}

static tsr_status bad(const ctx *c, const char *field, const char *what)
{
    return tsr_fail(TSR_ERR_FORMAT, "%s: %s: %s", c->file, field, what);
}

static tsr_status nomem(const ctx *c)
{
    return tsr_fail(TSR_ERR_NOMEM, "%s: out of memory", c->file);
}

/* Optional boolean field: default when absent or null. */
static tsr_status get_bool(const ctx *c, json_t *obj, const char *key, int def, int *out, const char *where)
{
    json_t *v = json_object_get(obj, key);
    if (!v || json_is_null(v)) {
        *out = def;
        return TSR_OK;
    }
    if (!json_is_boolean(v)) {
        char f[256];
        snprintf(f, sizeof f, "%s.%s", where, key);
        return bad(c, f, "expected true or false");
    }
    *out = json_is_true(v);
    return TSR_OK;
}

/* Optional string field: NULL when absent or null. */
static tsr_status get_str(const ctx *c, json_t *obj, const char *key, const char **out, size_t *len,
                          const char *where)
{
    json_t *v = json_object_get(obj, key);
    *out = NULL;
    if (len) *len = 0;
    if (!v || json_is_null(v)) return TSR_OK;
    if (!json_is_string(v)) {
        char f[256];
        snprintf(f, sizeof f, "%s.%s", where, key);
        return bad(c, f, "expected a string");
    }
    *out = json_string_value(v);
    if (len) *len = json_string_length(v);
    return TSR_OK;
}

static char *dup_mem(const char *s, size_t n)
{
    char *p = malloc(n + 1);
    if (!p) return NULL;
    if (n) memcpy(p, s, n);
    p[n] = 0;
    return p;
}

/* The one-character string of Metaspace/Strip fields, as a code point. */
static tsr_status get_char(const ctx *c, json_t *obj, const char *key, uint32_t def, uint32_t *out,
                           const char *where)
{
    const char *s;
    size_t n;
    TSR_TRY(get_str(c, obj, key, &s, &n, where));
    if (!s) {
        *out = def;
        return TSR_OK;
    }
    int k = tok_utf8_next((const unsigned char *)s, n, out);
    if (k <= 0 || (size_t)k != n) {
        char f[256];
        snprintf(f, sizeof f, "%s.%s", where, key);
        return bad(c, f, "expected a single character");
    }
    return TSR_OK;
}

static tsr_status get_pattern(const ctx *c, json_t *obj, tok_pattern *p, const char *where)
{
    char f[256];
    snprintf(f, sizeof f, "%s.pattern", where);
    json_t *pat = json_object_get(obj, "pattern");
    if (!json_is_object(pat)) return bad(c, f, "expected {\"String\": ...} or {\"Regex\": ...}");
    json_t *s = json_object_get(pat, "String");
    json_t *r = json_object_get(pat, "Regex");
    if (json_is_string(s)) {
        p->is_regex = 0;
        p->lit_len = json_string_length(s);
        p->lit = dup_mem(json_string_value(s), p->lit_len);
        if (!p->lit) return nomem(c);
        return TSR_OK;
    }
    if (json_is_string(r)) {
        char w[300];
        snprintf(w, sizeof w, "%s: %s", c->file, f);
        p->is_regex = 1;
        return tok_regex_compile(&p->re, json_string_value(r), json_string_length(r), w);
    }
    return bad(c, f, "expected {\"String\": ...} or {\"Regex\": ...}");
}

static tsr_status get_type(const ctx *c, json_t *obj, const char **type, const char *where)
{
    if (!json_is_object(obj)) return bad(c, where, "expected an object");
    json_t *ty = json_object_get(obj, "type");
    if (!json_is_string(ty)) {
        char f[256];
        snprintf(f, sizeof f, "%s.type", where);
        return bad(c, f, "expected a string");
    }
    *type = json_string_value(ty);
    return TSR_OK;
}

/* ---------------------------------------------------------------- normalizers */

static tsr_status add_norm(const ctx *c, json_t *obj, const char *where)
{
    tsr_tokenizer *t = c->t;
    const char *type;
    TSR_TRY(get_type(c, obj, &type, where));
    if (!strcmp(type, "Sequence")) {
        json_t *list = json_object_get(obj, "normalizers");
        if (!json_is_array(list)) return bad(c, where, "Sequence without a 'normalizers' array");
        for (size_t i = 0; i < json_array_size(list); i++) {
            char f[256];
            snprintf(f, sizeof f, "%s.normalizers[%zu]", where, i);
            TSR_TRY(add_norm(c, json_array_get(list, i), f));
        }
        return TSR_OK;
    }
    tok_norm n = {0};
    if (!strcmp(type, "NFC")) n.kind = NORM_NFC;
    else if (!strcmp(type, "NFD")) n.kind = NORM_NFD;
    else if (!strcmp(type, "NFKC")) n.kind = NORM_NFKC;
    else if (!strcmp(type, "NFKD")) n.kind = NORM_NFKD;
    else if (!strcmp(type, "Lowercase")) n.kind = NORM_LOWER;
    else if (!strcmp(type, "Strip")) {
        n.kind = NORM_STRIP;
        TSR_TRY(get_bool(c, obj, "strip_left", 1, &n.strip_left, where));
        TSR_TRY(get_bool(c, obj, "strip_right", 1, &n.strip_right, where));
    } else if (!strcmp(type, "Prepend")) {
        const char *s;
        size_t len;
        n.kind = NORM_PREPEND;
        TSR_TRY(get_str(c, obj, "prepend", &s, &len, where));
        if (!s) return bad(c, where, "Prepend without 'prepend'");
        if (!(n.str = dup_mem(s, len))) return nomem(c);
        n.str_len = len;
    } else if (!strcmp(type, "Replace")) {
        const char *s;
        size_t len;
        n.kind = NORM_REPLACE;
        TSR_TRY(get_str(c, obj, "content", &s, &len, where));
        if (!s) return bad(c, where, "Replace without 'content'");
        if (!(n.str = dup_mem(s, len))) return nomem(c);
        n.str_len = len;
        tsr_status st = get_pattern(c, obj, &n.pat, where);
        if (st) {
            free(n.str);
            return st;
        }
    } else {
        return tsr_fail(TSR_ERR_UNSUPPORTED, "%s: %s.type: unsupported normalizer type '%s'", c->file, where, type);
    }
    tok_norm *a = realloc(t->norms, (t->n_norms + 1) * sizeof *a);
    if (!a) {
        free(n.str);
        tok_pattern_free(&n.pat);
        return nomem(c);
    }
    t->norms = a;
    t->norms[t->n_norms++] = n;
    return TSR_OK;
}

/* ------------------------------------------------------------ pre-tokenizers */

static const char *GPT2_REGEX = "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";

static tsr_status push_pretok(const ctx *c, tok_pretok *p)
{
    tsr_tokenizer *t = c->t;
    tok_pretok *a = realloc(t->pretoks, (t->n_pretoks + 1) * sizeof *a);
    if (!a) {
        tok_pattern_free(&p->pat);
        return nomem(c);
    }
    t->pretoks = a;
    t->pretoks[t->n_pretoks++] = *p;
    return TSR_OK;
}

static tsr_status regex_split(const ctx *c, const char *re, split_behavior b, int invert, const char *where)
{
    tok_pretok p = {0};
    char w[300];
    snprintf(w, sizeof w, "%s: %s", c->file, where);
    p.kind = PT_SPLIT;
    p.pat.is_regex = 1;
    p.behavior = b;
    p.invert = invert;
    TSR_TRY(tok_regex_compile(&p.pat.re, re, strlen(re), w));
    return push_pretok(c, &p);
}

static tsr_status get_behavior(const ctx *c, json_t *obj, split_behavior *b, const char *where)
{
    const char *s;
    TSR_TRY(get_str(c, obj, "behavior", &s, NULL, where));
    if (!s) return bad(c, where, "missing 'behavior'");
    if (!strcmp(s, "Removed")) *b = SPLIT_REMOVED;
    else if (!strcmp(s, "Isolated")) *b = SPLIT_ISOLATED;
    else if (!strcmp(s, "MergedWithPrevious")) *b = SPLIT_MERGED_PREV;
    else if (!strcmp(s, "MergedWithNext")) *b = SPLIT_MERGED_NEXT;
    else if (!strcmp(s, "Contiguous")) *b = SPLIT_CONTIGUOUS;
    else return tsr_fail(TSR_ERR_UNSUPPORTED, "%s: %s.behavior: unsupported split behavior '%s'", c->file, where, s);
    return TSR_OK;
}

static tsr_status get_scheme(const ctx *c, json_t *obj, prepend_scheme *sc, const char *where)
{
    const char *s;
    int aps;
    TSR_TRY(get_str(c, obj, "prepend_scheme", &s, NULL, where));
    TSR_TRY(get_bool(c, obj, "add_prefix_space", 1, &aps, where));
    if (!s || !strcmp(s, "always")) *sc = PREPEND_ALWAYS;
    else if (!strcmp(s, "first")) *sc = PREPEND_FIRST;
    else if (!strcmp(s, "never")) *sc = PREPEND_NEVER;
    else return tsr_fail(TSR_ERR_UNSUPPORTED, "%s: %s.prepend_scheme: unsupported value '%s'", c->file, where, s);
    if (!aps) *sc = PREPEND_NEVER;
    return TSR_OK;
}

static tsr_status add_pretok(const ctx *c, json_t *obj, const char *where)
{
    const char *type;
    TSR_TRY(get_type(c, obj, &type, where));
    tok_pretok p = {0};
    if (!strcmp(type, "Sequence")) {
        json_t *list = json_object_get(obj, "pretokenizers");
        if (!json_is_array(list)) return bad(c, where, "Sequence without a 'pretokenizers' array");
        for (size_t i = 0; i < json_array_size(list); i++) {
            char f[256];
            snprintf(f, sizeof f, "%s.pretokenizers[%zu]", where, i);
            TSR_TRY(add_pretok(c, json_array_get(list, i), f));
        }
        return TSR_OK;
    }
    if (!strcmp(type, "Split")) {
        p.kind = PT_SPLIT;
        TSR_TRY(get_behavior(c, obj, &p.behavior, where));
        TSR_TRY(get_bool(c, obj, "invert", 0, &p.invert, where));
        TSR_TRY(get_pattern(c, obj, &p.pat, where));
        return push_pretok(c, &p);
    }
    if (!strcmp(type, "ByteLevel")) {
        p.kind = PT_BYTELEVEL;
        TSR_TRY(get_bool(c, obj, "add_prefix_space", 1, &p.add_prefix_space, where));
        TSR_TRY(get_bool(c, obj, "use_regex", 1, &p.use_regex, where));
        if (p.use_regex) {
            char w[300];
            snprintf(w, sizeof w, "%s: %s", c->file, where);
            p.pat.is_regex = 1;
            TSR_TRY(tok_regex_compile(&p.pat.re, GPT2_REGEX, strlen(GPT2_REGEX), w));
        }
        return push_pretok(c, &p);
    }
    if (!strcmp(type, "Metaspace")) {
        uint32_t cp;
        p.kind = PT_METASPACE;
        TSR_TRY(get_char(c, obj, "replacement", 0x2581, &cp, where));
        p.repl_len = (size_t)tok_utf8_encode(cp, p.repl);
        TSR_TRY(get_scheme(c, obj, &p.scheme, where));
        TSR_TRY(get_bool(c, obj, "split", 1, &p.split, where));
        return push_pretok(c, &p);
    }
    if (!strcmp(type, "Whitespace")) return regex_split(c, "\\w+|[^\\w\\s]+", SPLIT_REMOVED, 1, where);
    if (!strcmp(type, "WhitespaceSplit")) return regex_split(c, "\\s", SPLIT_REMOVED, 0, where);
    if (!strcmp(type, "Digits")) {
        int individual = 0;
        TSR_TRY(get_bool(c, obj, "individual_digits", 0, &individual, where));
        return regex_split(c, "\\p{N}", individual ? SPLIT_ISOLATED : SPLIT_CONTIGUOUS, 0, where);
    }
    if (!strcmp(type, "Punctuation")) {
        split_behavior b = SPLIT_ISOLATED;
        if (json_object_get(obj, "behavior")) TSR_TRY(get_behavior(c, obj, &b, where));
        return regex_split(c, "[\\p{P}!-/:-@\\[-`{-~]", b, 0, where);
    }
    return tsr_fail(TSR_ERR_UNSUPPORTED, "%s: %s.type: unsupported pre-tokenizer type '%s'", c->file, where, type);
}

/* ------------------------------------------------------------------ decoders */

static tsr_status add_dec(const ctx *c, json_t *obj, const char *where)
{
    tsr_tokenizer *t = c->t;
    const char *type;
    TSR_TRY(get_type(c, obj, &type, where));
    if (!strcmp(type, "Sequence")) {
        json_t *list = json_object_get(obj, "decoders");
        if (!json_is_array(list)) return bad(c, where, "Sequence without a 'decoders' array");
        for (size_t i = 0; i < json_array_size(list); i++) {
            char f[256];
            snprintf(f, sizeof f, "%s.decoders[%zu]", where, i);
            TSR_TRY(add_dec(c, json_array_get(list, i), f));
        }
        return TSR_OK;
    }
    tok_dec d = {0};
    if (!strcmp(type, "Replace")) {
        const char *s;
        size_t len;
        d.kind = DEC_REPLACE;
        TSR_TRY(get_str(c, obj, "content", &s, &len, where));
        if (!s) return bad(c, where, "Replace without 'content'");
        TSR_TRY(get_pattern(c, obj, &d.pat, where));
        if (d.pat.is_regex) {
            tok_regex_free(&d.pat.re);
            return tsr_fail(TSR_ERR_UNSUPPORTED, "%s: %s: Replace decoder with a Regex pattern is not supported",
                            c->file, where);
        }
        if (!(d.str = dup_mem(s, len))) {
            tok_pattern_free(&d.pat);
            return nomem(c);
        }
        d.str_len = len;
    } else if (!strcmp(type, "ByteFallback")) {
        d.kind = DEC_BYTEFALLBACK;
    } else if (!strcmp(type, "Fuse")) {
        d.kind = DEC_FUSE;
    } else if (!strcmp(type, "Strip")) {
        json_t *st = json_object_get(obj, "start"), *sp = json_object_get(obj, "stop");
        d.kind = DEC_STRIP;
        TSR_TRY(get_char(c, obj, "content", ' ', &d.content, where));
        if ((st && !json_is_integer(st)) || (sp && !json_is_integer(sp)) || json_integer_value(st) < 0 ||
            json_integer_value(sp) < 0 || json_integer_value(st) > 1000000 || json_integer_value(sp) > 1000000)
            return bad(c, where, "Strip start/stop must be small non-negative integers");
        d.start = (int)json_integer_value(st);
        d.stop = (int)json_integer_value(sp);
    } else if (!strcmp(type, "Metaspace")) {
        d.kind = DEC_METASPACE;
        TSR_TRY(get_char(c, obj, "replacement", 0x2581, &d.content, where));
        TSR_TRY(get_scheme(c, obj, &d.scheme, where));
    } else if (!strcmp(type, "ByteLevel")) {
        d.kind = DEC_BYTELEVEL;
    } else {
        return tsr_fail(TSR_ERR_UNSUPPORTED, "%s: %s.type: unsupported decoder type '%s'", c->file, where, type);
    }
    tok_dec *a = realloc(t->decs, (t->n_decs + 1) * sizeof *a);
    if (!a) {
        free(d.str);
        tok_pattern_free(&d.pat);
        return nomem(c);
    }
    t->decs = a;
    t->decs[t->n_decs++] = d;
    return TSR_OK;
}

/* ----------------------------------------------------------- post-processors */

static tsr_status push_post(const ctx *c, int is_seq, const int32_t *ids, size_t n)
{
    tsr_tokenizer *t = c->t;
    tok_post_item *a = realloc(t->post, (t->n_post + 1) * sizeof *a);
    if (!a) return nomem(c);
    t->post = a;
    tok_post_item *it = &t->post[t->n_post++];
    it->is_seq = is_seq;
    it->n = n;
    it->ids = NULL;
    if (n) {
        if (!(it->ids = malloc(n * sizeof *ids))) return nomem(c);
        memcpy(it->ids, ids, n * sizeof *ids);
    }
    return TSR_OK;
}

/* BertProcessing / RobertaProcessing: "cls": ["[CLS]", 101], "sep": ["[SEP]", 102]. */
static tsr_status get_pair_id(const ctx *c, json_t *obj, const char *key, int32_t *id, const char *where)
{
    json_t *v = json_object_get(obj, key);
    if (!json_is_array(v) || json_array_size(v) != 2 || !json_is_integer(json_array_get(v, 1))) {
        char f[256];
        snprintf(f, sizeof f, "%s.%s", where, key);
        return bad(c, f, "expected [token, id]");
    }
    *id = (int32_t)json_integer_value(json_array_get(v, 1));
    return TSR_OK;
}

static tsr_status add_post(const ctx *c, json_t *obj, const char *where)
{
    const char *type;
    TSR_TRY(get_type(c, obj, &type, where));
    if (!strcmp(type, "Sequence")) {
        json_t *list = json_object_get(obj, "processors");
        if (!json_is_array(list)) return bad(c, where, "Sequence without a 'processors' array");
        for (size_t i = 0; i < json_array_size(list); i++) {
            char f[256];
            snprintf(f, sizeof f, "%s.processors[%zu]", where, i);
            TSR_TRY(add_post(c, json_array_get(list, i), f));
        }
        return TSR_OK;
    }
    if (!strcmp(type, "ByteLevel")) return TSR_OK; /* only trims offsets: ids unchanged */
    if (c->t->n_post)
        return tsr_fail(TSR_ERR_UNSUPPORTED, "%s: %s: more than one template post-processor", c->file, where);
    if (!strcmp(type, "BertProcessing") || !strcmp(type, "RobertaProcessing")) {
        int32_t cls, sep;
        TSR_TRY(get_pair_id(c, obj, "cls", &cls, where));
        TSR_TRY(get_pair_id(c, obj, "sep", &sep, where));
        TSR_TRY(push_post(c, 0, &cls, 1));
        TSR_TRY(push_post(c, 1, NULL, 0));
        return push_post(c, 0, &sep, 1);
    }
    if (!strcmp(type, "TemplateProcessing")) {
        json_t *single = json_object_get(obj, "single");
        json_t *specials = json_object_get(obj, "special_tokens");
        if (!json_is_array(single)) return bad(c, where, "TemplateProcessing without a 'single' array");
        for (size_t i = 0; i < json_array_size(single); i++) {
            json_t *it = json_array_get(single, i);
            char f[256];
            snprintf(f, sizeof f, "%s.single[%zu]", where, i);
            json_t *sp = json_object_get(it, "SpecialToken"), *sq = json_object_get(it, "Sequence");
            if (json_is_object(sq)) {
                TSR_TRY(push_post(c, 1, NULL, 0));
            } else if (json_is_object(sp) && json_is_string(json_object_get(sp, "id"))) {
                const char *name = json_string_value(json_object_get(sp, "id"));
                json_t *def = json_object_get(specials, name);
                json_t *ids = json_object_get(def, "ids");
                if (!json_is_array(ids)) {
                    char m[300];
                    snprintf(m, sizeof m, "special token '%.200s' is not in special_tokens", name);
                    return bad(c, f, m);
                }
                size_t n = json_array_size(ids);
                int32_t *v = malloc((n ? n : 1) * sizeof *v);
                if (!v) return nomem(c);
                for (size_t k = 0; k < n; k++) {
                    json_t *x = json_array_get(ids, k);
                    if (!json_is_integer(x) || json_integer_value(x) < 0 || json_integer_value(x) > INT32_MAX) {
                        free(v);
                        return bad(c, f, "special token ids must be non-negative integers");
                    }
                    v[k] = (int32_t)json_integer_value(x);
                }
                tsr_status st = push_post(c, 0, v, n);
                free(v);
                TSR_TRY(st);
            } else {
                return bad(c, f, "expected {\"SpecialToken\": {...}} or {\"Sequence\": {...}}");
            }
        }
        return TSR_OK;
    }
    return tsr_fail(TSR_ERR_UNSUPPORTED, "%s: %s.type: unsupported post-processor type '%s'", c->file, where, type);
}

/* --------------------------------------------------------------------- model */

static tsr_status parse_merge(const ctx *c, json_t *m, size_t i, const char **a, size_t *al, const char **b,
                              size_t *bl)
{
    char f[64];
    snprintf(f, sizeof f, "model.merges[%zu]", i);
    if (json_is_string(m)) {
        const char *s = json_string_value(m);
        size_t n = json_string_length(m);
        const char *sp = memchr(s, ' ', n);
        if (!sp || memchr(sp + 1, ' ', n - (size_t)(sp + 1 - s)))
            return bad(c, f, "expected \"left right\" with exactly one space");
        *a = s;
        *al = (size_t)(sp - s);
        *b = sp + 1;
        *bl = n - *al - 1;
        return TSR_OK;
    }
    if (json_is_array(m) && json_array_size(m) == 2 && json_is_string(json_array_get(m, 0)) &&
        json_is_string(json_array_get(m, 1))) {
        *a = json_string_value(json_array_get(m, 0));
        *al = json_string_length(json_array_get(m, 0));
        *b = json_string_value(json_array_get(m, 1));
        *bl = json_string_length(json_array_get(m, 1));
        return TSR_OK;
    }
    return bad(c, f, "expected \"left right\" or [\"left\", \"right\"]");
}

static tsr_status load_model(const ctx *c, json_t *model)
{
    tsr_tokenizer *t = c->t;
    if (!json_is_object(model)) return bad(c, "model", "missing or not an object");
    json_t *ty = json_object_get(model, "type");
    if (ty && !json_is_string(ty)) return bad(c, "model.type", "expected a string");
    if (ty && strcmp(json_string_value(ty), "BPE"))
        return tsr_fail(TSR_ERR_UNSUPPORTED, "%s: model.type: unsupported model type '%s' (only BPE)", c->file,
                        json_string_value(ty));
    json_t *vocab = json_object_get(model, "vocab");
    json_t *merges = json_object_get(model, "merges");
    if (!json_is_object(vocab)) return bad(c, "model.vocab", "missing or not an object");
    if (!merges) merges = json_array();
    else json_incref(merges);
    if (!json_is_array(merges)) {
        json_decref(merges);
        return bad(c, "model.merges", "expected an array");
    }
    tsr_status st = TSR_OK;
    const char *key;
    json_t *val;
    size_t total = 0;
    json_object_foreach(vocab, key, val) total += strlen(key) + 1;
    char *arena = malloc(total ? total : 1);
    char **arenas = realloc(t->arenas, (t->n_arenas + 1) * sizeof *arenas);
    if (!arena || !arenas) {
        free(arena);
        if (arenas) t->arenas = arenas;
        json_decref(merges);
        return nomem(c);
    }
    t->arenas = arenas;
    t->arenas[t->n_arenas++] = arena;
    if (tok_strmap_init(&t->vocab, json_object_size(vocab))) {
        json_decref(merges);
        return nomem(c);
    }
    size_t off = 0;
    json_object_foreach(vocab, key, val)
    {
        if (!json_is_integer(val) || json_integer_value(val) < 0 || json_integer_value(val) >= INT32_MAX / 2) {
            char f[300];
            snprintf(f, sizeof f, "model.vocab[\"%.200s\"]", key);
            json_decref(merges);
            return bad(c, f, "expected a non-negative integer id");
        }
        size_t n = strlen(key);
        memcpy(arena + off, key, n + 1);
        if (tok_strmap_put(&t->vocab, arena + off, n, (int32_t)json_integer_value(val))) {
            json_decref(merges);
            return nomem(c);
        }
        off += n + 1;
    }

    int dropout_set = 0;
    json_t *dr = json_object_get(model, "dropout");
    if (dr && !json_is_null(dr)) dropout_set = !(json_is_number(dr) && json_number_value(dr) == 0.0);
    if (dropout_set) {
        json_decref(merges);
        return tsr_fail(TSR_ERR_UNSUPPORTED, "%s: model.dropout: BPE dropout is not supported", c->file);
    }
    if ((st = get_bool(c, model, "ignore_merges", 0, &t->ignore_merges, "model")) ||
        (st = get_bool(c, model, "byte_fallback", 0, &t->byte_fallback, "model")) ||
        (st = get_bool(c, model, "fuse_unk", 0, &t->fuse_unk, "model"))) {
        json_decref(merges);
        return st;
    }
    const char *unk, *pre, *suf;
    size_t unk_len, pre_len, suf_len;
    if ((st = get_str(c, model, "unk_token", &unk, &unk_len, "model")) ||
        (st = get_str(c, model, "continuing_subword_prefix", &pre, &pre_len, "model")) ||
        (st = get_str(c, model, "end_of_word_suffix", &suf, &suf_len, "model"))) {
        json_decref(merges);
        return st;
    }
    t->unk_id = -1;
    if (unk) {
        t->unk_id = tok_strmap_get(&t->vocab, unk, unk_len);
        if (t->unk_id < 0) {
            json_decref(merges);
            return bad(c, "model.unk_token", "the unk token is not in the vocab");
        }
    }
    if (pre && pre_len) {
        if (!(t->cont_prefix = dup_mem(pre, pre_len))) goto oom;
        t->cont_prefix_len = pre_len;
    }
    if (suf && suf_len) {
        if (!(t->eow_suffix = dup_mem(suf, suf_len))) goto oom;
        t->eow_suffix_len = suf_len;
    }
    for (int b = 0; b < 256; b++) {
        char s[8];
        snprintf(s, sizeof s, "<0x%02X>", b);
        t->byte_ids[b] = tok_strmap_get(&t->vocab, s, 6);
        char ch = (char)b;
        t->char_ids[b] = b < 0x80 ? tok_strmap_get(&t->vocab, &ch, 1) : -1;
    }

    size_t nm = json_array_size(merges);
    if (tok_pairmap_init(&t->merges, nm)) goto oom;
    tok_buf tmp = {0};
    for (size_t i = 0; i < nm; i++) {
        const char *a = NULL, *b = NULL;
        size_t al = 0, bl = 0;
        if ((st = parse_merge(c, json_array_get(merges, i), i, &a, &al, &b, &bl))) break;
        int32_t ia = tok_strmap_get(&t->vocab, a, al), ib = tok_strmap_get(&t->vocab, b, bl);
        size_t skip = t->cont_prefix_len <= bl ? t->cont_prefix_len : bl;
        tmp.len = 0;
        if (tok_buf_add(&tmp, a, al) || tok_buf_add(&tmp, b + skip, bl - skip)) {
            tok_buf_free(&tmp);
            goto oom;
        }
        int32_t im = tok_strmap_get(&t->vocab, tmp.data, tmp.len);
        if (ia < 0 || ib < 0 || im < 0) {
            char f[64], m[400];
            snprintf(f, sizeof f, "model.merges[%zu]", i);
            snprintf(m, sizeof m, "merge '%.*s' + '%.*s' uses a token that is not in the vocab",
                     (int)(al > 100 ? 100 : al), a, (int)(bl > 100 ? 100 : bl), b);
            st = bad(c, f, m);
            break;
        }
        tok_pairmap_put(&t->merges, ia, ib, (int32_t)i, im);
    }
    tok_buf_free(&tmp);
    json_decref(merges);
    return st;
oom:
    json_decref(merges);
    return nomem(c);
}

/* ------------------------------------------------------------- added tokens */

static tsr_status load_added(const ctx *c, json_t *list)
{
    tsr_tokenizer *t = c->t;
    if (!list || json_is_null(list)) return TSR_OK;
    if (!json_is_array(list)) return bad(c, "added_tokens", "expected an array");
    size_t n = json_array_size(list);
    t->added = calloc(n ? n : 1, sizeof *t->added);
    if (!t->added || tok_strmap_init(&t->added_map, n)) return nomem(c);
    for (size_t i = 0; i < n; i++) {
        json_t *o = json_array_get(list, i);
        char f[64];
        snprintf(f, sizeof f, "added_tokens[%zu]", i);
        if (!json_is_object(o)) return bad(c, f, "expected an object");
        json_t *id = json_object_get(o, "id");
        const char *content;
        size_t len;
        if (!json_is_integer(id) || json_integer_value(id) < 0 || json_integer_value(id) >= INT32_MAX / 2)
            return bad(c, f, "missing or invalid 'id'");
        TSR_TRY(get_str(c, o, "content", &content, &len, f));
        if (!content) return bad(c, f, "missing 'content'");
        tok_added *a = &t->added[t->n_added];
        a->id = (int32_t)json_integer_value(id);
        TSR_TRY(get_bool(c, o, "special", 0, &a->special, f));
        TSR_TRY(get_bool(c, o, "lstrip", 0, &a->lstrip, f));
        TSR_TRY(get_bool(c, o, "rstrip", 0, &a->rstrip, f));
        TSR_TRY(get_bool(c, o, "single_word", 0, &a->single_word, f));
        TSR_TRY(get_bool(c, o, "normalized", !a->special, &a->normalized, f));
        if (!(a->content = dup_mem(content, len))) return nomem(c);
        a->len = len;
        t->n_added++;
        if (len && tok_strmap_put(&t->added_map, a->content, len, a->id)) return nomem(c);
    }
    return TSR_OK;
}

/* id → string table; added tokens override the model vocab. */
static tsr_status build_id_table(const ctx *c)
{
    tsr_tokenizer *t = c->t;
    size_t n = 0;
    for (size_t i = 0; i <= t->vocab.mask; i++)
        if (t->vocab.slots[i].key && (size_t)t->vocab.slots[i].val + 1 > n) n = (size_t)t->vocab.slots[i].val + 1;
    for (size_t i = 0; i < t->n_added; i++)
        if ((size_t)t->added[i].id + 1 > n) n = (size_t)t->added[i].id + 1;
    t->n_ids = n;
    t->id_str = calloc(n ? n : 1, sizeof *t->id_str);
    t->id_len = calloc(n ? n : 1, sizeof *t->id_len);
    t->id_special = calloc(n ? n : 1, 1);
    if (!t->id_str || !t->id_len || !t->id_special) return nomem(c);
    for (size_t i = 0; i <= t->vocab.mask; i++) {
        const tok_strmap_slot *s = &t->vocab.slots[i];
        if (!s->key) continue;
        t->id_str[s->val] = s->key;
        t->id_len[s->val] = s->len;
    }
    tok_strmap specials;
    if (tok_strmap_init(&specials, t->n_added)) return nomem(c);
    for (size_t i = 0; i < t->n_added; i++) {
        t->id_str[t->added[i].id] = t->added[i].content;
        t->id_len[t->added[i].id] = (uint32_t)t->added[i].len;
        if (t->added[i].special && t->added[i].len &&
            tok_strmap_put(&specials, t->added[i].content, t->added[i].len, 1)) {
            tok_strmap_free(&specials);
            return nomem(c);
        }
    }
    for (size_t i = 0; i < n; i++)
        if (t->id_str[i] && tok_strmap_get(&specials, t->id_str[i], t->id_len[i]) == 1) t->id_special[i] = 1;
    tsr_status st = TSR_OK;
    t->dec_str = malloc((n ? n : 1) * sizeof *t->dec_str);
    t->dec_len = malloc((n ? n : 1) * sizeof *t->dec_len);
    t->dec_special = malloc(n ? n : 1);
    if (!t->dec_str || !t->dec_len || !t->dec_special) {
        st = nomem(c);
    } else {
        memcpy(t->dec_str, t->id_str, n * sizeof *t->dec_str);
        memcpy(t->dec_len, t->id_len, n * sizeof *t->dec_len);
        memcpy(t->dec_special, t->id_special, n);
        for (size_t i = 0; i < t->n_added; i++) {
            const tok_added *a = &t->added[i];
            if (!a->norm) continue;
            t->dec_str[a->id] = a->norm;
            t->dec_len[a->id] = (uint32_t)a->norm_len;
            t->dec_special[a->id] = tok_strmap_get(&specials, a->norm, a->norm_len) == 1;
        }
    }
    tok_strmap_free(&specials);
    return st;
}

/* Normalized added tokens are matched in their normalized form. */
static tsr_status normalize_added(const ctx *c)
{
    tsr_tokenizer *t = c->t;
    tok_buf b = {0};
    for (size_t i = 0; i < t->n_added; i++) {
        tok_added *a = &t->added[i];
        if (!a->normalized || !t->n_norms) continue;
        tsr_status st = tok_normalize(t, a->content, a->len, &b);
        if (st) {
            tok_buf_free(&b);
            return st;
        }
        if (!(a->norm = dup_mem(b.data ? b.data : "", b.len))) {
            tok_buf_free(&b);
            return nomem(c);
        }
        a->norm_len = b.len;
    }
    tok_buf_free(&b);
    return TSR_OK;
}

tsr_status tok_load_json(tsr_tokenizer *t, const char *file)
{
    json_error_t err;
    json_t *root = json_load_file(file, JSON_REJECT_DUPLICATES | JSON_ALLOW_NUL, &err);
    ctx c = {base_name(file), t};
    if (!root) {
        FILE *f = fopen(file, "rb");
        if (!f) return tsr_fail(TSR_ERR_IO, "%s: cannot open: %s", file, err.text);
        fclose(f);
        return tsr_fail(TSR_ERR_FORMAT, "%s: malformed JSON at line %d, column %d: %s", file, err.line, err.column,
                        err.text);
    }
    tsr_status st = TSR_OK;
    json_t *v;
    if (!json_is_object(root)) {
        st = bad(&c, "(root)", "expected an object");
        goto done;
    }
    if ((st = load_model(&c, json_object_get(root, "model")))) goto done;
    if ((st = load_added(&c, json_object_get(root, "added_tokens")))) goto done;
    if ((v = json_object_get(root, "normalizer")) && !json_is_null(v) && (st = add_norm(&c, v, "normalizer")))
        goto done;
    if ((v = json_object_get(root, "pre_tokenizer")) && !json_is_null(v) &&
        (st = add_pretok(&c, v, "pre_tokenizer")))
        goto done;
    if (t->n_pretoks > TOK_MAX_DEPTH - 1) {
        st = tsr_fail(TSR_ERR_UNSUPPORTED, "%s: pre_tokenizer: more than %d steps", c.file, TOK_MAX_DEPTH - 1);
        goto done;
    }
    if ((v = json_object_get(root, "post_processor")) && !json_is_null(v)) {
        t->has_post = 1;
        if ((st = add_post(&c, v, "post_processor"))) goto done;
    }
    if ((v = json_object_get(root, "decoder")) && !json_is_null(v)) {
        t->has_decoder = 1;
        if ((st = add_dec(&c, v, "decoder"))) goto done;
    }
    if ((v = json_object_get(root, "truncation")) && !json_is_null(v)) {
        st = tsr_fail(TSR_ERR_UNSUPPORTED, "%s: truncation: truncation settings are not supported", c.file);
        goto done;
    }
    if ((st = normalize_added(&c))) goto done;
    if ((st = build_id_table(&c))) goto done;
    if ((st = tok_build_matchers(t))) goto done;
done:
    json_decref(root);
    return st;
}

static tsr_status config_token(const ctx *c, json_t *root, const char *key, char **out)
{
    json_t *v = json_object_get(root, key);
    if (json_is_object(v)) v = json_object_get(v, "content");
    if (!v || json_is_null(v)) return TSR_OK;
    if (!json_is_string(v)) return bad(c, key, "expected a string or {\"content\": ...}");
    if (!(*out = dup_mem(json_string_value(v), json_string_length(v)))) return nomem(c);
    return TSR_OK;
}

tsr_status tok_load_config(tsr_tokenizer *t, const char *file)
{
    json_error_t err;
    /* integers as reals: Hugging Face writes model_max_length as 1e30 spelled out (Llama 3's tokenizer_config.json),
     * beyond jansson's integers; only strings are read here */
    json_t *root = json_load_file(file, JSON_ALLOW_NUL | JSON_DECODE_INT_AS_REAL, &err);
    ctx c = {base_name(file), t};
    if (!root)
        return tsr_fail(TSR_ERR_FORMAT, "%s: malformed JSON at line %d, column %d: %s", file, err.line, err.column,
                        err.text);
    tsr_status st = TSR_OK;
    if (!json_is_object(root)) st = bad(&c, "(root)", "expected an object");
    if (!st) st = config_token(&c, root, "bos_token", &t->bos);
    if (!st) st = config_token(&c, root, "eos_token", &t->eos);
    json_decref(root);
    return st;
}
