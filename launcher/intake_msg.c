/* The intake's message decoder (see intake_msg.h): one json_loadb, then field look-ups and length checks. */
#include "launcher/intake_msg.h"

#include <stdio.h>
#include <string.h>

int tsr_intake_addr_valid(const char *a)
{
    return !strncmp(a, "ipc://", 6) || !strncmp(a, "tcp://", 6) || !strncmp(a, "inproc://", 9);
}

void tsr_intake_msg_clear(tsr_intake_msg *msg)
{
    json_decref(msg->root);
    memset(msg, 0, sizeof *msg);
}

static tsr_intake_msg_type type_of(const char *name)
{
    if (!name) return TSR_INTAKE_MSG_NONE;
    if (!strcmp(name, "submit")) return TSR_INTAKE_MSG_SUBMIT;
    if (!strcmp(name, "cancel")) return TSR_INTAKE_MSG_CANCEL;
    if (!strcmp(name, "ping")) return TSR_INTAKE_MSG_PING;
    if (!strcmp(name, "bye")) return TSR_INTAKE_MSG_BYE;
    return TSR_INTAKE_MSG_OTHER;
}

tsr_status tsr_intake_msg_decode(const char *data, size_t len, tsr_intake_msg *msg)
{
    memset(msg, 0, sizeof *msg);
    json_error_t jerr;
    msg->root = json_loadb(data, len, 0, &jerr);
    if (!json_is_object(msg->root)) {
        snprintf(msg->why, sizeof msg->why, "not a JSON object (%s)", msg->root ? "another JSON value" : jerr.text);
        return TSR_ERR_FORMAT;
    }
    const json_t *m = msg->root;
    msg->type_name = json_string_value(json_object_get(m, "type"));
    msg->type = type_of(msg->type_name);
    msg->client_id = json_string_value(json_object_get(m, "client_id"));
    if (!msg->client_id || !*msg->client_id || strlen(msg->client_id) > TSR_INTAKE_MAX_ID) {
        msg->client_id = NULL;
        snprintf(msg->why, sizeof msg->why, "no client_id (a string of 1 to %d bytes)", TSR_INTAKE_MAX_ID);
        return TSR_ERR_FORMAT;
    }
    msg->reply_to = json_string_value(json_object_get(m, "reply_to"));
    msg->reply_to_ok = msg->reply_to && strlen(msg->reply_to) <= TSR_INTAKE_MAX_ADDR &&
                       tsr_intake_addr_valid(msg->reply_to);
    msg->request_id = json_string_value(json_object_get(m, "request_id"));
    msg->request_id_ok = msg->request_id && *msg->request_id && strlen(msg->request_id) <= TSR_INTAKE_MAX_ID;
    const char *url = json_string_value(json_object_get(m, "url"));
    if (url && !strcmp(url, "/v1/completions")) {
        msg->kind = TSR_OAI_COMPLETIONS;
        msg->url_ok = 1;
    } else if (url && !strcmp(url, "/v1/chat/completions")) {
        msg->kind = TSR_OAI_CHAT;
        msg->url_ok = 1;
    }
    json_t *body = json_object_get(m, "body");
    msg->body = json_is_object(body) ? body : NULL;
    return TSR_OK;
}
