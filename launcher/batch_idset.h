/* A set of strings with two counters each, for tessera batch's bookkeeping: which custom_ids already have a result
 * in the output file, how many duplicate-id error lines were written for each, which custom_ids the input has shown
 * so far, and which unidentifiable input lines (no custom_id) already have their error line.
 *
 * Open addressing with linear probing over FNV-1a hashes; keys are copied (any bytes, with an explicit length, so a
 * custom_id with a NUL inside is still one key). Ownership: the set owns its keys; tsr_idset_free() accepts NULL.
 * Errors: only TSR_ERR_NOMEM from tsr_idset_get(). Not thread-safe. */
#ifndef TSR_LAUNCHER_BATCH_IDSET_H
#define TSR_LAUNCHER_BATCH_IDSET_H

#include "runtime/status.h"

#include <stddef.h>

typedef struct tsr_idset_entry {
    char *key;
    size_t len;
    int done;  /* meaning chosen by the caller (e.g. "has a result line") */
    int count; /* likewise (e.g. "duplicate errors written", "occurrences seen") */
} tsr_idset_entry;

typedef struct tsr_idset {
    tsr_idset_entry *slots;
    size_t cap, n;
} tsr_idset;

/* Finds key, or inserts it with zero counters when create != 0. *out is NULL when absent and create == 0; the
 * pointer stays valid until the next insertion. */
tsr_status tsr_idset_get(tsr_idset *s, const char *key, size_t len, int create, tsr_idset_entry **out);
void tsr_idset_free(tsr_idset *s);

#endif
