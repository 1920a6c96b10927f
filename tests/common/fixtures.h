/* Test helpers: locating fixtures and comparing arrays.
 *
 * Fixture paths come from the environment CTest sets (tests/CMakeLists.txt): TSR_FIXTURES (the repo's
 * tests/fixtures), TSR_FIXTURES_BUILD (decompressed *.xz fixtures) and TSR_MODELS (the repo's models/). */
#ifndef TSR_TEST_FIXTURES_H
#define TSR_TEST_FIXTURES_H

#include <stddef.h>

/* Writes the path of `rel` under the first of TSR_FIXTURES_BUILD, TSR_FIXTURES, TSR_MODELS where it exists
 * into buf; returns buf, or NULL when it exists nowhere. */
char *tsr_fixture_path(char *buf, size_t cap, const char *rel);

/* Directory of a fixture model by name: tests/fixtures/models/<name> or models/<name>. */
char *tsr_fixture_model(char *buf, size_t cap, const char *name);

/* Lists the reference files in reference/ whose name ends with `suffix` (e.g. ".exl2-ref.safetensors"):
 * returns the count and a malloc'd array of malloc'd names (without the suffix). */
int tsr_fixture_list_refs(const char *suffix, char ***names);
void tsr_fixture_free_list(char **names, int n);

typedef struct {
    double max_abs, mean_abs;
    long argmax_disagree;  /* rows where argmax differs and the reference's top-2 margin exceeds 0.1 */
    long rows;
} tsr_logit_diff;

/* Compares rows × cols logits against a reference. */
tsr_logit_diff tsr_compare_logits(const float *got, const float *ref, long rows, long cols);

#endif
