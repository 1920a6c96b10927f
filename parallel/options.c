/* Multi-rank command-line options (see options.h). */
#include "parallel/options.h"

#include "parallel/plan.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

void tsr_par_opts_init(tsr_par_opts *o)
{
    memset(o, 0, sizeof *o);
    o->comm_timeout = 120;
    o->load_timeout = 1800;
    o->micro_batches = 2;
    o->bind = 1;
}

void tsr_par_opts_help(FILE *f)
{
    fprintf(f, "multi-rank (under mpirun: rank 0 coordinates, ranks 1..N-1 are workers):\n"
               "  --split S           none, layers, layers:R1,R2,... (per-stage shares) or tensor\n"
               "  --tp N              tensor groups of N workers inside each layer stage\n"
               "  --gpu-memory SIZE   usable memory per GPU, e.g. 24GiB (or one per worker: 24GiB,20GiB)\n"
               "  --comm-timeout S    seconds to wait for a peer before failing (default 120, 0 = forever)\n"
               "  --load-timeout S    seconds to wait for the workers to load (default 1800)\n"
               "  --micro-batches N   pipelining over layer stages: steps in flight and calls per prefill step\n"
               "                      (default 2; 1 = off)\n"
               "  --bind auto|none    hwloc CPU/memory binding of ranks (default auto)\n"
               "  --quiet-ranks       no per-rank start-up lines\n");
}

static int number(const char *cmd, const char *opt, const char *v, double lo, double hi, double *out)
{
    char *end;
    errno = 0;
    double x = strtod(v, &end);
    if (errno || end == v || *end || !isfinite(x) || x < lo || x > hi) {
        fprintf(stderr, "tessera %s: %s must be a number in [%g, %g], got '%s'\n", cmd, opt, lo, hi, v);
        return -1;
    }
    *out = x;
    return 0;
}

int tsr_par_opts_take(const char *cmd, tsr_par_opts *o, int argc, char **argv, int *i)
{
    const char *a = argv[*i];
    if (!strcmp(a, "--quiet-ranks")) {
        o->quiet = 1;
        return 1;
    }
    static const char *const with_value[] = {
        "--split", "--tp", "--gpu-memory", "--comm-timeout", "--load-timeout", "--micro-batches", "--bind"};
    size_t k = 0;
    while (k < sizeof with_value / sizeof with_value[0] && strcmp(a, with_value[k]))
        k++;
    if (k == sizeof with_value / sizeof with_value[0]) return 0;
    if (*i + 1 >= argc) {
        fprintf(stderr, "tessera %s: option %s needs a value\n", cmd, a);
        return -1;
    }
    const char *v = argv[++*i];
    double x;
    if (!strcmp(a, "--split")) {
        tsr_split_spec spec;
        if (tsr_split_parse(v, &spec) != TSR_OK) {
            fprintf(stderr, "tessera %s: %s\n", cmd, tsr_last_error());
            return -1;
        }
        o->split = v;
    } else if (!strcmp(a, "--tp")) {
        if (number(cmd, a, v, 1, TSR_PLAN_MAX, &x) || x != (int)x) return -1;
        o->tp = (int)x;
    } else if (!strcmp(a, "--gpu-memory")) {
        uint64_t sizes[TSR_PLAN_MAX];
        int n;
        if (tsr_sizes_parse(v, sizes, TSR_PLAN_MAX, &n) != TSR_OK) {
            fprintf(stderr, "tessera %s: --gpu-memory: %s\n", cmd, tsr_last_error());
            return -1;
        }
        o->gpu_memory = v;
    } else if (!strcmp(a, "--comm-timeout")) {
        if (number(cmd, a, v, 0, 1e7, &o->comm_timeout)) return -1;
    } else if (!strcmp(a, "--load-timeout")) {
        if (number(cmd, a, v, 0, 1e7, &o->load_timeout)) return -1;
    } else if (!strcmp(a, "--micro-batches")) {
        if (number(cmd, a, v, 1, 64, &x) || x != (int)x) return -1;
        o->micro_batches = (int)x;
    } else if (!strcmp(a, "--bind")) {
        if (strcmp(v, "auto") && strcmp(v, "none")) {
            fprintf(stderr, "tessera %s: --bind must be auto or none, got '%s'\n", cmd, v);
            return -1;
        }
        o->bind = !strcmp(v, "auto");
    }
    return 1;
}
