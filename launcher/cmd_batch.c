/* tessera batch: runs an OpenAI batch input file (JSONL) through the model and writes the OpenAI batch output
 * file, one line per request, resumably.
 *
 * One thread reads the input a line at a time and submits requests to the service while at most --max-inflight
 * choices are running or queued (so memory stays bounded on huge files); the service batches them continuously.
 * Results are written as they complete (so output order is completion order; custom_id ties them to the input),
 * each as one whole line (batch_writer.c). Rerunning with the same output skips the custom_ids already written
 * there (batch_resume.c), so an interrupted run (crash, Ctrl-C, full disk) is completed exactly once by the next.
 * A bad line gets an error line and the rest still run. docs/batch.md describes the formats and the rules. */
#include "launcher/backend_select.h"
#include "launcher/batch_host.h"
#include "launcher/batch_input.h"
#include "launcher/batch_job.h"
#include "launcher/batch_progress.h"
#include "launcher/batch_resume.h"
#include "launcher/batch_writer.h"
#include "launcher/cli.h"
#include "launcher/commands.h"
#include "parallel/rank.h"

#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/stat.h>

static void usage(FILE *f)
{
    fprintf(f, "usage: tessera batch --model DIR --input IN.jsonl --output OUT.jsonl [options]\n"
               "  --device D             cpu (default), cuda or cuda:N\n"
               "  --max-running N        sequences running at once (default 256 on cuda, 64 on cpu)\n"
               "  --max-inflight N       choices submitted but not finished, at most (default 4 x max-running)\n");
    tsr_host_opts_kv_help(f);
    fprintf(f, "  --step-tokens N        tokens per step: decode rows plus prompt chunks (default 2048)\n"
               "  --prefill-chunk N      prompt tokens in a step that also decodes running requests (default 0:\n"
               "                         as many as the step leaves)\n"
               "  --served-model-name S  the model name request bodies may give (default: DIR's last component)\n"
               "  --threads N            CPU threads (default: all cores)\n"
               "  --no-prefix-cache      do not share prompt pages between requests\n"
               "  --progress             show progress even when stderr is not a terminal\n"
               "  --quiet                no progress bar and no summary\n"
               "Rerunning with the same --output completes only the requests not already in it.\n");
    tsr_par_opts_help(f);
}

static volatile sig_atomic_t interrupted;

static void on_signal(int sig)
{
    interrupted = sig;
}

/* Per request: what the output line needs besides the job. */
typedef struct item {
    char *custom_id;
    struct item *next;                      /* pending-submission list */
    struct item *prev_active, *next_active; /* every unfinished job */
    tsr_job *job;
    int cancelled; /* stopped by us: no line is written, the rerun does it */
} item;

typedef struct batch {
    tsr_host *host;
    tsr_batch_writer *w;
    tsr_batch_done done; /* results already in the output */
    tsr_idset seen;      /* custom_id -> occurrences in the input so far */
    tsr_job_queue q;
    item *pending_head, *pending_tail; /* jobs with choices left to submit */
    item *active_head;                 /* every unfinished job */
    long active;                       /* jobs not finished */
    long inflight;                     /* choices submitted and not final */
    long total, n_done, n_skipped, n_written, n_errors;
    uint64_t tokens;
    int stopping; /* a write failed or a signal came: submit nothing more */
    tsr_status write_st;
    char write_err[512];
    char server_err[600]; /* the service failed a request: the run stops, nothing is written for it */
} batch;

static void random_hex(char *out, size_t n_hex)
{
    static const char hex[] = "0123456789abcdef";
    unsigned char b[32];
    size_t n = (n_hex + 1) / 2 > sizeof b ? sizeof b : (n_hex + 1) / 2;
    if (getrandom(b, n, 0) != (ssize_t)n) {
        static uint64_t ctr = 0x9e3779b97f4a7c15ull;
        for (size_t i = 0; i < n; i++)
            b[i] = (unsigned char)((ctr += 0x9e3779b97f4a7c15ull) >> 56);
    }
    for (size_t i = 0; i < n_hex && i / 2 < n; i++)
        out[i] = hex[i % 2 ? b[i / 2] & 15 : b[i / 2] >> 4];
    out[n_hex] = '\0';
}

/* Writes one output line; a failure stops the run (remembered in b). */
static tsr_status put_line(batch *b, json_t *line)
{
    tsr_status st = TSR_OK;
    char *text = line ? json_dumps(line, JSON_COMPACT) : NULL;
    json_decref(line);
    if (!text)
        st = tsr_fail(TSR_ERR_NOMEM, "out of memory building an output line");
    else
        st = tsr_batch_writer_put(b->w, text, strlen(text));
    free(text);
    if (st != TSR_OK) {
        if (b->write_st == TSR_OK) {
            b->write_st = st;
            snprintf(b->write_err, sizeof b->write_err, "%s", tsr_last_error());
        }
        b->stopping = 1;
        return st;
    }
    b->n_written++;
    b->n_done++;
    return TSR_OK;
}

static json_t *id_or_null(const char *custom_id, size_t len)
{
    return custom_id ? json_stringn(custom_id, len) : json_null();
}

static tsr_status put_error_line(batch *b, const char *custom_id, size_t id_len, const char *code, const char *msg,
                                 long line_no)
{
    char id[48] = "batch_req_";
    random_hex(id + 10, 32);
    json_t *err = json_pack("{s:s, s:s, s:I}", "code", code, "message", msg, "line", (json_int_t)line_no);
    if (!err)
        err = json_pack("{s:s, s:s, s:I}", "code", code, "message", "(message not UTF-8)", "line", (json_int_t)line_no);
    json_t *line = json_pack("{s:s, s:o, s:n, s:o}", "id", id, "custom_id", id_or_null(custom_id, id_len), "response",
                             "error", err);
    tsr_status st = put_line(b, line);
    if (st == TSR_OK) b->n_errors++;
    return st;
}

static tsr_status put_result_line(batch *b, item *it)
{
    int status = 0;
    json_t *body = tsr_job_response(it->job, &status);
    char id[48] = "batch_req_", request_id[40];
    random_hex(id + 10, 32);
    random_hex(request_id, 32);
    json_t *line = body ? json_pack("{s:s, s:s, s:{s:i, s:s, s:o}, s:n}", "id", id, "custom_id", it->custom_id,
                                    "response", "status_code", status, "request_id", request_id, "body", body, "error")
                        : NULL;
    tsr_status st = put_line(b, line);
    if (st == TSR_OK && status != 200) b->n_errors++;
    return st;
}

static void item_free(item *it)
{
    if (!it) return;
    tsr_job_free(it->job);
    free(it->custom_id);
    free(it);
}

static void activate(batch *b, item *it)
{
    it->next_active = b->active_head;
    if (b->active_head) b->active_head->prev_active = it;
    b->active_head = it;
    b->active++;
}

/* A failure of the server rather than of the request (the executor failed or is gone, memory ran out): not a
 * result to record, since a rerun may well succeed. */
static const char *server_error(const tsr_job *j)
{
    if (j->failed) return j->err.status >= 500 ? j->err.message : NULL;
    return tsr_oai_result_error(j->res);
}

static void finish_item(batch *b, item *it)
{
    const char *err = server_error(it->job);
    if (err && !it->cancelled && !b->server_err[0]) {
        snprintf(b->server_err, sizeof b->server_err, "request %s: %s", it->custom_id, err);
        b->stopping = 1;
    } else if (!err && !it->cancelled && b->write_st == TSR_OK) {
        put_result_line(b, it);
    }
    if (it->prev_active)
        it->prev_active->next_active = it->next_active;
    else
        b->active_head = it->next_active;
    if (it->next_active) it->next_active->prev_active = it->prev_active;
    b->active--;
    item_free(it);
}

/* ---- reading and submitting ---- */

static tsr_status handle_line(batch *b, tsr_batch_line *ln)
{
    char key[32];
    tsr_idset_entry *e = NULL;
    if (!ln->custom_id) { /* unidentifiable: keyed by line number */
        int n = snprintf(key, sizeof key, "%ld", ln->line_no);
        TSR_TRY(tsr_idset_get(&b->done.lines, key, (size_t)n, 0, &e));
        if (e) {
            b->n_skipped++;
            b->n_done++;
            return TSR_OK;
        }
        return put_error_line(b, NULL, 0, ln->err_code, ln->err_msg, ln->line_no);
    }
    tsr_idset_entry *seen, *prev;
    TSR_TRY(tsr_idset_get(&b->seen, ln->custom_id, ln->custom_id_len, 1, &seen));
    int occurrence = ++seen->count;
    TSR_TRY(tsr_idset_get(&b->done.ids, ln->custom_id, ln->custom_id_len, 0, &prev));
    if (occurrence > 1) {
        if (prev && occurrence - 1 <= prev->count) {
            b->n_skipped++;
            b->n_done++;
            return TSR_OK;
        }
        char msg[256];
        snprintf(msg, sizeof msg, "line %ld repeats the custom_id of an earlier line; custom_ids must be unique",
                 ln->line_no);
        return put_error_line(b, ln->custom_id, ln->custom_id_len, "duplicate_custom_id", msg, ln->line_no);
    }
    if (prev && prev->done) {
        b->n_skipped++;
        b->n_done++;
        return TSR_OK;
    }
    if (ln->err_code)
        return put_error_line(b, ln->custom_id, ln->custom_id_len, ln->err_code, ln->err_msg, ln->line_no);

    item *it = calloc(1, sizeof *it);
    if (!it || !(it->custom_id = strndup(ln->custom_id, ln->custom_id_len))) {
        free(it);
        return tsr_fail(TSR_ERR_NOMEM, "out of memory");
    }
    tsr_oai_kind kind = ln->url == TSR_BATCH_URL_CHAT ? TSR_OAI_CHAT : TSR_OAI_COMPLETIONS;
    tsr_status st = tsr_job_new(b->host->svc, &b->q, &b->host->model, kind, ln->body, 1, &it->job);
    if (st != TSR_OK) {
        item_free(it);
        return st;
    }
    it->job->user = it;
    activate(b, it);
    if (it->job->stopped) { /* the body was refused: its error is the result */
        finish_item(b, it);
        return TSR_OK;
    }
    if (b->pending_tail)
        b->pending_tail->next = it;
    else
        b->pending_head = it;
    b->pending_tail = it;
    return TSR_OK;
}

/* Submits pending choices while there is room; returns 1 when the service was busy. */
static int pump(batch *b, long max_inflight)
{
    while (b->pending_head && b->inflight < max_inflight && !b->stopping) {
        item *it = b->pending_head;
        int busy = 0;
        b->inflight += tsr_job_pump(it->job, (int)(max_inflight - b->inflight), &busy);
        if (it->job->stopped) {
            b->pending_head = it->next;
            if (!b->pending_head) b->pending_tail = NULL;
            it->next = NULL;
            if (tsr_job_finished(it->job)) finish_item(b, it); /* refused before anything ran */
        }
        if (busy) return 1;
    }
    return 0;
}

static void apply_events(batch *b)
{
    tsr_job_event *e = tsr_job_queue_drain(&b->q);
    while (e) {
        tsr_job_event *next = tsr_job_event_next(e);
        tsr_job *j = tsr_job_event_job(e);
        int was_running = tsr_job_running(j);
        uint64_t t0 = j->tokens_out;
        if (tsr_job_apply(e, NULL) != TSR_OK)
            fprintf(stderr, "tessera batch: %s: %s\n", ((item *)j->user)->custom_id, tsr_last_error());
        b->tokens += j->tokens_out - t0;
        b->inflight -= was_running - tsr_job_running(j);
        tsr_job_event_free(e);
        if (tsr_job_finished(j)) finish_item(b, j->user);
        e = next;
    }
}

/* Cancels every unfinished job (once); their final events still come and free them. */
static void stop_all(batch *b)
{
    while (b->pending_head) { /* nothing more is submitted (unlinked first: finish_item below frees items) */
        item *it = b->pending_head;
        b->pending_head = it->next;
        it->next = NULL;
    }
    b->pending_tail = NULL;
    item *next;
    for (item *it = b->active_head; it; it = next) {
        next = it->next_active;
        if (it->cancelled) continue;
        it->cancelled = 1;
        tsr_job_cancel(it->job);
        if (tsr_job_finished(it->job)) finish_item(b, it); /* nothing was running: no event will come */
    }
}

static long count_lines(const char *path)
{
    struct stat sb;
    if (!strcmp(path, "-") || stat(path, &sb) || !S_ISREG(sb.st_mode)) return -1;
    FILE *f = fopen(path, "rb");
    if (!f) return -1;
    long n = 0;
    int c, content = 0;
    while ((c = getc(f)) != EOF) {
        if (c == '\n') {
            n += content;
            content = 0;
        } else if (c != ' ' && c != '\t' && c != '\r') {
            content = 1;
        }
    }
    n += content;
    fclose(f);
    return n;
}

static int same_file(const char *a, const char *b)
{
    struct stat sa, sb;
    return !stat(a, &sa) && !stat(b, &sb) && sa.st_dev == sb.st_dev && sa.st_ino == sb.st_ino;
}

int tsr_cmd_batch(int argc, char **argv)
{
    const char *input = NULL, *output = NULL;
    tsr_host_opts ho = {.cmd = "batch", .device = "cpu"};
    tsr_par_opts_init(&ho.par);
    long max_inflight = 0;
    int quiet = 0, progress_on = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = NULL;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            if (!tsr_rank_is_worker()) usage(stdout);
            return 0;
        }
        if (!strcmp(a, "--quiet")) {
            quiet = 1;
            continue;
        }
        if (!strcmp(a, "--progress")) {
            progress_on = 1;
            continue;
        }
        const int shared = tsr_host_opts_take(&ho, argc, argv, &i);
        if (shared < 0) return 2;
        if (shared > 0) continue;
        if (!(v = tsr_cli_value("batch", argc, argv, &i))) return 2;
        if (!strcmp(a, "--input"))
            input = v;
        else if (!strcmp(a, "--output"))
            output = v;
        else if (!strcmp(a, "--max-inflight")) {
            if (tsr_cli_int("batch", a, v, 1, 1 << 20, &max_inflight)) return 2;
        } else {
            fprintf(stderr, "tessera batch: unknown option '%s'\n", a);
            usage(stderr);
            return 2;
        }
    }
    if (!ho.model_dir || !input || !output) {
        usage(stderr);
        return 2;
    }
    if (tsr_cli_kv_size_check("batch", ho.kv_tokens, ho.kv_fraction)) return 2;
    if (!ho.max_running) ho.max_running = tsr_default_max_running(ho.device);
    if (!max_inflight) max_inflight = 4L * ho.max_running;
    if (tsr_rank_is_worker()) return tsr_host_run_worker(&ho); /* under mpirun: serve rank 0's steps */
    if (same_file(input, output)) {
        fprintf(stderr, "tessera batch: --input and --output are the same file\n");
        tsr_session_cancel("--input and --output are the same file");
        return 2;
    }

    batch b = {0};
    tsr_batch_reader *rd = NULL;
    tsr_batch_line ln = {0};
    tsr_progress pr;
    int rc = 1, queue_ok = 0, host_tried = 0;
    tsr_status st;
    if ((st = tsr_batch_reader_open(input, &rd)) != TSR_OK) {
        rc = tsr_cli_error("batch", st);
        goto done;
    }
    if ((st = tsr_batch_done_load(output, &b.done)) != TSR_OK) {
        rc = tsr_cli_error("batch", st);
        goto done;
    }
    if (b.done.dropped_bytes > 0 && !quiet)
        fprintf(stderr, "tessera batch: %s: dropping %lld bytes of an incomplete last line (an interrupted run)\n",
                output, b.done.dropped_bytes);
    if ((st = tsr_batch_writer_open(output, b.done.good_bytes, &b.w)) != TSR_OK) {
        rc = tsr_cli_error("batch", st);
        goto done;
    }
    if ((st = tsr_job_queue_init(&b.q)) != TSR_OK) {
        rc = tsr_cli_error("batch", st);
        goto done;
    }
    queue_ok = 1;
    host_tried = 1;
    if ((st = tsr_host_open(&ho, &b.host)) != TSR_OK) {
        rc = tsr_cli_error("batch", st);
        goto done;
    }
    b.total = count_lines(input);
    if (!quiet) {
        const tsr_executor *x = b.host->session->x;
        char n[32] = "input";
        if (b.total >= 0) snprintf(n, sizeof n, "%ld requests", b.total);
        fprintf(stderr, "tessera batch: %s, KV cache %ld tokens (%d pages of %d), up to %ld running\n", n,
                (long)x->n_pages * x->page_size, x->n_pages, x->page_size, (long)ho.max_running);
    }
    struct sigaction sa = {.sa_handler = on_signal};
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    tsr_progress_init(&pr, quiet ? TSR_PROGRESS_OFF : progress_on ? TSR_PROGRESS_ON : TSR_PROGRESS_AUTO, 0);

    int eof = 0;
    tsr_status fatal = TSR_OK;
    for (;;) {
        apply_events(&b);
        if (interrupted && !b.stopping) {
            b.stopping = 1;
            if (!quiet) fprintf(stderr, "\ntessera batch: interrupted; stopping (rerun to complete the rest)\n");
        }
        if (b.stopping) stop_all(&b);
        int busy = 0;
        while (!b.stopping && !busy && b.inflight < max_inflight) {
            if (b.pending_head) {
                busy = pump(&b, max_inflight);
                continue;
            }
            if (eof) break;
            if ((st = tsr_batch_reader_next(rd, &ln, &eof)) != TSR_OK) {
                fatal = st;
                b.stopping = 1;
                break;
            }
            if (eof) break;
            if ((st = handle_line(&b, &ln)) != TSR_OK && !b.stopping) {
                fatal = st;
                b.stopping = 1;
            }
            tsr_batch_line_clear(&ln);
        }
        tsr_progress_update(&pr, b.n_done, b.total, b.tokens, 0);
        if ((eof || b.stopping) && b.active == 0) break;
        if (b.stopping) stop_all(&b);
        tsr_job_queue_wait(&b.q, busy ? 0.01 : 0.1);
    }
    tsr_progress_finish(&pr, b.n_done, b.total, b.tokens);
    tsr_status cst = tsr_batch_writer_close(b.w);
    b.w = NULL;
    if (cst != TSR_OK && b.write_st == TSR_OK) {
        b.write_st = cst;
        snprintf(b.write_err, sizeof b.write_err, "%s", tsr_last_error());
    }
    if (!quiet) {
        char stats[512];
        tsr_host_stats_line(b.host, stats, sizeof stats);
        fprintf(stderr,
                "tessera batch: stats lines_done=%ld written=%ld skipped=%ld errors=%ld generated_tokens=%llu %s\n",
                b.n_done, b.n_written, b.n_skipped, b.n_errors, (unsigned long long)b.tokens, stats);
    }
    if (b.write_st != TSR_OK) {
        fprintf(stderr,
                "tessera batch: %s: %s\ntessera batch: %ld results were written whole; rerun the same "
                "command to complete the rest\n",
                tsr_status_str(b.write_st), b.write_err, b.n_written);
        rc = 1;
    } else if (b.server_err[0]) {
        fprintf(stderr,
                "tessera batch: the model failed (%s)\ntessera batch: %ld results were written; rerun the "
                "same command to complete the rest\n",
                b.server_err, b.n_written);
        rc = 1;
    } else if (fatal != TSR_OK) {
        rc = tsr_cli_error("batch", fatal);
    } else if (interrupted) {
        rc = 128 + interrupted;
    } else {
        rc = 0;
    }
done:
    if (!host_tried) tsr_session_cancel("tessera batch failed before the model was opened");
    tsr_batch_line_clear(&ln);
    tsr_host_close(b.host, 0);
    if (queue_ok) tsr_job_queue_destroy(&b.q);
    tsr_batch_writer_close(b.w);
    tsr_batch_reader_close(rd);
    tsr_batch_done_free(&b.done);
    tsr_idset_free(&b.seen);
    return rc;
}
