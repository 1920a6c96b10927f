/* RoPE frequency tables for the default, linear, dynamic, llama3 and yarn variants (see rope.h).
 * Formulas follow transformers' modeling_rope_utils; computed in double, rounded to float once. */
#include "runtime/rope.h"

#include <math.h>

static double yarn_mscale(double scale, double mscale)
{
    if (scale <= 1.0) return 1.0;
    return 0.1 * mscale * log(scale) + 1.0;
}

static double yarn_correction_dim(double num_rotations, int dim, double base, double max_pos)
{
    return (dim * log(max_pos / (num_rotations * 2.0 * M_PI))) / (2.0 * log(base));
}

void tsr_rope_freqs(const tsr_rope_config *r, int seq_len, float *inv_freq, float *attention_factor)
{
    int dim = r->dim, half = dim / 2;
    double base = r->theta;
    *attention_factor = 1.0f;
    if (r->type == TSR_ROPE_DYNAMIC && seq_len > r->original_max_pos) {
        double f = r->factor;
        base = base * pow(f * seq_len / r->original_max_pos - (f - 1.0), (double)dim / (dim - 2));
    }
    for (int i = 0; i < half; i++) {
        /* HF: 1 / base ** (arange(0, dim, 2) / dim), in float32 */
        float expo = (float)(2 * i) / (float)dim;
        inv_freq[i] = (float)(1.0 / pow(base, (double)expo));
    }
    switch (r->type) {
    case TSR_ROPE_DEFAULT:
    case TSR_ROPE_DYNAMIC:
        break;
    case TSR_ROPE_LINEAR:
        for (int i = 0; i < half; i++) inv_freq[i] = (float)(inv_freq[i] / r->factor);
        break;
    case TSR_ROPE_LLAMA3: {
        double low_wl = r->original_max_pos / r->low_freq_factor;
        double high_wl = r->original_max_pos / r->high_freq_factor;
        for (int i = 0; i < half; i++) {
            double f = inv_freq[i], wl = 2.0 * M_PI / f;
            if (wl < high_wl) continue;
            if (wl > low_wl) {
                inv_freq[i] = (float)(f / r->factor);
            } else {
                double smooth =
                    (r->original_max_pos / wl - r->low_freq_factor) / (r->high_freq_factor - r->low_freq_factor);
                inv_freq[i] = (float)((1.0 - smooth) * f / r->factor + smooth * f);
            }
        }
        break;
    }
    case TSR_ROPE_YARN: {
        double factor = r->factor;
        double af = r->attention_factor;
        if (!(af > 0)) {
            if (r->mscale > 0 && r->mscale_all_dim > 0)
                af = yarn_mscale(factor, r->mscale) / yarn_mscale(factor, r->mscale_all_dim);
            else
                af = yarn_mscale(factor, 1.0);
        }
        *attention_factor = (float)af;
        double low = yarn_correction_dim(r->beta_fast, dim, base, r->original_max_pos);
        double high = yarn_correction_dim(r->beta_slow, dim, base, r->original_max_pos);
        if (r->truncate) {
            low = floor(low);
            high = ceil(high);
        }
        if (low < 0) low = 0;
        if (high > dim - 1) high = dim - 1;
        if (low == high) high += 0.001;
        for (int i = 0; i < half; i++) {
            double pos_freq = pow(base, (double)(2 * i) / dim);
            double extrap = 1.0 / pos_freq, interp = 1.0 / (factor * pos_freq);
            double ramp = (i - low) / (high - low);
            if (ramp < 0) ramp = 0;
            if (ramp > 1) ramp = 1;
            double extrap_factor = 1.0 - ramp;
            inv_freq[i] = (float)(interp * (1.0 - extrap_factor) + extrap * extrap_factor);
        }
        break;
    }
    }
}
