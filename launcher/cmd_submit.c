/* tessera submit: the reference client of the nanomsg intake (docs/intake.md). Sends one request (a prompt, or a
 * whole OpenAI request body from a file) to a running `tessera intake` / `tessera serve --intake`, prints the
 * generated text as it streams in, and exits when the request's last message ("done" or "error") arrives.
 *
 * It binds its own NN_PULL reply socket (a fresh ipc:// path, or a free local tcp:// port, unless --reply names
 * one), PUSHes the submit, pings every second while it waits (so the intake knows it is alive) and sends
 * "cancel" on Ctrl-C. --raw prints every message received as one JSON line instead of text; --cancel-after N
 * cancels after N chunks (both for tests and debugging). */
#include "launcher/cli.h"
#include "launcher/commands.h"

#include <errno.h>
#include <jansson.h>
#include <nanomsg/nn.h>
#include <nanomsg/pipeline.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>

static void usage(FILE *f)
{
    fprintf(f, "usage: tessera submit --connect ADDR [options] ([--] PROMPT | --body FILE)\n"
               "  --connect ADDR       the intake's address (ipc:///path or tcp://host:port)\n"
               "  --chat               /v1/chat/completions with PROMPT as the user message (default: completions)\n"
               "  --stream             stream the text as it is generated\n"
               "  --max-tokens N       tokens to generate\n"
               "  --temperature T      sampling temperature (default: the server's, 1)\n"
               "  --seed S             sampling seed\n"
               "  --body FILE          a whole request body (JSON object; - reads stdin); options above override it\n"
               "  --url URL            /v1/completions or /v1/chat/completions (default from --chat)\n"
               "  --reply ADDR         address to bind for replies (default: a fresh ipc path in $TMPDIR or /tmp,\n"
               "                       or a free local tcp port when ADDR is tcp://)\n"
               "  --client-id ID       default: submit-<pid>-<random>\n"
               "  --request-id ID      default: r1\n"
               "  --timeout S          give up after S seconds (default: none)\n"
               "  --raw                print every message received as a JSON line\n"
               "  --cancel-after N     cancel the request after N stream chunks\n"
               "  --send TEXT          send TEXT to the intake as one message, verbatim, and exit (for debugging)\n");
}

static volatile sig_atomic_t interrupted;

static void on_signal(int sig)
{
    interrupted = sig;
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static unsigned rand32(void)
{
    unsigned r = 0;
    if (getrandom(&r, sizeof r, 0) != (ssize_t)sizeof r) r = (unsigned)getpid() * 2654435761u ^ (unsigned)time(0);
    return r;
}

/* Binds sock for replies; *addr receives the address (malloc'd). */
static int bind_reply(int sock, const char *connect, const char *given, char **addr)
{
    char buf[256];
    if (given) {
        if (nn_bind(sock, given) < 0) {
            fprintf(stderr, "tessera submit: cannot bind %s: %s\n", given, nn_strerror(nn_errno()));
            return -1;
        }
        *addr = strdup(given);
        return *addr ? 0 : -1;
    }
    const char *dir = getenv("TMPDIR");
    if (!dir || !*dir || strlen(dir) > 80) dir = "/tmp";
    for (int attempt = 0; attempt < 32; attempt++) {
        if (!strncmp(connect, "tcp://", 6))
            snprintf(buf, sizeof buf, "tcp://127.0.0.1:%u", 20000 + rand32() % 40000);
        else
            snprintf(buf, sizeof buf, "ipc://%s/tessera-submit-%d-%08x.ipc", dir, (int)getpid(), rand32());
        if (nn_bind(sock, buf) >= 0) {
            *addr = strdup(buf);
            return *addr ? 0 : -1;
        }
        if (nn_errno() != EADDRINUSE) break;
    }
    fprintf(stderr, "tessera submit: cannot bind a reply address (%s): %s (give one with --reply)\n", buf,
            nn_strerror(nn_errno()));
    return -1;
}

static int send_json(int sock, json_t *m, int flags)
{
    char *s = json_dumps(m, JSON_COMPACT);
    json_decref(m);
    if (!s) return -1;
    int rc = nn_send(sock, s, strlen(s), flags);
    free(s);
    return rc < 0 ? -1 : 0;
}

static void print_text(json_t *choices, const char *path1, const char *path2)
{
    size_t i;
    json_t *c;
    json_array_foreach(choices, i, c)
    {
        json_t *v = json_object_get(c, path1);
        if (path2) v = json_object_get(v, path2);
        if (json_is_string(v)) fwrite(json_string_value(v), 1, json_string_length(v), stdout);
    }
}

static json_t *load_body(const char *path)
{
    json_error_t e;
    json_t *b = !strcmp(path, "-") ? json_loadf(stdin, 0, &e) : json_load_file(path, 0, &e);
    if (!b) {
        fprintf(stderr, "tessera submit: %s: %s (line %d)\n", path, e.text, e.line);
        return NULL;
    }
    if (!json_is_object(b)) {
        fprintf(stderr, "tessera submit: %s: the body must be a JSON object\n", path);
        json_decref(b);
        return NULL;
    }
    return b;
}

/* --send: one message as given, no reply awaited. Kept open a moment: nanomsg does not linger on close. */
static int send_verbatim(const char *connect, const char *text)
{
    int sock = nn_socket(AF_SP, NN_PUSH), ms = 5000, rc = 1;
    if (sock < 0) {
        fprintf(stderr, "tessera submit: cannot create a socket: %s\n", nn_strerror(nn_errno()));
        return 1;
    }
    nn_setsockopt(sock, NN_SOL_SOCKET, NN_SNDTIMEO, &ms, sizeof ms);
    if (nn_connect(sock, connect) < 0 || nn_send(sock, text, strlen(text), 0) < 0) {
        fprintf(stderr, "tessera submit: cannot send to %s: %s\n", connect, nn_strerror(nn_errno()));
    } else {
        struct timespec ts = {0, 200 * 1000 * 1000};
        nanosleep(&ts, NULL);
        rc = 0;
    }
    nn_close(sock);
    return rc;
}

int tsr_cmd_submit(int argc, char **argv)
{
    const char *connect = NULL, *body_path = NULL, *url = NULL, *reply = NULL, *prompt = NULL;
    const char *client_id = NULL, *request_id = "r1", *send_text = NULL;
    long max_tokens = -1, seed = -1, cancel_after = -1;
    double temperature = -1, timeout = 0;
    int chat = 0, stream = 0, raw = 0, options = 1;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = NULL;
        if (options && !strcmp(a, "--")) { /* a prompt that starts with '-' follows */
            options = 0;
            continue;
        }
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            usage(stdout);
            return 0;
        }
        if (!strcmp(a, "--chat")) {
            chat = 1;
            continue;
        }
        if (!strcmp(a, "--stream")) {
            stream = 1;
            continue;
        }
        if (!strcmp(a, "--raw")) {
            raw = 1;
            continue;
        }
        if (!options || a[0] != '-' || !strcmp(a, "-")) {
            if (prompt) {
                fprintf(stderr, "tessera submit: one PROMPT only (quote it)\n");
                return 2;
            }
            prompt = a;
            continue;
        }
        if (!(v = tsr_cli_value("submit", argc, argv, &i))) return 2;
        if (!strcmp(a, "--connect"))
            connect = v;
        else if (!strcmp(a, "--body"))
            body_path = v;
        else if (!strcmp(a, "--url"))
            url = v;
        else if (!strcmp(a, "--reply"))
            reply = v;
        else if (!strcmp(a, "--client-id"))
            client_id = v;
        else if (!strcmp(a, "--request-id"))
            request_id = v;
        else if (!strcmp(a, "--send"))
            send_text = v;
        else if (!strcmp(a, "--max-tokens")) {
            if (tsr_cli_int("submit", a, v, 1, 1 << 24, &max_tokens)) return 2;
        } else if (!strcmp(a, "--seed")) {
            if (tsr_cli_int("submit", a, v, 0, __LONG_MAX__, &seed)) return 2;
        } else if (!strcmp(a, "--cancel-after")) {
            if (tsr_cli_int("submit", a, v, 0, 1 << 30, &cancel_after)) return 2;
        } else if (!strcmp(a, "--temperature")) {
            if (tsr_cli_float("submit", a, v, 0, 100, &temperature)) return 2;
        } else if (!strcmp(a, "--timeout")) {
            if (tsr_cli_float("submit", a, v, 0.1, 1e7, &timeout)) return 2;
        } else {
            fprintf(stderr, "tessera submit: unknown option '%s'\n", a);
            usage(stderr);
            return 2;
        }
    }
    if (connect && send_text && !prompt && !body_path) return send_verbatim(connect, send_text);
    if (!connect || (!prompt == !body_path)) {
        usage(stderr);
        return 2;
    }

    /* the request body */
    json_t *body = body_path ? load_body(body_path) : json_object();
    if (!body) return body_path ? 1 : 2;
    if (prompt) {
        json_t *p = json_string(prompt);
        if (!p) {
            fprintf(stderr, "tessera submit: the prompt is not valid UTF-8\n");
            json_decref(body);
            return 2;
        }
        if (chat)
            json_object_set_new(body, "messages", json_pack("[{s:s, s:o}]", "role", "user", "content", p));
        else
            json_object_set_new(body, "prompt", p);
    }
    if (!url) url = chat || json_object_get(body, "messages") ? "/v1/chat/completions" : "/v1/completions";
    if (stream) json_object_set_new(body, "stream", json_true());
    stream = json_is_true(json_object_get(body, "stream"));
    if (max_tokens > 0) json_object_set_new(body, "max_tokens", json_integer(max_tokens));
    if (seed >= 0) json_object_set_new(body, "seed", json_integer(seed));
    if (temperature >= 0) json_object_set_new(body, "temperature", json_real(temperature));
    int is_chat = !strcmp(url, "/v1/chat/completions");

    char id_buf[64];
    if (!client_id) {
        snprintf(id_buf, sizeof id_buf, "submit-%d-%08x", (int)getpid(), rand32());
        client_id = id_buf;
    }
    struct sigaction sa = {.sa_handler = on_signal};
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);

    int rc = 1;
    char *reply_addr = NULL;
    int out = nn_socket(AF_SP, NN_PUSH), in = nn_socket(AF_SP, NN_PULL);
    if (out < 0 || in < 0) {
        fprintf(stderr, "tessera submit: cannot create sockets: %s\n", nn_strerror(nn_errno()));
        goto done;
    }
    int ms = 5000, maxsize = -1;
    nn_setsockopt(out, NN_SOL_SOCKET, NN_SNDTIMEO, &ms, sizeof ms);
    ms = 200;
    nn_setsockopt(in, NN_SOL_SOCKET, NN_RCVTIMEO, &ms, sizeof ms);
    nn_setsockopt(in, NN_SOL_SOCKET, NN_RCVMAXSIZE, &maxsize, sizeof maxsize);
    if (bind_reply(in, connect, reply, &reply_addr)) goto done;
    if (nn_connect(out, connect) < 0) {
        fprintf(stderr, "tessera submit: cannot connect to %s: %s\n", connect, nn_strerror(nn_errno()));
        goto done;
    }
    json_t *msg = json_pack("{s:s, s:s, s:s, s:s, s:s, s:O}", "type", "submit", "client_id", client_id, "reply_to",
                            reply_addr, "request_id", request_id, "url", url, "body", body);
    if (!msg || send_json(out, msg, 0)) {
        fprintf(stderr, "tessera submit: cannot send to %s: %s (is an intake listening there?)\n", connect,
                nn_strerror(nn_errno()));
        goto done;
    }

    double t0 = now_s(), last_ping = t0;
    int accepted = 0, cancelled = 0, chunks = 0, final = 0;
    while (!final) {
        double t = now_s();
        if ((interrupted || (cancel_after >= 0 && chunks >= cancel_after)) && !cancelled) {
            cancelled = 1;
            send_json(out,
                      json_pack("{s:s, s:s, s:s, s:s}", "type", "cancel", "client_id", client_id, "reply_to",
                                reply_addr, "request_id", request_id),
                      NN_DONTWAIT);
            t0 = t; /* give the final message 5 s from here */
        }
        if (cancelled && interrupted && t - t0 > 5) {
            fprintf(stderr, "tessera submit: no answer to the cancel\n");
            break;
        }
        if (!accepted && t - t0 > 10) {
            fprintf(stderr, "tessera submit: no answer from %s in 10 s\n", connect);
            break;
        }
        if (timeout > 0 && t - t0 > timeout) {
            fprintf(stderr, "tessera submit: timed out after %.1f s\n", timeout);
            break;
        }
        if (t - last_ping >= 1) {
            last_ping = t;
            send_json(out, json_pack("{s:s, s:s, s:s}", "type", "ping", "client_id", client_id, "reply_to", reply_addr),
                      NN_DONTWAIT);
        }
        void *buf = NULL;
        int n = nn_recv(in, &buf, NN_MSG, 0);
        if (n < 0) {
            int err = nn_errno();
            if (err == ETIMEDOUT || err == EAGAIN || err == EINTR) continue;
            fprintf(stderr, "tessera submit: receiving: %s\n", nn_strerror(err));
            break;
        }
        json_t *m = json_loadb(buf, (size_t)n, 0, NULL);
        nn_freemsg(buf);
        const char *type = json_string_value(json_object_get(m, "type"));
        const char *rid = json_string_value(json_object_get(m, "request_id"));
        if (!type || (strcmp(type, "pong") && rid && strcmp(rid, request_id))) {
            json_decref(m);
            continue;
        }
        if (raw && strcmp(type, "pong")) {
            char *s = json_dumps(m, JSON_COMPACT);
            if (s) printf("%s\n", s);
            free(s);
            fflush(stdout);
        }
        if (!strcmp(type, "accepted")) {
            accepted = 1;
        } else if (!strcmp(type, "chunk")) {
            accepted = 1;
            chunks++;
            if (!raw) {
                json_t *choices = json_object_get(json_object_get(m, "chunk"), "choices");
                print_text(choices, is_chat ? "delta" : "text", is_chat ? "content" : NULL);
                fflush(stdout);
            }
        } else if (!strcmp(type, "done")) {
            final = 1;
            rc = 0;
            if (!raw) {
                json_t *choices = json_object_get(json_object_get(m, "body"), "choices");
                print_text(choices, is_chat ? "message" : "text", is_chat ? "content" : NULL);
                printf("\n");
            }
        } else if (!strcmp(type, "error")) {
            final = 1;
            json_t *e = json_object_get(m, "error");
            fprintf(stderr, "tessera submit: error %d: %s\n",
                    (int)json_integer_value(json_object_get(m, "status_code")),
                    json_string_value(json_object_get(e, "message")) ? json_string_value(json_object_get(e, "message"))
                                                                     : "(no message)");
        }
        json_decref(m);
    }
    /* best effort: nanomsg may drop it on close, and the intake forgets idle clients anyway */
    send_json(out, json_pack("{s:s, s:s}", "type", "bye", "client_id", client_id), NN_DONTWAIT);
    struct timespec ts = {0, 20 * 1000 * 1000};
    nanosleep(&ts, NULL);
    if (interrupted && rc == 0) rc = 128 + interrupted;
done:
    if (out >= 0) nn_close(out);
    if (in >= 0) nn_close(in);
    if (reply_addr && !strncmp(reply_addr, "ipc://", 6)) unlink(reply_addr + 6);
    free(reply_addr);
    json_decref(body);
    fflush(stdout);
    return rc;
}
