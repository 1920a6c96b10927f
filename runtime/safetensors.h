/* safetensors reader (mmap) and streaming writer.
 *
 * A tsr_st_set is every tensor of a model directory: all its *.safetensors files mapped read-only, with one
 * name → tensor table. Tensor data points into the mappings and stays valid until tsr_st_set_free(); nothing
 * is copied, except tensors misaligned for their element type (files written without header padding), which get an
 * aligned heap copy. Every header is validated before use (offsets in range, sizes matching dtype × shape, no overlap,
 * no duplicate names across files); a failure names the file and the tensor.
 *
 * The writer streams: declare every tensor (name, dtype, shape) first, then write the header, then each
 * tensor's bytes in declaration order. That is how `tessera synth` writes files larger than memory. */
#ifndef TSR_SAFETENSORS_H
#define TSR_SAFETENSORS_H

#include "runtime/dtype.h"
#include "runtime/status.h"

#include <stdint.h>
#include <stdio.h>

#define TSR_ST_MAX_DIMS 8

typedef struct tsr_st_tensor {
    const char *name;  /* owned by the set */
    const char *file;  /* path of the file holding it; owned by the set */
    tsr_dtype dtype;
    int ndim;
    int64_t shape[TSR_ST_MAX_DIMS];
    const void *data;  /* inside the read-only mapping */
    size_t nbytes;
} tsr_st_tensor;

typedef struct tsr_st_set tsr_st_set;

/* Maps one file. */
tsr_status tsr_st_open_file(const char *path, tsr_st_set **out);
/* Parses a safetensors image held in memory (borrowed: it must outlive the set); `name` labels errors. */
tsr_status tsr_st_parse_buffer(const void *data, size_t size, const char *name, tsr_st_set **out);
/* Maps the safetensors files of a model directory: the files named by model.safetensors.index.json when it
 * exists and every file it names is present, otherwise every *.safetensors file (EXL2 directories have no index,
 * and a copied index may be stale). Fails when there is none. */
tsr_status tsr_st_open_dir(const char *dir, tsr_st_set **out);
void tsr_st_set_free(tsr_st_set *set);

/* Tensor by name, or NULL. */
const tsr_st_tensor *tsr_st_find(const tsr_st_set *set, const char *name);
size_t tsr_st_count(const tsr_st_set *set);
const tsr_st_tensor *tsr_st_at(const tsr_st_set *set, size_t i);
/* Sum of the sizes of the mapped files. */
uint64_t tsr_st_total_bytes(const tsr_st_set *set);

/* Finds `name` and checks its dtype and rank; dims with expected size < 0 are not checked. */
tsr_status tsr_st_expect(const tsr_st_set *set, const char *name, tsr_dtype dtype, int ndim, const int64_t *shape,
                         const tsr_st_tensor **out);

/* Number of elements of a tensor. */
int64_t tsr_st_numel(const tsr_st_tensor *t);

/* ---- writer ---- */
typedef struct tsr_st_writer tsr_st_writer;

tsr_status tsr_st_writer_open(const char *path, tsr_st_writer **out);
/* Declares the next tensor. Names must be unique. */
tsr_status tsr_st_writer_declare(tsr_st_writer *w, const char *name, tsr_dtype dtype, int ndim, const int64_t *shape);
/* Writes the header; call once after every declaration. */
tsr_status tsr_st_writer_begin_data(tsr_st_writer *w);
/* Appends bytes of the current tensor (may be called several times per tensor, in declaration order). */
tsr_status tsr_st_writer_write(tsr_st_writer *w, const void *data, size_t nbytes);
/* Checks every declared byte was written, flushes and closes. Frees w in every case. */
tsr_status tsr_st_writer_close(tsr_st_writer *w);
/* Frees w without finishing (after an error); removes the partial file. */
void tsr_st_writer_abort(tsr_st_writer *w);

#endif
