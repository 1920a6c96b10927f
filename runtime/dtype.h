/* Element types of tensors as they appear in safetensors files and in memory, plus the KV-cache storage modes.
 *
 * TSR_KV_Q4 / TSR_KV_Q6 / TSR_KV_Q8 name the quantized KV-cache storage modes (runtime/kv_cache.h), so that one
 * tsr_dtype field selects any KV storage; they are not element types: their size is 0 and tsr_dtype_parse never
 * returns them. */
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
    /* KV-cache storage modes only (not element types; see runtime/kv_cache.h) */
    TSR_KV_Q4, /* 4-bit K and V */
    TSR_KV_Q6, /* 8-bit K, 4-bit V */
    TSR_KV_Q8, /* 8-bit K and V */
} tsr_dtype;

/* Size of one element in bytes (0 for TSR_DTYPE_INVALID and the TSR_KV_Q* modes). */
size_t tsr_dtype_size(tsr_dtype t);
/* The safetensors spelling ("F16", "I32", ...); "KV_Q4", "KV_Q6", "KV_Q8" for the KV modes. */
const char *tsr_dtype_name(tsr_dtype t);
/* Parses a safetensors dtype string; TSR_DTYPE_INVALID when unknown (the KV modes are never parsed). */
tsr_dtype tsr_dtype_parse(const char *s);

#endif
