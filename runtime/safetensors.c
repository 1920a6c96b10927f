/* safetensors: validated mmap reader and streaming writer (see safetensors.h).
 *
 * File layout: uint64 little-endian header length H, H bytes of JSON, then the data section. The JSON maps each
 * tensor name to {"dtype", "shape", "data_offsets": [begin, end]} relative to the data section; "__metadata__"
 * is skipped. */
#include "runtime/safetensors.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#define ST_MAX_HEADER (256u << 20)

typedef struct {
    char *path;
    void *map;
    size_t size;
    int borrowed; /* map is the caller's buffer (tsr_st_parse_buffer), not an mmap */
} st_file;

struct tsr_st_set {
    st_file *files;
    size_t n_files;
    tsr_st_tensor *tensors; /* sorted by name */
    size_t n_tensors;
    void **copies;          /* aligned copies of misaligned tensors */
    size_t n_copies;
};

static int cmp_tensor_name(const void *a, const void *b)
{
    return strcmp(((const tsr_st_tensor *)a)->name, ((const tsr_st_tensor *)b)->name);
}

typedef struct {
    uint64_t begin, end;
    const char *name;
} st_span;

static int cmp_span(const void *a, const void *b)
{
    const st_span *x = a, *y = b;
    if (x->begin != y->begin) return x->begin < y->begin ? -1 : 1;
    return x->end < y->end ? -1 : x->end > y->end;
}

void tsr_st_set_free(tsr_st_set *set)
{
    if (!set) return;
    for (size_t i = 0; i < set->n_tensors; i++) free((char *)set->tensors[i].name);
    for (size_t i = 0; i < set->n_files; i++) {
        if (set->files[i].map && set->files[i].size && !set->files[i].borrowed)
            munmap(set->files[i].map, set->files[i].size);
        free(set->files[i].path);
    }
    for (size_t i = 0; i < set->n_copies; i++) free(set->copies[i]);
    free(set->copies);
    free(set->files);
    free(set->tensors);
    free(set);
}

static tsr_status parse_shape(const char *path, const char *name, json_t *shape, tsr_st_tensor *t)
{
    if (!json_is_array(shape))
        return tsr_fail(TSR_ERR_FORMAT, "%s: tensor '%s': \"shape\" is not an array", path, name);
    size_t nd = json_array_size(shape);
    if (nd > TSR_ST_MAX_DIMS)
        return tsr_fail(TSR_ERR_FORMAT, "%s: tensor '%s': %zu dimensions (at most %d)", path, name, nd,
                        TSR_ST_MAX_DIMS);
    t->ndim = (int)nd;
    for (size_t d = 0; d < nd; d++) {
        json_t *v = json_array_get(shape, d);
        if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) > (INT64_C(1) << 40))
            return tsr_fail(TSR_ERR_FORMAT, "%s: tensor '%s': shape[%zu] is not a valid size", path, name, d);
        t->shape[d] = json_integer_value(v);
    }
    return TSR_OK;
}

/* Parses and validates one file's header, appending its tensors to set. */
static tsr_status parse_header(tsr_st_set *set, const st_file *f)
{
    if (f->size < 8)
        return tsr_fail(TSR_ERR_FORMAT, "%s: file too short for a safetensors header (%zu bytes)", f->path, f->size);
    const unsigned char *p = f->map;
    uint64_t hlen = 0;
    for (int i = 7; i >= 0; i--) hlen = (hlen << 8) | p[i];
    if (hlen > ST_MAX_HEADER || hlen > f->size - 8)
        return tsr_fail(TSR_ERR_FORMAT,
                        "%s: header length %llu exceeds the file size %zu (truncated or not safetensors)", f->path,
                        (unsigned long long)hlen, f->size);
    json_error_t jerr;
    json_t *root = json_loadb((const char *)p + 8, (size_t)hlen, JSON_REJECT_DUPLICATES | JSON_ALLOW_NUL, &jerr);
    if (!root)
        return tsr_fail(TSR_ERR_FORMAT, "%s: header JSON invalid at line %d column %d: %s", f->path, jerr.line,
                        jerr.column, jerr.text);
    if (!json_is_object(root)) {
        json_decref(root);
        return tsr_fail(TSR_ERR_FORMAT, "%s: header is not a JSON object", f->path);
    }
    const char *data = (const char *)p + 8 + hlen;
    uint64_t data_size = f->size - 8 - hlen;
    size_t n_new = json_object_size(root);
    tsr_st_tensor *grown = realloc(set->tensors, (set->n_tensors + n_new + 1) * sizeof *grown);
    if (!grown) {
        json_decref(root);
        return tsr_fail(TSR_ERR_NOMEM, "%s: out of memory reading the header", f->path);
    }
    set->tensors = grown;

    tsr_status st = TSR_OK;
    /* spans keep names borrowed from the JSON object, which lives until the end of this function */
    st_span *spans = malloc((n_new + 1) * sizeof *spans);
    size_t n_spans = 0;
    if (!spans) {
        json_decref(root);
        return tsr_fail(TSR_ERR_NOMEM, "%s: out of memory reading the header", f->path);
    }
    const char *name;
    json_t *val;
    json_object_foreach(root, name, val) {
        if (!strcmp(name, "__metadata__")) continue;
        tsr_st_tensor t = {0};
        t.file = f->path;
        if (!json_is_object(val)) {
            st = tsr_fail(TSR_ERR_FORMAT, "%s: tensor '%s' entry is not an object", f->path, name);
            break;
        }
        json_t *jd = json_object_get(val, "dtype"), *js = json_object_get(val, "shape"),
               *jo = json_object_get(val, "data_offsets");
        if (!json_is_string(jd)) {
            st = tsr_fail(TSR_ERR_FORMAT, "%s: tensor '%s' has no dtype", f->path, name);
            break;
        }
        t.dtype = tsr_dtype_parse(json_string_value(jd));
        if (t.dtype == TSR_DTYPE_INVALID) {
            st = tsr_fail(TSR_ERR_UNSUPPORTED, "%s: tensor '%s' has unsupported dtype '%s'", f->path, name,
                          json_string_value(jd));
            break;
        }
        if ((st = parse_shape(f->path, name, js, &t)) != TSR_OK) break;
        if (!json_is_array(jo) || json_array_size(jo) != 2 || !json_is_integer(json_array_get(jo, 0)) ||
            !json_is_integer(json_array_get(jo, 1))) {
            st = tsr_fail(TSR_ERR_FORMAT, "%s: tensor '%s': data_offsets must be [begin, end]", f->path, name);
            break;
        }
        json_int_t b = json_integer_value(json_array_get(jo, 0)), e = json_integer_value(json_array_get(jo, 1));
        if (b < 0 || e < b || (uint64_t)e > data_size) {
            st = tsr_fail(TSR_ERR_FORMAT,
                          "%s: tensor '%s': data_offsets [%lld, %lld] outside the data section (%llu bytes)", f->path,
                          name, (long long)b, (long long)e, (unsigned long long)data_size);
            break;
        }
        /* dtype × shape must match the byte span exactly (checked without overflow) */
        unsigned __int128 want = tsr_dtype_size(t.dtype);
        for (int d = 0; d < t.ndim; d++) want *= (uint64_t)t.shape[d];
        if (want != (unsigned __int128)(e - b)) {
            st = tsr_fail(TSR_ERR_FORMAT, "%s: tensor '%s': %s shape needs %llu bytes but data_offsets span %lld",
                          f->path, name, tsr_dtype_name(t.dtype), (unsigned long long)want, (long long)(e - b));
            break;
        }
        t.data = data + b;
        t.nbytes = (size_t)(e - b);
        spans[n_spans++] = (st_span){(uint64_t)b, (uint64_t)e, name};
        if ((uintptr_t)t.data % tsr_dtype_size(t.dtype)) {
            /* files written without header padding: keep an aligned copy (rare; costs the tensor's size) */
            void *copy = malloc(t.nbytes ? t.nbytes : 1);
            void **grown_copies = realloc(set->copies, (set->n_copies + 1) * sizeof *grown_copies);
            if (!copy || !grown_copies) {
                free(copy);
                if (grown_copies) set->copies = grown_copies;
                st = tsr_fail(TSR_ERR_NOMEM, "%s: out of memory copying misaligned tensor '%s'", f->path, name);
                break;
            }
            memcpy(copy, t.data, t.nbytes);
            set->copies = grown_copies;
            set->copies[set->n_copies++] = copy;
            t.data = copy;
        }
        t.name = strdup(name);
        if (!t.name) {
            st = tsr_fail(TSR_ERR_NOMEM, "out of memory");
            break;
        }
        set->tensors[set->n_tensors++] = t;
    }
    /* no two tensors of this file may overlap (checked on file offsets: misaligned ones live in copies) */
    if (st == TSR_OK && n_spans > 1) {
        qsort(spans, n_spans, sizeof *spans, cmp_span);
        for (size_t i = 1; i < n_spans && st == TSR_OK; i++)
            if (spans[i - 1].end > spans[i].begin && spans[i].end > spans[i].begin)
                st = tsr_fail(TSR_ERR_FORMAT, "%s: tensors '%s' and '%s' overlap", f->path, spans[i - 1].name,
                              spans[i].name);
    }
    free(spans);
    json_decref(root);
    return st;
}

static tsr_status map_file(const char *path, st_file *f)
{
    f->path = strdup(path);
    if (!f->path) return tsr_fail(TSR_ERR_NOMEM, "out of memory");
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return tsr_fail(TSR_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
    struct stat sb;
    if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode)) {
        close(fd);
        return tsr_fail(TSR_ERR_IO, "%s: not a regular file", path);
    }
    f->size = (size_t)sb.st_size;
    if (f->size > 0) {
        f->map = mmap(NULL, f->size, PROT_READ, MAP_PRIVATE, fd, 0);
        if (f->map == MAP_FAILED) {
            f->map = NULL;
            close(fd);
            return tsr_fail(TSR_ERR_IO, "%s: mmap failed: %s", path, strerror(errno));
        }
    }
    close(fd);
    return TSR_OK;
}

static tsr_status finish_set(tsr_st_set *set)
{
    qsort(set->tensors, set->n_tensors, sizeof *set->tensors, cmp_tensor_name);
    for (size_t i = 1; i < set->n_tensors; i++)
        if (!strcmp(set->tensors[i - 1].name, set->tensors[i].name))
            return tsr_fail(TSR_ERR_FORMAT, "tensor '%s' appears in both %s and %s", set->tensors[i].name,
                            set->tensors[i - 1].file, set->tensors[i].file);
    return TSR_OK;
}

static tsr_status open_paths(char **paths, size_t n, tsr_st_set **out)
{
    tsr_st_set *set = calloc(1, sizeof *set);
    if (!set || !(set->files = calloc(n ? n : 1, sizeof *set->files))) {
        free(set);
        return tsr_fail(TSR_ERR_NOMEM, "out of memory");
    }
    tsr_status st = TSR_OK;
    for (size_t i = 0; i < n && st == TSR_OK; i++) {
        st = map_file(paths[i], &set->files[set->n_files]);
        set->n_files++;
        if (st == TSR_OK) st = parse_header(set, &set->files[set->n_files - 1]);
    }
    if (st == TSR_OK) st = finish_set(set);
    if (st != TSR_OK) {
        tsr_st_set_free(set);
        return st;
    }
    *out = set;
    return TSR_OK;
}

tsr_status tsr_st_parse_buffer(const void *data, size_t size, const char *name, tsr_st_set **out)
{
    tsr_st_set *set = calloc(1, sizeof *set);
    if (!set || !(set->files = calloc(1, sizeof *set->files)) || !(set->files[0].path = strdup(name))) {
        if (set) free(set->files);
        free(set);
        return tsr_fail(TSR_ERR_NOMEM, "out of memory");
    }
    set->n_files = 1;
    set->files[0].map = (void *)data;
    set->files[0].size = size;
    set->files[0].borrowed = 1;
    tsr_status st = parse_header(set, &set->files[0]);
    if (st == TSR_OK) st = finish_set(set);
    if (st != TSR_OK) {
        tsr_st_set_free(set);
        return st;
    }
    *out = set;
    return TSR_OK;
}

tsr_status tsr_st_open_file(const char *path, tsr_st_set **out)
{
    char *p = (char *)path;
    return open_paths(&p, 1, out);
}

static int cmp_str(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

static void free_paths(char **paths, size_t n)
{
    for (size_t i = 0; i < n; i++) free(paths[i]);
    free(paths);
}

static int ends_with(const char *s, const char *suffix)
{
    size_t a = strlen(s), b = strlen(suffix);
    return a >= b && !strcmp(s + a - b, suffix);
}

/* Files named by model.safetensors.index.json, if it exists, parses, and every file exists; else returns 0 files. */
static size_t index_files(const char *dir, char ***out)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/model.safetensors.index.json", dir);
    json_t *root = json_load_file(path, 0, NULL);
    if (!root) return 0;
    json_t *map = json_object_get(root, "weight_map");
    char **paths = NULL;
    size_t n = 0;
    int ok = json_is_object(map);
    const char *key;
    json_t *v;
    json_object_foreach(map, key, v) {
        if (!ok) break;
        if (!json_is_string(v) || strchr(json_string_value(v), '/')) {
            ok = 0;
            break;
        }
        char full[4096];
        snprintf(full, sizeof full, "%s/%s", dir, json_string_value(v));
        int dup = 0;
        for (size_t i = 0; i < n; i++) dup |= !strcmp(paths[i], full);
        if (dup) continue;
        if (access(full, R_OK) != 0) {
            ok = 0;
            break;
        }
        char **grown = realloc(paths, (n + 1) * sizeof *paths);
        if (!grown) {
            ok = 0;
            break;
        }
        paths = grown;
        paths[n++] = strdup(full);
    }
    json_decref(root);
    if (!ok || n == 0) {
        free_paths(paths, n);
        return 0;
    }
    qsort(paths, n, sizeof *paths, cmp_str);
    *out = paths;
    return n;
}

tsr_status tsr_st_open_dir(const char *dir, tsr_st_set **out)
{
    char **paths = NULL;
    size_t n = index_files(dir, &paths);
    if (n == 0) {
        DIR *d = opendir(dir);
        if (!d) return tsr_fail(TSR_ERR_IO, "%s: cannot open model directory: %s", dir, strerror(errno));
        struct dirent *e;
        while ((e = readdir(d))) {
            if (e->d_name[0] == '.' || !ends_with(e->d_name, ".safetensors")) continue;
            char **grown = realloc(paths, (n + 1) * sizeof *paths);
            if (!grown) {
                closedir(d);
                free_paths(paths, n);
                return tsr_fail(TSR_ERR_NOMEM, "out of memory");
            }
            paths = grown;
            size_t len = strlen(dir) + strlen(e->d_name) + 2;
            paths[n] = malloc(len);
            if (!paths[n]) {
                closedir(d);
                free_paths(paths, n);
                return tsr_fail(TSR_ERR_NOMEM, "out of memory");
            }
            snprintf(paths[n], len, "%s/%s", dir, e->d_name);
            n++;
        }
        closedir(d);
        if (n == 0) return tsr_fail(TSR_ERR_MISSING, "%s: no *.safetensors files in the model directory", dir);
        qsort(paths, n, sizeof *paths, cmp_str);
    }
    tsr_status st = open_paths(paths, n, out);
    free_paths(paths, n);
    return st;
}

const tsr_st_tensor *tsr_st_find(const tsr_st_set *set, const char *name)
{
    size_t lo = 0, hi = set->n_tensors;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        int c = strcmp(set->tensors[mid].name, name);
        if (c == 0) return &set->tensors[mid];
        if (c < 0)
            lo = mid + 1;
        else
            hi = mid;
    }
    return NULL;
}

size_t tsr_st_count(const tsr_st_set *set) { return set->n_tensors; }
const tsr_st_tensor *tsr_st_at(const tsr_st_set *set, size_t i) { return i < set->n_tensors ? &set->tensors[i] : NULL; }

uint64_t tsr_st_total_bytes(const tsr_st_set *set)
{
    uint64_t total = 0;
    for (size_t i = 0; i < set->n_files; i++) total += set->files[i].size;
    return total;
}

int64_t tsr_st_numel(const tsr_st_tensor *t)
{
    int64_t n = 1;
    for (int d = 0; d < t->ndim; d++) n *= t->shape[d];
    return n;
}

static void format_shape(char *buf, size_t cap, int ndim, const int64_t *shape)
{
    size_t used = (size_t)snprintf(buf, cap, "[");
    for (int d = 0; d < ndim && used < cap; d++)
        used += (size_t)snprintf(buf + used, cap - used, d ? ", %lld" : "%lld", (long long)shape[d]);
    if (used < cap) snprintf(buf + used, cap - used, "]");
}

tsr_status tsr_st_expect(const tsr_st_set *set, const char *name, tsr_dtype dtype, int ndim, const int64_t *shape,
                         const tsr_st_tensor **out)
{
    const tsr_st_tensor *t = tsr_st_find(set, name);
    if (!t) return tsr_fail(TSR_ERR_MISSING, "tensor '%s' is missing", name);
    if (t->dtype != dtype)
        return tsr_fail(TSR_ERR_FORMAT, "%s: tensor '%s' has dtype %s, expected %s", t->file, name,
                        tsr_dtype_name(t->dtype), tsr_dtype_name(dtype));
    int bad = t->ndim != ndim;
    for (int d = 0; d < ndim && !bad; d++) bad = shape && shape[d] >= 0 && shape[d] != t->shape[d];
    if (bad) {
        char have[128], want[128];
        format_shape(have, sizeof have, t->ndim, t->shape);
        format_shape(want, sizeof want, ndim, shape ? shape : t->shape);
        if (!shape) snprintf(want, sizeof want, "%d dimensions", ndim);
        return tsr_fail(TSR_ERR_FORMAT, "%s: tensor '%s' has shape %s, expected %s", t->file, name, have, want);
    }
    *out = t;
    return TSR_OK;
}

/* ---------------- writer ---------------- */

typedef struct {
    char *name;
    tsr_dtype dtype;
    int ndim;
    int64_t shape[TSR_ST_MAX_DIMS];
    uint64_t nbytes;
} st_decl;

struct tsr_st_writer {
    char *path;
    FILE *fp;
    st_decl *decls;
    size_t n_decls;
    size_t current;    /* tensor being written */
    uint64_t written;  /* bytes of the current tensor written so far */
    int header_done;
};

tsr_status tsr_st_writer_open(const char *path, tsr_st_writer **out)
{
    tsr_st_writer *w = calloc(1, sizeof *w);
    if (!w || !(w->path = strdup(path))) {
        free(w);
        return tsr_fail(TSR_ERR_NOMEM, "out of memory");
    }
    w->fp = fopen(path, "wb");
    if (!w->fp) {
        tsr_status st = tsr_fail(TSR_ERR_IO, "%s: cannot create: %s", path, strerror(errno));
        free(w->path);
        free(w);
        return st;
    }
    *out = w;
    return TSR_OK;
}

tsr_status tsr_st_writer_declare(tsr_st_writer *w, const char *name, tsr_dtype dtype, int ndim, const int64_t *shape)
{
    if (w->header_done) return tsr_fail(TSR_ERR_INTERNAL, "%s: tensor '%s' declared after the header", w->path, name);
    if (ndim < 0 || ndim > TSR_ST_MAX_DIMS)
        return tsr_fail(TSR_ERR_ARG, "%s: tensor '%s': bad rank %d", w->path, name, ndim);
    for (size_t i = 0; i < w->n_decls; i++)
        if (!strcmp(w->decls[i].name, name))
            return tsr_fail(TSR_ERR_ARG, "%s: tensor '%s' declared twice", w->path, name);
    st_decl *grown = realloc(w->decls, (w->n_decls + 1) * sizeof *grown);
    if (!grown) return tsr_fail(TSR_ERR_NOMEM, "out of memory");
    w->decls = grown;
    st_decl *d = &w->decls[w->n_decls];
    memset(d, 0, sizeof *d);
    if (!(d->name = strdup(name))) return tsr_fail(TSR_ERR_NOMEM, "out of memory");
    d->dtype = dtype;
    d->ndim = ndim;
    d->nbytes = tsr_dtype_size(dtype);
    for (int i = 0; i < ndim; i++) {
        d->shape[i] = shape[i];
        d->nbytes *= (uint64_t)shape[i];
    }
    w->n_decls++;
    return TSR_OK;
}

tsr_status tsr_st_writer_begin_data(tsr_st_writer *w)
{
    json_t *root = json_object();
    uint64_t off = 0;
    for (size_t i = 0; i < w->n_decls; i++) {
        st_decl *d = &w->decls[i];
        json_t *shape = json_array();
        for (int k = 0; k < d->ndim; k++) json_array_append_new(shape, json_integer(d->shape[k]));
        json_t *offs = json_array();
        json_array_append_new(offs, json_integer((json_int_t)off));
        json_array_append_new(offs, json_integer((json_int_t)(off + d->nbytes)));
        json_t *entry = json_object();
        json_object_set_new(entry, "dtype", json_string(tsr_dtype_name(d->dtype)));
        json_object_set_new(entry, "shape", shape);
        json_object_set_new(entry, "data_offsets", offs);
        json_object_set_new(root, d->name, entry);
        off += d->nbytes;
    }
    char *text = json_dumps(root, JSON_COMPACT | JSON_PRESERVE_ORDER);
    json_decref(root);
    if (!text) return tsr_fail(TSR_ERR_NOMEM, "%s: cannot build the header", w->path);
    size_t len = strlen(text);
    size_t padded = (len + 7) & ~(size_t)7; /* keep the data section 8-byte aligned */
    unsigned char hdr[8];
    for (int i = 0; i < 8; i++) hdr[i] = (unsigned char)((uint64_t)padded >> (8 * i));
    int ok = fwrite(hdr, 1, 8, w->fp) == 8 && fwrite(text, 1, len, w->fp) == len;
    for (size_t i = len; i < padded && ok; i++) ok = fputc(' ', w->fp) != EOF;
    free(text);
    if (!ok) return tsr_fail(TSR_ERR_IO, "%s: write failed: %s", w->path, strerror(errno));
    w->header_done = 1;
    w->current = 0;
    w->written = 0;
    return TSR_OK;
}

tsr_status tsr_st_writer_write(tsr_st_writer *w, const void *data, size_t nbytes)
{
    if (!w->header_done) return tsr_fail(TSR_ERR_INTERNAL, "%s: data written before the header", w->path);
    const unsigned char *p = data;
    while (nbytes > 0) {
        while (w->current < w->n_decls && w->written == w->decls[w->current].nbytes) {
            w->current++;
            w->written = 0;
        }
        if (w->current >= w->n_decls) return tsr_fail(TSR_ERR_INTERNAL, "%s: more data than declared", w->path);
        uint64_t room = w->decls[w->current].nbytes - w->written;
        size_t chunk = nbytes < room ? nbytes : (size_t)room;
        if (fwrite(p, 1, chunk, w->fp) != chunk)
            return tsr_fail(TSR_ERR_IO, "%s: write failed: %s", w->path, strerror(errno));
        p += chunk;
        nbytes -= chunk;
        w->written += chunk;
    }
    return TSR_OK;
}

static void writer_free(tsr_st_writer *w)
{
    for (size_t i = 0; i < w->n_decls; i++) free(w->decls[i].name);
    free(w->decls);
    free(w->path);
    free(w);
}

tsr_status tsr_st_writer_close(tsr_st_writer *w)
{
    tsr_status st = TSR_OK;
    while (w->current < w->n_decls && w->written == w->decls[w->current].nbytes) {
        w->current++;
        w->written = 0;
    }
    if (!w->header_done || w->current < w->n_decls)
        st = tsr_fail(TSR_ERR_INTERNAL, "%s: closed before every tensor was written", w->path);
    if (fclose(w->fp) != 0 && st == TSR_OK) st = tsr_fail(TSR_ERR_IO, "%s: close failed: %s", w->path, strerror(errno));
    if (st != TSR_OK) remove(w->path);
    writer_free(w);
    return st;
}

void tsr_st_writer_abort(tsr_st_writer *w)
{
    if (!w) return;
    fclose(w->fp);
    remove(w->path);
    writer_free(w);
}
