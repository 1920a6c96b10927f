/* tessera serve: an OpenAI-compatible HTTP server over one model (the coordinator's front door).
 *
 * The model runs through a session (parallel/session.h): in this process, or under mpirun with this rank (0) as
 * the coordinator and the other ranks as workers, which only execute step plans; everything below happens on
 * rank 0, and a worker rank just serves steps until the coordinator shuts it down. mpirun turns SIGINT/SIGTERM
 * into killing the whole job, but forwards SIGUSR1 to every rank: SIGUSR1 to mpirun (or SIGTERM to rank 0) is the
 * graceful stop of a multi-rank server; workers ignore SIGUSR1 and leave when the coordinator tells them.
 *
 * Order of things: SIGINT, SIGTERM and SIGUSR1 are caught (see below) and SIGPIPE is ignored. The gateway starts
 * listening at once, so /health answers 503 "loading" while the tokenizer, the chat template and the model load; then
 * the executor and the service loop start and the gateway turns ready. A signal during loading exits at once (0:
 * nothing was in flight). A signal once ready: the gateway stops accepting, the service lets running requests finish
 * for up to --grace seconds and cancels the rest (each client gets its answer or the end of its stream), the gateway
 * waits for the answers to go out, and the process exits 0. Further signals during the grace period do not shorten it;
 * the grace period is the bound. */
#include "launcher/backend_select.h"
#include "launcher/cli.h"
#include "launcher/commands.h"
#include "launcher/http_server.h"
#include "launcher/intake_nn.h"
#include "launcher/openai.h"
#include "parallel/rank.h"
#include "parallel/session.h"
#include "runtime/executor.h"
#include "runtime/sched/scheduler.h"
#include "runtime/service.h"
#include "runtime/text/chat_template.h"
#include "runtime/text/tokenizer.h"

#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define MAX_KEYS 16

static void usage(FILE *f)
{
    fprintf(f,
            "usage: tessera serve --model DIR [options]\n"
            "  --host ADDR             address to bind (default 127.0.0.1)\n"
            "  --port N                TCP port (default 8000; 0 = any free port)\n"
            "  --device D              cpu (default), cuda or cuda:N\n"
            "  --threads N             CPU threads for the model (default: all cores)\n"
            "  --served-model-name S   the model name clients use (default: the folder's name)\n"
            "  --chat-template PATH    a Jinja chat template file (default: the model's tokenizer_config.json)\n"
            "  --allow-any-host        on a loopback address, also answer requests for other host names (by\n"
            "                          default those get 403, against DNS rebinding)\n"
            "  --api-key KEY           require 'Authorization: Bearer KEY' on /v1/... (repeatable; also\n"
            "                          TESSERA_API_KEY)\n"
            "  --max-running N         sequences decoding at once (default 256 on cuda, 64 on cpu)\n"
            "  --max-waiting N         queued requests before 429 (default 1024)\n"
            "  --kv-tokens N           KV cache size in tokens (default: one full context, or GPU memory)\n"
            "  --kv-fraction F         with no --kv-tokens: the cache's share of the GPU memory the weights and\n"
            "                          workspace leave (default 0.9; 0.95 under a --gpu-memory plan; on the CPU only\n"
            "                          with --gpu-memory)\n"
            "  --kv-dtype D            f16 (default), q4, q6 or q8 (quantized: 2-3.5x the tokens), f32\n"
            "  --max-context N         the longest sequence served, prompt and output (default: the model's\n"
            "                          context); sizes the KV cache's default and longer requests get 400\n"
            "  --step-tokens N         tokens per step: decode rows plus prompt chunks (default 2048)\n"
            "  --prefill-chunk N       prompt tokens in a step that also decodes running streams, which wait for\n"
            "                          the whole step (default 1024; 0: as many as --step-tokens leaves)\n"
            "  --max-body BYTES        largest request body (default 8388608)\n"
            "  --max-header BYTES      memory per connection for the request line and headers (default 65536)\n"
            "  --max-connections N     simultaneous connections (default: the open-file limit less 256)\n"
            "  --max-connections-per-ip N  simultaneous connections from one address (default 0: no limit)\n"
            "  --conn-timeout SECONDS  close a connection after this long without a byte moving (default 60;\n"
            "                          --timeout is the same)\n"
            "  --header-timeout SECONDS  time a connection has to send a request's headers (default 30)\n"
            "  --stream-backlog BYTES  events a stream may queue for a client that does not read before it is\n"
            "                          cancelled and closed (default 1048576)\n"
            "  --http-threads N        HTTP threads (default 2)\n"
            "  --grace SECONDS         on SIGTERM/SIGINT, time left to running requests (default 30)\n"
            "  --intake ADDR           also take requests over nanomsg at ipc:///path or tcp://host:port\n"
            "                          (docs/intake.md; its requests are cancelled, not drained, at shutdown)\n");
    tsr_par_opts_help(f);
}

/* Signals: the handler only writes the signal number into a pipe (async-signal-safe, and it works whichever
 * thread the signal lands on: MPI's threads do not share our signal mask); the signal thread reads it and either
 * exits (still loading) or wakes the main thread, which then shuts down gracefully. */
static struct {
    pthread_mutex_t mu;
    pthread_cond_t cond;
    int pipe[2];
    int ready, signo;
} sig_state = {.mu = PTHREAD_MUTEX_INITIALIZER, .cond = PTHREAD_COND_INITIALIZER, .pipe = {-1, -1}};

static void on_signal(int signo)
{
    int saved = errno;
    unsigned char b = (unsigned char)signo;
    ssize_t w = write(sig_state.pipe[1], &b, 1);
    (void)w;
    errno = saved;
}

static const char *sig_name(int signo)
{
    return signo == SIGINT ? "SIGINT" : signo == SIGTERM ? "SIGTERM" : "SIGUSR1";
}

static void *signal_main(void *arg)
{
    (void)arg;
    for (;;) {
        unsigned char b;
        ssize_t n = read(sig_state.pipe[0], &b, 1);
        if (n != 1) {
            if (n < 0 && errno == EINTR) continue;
            return NULL;
        }
        pthread_mutex_lock(&sig_state.mu);
        if (!sig_state.ready) {
            fprintf(stderr, "tessera serve: %s while loading: exiting\n", sig_name(b));
            _exit(0);
        }
        if (!sig_state.signo) sig_state.signo = b;
        pthread_cond_signal(&sig_state.cond);
        pthread_mutex_unlock(&sig_state.mu);
    }
}

static int catch_signals(void)
{
    if (pipe(sig_state.pipe) != 0) return -1;
    pthread_t t;
    if (pthread_create(&t, NULL, signal_main, NULL) != 0) return -1;
    pthread_detach(t);
    struct sigaction sa = {0};
    sa.sa_handler = on_signal;
    sa.sa_flags = SA_RESTART;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGUSR1, &sa, NULL);
    signal(SIGPIPE, SIG_IGN);
    return 0;
}

/* Everything serve opens, closed in reverse by close_all(). */
typedef struct serve_state {
    tsr_http *http;
    tsr_tokenizer *tok;
    tsr_chat_template *tpl;
    char *bos, *eos;
    tsr_session *session;
    tsr_executor *x;          /* the session's */
    tsr_service *svc;
    int32_t eos_ids[64];
    char name[256];
    tsr_oai_model model;
} serve_state;

static void close_all(serve_state *s)
{
    tsr_http_stop(s->http);
    tsr_session_close(s->session);
    tsr_chat_template_free(s->tpl);
    tsr_tokenizer_free(s->tok);
    free(s->bos);
    free(s->eos);
}

static tsr_status read_file(const char *path, char **out)
{
    FILE *f = fopen(path, "rb");
    if (!f) return tsr_fail(TSR_ERR_IO, "cannot open %s", path);
    size_t cap = 4096, len = 0;
    char *buf = malloc(cap);
    size_t n;
    while (buf && (n = fread(buf + len, 1, cap - len - 1, f)) > 0) {
        len += n;
        if (len + 1 == cap) {
            char *b = realloc(buf, cap * 2);
            if (!b) free(buf);
            buf = b;
            cap *= 2;
        }
    }
    int err = ferror(f);
    fclose(f);
    if (!buf) return tsr_fail(TSR_ERR_NOMEM, "out of memory reading %s", path);
    if (err) {
        free(buf);
        return tsr_fail(TSR_ERR_IO, "cannot read %s", path);
    }
    buf[len] = 0;
    *out = buf;
    return TSR_OK;
}

static tsr_status load_template(serve_state *s, const char *model_dir, const char *path)
{
    if (path) {
        char *src = NULL;
        TSR_TRY(read_file(path, &src));
        tsr_status st = tsr_chat_template_parse(src, &s->tpl);
        free(src);
        if (st != TSR_OK) return tsr_fail_context(st, "%s", path);
        const char *b = tsr_tokenizer_bos_token(s->tok), *e = tsr_tokenizer_eos_token(s->tok);
        if ((b && !(s->bos = strdup(b))) || (e && !(s->eos = strdup(e))))
            return tsr_fail(TSR_ERR_NOMEM, "out of memory");
        return TSR_OK;
    }
    tsr_status st = tsr_chat_template_load_dir(model_dir, 0, &s->tpl, &s->bos, &s->eos);
    if (st == TSR_ERR_MISSING) {
        fprintf(stderr, "tessera serve: %s has no chat template; /v1/chat/completions will answer 400 (give one "
                        "with --chat-template)\n", model_dir);
        s->tpl = NULL;
        return TSR_OK;
    }
    return st;
}

static void model_name(const char *dir, char *out, size_t cap)
{
    size_t n = strlen(dir);
    while (n > 1 && dir[n - 1] == '/') n--;
    size_t b = n;
    while (b > 0 && dir[b - 1] != '/') b--;
    snprintf(out, cap, "%.*s", (int)(n - b), dir + b);
}

static void describe_eos(serve_state *s)
{
    const tsr_model_config *c = &s->session->cfg;
    int n = 0;
    for (int i = 0; i < c->n_eos && n < 63; i++) s->eos_ids[n++] = c->eos_ids[i];
    const char *eos = s->eos ? s->eos : tsr_tokenizer_eos_token(s->tok);
    int32_t id = eos ? tsr_tokenizer_token_id(s->tok, eos) : -1;
    int seen = 0;
    for (int i = 0; i < n; i++) seen |= s->eos_ids[i] == id;
    if (id >= 0 && id < c->vocab_size && !seen) s->eos_ids[n++] = id;
    s->model.eos_ids = s->eos_ids;
    s->model.n_eos = n;
}

int tsr_cmd_serve(int argc, char **argv)
{
    const char *model_dir = NULL, *device = "cpu", *tpl_path = NULL, *served = NULL, *keys[MAX_KEYS];
    int n_keys = 0;
    long port = 8000, threads = 0, max_running = 0, max_waiting = 1024, kv_tokens = 0, max_body = 8 << 20;
    double kv_fraction = 0;
    long max_context = 0;
    tsr_dtype kv_dtype = TSR_F16;
    long step_tokens = 0, prefill_chunk = TSR_PREFILL_CHUNK_DEFAULT;
    long max_conns = 0, per_ip = 0, timeout = 60, header_timeout = 30, http_threads = 2;
    long max_header = 64 << 10, backlog = 1 << 20;
    double grace = 30;
    const char *intake_addr = NULL;
    tsr_intake *intake = NULL;
    tsr_http_opts ho = {.host = "127.0.0.1"};
    tsr_par_opts po;
    tsr_par_opts_init(&po);
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v;
        if (!strcmp(a, "--allow-any-host")) {
            ho.allow_any_host = 1;
            continue;
        }
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            if (!tsr_rank_is_worker()) usage(stdout);
            return 0;
        }
        int par = tsr_par_opts_take("serve", &po, argc, argv, &i);
        if (par < 0) return 2;
        if (par > 0) continue;
        if (!(v = tsr_cli_value("serve", argc, argv, &i))) return 2;
        if (!strcmp(a, "--model")) model_dir = v;
        else if (!strcmp(a, "--host")) ho.host = v;
        else if (!strcmp(a, "--device")) device = v;
        else if (!strcmp(a, "--chat-template")) tpl_path = v;
        else if (!strcmp(a, "--served-model-name")) served = v;
        else if (!strcmp(a, "--intake")) intake_addr = v;
        else if (!strcmp(a, "--api-key")) {
            if (n_keys == MAX_KEYS || !*v) {
                fprintf(stderr, "tessera serve: --api-key: at most %d non-empty keys\n", MAX_KEYS);
                return 2;
            }
            keys[n_keys++] = v;
        } else if (!strcmp(a, "--port")) {
            if (tsr_cli_int("serve", a, v, 0, 65535, &port)) return 2;
        } else if (!strcmp(a, "--threads")) {
            if (tsr_cli_int("serve", a, v, 1, 1024, &threads)) return 2;
        } else if (!strcmp(a, "--max-running")) {
            if (tsr_cli_int("serve", a, v, 1, 1 << 20, &max_running)) return 2;
        } else if (!strcmp(a, "--max-waiting")) {
            if (tsr_cli_int("serve", a, v, 1, 1 << 24, &max_waiting)) return 2;
        } else if (!strcmp(a, "--kv-tokens")) {
            if (tsr_cli_int("serve", a, v, 16, 1L << 30, &kv_tokens)) return 2;
        } else if (!strcmp(a, "--max-context")) {
            if (tsr_cli_int("serve", a, v, 16, 1L << 30, &max_context)) return 2;
        } else if (!strcmp(a, "--kv-fraction")) {
            if (tsr_cli_kv_fraction("serve", v, &kv_fraction)) return 2;
        } else if (!strcmp(a, "--kv-dtype")) {
            if (tsr_cli_kv_dtype("serve", v, &kv_dtype)) return 2;
        } else if (!strcmp(a, "--step-tokens")) {
            if (tsr_cli_int("serve", a, v, 1, 1 << 20, &step_tokens)) return 2;
        } else if (!strcmp(a, "--prefill-chunk")) {
            if (tsr_cli_int("serve", a, v, 0, 1 << 20, &prefill_chunk)) return 2;
        } else if (!strcmp(a, "--max-body")) {
            if (tsr_cli_int("serve", a, v, 64, 1L << 30, &max_body)) return 2;
        } else if (!strcmp(a, "--max-header")) {
            if (tsr_cli_int("serve", a, v, 16 << 10, 16 << 20, &max_header)) return 2;
        } else if (!strcmp(a, "--max-connections")) {
            if (tsr_cli_int("serve", a, v, 1, 1 << 20, &max_conns)) return 2;
        } else if (!strcmp(a, "--max-connections-per-ip")) {
            if (tsr_cli_int("serve", a, v, 0, 1 << 20, &per_ip)) return 2;
        } else if (!strcmp(a, "--conn-timeout") || !strcmp(a, "--timeout")) {
            if (tsr_cli_int("serve", a, v, 1, 1L << 20, &timeout)) return 2;
        } else if (!strcmp(a, "--header-timeout")) {
            if (tsr_cli_int("serve", a, v, 1, 1L << 20, &header_timeout)) return 2;
        } else if (!strcmp(a, "--stream-backlog")) {
            if (tsr_cli_int("serve", a, v, 4096, 1L << 30, &backlog)) return 2;
        } else if (!strcmp(a, "--http-threads")) {
            if (tsr_cli_int("serve", a, v, 1, 256, &http_threads)) return 2;
        } else if (!strcmp(a, "--grace")) {
            if (tsr_cli_float("serve", a, v, 0, 86400, &grace)) return 2;
        } else {
            fprintf(stderr, "tessera serve: unknown option '%s'\n", a);
            usage(stderr);
            return 2;
        }
    }
    if (!model_dir) {
        usage(stderr);
        return 2;
    }
    if (tsr_cli_kv_size_check("serve", kv_tokens, kv_fraction)) return 2;
    if (!max_running) max_running = tsr_default_max_running(device);
    tsr_session_req req = {.cmd = "serve", .model_dir = model_dir, .device = device,
                           .select_backend = tsr_select_backend, .threads = (int)threads,
                           .max_tokens = (int)step_tokens, .kv_dtype = kv_dtype, .kv_tokens = kv_tokens,
                           .kv_fraction = kv_fraction, .max_context = max_context};
    if (tsr_rank_is_worker()) {
        /* a worker rank: execute the coordinator's steps until it shuts us down; SIGUSR1 (which mpirun forwards
         * to every rank) is the coordinator's cue to shut down gracefully, not ours */
        signal(SIGUSR1, SIG_IGN);
        tsr_session *ws = NULL;
        tsr_status wst = tsr_session_open(&req, &po, &ws);
        if (wst != TSR_OK) return tsr_cli_error("serve", wst);
        int rc = ws->worker_rc;
        tsr_session_close(ws);
        return rc;
    }
    const char *env_key = getenv("TESSERA_API_KEY");
    if (env_key && *env_key && n_keys < MAX_KEYS) keys[n_keys++] = env_key;
    ho.port = (int)port;
    ho.api_keys = keys;
    ho.n_api_keys = n_keys;
    ho.max_body = (size_t)max_body;
    ho.max_header = (size_t)max_header;
    ho.conn_limit = (unsigned)max_conns;
    ho.per_ip_limit = (unsigned)per_ip;
    ho.conn_timeout_s = (unsigned)timeout;
    ho.header_timeout_s = (unsigned)header_timeout;
    ho.stream_backlog = (size_t)backlog;
    ho.threads = (unsigned)http_threads;

    if (catch_signals() != 0) {
        tsr_session_cancel("the coordinator cannot set up its signal handling");
        fprintf(stderr, "tessera serve: cannot set up signal handling\n");
        return 1;
    }

    long fds = tsr_http_raise_fd_limit(); /* many idle clients are cheap; running out of descriptors is not */
    ho.conn_limit = tsr_http_conn_limit(ho.conn_limit);
    serve_state s = {0};
    tsr_status st = tsr_http_start(&ho, &s.http);
    if (st != TSR_OK) {
        tsr_session_cancel("the coordinator cannot listen");
        return tsr_cli_error("serve", st);
    }
    fprintf(stderr, "tessera serve: listening on http://%s%s%s:%d (loading %s)\n", strchr(ho.host, ':') ? "[" : "",
            ho.host, strchr(ho.host, ':') ? "]" : "", tsr_http_port(s.http), model_dir);
    fprintf(stderr, "tessera serve: limits: %u connections (open files %ld), %ld per address, %ld s idle, %ld s "
                    "for headers, %ld header bytes, %ld body bytes, %ld bytes of stream backlog\n",
            ho.conn_limit, fds, per_ip, timeout,
            header_timeout < timeout ? header_timeout : timeout, max_header, max_body, backlog);

    if ((st = tsr_tokenizer_load(model_dir, &s.tok)) != TSR_OK || (st = load_template(&s, model_dir, tpl_path))) {
        tsr_session_cancel("the coordinator cannot load the tokenizer or the chat template");
        close_all(&s);
        return tsr_cli_error("serve", st);
    }
    if ((st = tsr_session_open(&req, &po, &s.session)) != TSR_OK) {
        close_all(&s);
        return tsr_cli_error("serve", st);
    }
    s.x = s.session->x;
    tsr_service_opts so = {.sched = {.max_running = (int)max_running,
                                     .max_waiting = (int)max_waiting,
                                     .max_prefill_decoding = (int)prefill_chunk}};
    if ((st = tsr_service_start(s.x, s.tok, &so, &s.svc)) != TSR_OK) {
        close_all(&s);
        return tsr_cli_error("serve", st);
    }
    if (served) snprintf(s.name, sizeof s.name, "%s", served);
    else model_name(model_dir, s.name, sizeof s.name);
    s.model = (tsr_oai_model){.name = s.name, .tok = s.tok, .tpl = s.tpl, .bos_token = s.bos, .eos_token = s.eos,
                              .vocab = s.x->vocab, .max_context = s.x->max_context, .created = (int64_t)time(NULL)};
    describe_eos(&s);
    if (intake_addr && (st = tsr_intake_start(s.svc, &s.model, intake_addr, NULL, &intake)) != TSR_OK) {
        int rc = tsr_cli_error("serve", st);
        tsr_service_stop(s.svc, 0);
        s.svc = NULL;
        close_all(&s);
        return rc;
    }
    tsr_http_set_ready(s.http, &s.model, s.svc);
    char dev[256] = "";
    if (s.session->engine) tsr_backend_describe(s.session->engine->ops, dev, sizeof dev);
    else snprintf(dev, sizeof dev, "%s workers", device);
    fprintf(stderr,
            "tessera serve: ready: model '%s' (%s), context %d, KV cache %d pages of %d tokens (%s), up to %ld "
            "running%s\n",
            s.name, dev, s.x->max_context, s.x->n_pages, s.x->page_size, tsr_kv_dtype_name(kv_dtype), max_running,
            n_keys ? ", API keys required" : "");
    if (intake) fprintf(stderr, "tessera serve: nanomsg intake on %s\n", intake_addr);

    pthread_mutex_lock(&sig_state.mu);
    sig_state.ready = 1;
    while (!sig_state.signo) pthread_cond_wait(&sig_state.cond, &sig_state.mu);
    int sig = sig_state.signo;
    pthread_mutex_unlock(&sig_state.mu);
    fprintf(stderr, "tessera serve: %s: stopping (grace %g s)\n", sig_name(sig), grace);
    tsr_http_drain(s.http);
    if (intake) tsr_intake_stop(intake); /* before the service goes: it cancels the intake's requests */
    tsr_service_stop(s.svc, grace);
    int left = tsr_http_wait_idle(s.http, 5.0);
    if (left) fprintf(stderr, "tessera serve: %d responses were still being written; closing them\n", left);
    close_all(&s);
    fprintf(stderr, "tessera serve: stopped\n");
    return 0;
}
