/* Fuzz target: one message a client sends to the nanomsg intake (launcher/intake_msg.h), decoded as the intake
 * thread decodes it, then taken as far as the intake takes it without sockets: a submit with a valid url and body
 * has its body parsed as an OpenAI request against the bundled tiny model (what tsr_job_new does), and every
 * error the intake would answer with is built as JSON. Checked beyond crashes, sanitizer reports and leaks: a
 * decoded message keeps the decoder's promises (a client_id of 1 to 256 bytes, a why message on failure). */
#include "launcher/intake_msg.h"
#include "tests/fuzz/fuzz_oai_model.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void check(int ok, const char *what)
{
    if (ok) return;
    fprintf(stderr, "fuzz_intake: %s\n", what);
    abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    tsr_fuzz_oai_model();
    tsr_intake_msg msg;
    if (tsr_intake_msg_decode((const char *)data, size, &msg) != TSR_OK) {
        check(msg.why[0] != '\0' && msg.client_id == NULL, "a refused message without a reason");
        tsr_intake_msg_clear(&msg);
        return 0;
    }
    size_t idl = strlen(msg.client_id);
    check(idl >= 1 && idl <= TSR_INTAKE_MAX_ID, "client_id outside 1..256 bytes");
    check(!msg.reply_to_ok || tsr_intake_addr_valid(msg.reply_to), "reply_to accepted but not an address");
    check(!msg.request_id_ok || (msg.request_id && strlen(msg.request_id) <= TSR_INTAKE_MAX_ID), "bad request_id");
    check(!msg.body || json_is_object(msg.body), "body not an object");
    tsr_oai_error e;
    if (msg.type == TSR_INTAKE_MSG_SUBMIT && msg.request_id_ok && msg.url_ok && msg.body) {
        tsr_fuzz_oai_parse(msg.kind, msg.body);
    } else {
        tsr_oai_error_set(&e, 400, NULL, "invalid_message", "unknown message type '%.64s'",
                          msg.type_name ? msg.type_name : "");
        json_decref(tsr_oai_error_json(&e));
    }
    if (msg.type == TSR_INTAKE_MSG_CANCEL) {
        tsr_oai_error_set(&e, 404, NULL, "request_not_found", "no running request '%.256s' for this client",
                          msg.request_id ? msg.request_id : "(none)");
        json_decref(tsr_oai_error_json(&e));
    }
    tsr_intake_msg_clear(&msg);
    return 0;
}
