/* The OpenAI model description the request-parsing fuzz targets (batch lines, intake messages) parse bodies
 * against: the bundled tiny model's tokenizer and chat template ($TSR_MODELS, else models/), loaded once, with the
 * template's render limits lowered so runaway inputs stop quickly. Exits when the model cannot be loaded. */
#ifndef TSR_TESTS_FUZZ_OAI_MODEL_H
#define TSR_TESTS_FUZZ_OAI_MODEL_H

#include "launcher/openai.h"

const tsr_oai_model *tsr_fuzz_oai_model(void);

/* Parses body as a request of kind and, when it parses, builds every choice's service request (what a job does
 * before submitting); frees everything. */
void tsr_fuzz_oai_parse(tsr_oai_kind kind, const json_t *body);

#endif
