/* Internal data of the tokenizer, shared by the tok_*.c files (not a public header).
 *
 * A loaded tokenizer is a flat description of the tokenizer.json pipeline: a list of normalizer steps, a list of
 * pre-tokenizer steps (Sequences are flattened), the BPE model (vocab hash map, merge-rank hash map), the added
 * tokens, the post-processor template and a list of decoder steps. Everything is immutable after loading.
 * Helpers here: a growable byte buffer, a growable id vector, UTF-8 helpers, a string hash map and a pair map. */
#ifndef TSR_TEXT_TOK_INTERNAL_H
#define TSR_TEXT_TOK_INTERNAL_H

#include "runtime/status.h"
#include "runtime/text/tokenizer.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

/* ---- buffers ---- */
typedef struct {
    char *data;
    size_t len, cap;
} tok_buf;
int tok_buf_reserve(tok_buf *b, size_t extra); /* 0 ok, -1 out of memory; keeps room for a NUL */
int tok_buf_add(tok_buf *b, const void *p, size_t n);
void tok_buf_free(tok_buf *b);

typedef struct {
    int32_t *v;
    size_t n, cap;
} tok_ids;
int tok_ids_push(tok_ids *a, int32_t id);

/* ---- UTF-8 ---- */
/* Length of the valid UTF-8 character at s (n bytes left), 0 when invalid or incomplete. Sets *cp. */
int tok_utf8_next(const unsigned char *s, size_t n, uint32_t *cp);
/* Offset of the first invalid byte, or len when the text is valid. */
size_t tok_utf8_validate(const char *s, size_t len);
int tok_utf8_encode(uint32_t cp, char *out);
/* Rust's String::from_utf8_lossy on bytes appended to out. When `final` is 0, a trailing incomplete but possibly
 * valid sequence is not consumed; returns the number of bytes consumed. */
size_t tok_utf8_lossy(const unsigned char *s, size_t n, int final, tok_buf *out, int *err);
int tok_is_whitespace(uint32_t cp); /* Rust char::is_whitespace */
int tok_is_word_char(uint32_t cp);  /* regex \w */
int tok_bytelevel_char(int b);       /* GPT-2 bytes_to_unicode: byte → code point */

uint64_t tok_hash(const void *p, size_t n);

/* ---- string → int32 map (open addressing) ---- */
typedef struct {
    const char *key; /* not owned */
    uint32_t len;
    int32_t val;
} tok_strmap_slot;
typedef struct {
    tok_strmap_slot *slots;
    size_t mask, count;
} tok_strmap;
int tok_strmap_init(tok_strmap *m, size_t expected);
/* Inserts or overwrites. 0 ok, -1 out of memory. */
int tok_strmap_put(tok_strmap *m, const char *key, size_t len, int32_t val);
int32_t tok_strmap_get(const tok_strmap *m, const char *key, size_t len); /* -1 if absent */
void tok_strmap_free(tok_strmap *m);

/* ---- (a, b) → (rank, merged id) map ---- */
typedef struct {
    uint64_t key; /* UINT64_MAX = empty */
    int32_t rank, id;
} tok_pairmap_slot;
typedef struct {
    tok_pairmap_slot *slots;
    size_t mask, count;
} tok_pairmap;
int tok_pairmap_init(tok_pairmap *m, size_t expected);
void tok_pairmap_put(tok_pairmap *m, int32_t a, int32_t b, int32_t rank, int32_t id);
static inline const tok_pairmap_slot *tok_pairmap_get(const tok_pairmap *m, int32_t a, int32_t b)
{
    uint64_t key = ((uint64_t)(uint32_t)a << 32) | (uint32_t)b;
    uint64_t h = key * 0x9E3779B97F4A7C15ull;
    size_t i = (size_t)(h >> 20) & m->mask;
    for (;;) {
        const tok_pairmap_slot *s = &m->slots[i];
        if (s->key == key) return s;
        if (s->key == UINT64_MAX) return NULL;
        i = (i + 1) & m->mask;
    }
}
void tok_pairmap_free(tok_pairmap *m);

/* ---- regex (PCRE2, UTF + UCP, JIT when available) ---- */
typedef struct {
    pcre2_code *code;
    int jit;
} tok_regex;
/* Compiles an Oniguruma-style pattern from tokenizer.json. `where` names the field for errors. */
tsr_status tok_regex_compile(tok_regex *re, const char *pattern, size_t len, const char *where);
void tok_regex_free(tok_regex *re);
/* Finds the next match at or after `from` in s[0..n]; returns 1 and sets [*ms, *me), 0 when none, -1 on error. */
int tok_regex_find(const tok_regex *re, pcre2_match_data *md, pcre2_match_context *mc, const char *s, size_t n,
                   size_t from, size_t *ms, size_t *me);

/* A pattern of Split / Replace: a literal string or a regex. */
typedef struct {
    int is_regex;
    char *lit;
    size_t lit_len;
    tok_regex re;
} tok_pattern;

/* Frees what a pattern owns (its literal or its regex); the pattern itself is the caller's. */
void tok_pattern_free(tok_pattern *p);

/* ---- pipeline components ---- */
typedef enum { NORM_NFC, NORM_NFD, NORM_NFKC, NORM_NFKD, NORM_LOWER, NORM_STRIP, NORM_PREPEND, NORM_REPLACE } norm_kind;
typedef struct {
    norm_kind kind;
    int strip_left, strip_right;
    char *str; /* Prepend text, Replace content */
    size_t str_len;
    tok_pattern pat;
} tok_norm;

typedef enum { SPLIT_REMOVED, SPLIT_ISOLATED, SPLIT_MERGED_PREV, SPLIT_MERGED_NEXT, SPLIT_CONTIGUOUS } split_behavior;
typedef enum { PT_SPLIT, PT_BYTELEVEL, PT_METASPACE } pretok_kind;
typedef enum { PREPEND_ALWAYS, PREPEND_FIRST, PREPEND_NEVER } prepend_scheme;
typedef struct {
    pretok_kind kind;
    /* Split (also ByteLevel's own regex when use_regex) */
    tok_pattern pat;
    split_behavior behavior;
    int invert;
    /* ByteLevel */
    int add_prefix_space, use_regex;
    /* Metaspace */
    char repl[8];
    size_t repl_len;
    prepend_scheme scheme;
    int split;
} tok_pretok;

typedef enum { DEC_REPLACE, DEC_BYTEFALLBACK, DEC_FUSE, DEC_STRIP, DEC_METASPACE, DEC_BYTELEVEL } dec_kind;
typedef struct {
    dec_kind kind;
    tok_pattern pat; /* Replace */
    char *str;       /* Replace content */
    size_t str_len;
    uint32_t content; /* Strip char; Metaspace replacement */
    int start, stop;  /* Strip */
    prepend_scheme scheme;
} tok_dec;

typedef struct {
    char *content;
    size_t len;
    char *norm; /* normalized content for normalized tokens */
    size_t norm_len;
    int32_t id;
    int special, lstrip, rstrip, normalized, single_word;
} tok_added;

/* The post-processor for one sequence: a list of items, each a run of special ids or the sequence itself. */
typedef struct {
    int is_seq;
    int32_t *ids;
    size_t n;
} tok_post_item;

struct tsr_tokenizer {
    char *path;
    /* model */
    tok_strmap vocab; /* model vocab, keys point into arena */
    tok_pairmap merges;
    int ignore_merges, byte_fallback, fuse_unk;
    int32_t unk_id; /* -1 none */
    char *cont_prefix, *eow_suffix;
    size_t cont_prefix_len, eow_suffix_len;
    int32_t byte_ids[256]; /* <0xNN> ids for byte_fallback, -1 when absent */
    int32_t char_ids[256]; /* vocab id of each single-byte (ASCII) string, -1 absent (fast path) */
    /* id → token string (added tokens override the model vocab) */
    const char **id_str;
    uint32_t *id_len;
    unsigned char *id_special;
    size_t n_ids;
    /* the strings decoding starts from: like id_str, but normalized added tokens in their normalized form (as
     * tokenizers does), and dec_special: that string is the content of a special added token */
    const char **dec_str;
    uint32_t *dec_len;
    unsigned char *dec_special;
    /* added tokens */
    tok_added *added;
    size_t n_added;
    tok_strmap added_map;
    /* pipeline */
    tok_norm *norms;
    size_t n_norms;
    tok_pretok *pretoks;
    size_t n_pretoks;
    tok_post_item *post;
    size_t n_post;
    int has_post;
    tok_dec *decs;
    size_t n_decs;
    int has_decoder;
    char *bos, *eos;
    /* scratch spaces of finished encode calls, reused by the next ones (guarded by pool_lock) */
    pthread_mutex_t pool_lock;
    struct tok_work *pool[8];
    size_t n_pool;
    /* added-token matchers: [0] raw text (normalized=false tokens), [1] normalized text; for each first byte the
     * range [first[c], first[c+1]) of `order` lists candidate added-token indices, longest first */
    uint32_t *am_order[2];
    uint32_t am_first[2][257];
    /* all strings of vocab keys */
    char **arenas;
    size_t n_arenas;
};

/* tok_load.c */
tsr_status tok_load_json(tsr_tokenizer *t, const char *file);
tsr_status tok_load_config(tsr_tokenizer *t, const char *file);
/* tok_normalize.c: normalizes in[0..n] into out (cleared first). */
tsr_status tok_normalize(const tsr_tokenizer *t, const char *in, size_t n, tok_buf *out);
/* tok_pretok.c: runs the pre-tokenizers on one normalized piece and the model on each resulting word. */
typedef struct tok_work tok_work;
tsr_status tok_pretok_run(const tsr_tokenizer *t, tok_work *w, const char *s, size_t n, int at_start,
                          tok_ids *out);
/* tok_bpe.c: tokenizes one word with the BPE model, appending ids. */
tsr_status tok_bpe_word(const tsr_tokenizer *t, tok_work *w, const char *s, size_t n, tok_ids *out);
/* tok_encode.c */
tsr_status tok_build_matchers(tsr_tokenizer *t);
tok_work *tok_work_new(void);
void tok_work_free(tok_work *w);
tok_work *tok_work_get(const tsr_tokenizer *t); /* from the tokenizer's pool, or new */
void tok_work_put(const tsr_tokenizer *t, tok_work *w);

/* Scratch space of one encode call (so a tokenizer can be shared between threads). */
#define TOK_MAX_DEPTH 16
struct tok_work {
    pcre2_match_data *md;
    pcre2_match_context *mc;
    pcre2_jit_stack *jit_stack;
    tok_buf depth_a[TOK_MAX_DEPTH], depth_b[TOK_MAX_DEPTH]; /* per pre-tokenizer step */
    size_t *spans[TOK_MAX_DEPTH];                          /* split spans, 3 per entry */
    size_t spans_cap[TOK_MAX_DEPTH];
    /* BPE scratch */
    int32_t *sym_id;
    int32_t *sym_prev, *sym_next;
    uint32_t *sym_len;
    size_t sym_cap;
    void *heap;
    size_t heap_cap;
    tok_buf norm;
    struct tok_cache_ent *cache; /* word → ids cache (direct mapped), kept with the pooled scratch */
};
#define TOK_CACHE_SLOTS 8192
#define TOK_CACHE_WORD 30
#define TOK_CACHE_IDS 7
struct tok_cache_ent {
    uint8_t len, n_ids;
    char word[TOK_CACHE_WORD];
    int32_t ids[TOK_CACHE_IDS];
};

#endif
