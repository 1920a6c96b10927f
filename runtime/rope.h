/* Rotary position embedding frequencies, as Hugging Face transformers computes them for each rope type.
 *
 * tsr_rope_freqs() fills inv_freq[dim/2] and the attention factor that multiplies cos and sin (YaRN). Dynamic
 * NTK scaling depends on the sequence length being processed (HF recomputes the base once the sequence grows past
 * max_position_embeddings), so callers pass it; the other types ignore it. */
#ifndef TSR_ROPE_H
#define TSR_ROPE_H

#include "runtime/config.h"

/* inv_freq must hold rope->dim / 2 floats. */
void tsr_rope_freqs(const tsr_rope_config *rope, int seq_len, float *inv_freq, float *attention_factor);

#endif
