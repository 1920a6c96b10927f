/* Fuzz target: config.json parsing. The input is split at the first NUL byte into config.json and
 * generation_config.json texts. */
#include "runtime/config.h"
#include "runtime/rope.h"

#include <stdint.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const char *text = (const char *)data;
    const char *nul = memchr(data, 0, size);
    size_t len = nul ? (size_t)(nul - text) : size;
    tsr_model_config cfg;
    if (tsr_config_parse(text, len, nul ? nul + 1 : NULL, nul ? size - len - 1 : 0, "fuzz", &cfg) == TSR_OK) {
        float inv[512], af;
        if (cfg.rope.dim / 2 <= 512) tsr_rope_freqs(&cfg.rope, 4096, inv, &af);
        for (int l = 0; l < cfg.n_layers && l < 1024; l++) (void)tsr_config_layer_window(&cfg, l);
    }
    return 0;
}
