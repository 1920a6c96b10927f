/* The fuzz targets' OpenAI model (see fuzz_oai_model.h). */
#include "tests/fuzz/fuzz_oai_model.h"

#include <stdio.h>
#include <stdlib.h>

static tsr_tokenizer *tok;
static tsr_chat_template *tpl;
static char *bos, *eos;
static const int32_t eos_ids[] = {1, 4};
static tsr_oai_model model;

const tsr_oai_model *tsr_fuzz_oai_model(void)
{
    if (tok) return &model;
    const char *models = getenv("TSR_MODELS");
    char dir[1024];
    snprintf(dir, sizeof dir, "%s/tiny-llama-exl2-4.0bpw", models ? models : "models");
    if (tsr_tokenizer_load(dir, &tok) != TSR_OK || tsr_chat_template_load_dir(dir, 0, &tpl, &bos, &eos) != TSR_OK) {
        fprintf(stderr, "fuzz: cannot load %s: %s\n", dir, tsr_last_error());
        exit(1);
    }
    tsr_chat_template_set_limits(8u << 20, 200000);
    model = (tsr_oai_model){.name = "tiny", .tok = tok, .tpl = tpl, .bos_token = bos, .eos_token = eos,
                            .eos_ids = eos_ids, .n_eos = 2, .vocab = 2048, .max_context = 256, .created = 1};
    return &model;
}

void tsr_fuzz_oai_parse(tsr_oai_kind kind, const json_t *body)
{
    tsr_oai_request *rq = NULL;
    tsr_oai_error err;
    if (tsr_oai_parse(kind, body, tsr_fuzz_oai_model(), &rq, &err) == TSR_OK) {
        for (int c = 0; c < rq->n_choices; c++) {
            tsr_gen_request g;
            tsr_oai_gen_request(rq, c, &g);
        }
        tsr_oai_request_free(rq);
    } else {
        json_decref(tsr_oai_error_json(&err));
    }
}
