/* The allocation wrappers behind fail_alloc.h.
 *
 * The linker sends every reference to malloc, calloc, realloc, free, strdup and strndup in the linked objects to
 * __wrap_<name>; the real function stays reachable as __real_<name>. Each wrapper takes one process-wide mutex,
 * asks the current run whether this allocation is the one to fail, calls the real allocator and updates the
 * table of live blocks. The table is open addressing with linear probing and backward-shift deletion, keyed by
 * pointer, grown at half load; it and the site list use only the real allocator, so they are invisible to the
 * counts. Frees of pointers the table does not know (memory handed out by a shared library's own malloc, such
 * as utf8proc_map's) pass straight through. A realloc keeps its block's serial number: growing an old buffer is
 * not a new allocation.
 *
 * Also wrapped: json_loadb and json_load_file, so that only the first allocation of a parser call can fail
 * (fail_alloc.h says why), and the constructors and destructors of the PCRE2 objects tessera makes (compiled
 * patterns, match data, match contexts, JIT stacks), which PCRE2 allocates with its own malloc: each object
 * counts as one allocation that can fail and stays a live block until its destructor runs. */
#include "tests/fault/fail_alloc.h"

#include <dlfcn.h>
#include <errno.h>
#include <execinfo.h>
#include <jansson.h>
#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void *__real_malloc(size_t n);
void *__real_calloc(size_t count, size_t n);
void *__real_realloc(void *p, size_t n);
void __real_free(void *p);
void *__wrap_malloc(size_t n);
void *__wrap_calloc(size_t count, size_t n);
void *__wrap_realloc(void *p, size_t n);
void __wrap_free(void *p);
char *__wrap_strdup(const char *s);
char *__wrap_strndup(const char *s, size_t n);
json_t *__real_json_loadb(const char *buffer, size_t buflen, size_t flags, json_error_t *error);
json_t *__real_json_load_file(const char *path, size_t flags, json_error_t *error);
json_t *__wrap_json_loadb(const char *buffer, size_t buflen, size_t flags, json_error_t *error);
json_t *__wrap_json_load_file(const char *path, size_t flags, json_error_t *error);

typedef enum run_mode { RUN_OFF = 0, RUN_COUNT, RUN_FAIL_NTH, RUN_FAIL_SITE } run_mode;

typedef struct block {
    void *ptr;          /* NULL: empty slot */
    uint64_t serial;
    size_t size;
    const void *site;
} block;

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static block *table;
static size_t table_cap, table_used;
static uint64_t next_serial = 1;

static run_mode mode;
static long counted, fail_at;
static const void *fail_site;
static int injected;
static const void *injected_site;
static int suspended;
static _Thread_local int in_json_parser;    /* depth of wrapped jansson parser calls on this thread */
static _Thread_local long parser_allocs;    /* allocations of the current outermost parser call */

static const void **sites;        /* distinct sites of the counted run, in order */
static size_t n_sites, cap_sites;
static const void **site_set;     /* open-addressing set over the same sites */
static size_t site_set_cap;

/* ---- the live-block table ---------------------------------------------------------------------------------- */

static size_t slot_of(const void *p, size_t cap)
{
    uintptr_t h = (uintptr_t)p;
    h ^= h >> 33;
    h *= 0xff51afd7ed558ccdULL;
    h ^= h >> 29;
    return (size_t)h & (cap - 1);
}

static void table_put(block b);

static void table_grow(void)
{
    block *old = table;
    size_t old_cap = table_cap;
    table_cap = old_cap ? old_cap * 2 : 1u << 16;
    table = __real_calloc(table_cap, sizeof *table);
    if (!table) {
        fputs("fail_alloc: cannot grow the live-block table\n", stderr);
        abort();
    }
    table_used = 0;
    for (size_t i = 0; i < old_cap; i++)
        if (old[i].ptr) table_put(old[i]);
    __real_free(old);
}

static void table_put(block b)
{
    if ((table_used + 1) * 2 > table_cap) table_grow();
    size_t i = slot_of(b.ptr, table_cap);
    while (table[i].ptr && table[i].ptr != b.ptr) i = (i + 1) & (table_cap - 1);
    if (!table[i].ptr) table_used++;
    table[i] = b;
}

/* Removes p; returns its entry (ptr NULL when p was not tracked). */
static block table_take(const void *p)
{
    block none = {0};
    if (!table_cap) return none;
    size_t i = slot_of(p, table_cap);
    while (table[i].ptr && table[i].ptr != p) i = (i + 1) & (table_cap - 1);
    if (!table[i].ptr) return none;
    block found = table[i];
    /* backward-shift deletion: move later members of the probe run into the hole when their home allows it */
    size_t hole = i;
    for (size_t j = (i + 1) & (table_cap - 1); table[j].ptr; j = (j + 1) & (table_cap - 1)) {
        size_t home = slot_of(table[j].ptr, table_cap);
        int movable = hole <= j ? (home <= hole || home > j) : (home <= hole && home > j);
        if (movable) {
            table[hole] = table[j];
            hole = j;
        }
    }
    table[hole].ptr = NULL;
    table_used--;
    return found;
}

/* ---- runs and sites ------------------------------------------------------------------------------------------ */

static void record_site(const void *site)
{
    if ((n_sites + 1) * 2 > site_set_cap) {
        size_t cap = site_set_cap ? site_set_cap * 2 : 1024;
        const void **set = __real_calloc(cap, sizeof *set);
        if (!set) abort();
        for (size_t k = 0; k < n_sites; k++) {
            size_t i = slot_of(sites[k], cap);
            while (set[i]) i = (i + 1) & (cap - 1);
            set[i] = sites[k];
        }
        __real_free((void *)site_set);
        site_set = set;
        site_set_cap = cap;
    }
    size_t i = slot_of(site, site_set_cap);
    while (site_set[i] && site_set[i] != site) i = (i + 1) & (site_set_cap - 1);
    if (site_set[i]) return;
    site_set[i] = site;
    if (n_sites == cap_sites) {
        cap_sites = cap_sites ? cap_sites * 2 : 512;
        const void **grown = __real_realloc((void *)sites, cap_sites * sizeof *grown);
        if (!grown) abort();
        sites = grown;
    }
    sites[n_sites++] = site;
}

/* Called under the lock for every allocation: 1 when this one must fail. */
static int must_fail(const void *site)
{
    if (mode == RUN_OFF || suspended) return 0;
    if (in_json_parser && parser_allocs++ > 0) return 0; /* see fail_alloc.h */
    counted++;
    if (mode == RUN_COUNT) {
        record_site(site);
        return 0;
    }
    if (injected) return 0;
    if ((mode == RUN_FAIL_NTH && counted == fail_at) || (mode == RUN_FAIL_SITE && site == fail_site)) {
        injected = 1;
        injected_site = site;
        if (getenv("TSR_FAULT_BACKTRACE")) { /* where the failure lands, for whoever debugs a report */
            void *frames[32];
            int n = backtrace(frames, 32);
            fprintf(stderr, "fail_alloc: failing allocation %ld here:\n", counted);
            backtrace_symbols_fd(frames, n, 2);
        }
        return 1;
    }
    return 0;
}

static void start_run(run_mode m, long nth, const void *site)
{
    pthread_mutex_lock(&lock);
    mode = m;
    counted = 0;
    fail_at = nth;
    fail_site = site;
    injected = 0;
    injected_site = NULL;
    if (m == RUN_COUNT) {
        n_sites = 0;
        if (site_set) memset((void *)site_set, 0, site_set_cap * sizeof *site_set);
    }
    pthread_mutex_unlock(&lock);
}

void fa_count_start(void) { start_run(RUN_COUNT, 0, NULL); }
void fa_fail_nth(long n) { start_run(RUN_FAIL_NTH, n, NULL); }
void fa_fail_site(const void *site) { start_run(RUN_FAIL_SITE, 0, site); }

long fa_stop(void)
{
    pthread_mutex_lock(&lock);
    mode = RUN_OFF;
    long n = counted;
    pthread_mutex_unlock(&lock);
    return n;
}

int fa_injected(void)
{
    pthread_mutex_lock(&lock);
    int r = injected;
    pthread_mutex_unlock(&lock);
    return r;
}

const void *fa_injected_site(void)
{
    pthread_mutex_lock(&lock);
    const void *site = injected_site;
    pthread_mutex_unlock(&lock);
    return site;
}

void fa_suspend(int on)
{
    pthread_mutex_lock(&lock);
    suspended = on;
    pthread_mutex_unlock(&lock);
}

size_t fa_sites(const void *const **out)
{
    *out = sites;
    return n_sites;
}

uint64_t fa_mark(void)
{
    pthread_mutex_lock(&lock);
    uint64_t m = next_serial;
    pthread_mutex_unlock(&lock);
    return m;
}

const char *fa_site_str(const void *site, char *buf, size_t cap)
{
    Dl_info info;
    if (dladdr(site, &info) && info.dli_fname) {
        const char *name = strrchr(info.dli_fname, '/');
        snprintf(buf, cap, "%s+%#lx", name ? name + 1 : info.dli_fname,
                 (unsigned long)((const char *)site - (const char *)info.dli_fbase));
    } else {
        snprintf(buf, cap, "%p", site);
    }
    return buf;
}

size_t fa_live_since(uint64_t mark, int report)
{
    block shown[16];
    int n_shown = 0;
    size_t live = 0;
    pthread_mutex_lock(&lock);
    for (size_t i = 0; i < table_cap; i++) {
        if (!table[i].ptr || table[i].serial < mark) continue;
        if (n_shown < report && n_shown < 16) shown[n_shown++] = table[i];
        live++;
    }
    pthread_mutex_unlock(&lock);
    for (int k = 0; k < n_shown; k++) {
        char where[256];
        fprintf(stderr, "  live: %zu bytes from %s\n", shown[k].size, fa_site_str(shown[k].site, where, sizeof where));
    }
    return live;
}

/* ---- the wrappers ---------------------------------------------------------------------------------------------- */

static void *counted_alloc(size_t count, size_t n, int zero, const void *site)
{
    pthread_mutex_lock(&lock);
    if (must_fail(site)) {
        pthread_mutex_unlock(&lock);
        errno = ENOMEM;
        return NULL;
    }
    void *p = zero ? __real_calloc(count, n) : __real_malloc(n);
    if (p) table_put((block){p, next_serial++, zero ? count * n : n, site});
    pthread_mutex_unlock(&lock);
    return p;
}

void *__wrap_malloc(size_t n) { return counted_alloc(1, n, 0, __builtin_return_address(0)); }

void *__wrap_calloc(size_t count, size_t n) { return counted_alloc(count, n, 1, __builtin_return_address(0)); }

void *__wrap_realloc(void *p, size_t n)
{
    const void *site = __builtin_return_address(0);
    if (!p) return counted_alloc(1, n, 0, site);
    pthread_mutex_lock(&lock);
    if (n == 0) { /* glibc frees the block */
        table_take(p);
        void *r = __real_realloc(p, 0);
        pthread_mutex_unlock(&lock);
        return r;
    }
    if (must_fail(site)) {
        pthread_mutex_unlock(&lock);
        errno = ENOMEM;
        return NULL;
    }
    void *r = __real_realloc(p, n);
    if (r) {
        block b = table_take(p);
        table_put((block){r, b.ptr ? b.serial : next_serial++, n, site});
    }
    pthread_mutex_unlock(&lock);
    return r;
}

void __wrap_free(void *p)
{
    if (!p) return;
    pthread_mutex_lock(&lock);
    table_take(p);
    __real_free(p);
    pthread_mutex_unlock(&lock);
}

char *__wrap_strdup(const char *s)
{
    size_t n = strlen(s) + 1;
    char *d = counted_alloc(1, n, 0, __builtin_return_address(0));
    if (d) memcpy(d, s, n);
    return d;
}

char *__wrap_strndup(const char *s, size_t n)
{
    size_t len = strnlen(s, n);
    char *d = counted_alloc(1, len + 1, 0, __builtin_return_address(0));
    if (d) {
        memcpy(d, s, len);
        d[len] = '\0';
    }
    return d;
}

/* jansson's hooks: the same counted path, with the site inside jansson (all JSON allocations share a few). */
static void *json_alloc(size_t n) { return counted_alloc(1, n, 0, __builtin_return_address(0)); }
static void json_release(void *p) { __wrap_free(p); }

void fa_route_jansson(void) { json_set_alloc_funcs(json_alloc, json_release); }

/* jansson's parsers, wrapped to know when an allocation is made inside one. */
json_t *__wrap_json_loadb(const char *buffer, size_t buflen, size_t flags, json_error_t *error)
{
    if (!in_json_parser++) parser_allocs = 0;
    json_t *j = __real_json_loadb(buffer, buflen, flags, error);
    in_json_parser--;
    return j;
}

json_t *__wrap_json_load_file(const char *path, size_t flags, json_error_t *error)
{
    if (!in_json_parser++) parser_allocs = 0;
    json_t *j = __real_json_load_file(path, flags, error);
    in_json_parser--;
    return j;
}

/* ---- PCRE2 objects ------------------------------------------------------------------------------------------- */

pcre2_code *__real_pcre2_compile_8(PCRE2_SPTR pattern, PCRE2_SIZE length, uint32_t options, int *errorcode,
                                   PCRE2_SIZE *erroroffset, pcre2_compile_context *ccontext);
void __real_pcre2_code_free_8(pcre2_code *code);
pcre2_match_data *__real_pcre2_match_data_create_8(uint32_t ovecsize, pcre2_general_context *gcontext);
void __real_pcre2_match_data_free_8(pcre2_match_data *md);
pcre2_match_context *__real_pcre2_match_context_create_8(pcre2_general_context *gcontext);
void __real_pcre2_match_context_free_8(pcre2_match_context *mc);
pcre2_jit_stack *__real_pcre2_jit_stack_create_8(PCRE2_SIZE startsize, PCRE2_SIZE maxsize,
                                                 pcre2_general_context *gcontext);
void __real_pcre2_jit_stack_free_8(pcre2_jit_stack *js);
pcre2_code *__wrap_pcre2_compile_8(PCRE2_SPTR pattern, PCRE2_SIZE length, uint32_t options, int *errorcode,
                                   PCRE2_SIZE *erroroffset, pcre2_compile_context *ccontext);
void __wrap_pcre2_code_free_8(pcre2_code *code);
pcre2_match_data *__wrap_pcre2_match_data_create_8(uint32_t ovecsize, pcre2_general_context *gcontext);
void __wrap_pcre2_match_data_free_8(pcre2_match_data *md);
pcre2_match_context *__wrap_pcre2_match_context_create_8(pcre2_general_context *gcontext);
void __wrap_pcre2_match_context_free_8(pcre2_match_context *mc);
pcre2_jit_stack *__wrap_pcre2_jit_stack_create_8(PCRE2_SIZE startsize, PCRE2_SIZE maxsize,
                                                 pcre2_general_context *gcontext);
void __wrap_pcre2_jit_stack_free_8(pcre2_jit_stack *js);

/* 1 when the object about to be made must fail (counted like an allocation). */
static int foreign_must_fail(const void *site)
{
    pthread_mutex_lock(&lock);
    int fail = must_fail(site);
    pthread_mutex_unlock(&lock);
    return fail;
}

static void *foreign_made(void *p, const void *site)
{
    if (!p) return NULL;
    pthread_mutex_lock(&lock);
    table_put((block){p, next_serial++, 0, site});
    pthread_mutex_unlock(&lock);
    return p;
}

static void foreign_gone(const void *p)
{
    if (!p) return;
    pthread_mutex_lock(&lock);
    table_take(p);
    pthread_mutex_unlock(&lock);
}

pcre2_code *__wrap_pcre2_compile_8(PCRE2_SPTR pattern, PCRE2_SIZE length, uint32_t options, int *errorcode,
                                   PCRE2_SIZE *erroroffset, pcre2_compile_context *ccontext)
{
    const void *site = __builtin_return_address(0);
    if (foreign_must_fail(site)) {
        *errorcode = PCRE2_ERROR_NOMEMORY;
        *erroroffset = 0;
        return NULL;
    }
    return foreign_made(__real_pcre2_compile_8(pattern, length, options, errorcode, erroroffset, ccontext), site);
}

void __wrap_pcre2_code_free_8(pcre2_code *code)
{
    foreign_gone(code);
    __real_pcre2_code_free_8(code);
}

pcre2_match_data *__wrap_pcre2_match_data_create_8(uint32_t ovecsize, pcre2_general_context *gcontext)
{
    const void *site = __builtin_return_address(0);
    if (foreign_must_fail(site)) return NULL;
    return foreign_made(__real_pcre2_match_data_create_8(ovecsize, gcontext), site);
}

void __wrap_pcre2_match_data_free_8(pcre2_match_data *md)
{
    foreign_gone(md);
    __real_pcre2_match_data_free_8(md);
}

pcre2_match_context *__wrap_pcre2_match_context_create_8(pcre2_general_context *gcontext)
{
    const void *site = __builtin_return_address(0);
    if (foreign_must_fail(site)) return NULL;
    return foreign_made(__real_pcre2_match_context_create_8(gcontext), site);
}

void __wrap_pcre2_match_context_free_8(pcre2_match_context *mc)
{
    foreign_gone(mc);
    __real_pcre2_match_context_free_8(mc);
}

pcre2_jit_stack *__wrap_pcre2_jit_stack_create_8(PCRE2_SIZE startsize, PCRE2_SIZE maxsize,
                                                 pcre2_general_context *gcontext)
{
    const void *site = __builtin_return_address(0);
    if (foreign_must_fail(site)) return NULL;
    return foreign_made(__real_pcre2_jit_stack_create_8(startsize, maxsize, gcontext), site);
}

void __wrap_pcre2_jit_stack_free_8(pcre2_jit_stack *js)
{
    foreign_gone(js);
    __real_pcre2_jit_stack_free_8(js);
}
