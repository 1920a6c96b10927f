/* tessera intake: serves a model on a nanomsg address only (no HTTP), for gateways and for testing the intake on
 * its own; `tessera serve --intake ADDR` runs the same intake next to the HTTP server. Runs until SIGINT or
 * SIGTERM, then stops the intake (clients with running requests get a "shutdown" error) and the service. */
#include "launcher/backend_select.h"
#include "launcher/batch_host.h"
#include "launcher/cli.h"
#include "launcher/commands.h"
#include "parallel/rank.h"
#include "launcher/intake_nn.h"
#include "runtime/sched/scheduler.h"

#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

static void usage(FILE *f)
{
    fprintf(f, "usage: tessera intake --model DIR --listen ADDR [options]\n"
               "  --listen ADDR          ipc:///path or tcp://host:port (docs/intake.md)\n"
               "  --device D             cpu (default), cuda or cuda:N\n"
               "  --max-running N        sequences running at once (default 256 on cuda, 64 on cpu)\n");
    tsr_host_opts_kv_help(f);
    fprintf(f, "  --step-tokens N        tokens per step: decode rows plus prompt chunks (default 2048)\n"
               "  --prefill-chunk N      prompt tokens in a step that also decodes running requests (default 1024;\n"
               "                         0: as many as the step leaves)\n"
               "  --served-model-name S  the model name request bodies may give (default: DIR's last component)\n"
               "  --threads N            CPU threads (default: all cores)\n"
               "  --no-prefix-cache      do not share prompt pages between requests\n"
               "  --client-timeout S     seconds of silence after which a client with requests is gone (default 15)\n"
               "  --send-timeout S       seconds a reply may stay undeliverable before its client is gone (default 5)\n"
               "  --verbose              log clients coming and going\n");
    tsr_par_opts_help(f);
}

static volatile sig_atomic_t stop_signal;

static void on_signal(int sig)
{
    stop_signal = sig;
}

int tsr_cmd_intake(int argc, char **argv)
{
    tsr_host_opts ho = {.cmd = "intake", .device = "cpu", .prefill_chunk = TSR_PREFILL_CHUNK_DEFAULT};
    tsr_par_opts_init(&ho.par);
    tsr_intake_opts io = {0};
    const char *listen = NULL;
    double client_timeout = 15, send_timeout = 5;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = NULL;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            if (!tsr_rank_is_worker()) usage(stdout);
            return 0;
        }
        if (!strcmp(a, "--verbose")) {
            io.verbose = 1;
            continue;
        }
        const int shared = tsr_host_opts_take(&ho, argc, argv, &i);
        if (shared < 0) return 2;
        if (shared > 0) continue;
        if (!(v = tsr_cli_value("intake", argc, argv, &i))) return 2;
        if (!strcmp(a, "--listen"))
            listen = v;
        else if (!strcmp(a, "--client-timeout")) {
            if (tsr_cli_float("intake", a, v, 0.1, 86400, &client_timeout)) return 2;
        } else if (!strcmp(a, "--send-timeout")) {
            if (tsr_cli_float("intake", a, v, 0.1, 86400, &send_timeout)) return 2;
        } else {
            fprintf(stderr, "tessera intake: unknown option '%s'\n", a);
            usage(stderr);
            return 2;
        }
    }
    if (!ho.max_running) ho.max_running = tsr_default_max_running(ho.device);
    if (!ho.model_dir || !listen) {
        usage(stderr);
        return 2;
    }
    if (tsr_cli_kv_size_check("intake", ho.kv_tokens, ho.kv_fraction)) return 2;
    io.client_timeout_s = client_timeout;
    io.send_timeout_s = send_timeout;
    if (tsr_rank_is_worker()) return tsr_host_run_worker(&ho); /* under mpirun: serve rank 0's steps */

    struct sigaction sa = {.sa_handler = on_signal};
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    signal(SIGPIPE, SIG_IGN);

    tsr_host *h = NULL;
    tsr_intake *in = NULL;
    tsr_status st = tsr_host_open(&ho, &h);
    if (st != TSR_OK) return tsr_cli_error("intake", st);
    if ((st = tsr_intake_start(h->svc, &h->model, listen, &io, &in)) != TSR_OK) {
        tsr_host_close(h, 0);
        return tsr_cli_error("intake", st);
    }
    const tsr_executor *x = h->session->x;
    fprintf(stderr, "tessera intake: serving %s on %s (KV cache %ld tokens, up to %ld running)\n", h->model.name,
            listen, (long)x->n_pages * x->page_size, (long)ho.max_running);
    while (!stop_signal) {
        struct timespec ts = {0, 100 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
    fprintf(stderr, "tessera intake: stopping\n");
    tsr_intake_stats s;
    tsr_intake_get_stats(in, &s);
    tsr_intake_stop(in);
    char stats[512];
    tsr_host_stats_line(h, stats, sizeof stats);
    fprintf(stderr,
            "tessera intake: stats messages=%llu bad_messages=%llu requests=%llu done=%llu failed=%llu "
            "clients_vanished=%llu cancelled_vanished=%llu %s\n",
            (unsigned long long)s.messages, (unsigned long long)s.bad_messages, (unsigned long long)s.requests,
            (unsigned long long)s.requests_done, (unsigned long long)s.requests_failed,
            (unsigned long long)s.clients_vanished, (unsigned long long)s.requests_cancelled_vanished, stats);
    tsr_host_close(h, 0);
    return 0;
}
