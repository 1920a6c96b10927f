/* Decode batches past one head call's rows, reduced on the device, against the host (tests/common/forward_slices.h). */
#include "tests/common/forward_slices.h"

#include "kernels/cpu/cpu_kernels.h"
#include "runtime/engine.h"
#include "runtime/forward.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    tsr_forward_ctx *f;
    const float *full; /* tsr_forward's rows [rows][vocab] */
    int vocab, rows;
    char *err;
    size_t cap;
} slices_ctx;

static int fail(slices_ctx *c, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(c->err, c->cap, fmt, ap);
    va_end(ap);
    return -1;
}

static int expect_rows(slices_ctx *c, int row0, int n)
{
    float *got = malloc((size_t)n * c->vocab * sizeof(float));
    if (!got) return fail(c, "out of memory");
    int rc = 0;
    if (tsr_forward_fetch_rows(c->f, row0, n, got) != TSR_OK)
        rc = fail(c, "fetch rows %d..%d: %s", row0, row0 + n - 1, tsr_last_error());
    else if (memcmp(got, c->full + (size_t)row0 * c->vocab, (size_t)n * c->vocab * sizeof(float)) != 0)
        rc = fail(c, "fetched rows %d..%d differ from tsr_forward's", row0, row0 + n - 1);
    free(got);
    return rc;
}

static int check_picks(slices_ctx *c, const tsr_seq_input *in)
{
    int32_t *ids = malloc((size_t)c->rows * sizeof *ids);
    float *vals = malloc((size_t)c->rows * sizeof *vals);
    int rc = ids && vals ? 0 : fail(c, "out of memory");
    for (int pass = 0; pass < 2 && rc == 0; pass++) {
        if (tsr_forward_argmax(c->f, in, c->rows, ids, vals) != TSR_OK) {
            rc = fail(c, "argmax: %s", tsr_last_error());
            break;
        }
        for (int r = 0; r < c->rows && rc == 0; r++) {
            const float *row = c->full + (size_t)r * c->vocab;
            int best = 0;
            for (int i = 1; i < c->vocab; i++)
                if (row[i] > row[best]) best = i;
            if (ids[r] != best || memcmp(&vals[r], &row[best], sizeof(float)) != 0)
                rc = fail(c, "pass %d, row %d: picked %d (%g), the whole row's argmax is %d (%g)", pass, r, ids[r],
                          vals[r], best, row[best]);
        }
    }
    free(ids), free(vals);
    return rc;
}

static int check_candidates(slices_ctx *c, const tsr_seq_input *in, float z_rel)
{
    const size_t cand = (size_t)c->rows * TSR_TOP_MAX;
    float *inv = malloc((size_t)c->rows * sizeof(float)), *z = malloc((size_t)c->rows * sizeof(float));
    float *want_z = malloc((size_t)c->rows * sizeof(float));
    int32_t *ids = malloc(cand * sizeof(int32_t)), *want_ids = malloc(cand * sizeof(int32_t));
    float *vals = malloc(cand * sizeof(float)), *want_vals = malloc(cand * sizeof(float));
    int rc = inv && z && want_z && ids && want_ids && vals && want_vals ? 0 : fail(c, "out of memory");
    if (rc == 0) {
        for (int r = 0; r < c->rows; r++) inv[r] = 0.5f + (float)(r % 5) * 0.25f;
        tsr_cpu_top_rows(c->full, c->rows, c->vocab, TSR_TOP_MAX, inv, want_ids, want_vals, want_z);
    }
    for (int pass = 0; pass < 2 && rc == 0; pass++) {
        if (tsr_forward_top(c->f, in, c->rows, inv, ids, vals, z) != TSR_OK) {
            rc = fail(c, "candidates: %s", tsr_last_error());
            break;
        }
        for (size_t i = 0; i < cand && rc == 0; i++)
            if (ids[i] != want_ids[i] || memcmp(&vals[i], &want_vals[i], sizeof(float)) != 0)
                rc = fail(c, "pass %d, row %zu, candidate %zu: %d (%g), the host's %d (%g)", pass, i / TSR_TOP_MAX,
                          i % TSR_TOP_MAX, ids[i], vals[i], want_ids[i], want_vals[i]);
        for (int r = 0; r < c->rows && rc == 0; r++)
            if (z_rel == 0.0f ? memcmp(&z[r], &want_z[r], sizeof(float)) != 0
                              : !(fabsf(z[r] - want_z[r]) <= z_rel * fabsf(want_z[r])))
                rc = fail(c, "pass %d, row %d: z %.9g, the host's %.9g", pass, r, z[r], want_z[r]);
    }
    free(inv), free(z), free(want_z), free(ids), free(want_ids), free(vals), free(want_vals);
    return rc;
}

int tsr_check_forward_slices(const char *model_dir, const tsr_ops *ops, int rows, float z_rel, char *err, size_t cap)
{
    slices_ctx c = {NULL, NULL, 0, rows, err, cap};
    tsr_engine *e = NULL;
    const int cut = TSR_HEAD_ROWS; /* where the first slice ends */
    if (rows < cut + 13)
        return fail(&c, "%d rows: the check needs at least %d (two slices and rows %d..%d)", rows, cut + 13, cut - 8,
                    cut + 11);
    tsr_engine_opts o = {.max_tokens = rows, .page_size = 16, .kv_tokens = 16L * rows, .kv_dtype = TSR_F16, .ops = ops};
    if (tsr_engine_open(model_dir, &o, &e) != TSR_OK) return fail(&c, "open %s: %s", model_dir, tsr_last_error());
    c.f = e->fwd;
    c.vocab = e->model->local.vocab;
    tsr_seq_input *in = malloc((size_t)rows * sizeof *in);
    int32_t *tokens = malloc((size_t)rows * sizeof *tokens), *pages = malloc((size_t)rows * sizeof *pages);
    float *full = malloc((size_t)rows * c.vocab * sizeof(float));
    int rc = in && tokens && pages && full ? 0 : fail(&c, "out of memory");
    if (rc == 0 && (tsr_forward_pick_rows(c.f) < rows || tsr_forward_top_rows(c.f) < rows))
        rc = fail(&c, "the forward takes %d picks and %d candidate rows, not %d", tsr_forward_pick_rows(c.f),
                  tsr_forward_top_rows(c.f), rows);
    if (rc == 0) { /* rows sequences of one token each, each in a page of its own, the logits of each */
        for (int s = 0; s < rows; s++) {
            tokens[s] = (7 * s + 3) % c.vocab, pages[s] = s;
            in[s] = (tsr_seq_input){&tokens[s], 1, 0, &pages[s], 1, TSR_LOGITS_LAST};
        }
        if (tsr_forward(c.f, in, rows, full) != TSR_OK) rc = fail(&c, "forward: %s", tsr_last_error());
        c.full = full;
    }
    if (rc == 0) rc = check_picks(&c, in);
    if (rc == 0) rc = expect_rows(&c, rows - 3, 3); /* the slice still held */
    if (rc == 0) rc = expect_rows(&c, 5, 3);        /* an earlier slice: the head again */
    if (rc == 0) rc = check_candidates(&c, in, z_rel);
    if (rc == 0) rc = expect_rows(&c, cut - 8, 20); /* across two slices */
    if (rc == 0) rc = expect_rows(&c, rows - 1, 1);
    float one[2];
    if (rc == 0 && tsr_forward_fetch_rows(c.f, rows - 1, 2, one) != TSR_ERR_ARG)
        rc = fail(&c, "fetching past the call's rows did not fail");
    free(in), free(tokens), free(pages), free(full);
    tsr_engine_close(e);
    return rc;
}
