/* Decoding one message a client sent to the nanomsg intake (docs/intake.md), with no sockets and no state: the
 * bytes become a JSON object and the fields every message type uses are picked out and checked, so the intake
 * (launcher/intake_nn.c) only decides what to do with them and the fuzz target (tests/fuzz/fuzz_intake.c) can reach
 * the whole decoder.
 *
 * tsr_intake_msg_decode() fails (TSR_ERR_FORMAT, with msg->why for the intake's log) only when the message cannot
 * be attributed to a client: not a JSON object, or no client_id of 1 to TSR_INTAKE_MAX_ID bytes. Everything else
 * (an unknown type, a bad request_id, url or body, an unreachable reply_to) is left for the intake to answer,
 * because the answer depends on the client's state; the per-field flags say what is valid.
 *
 * Ownership: a decoded message owns its JSON (root); every pointer in it is borrowed from root and lives until
 * tsr_intake_msg_clear(). */
#ifndef TSR_LAUNCHER_INTAKE_MSG_H
#define TSR_LAUNCHER_INTAKE_MSG_H

#include "launcher/openai.h"

#include <jansson.h>
#include <stddef.h>

#define TSR_INTAKE_MAX_ID   256 /* bytes in a client_id or request_id */
#define TSR_INTAKE_MAX_ADDR 256 /* bytes in a reply_to address */

typedef enum tsr_intake_msg_type {
    TSR_INTAKE_MSG_NONE = 0, /* no "type", or not a string */
    TSR_INTAKE_MSG_SUBMIT,
    TSR_INTAKE_MSG_CANCEL,
    TSR_INTAKE_MSG_PING,
    TSR_INTAKE_MSG_BYE,
    TSR_INTAKE_MSG_OTHER, /* a string naming no known type (type_name has it) */
} tsr_intake_msg_type;

typedef struct tsr_intake_msg {
    json_t *root; /* owned */
    tsr_intake_msg_type type;
    const char *type_name;  /* NULL for NONE */
    const char *client_id;  /* 1 to TSR_INTAKE_MAX_ID bytes */
    const char *reply_to;   /* NULL when absent or not a string */
    int reply_to_ok;        /* reply_to is an ipc://, tcp:// or inproc:// address of at most TSR_INTAKE_MAX_ADDR */
    const char *request_id; /* NULL when absent or not a string */
    int request_id_ok;      /* request_id has 1 to TSR_INTAKE_MAX_ID bytes */
    int url_ok;             /* "url" is /v1/completions or /v1/chat/completions; kind says which */
    tsr_oai_kind kind;
    json_t *body; /* the "body" object, NULL when absent or not an object */
    char why[256]; /* on failure: what is wrong, for the log */
} tsr_intake_msg;

/* Decodes len bytes (not NUL-terminated) into *msg (overwritten; clear it even on failure). */
tsr_status tsr_intake_msg_decode(const char *data, size_t len, tsr_intake_msg *msg);
void tsr_intake_msg_clear(tsr_intake_msg *msg);

/* 1 when addr starts with ipc://, tcp:// or inproc:// (nanomsg transports the intake connects or binds to). */
int tsr_intake_addr_valid(const char *addr);

#endif
