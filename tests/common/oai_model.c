/* The bundled model's tokenizer, chat template and tsr_oai_model for the OpenAI mapping tests (see oai_model.h). */
#include "tests/common/oai_model.h"

#include "tests/common/fixtures.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int tsr_test_oai_open(tsr_test_oai *t, const char *name, const int32_t *eos_ids, int n_eos, int max_context)
{
    memset(t, 0, sizeof *t);
    if (!tsr_fixture_model(t->dir, sizeof t->dir, name)) snprintf(t->dir, sizeof t->dir, "models/%s", name);
    if (tsr_tokenizer_load(t->dir, &t->tok) != TSR_OK) return -1;
    if (tsr_chat_template_load_dir(t->dir, 0, &t->tpl, &t->bos, &t->eos) != TSR_OK) return -1;
    t->eos_id = t->eos ? tsr_tokenizer_token_id(t->tok, t->eos) : 2;
    if (n_eos == 0) {
        eos_ids = &t->eos_id;
        n_eos = 1;
    }
    t->model = (tsr_oai_model){.name = "tiny", .tok = t->tok, .tpl = t->tpl, .bos_token = t->bos,
                               .eos_token = t->eos, .eos_ids = eos_ids, .n_eos = n_eos, .vocab = 2048,
                               .max_context = max_context, .created = 1};
    return 0;
}

void tsr_test_oai_close(tsr_test_oai *t)
{
    tsr_chat_template_free(t->tpl);
    tsr_tokenizer_free(t->tok);
    free(t->bos);
    free(t->eos);
    memset(t, 0, sizeof *t);
}
