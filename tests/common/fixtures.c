/* Fixture lookup and logit comparison for the tests (see fixtures.h). */
#include "tests/common/fixtures.h"

#include <dirent.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

char *tsr_fixture_path(char *buf, size_t cap, const char *rel)
{
    if (!buf || cap == 0) return NULL;
    const char *vars[] = {"TSR_FIXTURES_BUILD", "TSR_FIXTURES", "TSR_MODELS"};
    for (size_t i = 0; i < 3; i++) {
        const char *root = getenv(vars[i]);
        if (!root) continue;
        snprintf(buf, cap, "%s/%s", root, rel);
        if (access(buf, F_OK) == 0) return buf;
    }
    return NULL;
}

char *tsr_fixture_model(char *buf, size_t cap, const char *name)
{
    char rel[512];
    snprintf(rel, sizeof rel, "models/%s", name);
    if (tsr_fixture_path(buf, cap, rel)) return buf;
    return tsr_fixture_path(buf, cap, name); /* TSR_MODELS/<name> */
}

static int cmp_str(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

int tsr_fixture_list_refs(const char *suffix, char ***names)
{
    char dir[4096];
    int n = 0;
    *names = NULL;
    if (!tsr_fixture_path(dir, sizeof dir, "reference")) return 0;
    /* references may be decompressed (TSR_FIXTURES_BUILD) */
    const char *build = getenv("TSR_FIXTURES_BUILD");
    if (build) snprintf(dir, sizeof dir, "%s/reference", build);
    DIR *d = opendir(dir);
    if (!d) return 0;
    struct dirent *e;
    size_t sl = strlen(suffix);
    while ((e = readdir(d))) {
        size_t l = strlen(e->d_name);
        if (l <= sl || strcmp(e->d_name + l - sl, suffix)) continue;
        *names = realloc(*names, (size_t)(n + 1) * sizeof **names);
        (*names)[n] = strndup(e->d_name, l - sl);
        n++;
    }
    closedir(d);
    if (n) qsort(*names, (size_t)n, sizeof **names, cmp_str);
    return n;
}

void tsr_fixture_free_list(char **names, int n)
{
    for (int i = 0; i < n; i++) free(names[i]);
    free(names);
}

tsr_logit_diff tsr_compare_logits(const float *got, const float *ref, long rows, long cols)
{
    tsr_logit_diff r = {0, 0, 0, rows};
    double sum = 0;
    for (long i = 0; i < rows; i++) {
        const float *g = got + i * cols, *f = ref + i * cols;
        long ag = 0, af = 0, second = -1;
        for (long j = 0; j < cols; j++) {
            double d = fabs((double)g[j] - f[j]);
            if (!(d <= r.max_abs)) r.max_abs = isnan(d) ? INFINITY : d;
            sum += d;
            if (g[j] > g[ag]) ag = j;
            if (f[j] > f[af]) af = j;
        }
        for (long j = 0; j < cols; j++)
            if (j != af && (second < 0 || f[j] > f[second])) second = j;
        if (ag != af && second >= 0 && f[af] - f[second] > 0.1) r.argmax_disagree++;
    }
    r.mean_abs = rows && cols ? sum / ((double)rows * cols) : 0;
    return r;
}
