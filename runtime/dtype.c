/* Names and sizes of tensor element types (see dtype.h). */
#include "runtime/dtype.h"

#include <string.h>

static const struct {
    tsr_dtype type;
    const char *name;
    size_t size;
} dtypes[] = {
    {TSR_F16, "F16", 2}, {TSR_BF16, "BF16", 2}, {TSR_F32, "F32", 4}, {TSR_F64, "F64", 8},  {TSR_I8, "I8", 1},
    {TSR_U8, "U8", 1},   {TSR_I16, "I16", 2},   {TSR_I32, "I32", 4}, {TSR_I64, "I64", 8}, {TSR_BOOL, "BOOL", 1},
};

size_t tsr_dtype_size(tsr_dtype t)
{
    for (size_t i = 0; i < sizeof dtypes / sizeof dtypes[0]; i++)
        if (dtypes[i].type == t) return dtypes[i].size;
    return 0;
}

const char *tsr_dtype_name(tsr_dtype t)
{
    /* KV-cache storage modes: named, but outside the element table (no size, never parsed) */
    if (t == TSR_KV_Q4) return "KV_Q4";
    if (t == TSR_KV_Q6) return "KV_Q6";
    if (t == TSR_KV_Q8) return "KV_Q8";
    for (size_t i = 0; i < sizeof dtypes / sizeof dtypes[0]; i++)
        if (dtypes[i].type == t) return dtypes[i].name;
    return "INVALID";
}

tsr_dtype tsr_dtype_parse(const char *s)
{
    for (size_t i = 0; i < sizeof dtypes / sizeof dtypes[0]; i++)
        if (!strcmp(dtypes[i].name, s)) return dtypes[i].type;
    return TSR_DTYPE_INVALID;
}
