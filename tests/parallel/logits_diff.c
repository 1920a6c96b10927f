/* logits_diff A.safetensors B.safetensors MAX_ABS [MARGIN]: compares two `tessera logits` outputs tensor by tensor.
 *
 * Prints the largest absolute difference and the rows whose argmax differs; exits 0 when every tensor has the same
 * shape, the difference stays within MAX_ABS and every row's argmax agrees (MAX_ABS 0 demands bit-identical
 * values), 1 otherwise, 2 on bad input. With MARGIN, a row whose argmax differs counts only when A's top two logits
 * are more than MARGIN apart (near-ties may flip under a different summation order, e.g. on GPUs). Used by the
 * multi-rank tests (test_mpi.sh, gpu-check.sh). */
#include "runtime/safetensors.h"
#include "runtime/sampler.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int main(int argc, char **argv)
{
    if (argc != 4 && argc != 5) {
        fprintf(stderr, "usage: logits_diff A.safetensors B.safetensors MAX_ABS [MARGIN]\n");
        return 2;
    }
    const double tol = atof(argv[3]), margin = argc == 5 ? atof(argv[4]) : -1;
    tsr_st_set *a = NULL, *b = NULL;
    if (tsr_st_open_file(argv[1], &a) != TSR_OK || tsr_st_open_file(argv[2], &b) != TSR_OK) {
        fprintf(stderr, "logits_diff: %s\n", tsr_last_error());
        return 2;
    }
    double worst = 0;
    long disagree = 0, rows_total = 0;
    int bad = 0;
    for (int i = 0;; i++) {
        char name[64];
        snprintf(name, sizeof name, "logits.%d", i);
        const tsr_st_tensor *x = tsr_st_find(a, name), *y = tsr_st_find(b, name);
        if (!x && !y) break;
        if (!x || !y || x->ndim != 2 || y->ndim != 2 || x->shape[0] != y->shape[0] || x->shape[1] != y->shape[1] ||
            x->dtype != TSR_F32 || y->dtype != TSR_F32) {
            fprintf(stderr, "logits_diff: %s differs in presence, type or shape\n", name);
            bad = 1;
            break;
        }
        const long rows = (long)x->shape[0], cols = (long)x->shape[1];
        const float *p = x->data, *q = y->data;
        for (long r = 0; r < rows; r++) {
            for (long c = 0; c < cols; c++) {
                double d = fabs((double)p[r * cols + c] - q[r * cols + c]);
                if (!(d <= worst)) worst = isnan(d) ? INFINITY : d;
            }
            const int32_t ap = tsr_argmax(p + r * cols, (int)cols), aq = tsr_argmax(q + r * cols, (int)cols);
            if (ap == aq) continue;
            float second = -INFINITY;
            for (long c = 0; c < cols; c++)
                if (c != ap && p[r * cols + c] > second) second = p[r * cols + c];
            disagree += margin < 0 || p[r * cols + ap] - second > margin;
        }
        rows_total += rows;
    }
    printf("max |diff| %.3g over %ld rows, argmax disagreements %ld\n", worst, rows_total, disagree);
    tsr_st_set_free(a);
    tsr_st_set_free(b);
    return bad || !(worst <= tol) || disagree || rows_total == 0 ? 1 : 0;
}
