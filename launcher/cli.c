/* Command-line helpers (see cli.h). */
#include "launcher/cli.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int tsr_cli_int(const char *cmd, const char *what, const char *s, long lo, long hi, long *out)
{
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || end == s || *end || v < lo || v > hi) {
        fprintf(stderr, "tessera %s: %s must be an integer in [%ld, %ld], got '%s'\n", cmd, what, lo, hi, s);
        return -1;
    }
    *out = v;
    return 0;
}

int tsr_cli_float(const char *cmd, const char *what, const char *s, double lo, double hi, double *out)
{
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || end == s || *end || !isfinite(v) || v < lo || v > hi) {
        fprintf(stderr, "tessera %s: %s must be a number in [%g, %g], got '%s'\n", cmd, what, lo, hi, s);
        return -1;
    }
    *out = v;
    return 0;
}

int tsr_cli_kv_dtype(const char *cmd, const char *s, tsr_dtype *out)
{
    static const struct {
        const char *name;
        tsr_dtype dtype;
    } modes[] = {{"f16", TSR_F16},   {"fp16", TSR_F16},  {"f32", TSR_F32},
                 {"fp32", TSR_F32},  {"q4", TSR_KV_Q4},  {"q6", TSR_KV_Q6}, {"q8", TSR_KV_Q8}};
    for (size_t i = 0; i < sizeof modes / sizeof modes[0]; i++)
        if (!strcmp(s, modes[i].name)) {
            *out = modes[i].dtype;
            return 0;
        }
    fprintf(stderr,
            "tessera %s: --kv-dtype must be f16, f32, q4 (4-bit K and V), q6 (8-bit K, 4-bit V) or q8 (8-bit K and V), "
            "got '%s'\n",
            cmd, s);
    return -1;
}

int tsr_cli_ids(const char *cmd, const char *s, int32_t **ids, int *n)
{
    int cap = 16, count = 0;
    int32_t *v = malloc((size_t)cap * sizeof *v);
    const char *p = s;
    while (v && *p) {
        char *end;
        errno = 0;
        long x = strtol(p, &end, 10);
        if (errno || end == p || x < 0 || x > INT32_MAX || (*end && *end != ',')) {
            fprintf(stderr, "tessera %s: --ids must be comma-separated token ids, got '%s'\n", cmd, s);
            free(v);
            return -1;
        }
        if (count == cap) {
            int32_t *g = realloc(v, (size_t)(cap *= 2) * sizeof *g);
            if (!g) break;
            v = g;
        }
        v[count++] = (int32_t)x;
        p = *end ? end + 1 : end;
    }
    if (!v || count == 0) {
        fprintf(stderr, "tessera %s: --ids is empty\n", cmd);
        free(v);
        return -1;
    }
    *ids = v;
    *n = count;
    return 0;
}

int tsr_cli_kv_fraction(const char *cmd, const char *s, double *out)
{
    if (tsr_cli_float(cmd, "--kv-fraction", s, 0, 1, out)) return -1;
    if (*out > 0) return 0;
    fprintf(stderr, "tessera %s: --kv-fraction must be a share above 0 and at most 1 (0.9: 90%%)\n", cmd);
    return -1;
}

int tsr_cli_kv_size_check(const char *cmd, long kv_tokens, double kv_fraction)
{
    if (kv_tokens <= 0 || kv_fraction <= 0) return 0;
    fprintf(stderr, "tessera %s: give the KV pool's size (--kv-tokens) or its share of free memory (--kv-fraction), "
                    "not both\n", cmd);
    return -1;
}

int tsr_cli_error(const char *cmd, tsr_status st)
{
    fprintf(stderr, "tessera %s: %s: %s\n", cmd, tsr_status_str(st), tsr_last_error());
    return 1;
}

const char *tsr_cli_value(const char *cmd, int argc, char **argv, int *i)
{
    if (*i + 1 >= argc) {
        fprintf(stderr, "tessera %s: option %s needs a value\n", cmd, argv[*i]);
        return NULL;
    }
    return argv[++*i];
}
