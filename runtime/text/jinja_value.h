/* Values of the chat-template interpreter, the arena they live in, and their Python-like conversions.
 *
 * Every value, string, list and dict of one parse or one render is allocated from a jinja_arena and released at
 * once with it; nothing is reference counted. Errors anywhere in the interpreter (syntax, type, limits, failed
 * allocations) are raised with jinja_raise(): the message goes to tsr_fail() and control jumps back (longjmp) to
 * the entry point that armed the arena's jinja_err, which frees the arena and returns the status. Values follow
 * Python semantics because templates were written against Jinja2 on CPython: str() and repr() of values,
 * truthiness, equality, json.dumps for tojson, code-point indexing of strings.
 *
 * Ownership: jv values never own memory; the arena owns everything. Not thread-safe per arena. */
#ifndef TSR_TEXT_JINJA_VALUE_H
#define TSR_TEXT_JINJA_VALUE_H

#include "runtime/status.h"

#include <jansson.h>
#include <setjmp.h>
#include <stddef.h>
#include <stdint.h>

typedef struct jinja_err {
    jmp_buf jb;
    tsr_status status;
} jinja_err;

typedef struct jinja_chunk jinja_chunk;
typedef struct jinja_arena {
    jinja_chunk *head;
    size_t used_total;
    size_t limit; /* 0: no limit */
    jinja_err *err;
} jinja_arena;

/* Records "<message> (template line N)" (line 0: no line), then longjmps to err. Never returns. */
_Noreturn void jinja_raise(jinja_err *err, tsr_status st, int line, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

void *ja_alloc(jinja_arena *a, size_t n); /* zeroed; raises on failure or when over the limit */
char *ja_strdup(jinja_arena *a, const char *s, size_t n); /* NUL-terminated copy */
void ja_free_all(jinja_arena *a);

typedef enum {
    JV_UNDEF,
    JV_NONE,
    JV_BOOL,
    JV_INT,
    JV_FLOAT,
    JV_STR,
    JV_LIST,
    JV_DICT,
    JV_NS,    /* namespace(): a dict whose attributes can be assigned */
    JV_MACRO, /* u.ptr: jinja_macro (eval) */
    JV_FUNC,  /* u.i: builtin global id (eval) */
    JV_LOOP   /* u.ptr: loop state (eval) */
} jv_type;

typedef struct jlist jlist;
typedef struct jdict jdict;

typedef struct jv {
    jv_type t;
    union {
        int64_t i; /* INT, BOOL (0/1), FUNC */
        double f;
        struct {
            const char *p;
            size_t n;
        } s;
        jlist *l;
        jdict *d; /* DICT, NS */
        void *ptr;
    } u;
} jv;

struct jlist {
    jv *v;
    size_t n, cap;
    int tuple;
};
struct jdict {
    jv *k, *v;
    size_t n, cap;
};

/* Growable byte buffer in the arena. */
typedef struct jbuf {
    char *p;
    size_t n, cap;
    jinja_arena *a;
} jbuf;

void jbuf_put(jbuf *b, const char *s, size_t n);
void jbuf_puts(jbuf *b, const char *s);
void jbuf_putc(jbuf *b, char c);
void jbuf_printf(jbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
jv jbuf_value(jbuf *b); /* the buffer's text as a string value (shares the bytes) */

jv jv_undef(void);
jv jv_none(void);
jv jv_bool(int b);
jv jv_int(int64_t i);
jv jv_float(double f);
jv jv_str(const char *p, size_t n); /* no copy */
jv jv_cstr(const char *p);
jv jv_list_new(jinja_arena *a, size_t cap);
jv jv_dict_new(jinja_arena *a, size_t cap);
void jv_list_push(jinja_arena *a, jv list, jv item);
void jv_dict_set(jinja_arena *a, jv dict, jv key, jv val); /* replaces an equal key in place */
jv *jv_dict_find(jv dict, const char *key, size_t n); /* string keys; NULL if absent */
jv *jv_dict_find_v(jv dict, jv key);

int jv_truthy(jv v);
int jv_equal(jv a, jv b);
int jv_is_str(jv v, const char *s); /* v is a string equal to s */
int jv_is_number(jv v);               /* int, float, bool */
double jv_num(jv v);
const char *jv_type_name(jv v); /* Python type name: 'str', 'int', 'list', 'dict', 'NoneType', ... */

/* Python str(v) and repr(v) appended to b. */
void jv_to_str(jbuf *b, jv v);
void jv_repr(jbuf *b, jv v);
void jv_float_repr(jbuf *b, double f);

/* json.dumps(v, ensure_ascii=ascii, indent=..., separators=(item_sep, key_sep), sort_keys). indent_str NULL: none.
 * Raises (line) on values JSON cannot hold (undefined, macros). */
void jv_to_json(jbuf *b, jv v, const char *indent_str, const char *item_sep, const char *key_sep, int sort_keys,
                int ascii, jinja_err *err, int line);

/* Deep conversion of JSON to values (strings copied into the arena). */
jv jv_from_json(jinja_arena *a, const json_t *j);

/* UTF-8 helpers: code points are decoded leniently (a bad byte counts as one code point). */
size_t utf8_len(const char *p, size_t n);
size_t utf8_next(const char *p, size_t n, size_t i, uint32_t *cp); /* returns index after the code point */
size_t utf8_put(char *out, uint32_t cp);                            /* writes 1..4 bytes */
int py_isspace(uint32_t cp);                                        /* Python str.isspace() */

#endif
