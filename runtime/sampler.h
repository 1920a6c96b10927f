/* Token sampling on the CPU: greedy, or temperature with top-k and top-p truncation, from a seeded generator.
 *
 * Greedy (temperature 0) picks the first index of the maximum, as torch.argmax does. Otherwise the logits are
 * divided by the temperature, truncated to the top_k largest (0 = no limit), then to the smallest set whose
 * probability reaches top_p (1 = no limit), renormalized and drawn from with the sequence's own generator, so a
 * seed gives the same tokens whatever else runs. The full sampler of the scheduler issue builds on this. */
#ifndef TSR_SAMPLER_H
#define TSR_SAMPLER_H

#include "runtime/status.h"

#include <stdint.h>

typedef struct tsr_sampling {
    float temperature;  /* 0 = greedy */
    int top_k;          /* 0 = off */
    float top_p;        /* 1 = off */
} tsr_sampling;

typedef struct tsr_rng {
    uint64_t state;
} tsr_rng;

void tsr_rng_seed(tsr_rng *r, uint64_t seed);
/* Uniform double in [0, 1). */
double tsr_rng_uniform(tsr_rng *r);

/* Index of the largest logit (first on ties). */
int32_t tsr_argmax(const float *logits, int n);

/* Samples one token. Fails only on allocation failure or invalid parameters. */
tsr_status tsr_sample(const float *logits, int n, const tsr_sampling *p, tsr_rng *rng, int32_t *token);

#endif
