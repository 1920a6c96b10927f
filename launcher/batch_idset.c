/* String set with counters for tessera batch (see batch_idset.h): FNV-1a, linear probing, grown at 50% load. */
#include "launcher/batch_idset.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static uint64_t hash(const char *key, size_t len)
{
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < len; i++) {
        h ^= (unsigned char)key[i];
        h *= 1099511628211ull;
    }
    return h;
}

static tsr_idset_entry *find(tsr_idset_entry *slots, size_t cap, const char *key, size_t len)
{
    size_t i = (size_t)hash(key, len) & (cap - 1);
    for (;;) {
        tsr_idset_entry *e = &slots[i];
        if (!e->key || (e->len == len && !memcmp(e->key, key, len))) return e;
        i = (i + 1) & (cap - 1);
    }
}

static tsr_status grow(tsr_idset *s)
{
    size_t cap = s->cap ? s->cap * 2 : 64;
    tsr_idset_entry *slots = calloc(cap, sizeof *slots);
    if (!slots) return tsr_fail(TSR_ERR_NOMEM, "out of memory (id set of %zu entries)", s->n);
    for (size_t i = 0; i < s->cap; i++)
        if (s->slots[i].key) *find(slots, cap, s->slots[i].key, s->slots[i].len) = s->slots[i];
    free(s->slots);
    s->slots = slots;
    s->cap = cap;
    return TSR_OK;
}

tsr_status tsr_idset_get(tsr_idset *s, const char *key, size_t len, int create, tsr_idset_entry **out)
{
    *out = NULL;
    if (s->cap) {
        tsr_idset_entry *e = find(s->slots, s->cap, key, len);
        if (e->key || !create) {
            *out = e->key ? e : NULL;
            return TSR_OK;
        }
    }
    if (!create) return TSR_OK;
    if (2 * (s->n + 1) > s->cap) TSR_TRY(grow(s));
    tsr_idset_entry *e = find(s->slots, s->cap, key, len);
    char *k = malloc(len + 1);
    if (!k) return tsr_fail(TSR_ERR_NOMEM, "out of memory (id set key)");
    memcpy(k, key, len);
    k[len] = '\0';
    *e = (tsr_idset_entry){.key = k, .len = len};
    s->n++;
    *out = e;
    return TSR_OK;
}

void tsr_idset_free(tsr_idset *s)
{
    if (!s) return;
    for (size_t i = 0; i < s->cap; i++)
        free(s->slots[i].key);
    free(s->slots);
    s->slots = NULL;
    s->cap = s->n = 0;
}
