/* A counted, failing allocator for fault-injection tests.
 *
 * Test executables are linked with -Wl,--wrap=malloc,... (tests/fault/CMakeLists.txt), so every malloc, calloc,
 * realloc, free, strdup and strndup made by tessera's static library and the test itself goes through the
 * wrappers in fail_alloc.c; the product code allocates as usual and knows nothing of this. Shared libraries
 * (libc internals, PCRE2, utf8proc) keep the real allocator, except jansson, which fa_route_jansson() sends
 * through the same wrappers (json_set_alloc_funcs) so that JSON values tessera builds are counted, can fail and
 * are tracked too; the PCRE2 objects tessera makes count and are tracked through their wrapped constructors
 * and destructors. Under AddressSanitizer the wrappers sit in front of ASan's allocator (__real_malloc is
 * ASan's malloc), so both checks run. Inside jansson's parsers (json_loadb, json_load_file, wrapped to know) only the
 * first allocation of each call is counted and can fail, which makes the parser return NULL at once: later failures are
 * jansson's own business, and jansson 2.14 does not survive all of them (lex_save ignores a failed
 * strbuffer_append_byte: a character is dropped, or the lexer writes past its buffer and json_load_file
 * crashes, as a standalone program failing one allocation through json_set_alloc_funcs shows).
 *
 * The wrappers count allocations, can fail one chosen allocation (NULL with errno = ENOMEM), record the call
 * site of every allocation (the return address into the caller) and track live blocks in a small
 * open-addressing hash, allocated with the real allocator. Each block carries the serial number of its
 * allocation, so "what is still live of what was allocated after fa_mark()" is a leak check that ignores what
 * was live before (per-thread caches warmed up earlier, the test's own fixtures). All state is process-wide and
 * guarded by one mutex: allocations of every thread (the service loop, the CPU thread pool) are counted. */
#ifndef TSR_TESTS_FAIL_ALLOC_H
#define TSR_TESTS_FAIL_ALLOC_H

#include <stddef.h>
#include <stdint.h>

/* Routes jansson's allocations through the wrappers. Call once, before any JSON value exists. */
void fa_route_jansson(void);

/* Starts a counted run: counting from zero, no failure, site recording on (sites of the previous counted run
 * are forgotten). */
void fa_count_start(void);
/* Starts a run that fails the n-th allocation (1-based) and no other. */
void fa_fail_nth(long n);
/* Starts a run that fails the first allocation made from call site `site` and no other. */
void fa_fail_site(const void *site);
/* Ends a run: later allocations are neither counted nor failed. Returns the allocations counted by the run. */
long fa_stop(void);
/* 1 when the current or last run injected its failure. */
int fa_injected(void);
/* The call site of the allocation that failed (NULL when none did). */
const void *fa_injected_site(void);
/* Suspends (1) or resumes (0) counting and failing, e.g. around a consistency check inside a run whose own
 * allocations are not under test. Blocks are tracked either way. */
void fa_suspend(int on);

/* Distinct call sites seen by the last counted run, in order of first use (valid until the next counted run). */
size_t fa_sites(const void *const **sites);

/* A point in the allocation sequence; blocks allocated after it and still live are what fa_live_since reports. */
uint64_t fa_mark(void);
/* Number of live tracked blocks allocated after mark; prints up to `report` of them (size and call site as an
 * offset that `addr2line -e <binary>` resolves) to stderr. */
size_t fa_live_since(uint64_t mark, int report);

/* Describes a call site as "object+0xOFFSET" into buf. */
const char *fa_site_str(const void *site, char *buf, size_t cap);

#endif
