/* Loading, freeing and lookups of a tokenizer (the public entry points that are not encode/decode).
 *
 * tsr_tokenizer_load accepts a tokenizer.json file or a folder holding one; from a folder it also reads
 * tokenizer_config.json (when present) for the bos/eos token strings. Lookups are plain table reads. */
#include "runtime/text/tok_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

void tsr_tokenizer_free(tsr_tokenizer *t)
{
    if (!t) return;
    tok_strmap_free(&t->vocab);
    tok_pairmap_free(&t->merges);
    tok_strmap_free(&t->added_map);
    free(t->cont_prefix);
    free(t->eow_suffix);
    free(t->id_str);
    free(t->id_len);
    free(t->id_special);
    free(t->dec_str);
    free(t->dec_len);
    free(t->dec_special);
    for (size_t i = 0; i < t->n_added; i++) {
        free(t->added[i].content);
        free(t->added[i].norm);
    }
    free(t->added);
    for (size_t i = 0; i < t->n_norms; i++) {
        free(t->norms[i].str);
        tok_pattern_free(&t->norms[i].pat);
    }
    free(t->norms);
    for (size_t i = 0; i < t->n_pretoks; i++) tok_pattern_free(&t->pretoks[i].pat);
    free(t->pretoks);
    for (size_t i = 0; i < t->n_post; i++) free(t->post[i].ids);
    free(t->post);
    for (size_t i = 0; i < t->n_decs; i++) {
        free(t->decs[i].str);
        tok_pattern_free(&t->decs[i].pat);
    }
    free(t->decs);
    for (size_t i = 0; i < t->n_arenas; i++) free(t->arenas[i]);
    free(t->arenas);
    free(t->bos);
    free(t->eos);
    free(t->path);
    for (size_t i = 0; i < t->n_pool; i++) tok_work_free(t->pool[i]);
    pthread_mutex_destroy(&t->pool_lock);
    free(t->am_order[0]);
    free(t->am_order[1]);
    free(t);
}

tsr_status tsr_tokenizer_load(const char *path, tsr_tokenizer **out)
{
    if (!path || !out) return tsr_fail(TSR_ERR_ARG, "tsr_tokenizer_load: NULL argument");
    *out = NULL;
    struct stat sb;
    if (stat(path, &sb)) return tsr_fail(TSR_ERR_IO, "%s: no such file or folder", path);
    int is_dir = S_ISDIR(sb.st_mode);
    size_t n = strlen(path);
    char *file = malloc(n + 64), *config = malloc(n + 64);
    tsr_tokenizer *t = calloc(1, sizeof *t);
    if (!file || !config || !t) {
        free(file);
        free(config);
        free(t);
        return tsr_fail(TSR_ERR_NOMEM, "%s: out of memory", path);
    }
    t->unk_id = -1;
    pthread_mutex_init(&t->pool_lock, NULL);
    tsr_status st = TSR_OK;
    if (is_dir) {
        snprintf(file, n + 64, "%s/tokenizer.json", path);
        snprintf(config, n + 64, "%s/tokenizer_config.json", path);
        if (stat(file, &sb)) {
            st = tsr_fail(TSR_ERR_MISSING, "%s: no tokenizer.json in this folder", path);
            goto done;
        }
    } else {
        snprintf(file, n + 64, "%s", path);
    }
    t->path = strdup(file);
    if (!t->path) {
        st = tsr_fail(TSR_ERR_NOMEM, "%s: out of memory", path);
        goto done;
    }
    if ((st = tok_load_json(t, file))) goto done;
    if (is_dir && !stat(config, &sb) && (st = tok_load_config(t, config))) goto done;
done:
    free(file);
    free(config);
    if (st) {
        tsr_tokenizer_free(t);
        return st;
    }
    *out = t;
    return TSR_OK;
}

int32_t tsr_tokenizer_token_id(const tsr_tokenizer *t, const char *token)
{
    if (!t || !token) return -1;
    size_t n = strlen(token);
    int32_t id = tok_strmap_get(&t->added_map, token, n);
    return id >= 0 ? id : tok_strmap_get(&t->vocab, token, n);
}

const char *tsr_tokenizer_token_str(const tsr_tokenizer *t, int32_t id)
{
    if (!t || id < 0 || (size_t)id >= t->n_ids) return NULL;
    return t->id_str[id];
}

size_t tsr_tokenizer_vocab_size(const tsr_tokenizer *t)
{
    return t ? t->n_ids : 0;
}

int tsr_tokenizer_is_special(const tsr_tokenizer *t, int32_t id)
{
    if (!t || id < 0 || (size_t)id >= t->n_ids) return 0;
    return t->id_special[id];
}

const char *tsr_tokenizer_bos_token(const tsr_tokenizer *t)
{
    return t ? t->bos : NULL;
}

const char *tsr_tokenizer_eos_token(const tsr_tokenizer *t)
{
    return t ? t->eos : NULL;
}
