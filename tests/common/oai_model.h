/* Test helper: the OpenAI front door's view of a bundled model (launcher/openai.h's tsr_oai_model) made from the
 * model's tokenizer and chat template alone, with no engine, for the tests that parse requests and build responses
 * (tests/serve/http/test_openai.c, tests/fault/test_fault_admission.c). The tests differ only in the model's stop
 * ids and context, which are parameters. */
#ifndef TSR_TEST_OAI_MODEL_H
#define TSR_TEST_OAI_MODEL_H

#include "launcher/openai.h"

#include <stdint.h>

typedef struct {
    char dir[4096];          /* the model's directory */
    tsr_tokenizer *tok;
    tsr_chat_template *tpl;
    char *bos, *eos;         /* the template's bos and eos tokens (either may be NULL) */
    int32_t eos_id;          /* eos's token id (2 without an eos token): the stop id when none are given */
    tsr_oai_model model;     /* named "tiny", vocabulary 2048, created 1; points into this struct: do not copy it */
} tsr_test_oai;

/* Loads the tokenizer and chat template of model `name` (found with tsr_fixture_model, else as models/<name> in the
 * current directory) into t and builds t->model: it stops at eos_ids[0..n_eos), or at eos_id when n_eos is 0, and
 * max_context bounds prompt plus completion. Returns 0, or -1 when anything fails (cmocka's group setup result). */
int tsr_test_oai_open(tsr_test_oai *t, const char *name, const int32_t *eos_ids, int n_eos, int max_context);
/* Frees what tsr_test_oai_open loaded (also after it failed halfway). */
void tsr_test_oai_close(tsr_test_oai *t);

#endif
