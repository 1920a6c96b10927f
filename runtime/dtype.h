/* Element types of tensors as they appear in safetensors files and in memory. */
#ifndef TSR_DTYPE_H
#define TSR_DTYPE_H

#include <stddef.h>

typedef enum tsr_dtype {
    TSR_DTYPE_INVALID = 0,
    TSR_F16,
    TSR_BF16,
    TSR_F32,
    TSR_F64,
    TSR_I8,
    TSR_U8,
    TSR_I16,
    TSR_I32,
    TSR_I64,
    TSR_BOOL,
} tsr_dtype;

/* Size of one element in bytes (0 for TSR_DTYPE_INVALID). */
size_t tsr_dtype_size(tsr_dtype t);
/* The safetensors spelling ("F16", "I32", ...). */
const char *tsr_dtype_name(tsr_dtype t);
/* Parses a safetensors dtype string; TSR_DTYPE_INVALID when unknown. */
tsr_dtype tsr_dtype_parse(const char *s);

#endif
