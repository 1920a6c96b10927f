/* The stderr progress bar (see batch_progress.h). */
#include "launcher/batch_progress.h"

#include <stdio.h>
#include <string.h>
#include <sys/ioctl.h>
#include <time.h>
#include <unistd.h>

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

void tsr_progress_init(tsr_progress *p, tsr_progress_mode mode, long done0)
{
    memset(p, 0, sizeof *p);
    p->tty = isatty(STDERR_FILENO);
    p->enabled = mode == TSR_PROGRESS_ON || (mode == TSR_PROGRESS_AUTO && p->tty);
    p->t0 = now_s();
    p->done0 = done0;
    p->last_decile = -1;
}

static void fmt_time(char *buf, size_t cap, double s)
{
    if (s < 0 || s > 1e8) {
        snprintf(buf, cap, "--");
        return;
    }
    long t = (long)(s + 0.5);
    if (t >= 3600)
        snprintf(buf, cap, "%ldh%02ldm", t / 3600, t / 60 % 60);
    else if (t >= 60)
        snprintf(buf, cap, "%ldm%02lds", t / 60, t % 60);
    else
        snprintf(buf, cap, "%lds", t);
}

/* The text after the bar: "123/456 requests  789.0 tok/s  ETA 1m02s". */
static void describe(const tsr_progress *p, long done, long total, uint64_t tokens, double now, char *buf, size_t cap)
{
    double dt = now - p->t0;
    double tps = dt > 0 ? (double)tokens / dt : 0;
    double rps = dt > 0 ? (double)(done - p->done0) / dt : 0;
    char eta[32] = "--", el[32];
    if (total >= 0 && rps > 0) fmt_time(eta, sizeof eta, (double)(total - done) / rps);
    fmt_time(el, sizeof el, dt);
    if (total >= 0)
        snprintf(buf, cap, "%ld/%ld requests  %.1f tok/s  %s elapsed  ETA %s", done, total, tps, el, eta);
    else
        snprintf(buf, cap, "%ld requests  %.1f tok/s  %s elapsed", done, tps, el);
}

static int term_width(void)
{
    struct winsize ws;
    if (ioctl(STDERR_FILENO, TIOCGWINSZ, &ws) == 0 && ws.ws_col >= 20) return ws.ws_col;
    return 80;
}

static void draw(tsr_progress *p, long done, long total, uint64_t tokens, double now)
{
    char text[160], bar[512];
    describe(p, done, total, tokens, now, text, sizeof text);
    int width = term_width() - (int)strlen(text) - 4;
    if (width > (int)sizeof bar - 1) width = (int)sizeof bar - 1;
    if (total > 0 && width >= 10) {
        int fill = (int)((double)width * (double)done / (double)total);
        if (fill > width) fill = width;
        for (int i = 0; i < width; i++)
            bar[i] = i < fill ? '=' : (i == fill ? '>' : ' ');
        bar[width] = '\0';
        fprintf(stderr, "\r[%s] %s", bar, text);
    } else {
        fprintf(stderr, "\r%s\033[K", text);
    }
    fflush(stderr);
    p->drawn = 1;
}

void tsr_progress_update(tsr_progress *p, long done, long total, uint64_t tokens, int force)
{
    if (!p->enabled) return;
    double now = now_s();
    if (p->tty) {
        if (!force && now - p->last_draw < 0.1) return;
        p->last_draw = now;
        draw(p, done, total, tokens, now);
        return;
    }
    if (total <= 0) return;
    int decile = (int)(10 * done / total);
    if (decile <= p->last_decile && !force) return;
    p->last_decile = decile;
    char text[160];
    describe(p, done, total, tokens, now, text, sizeof text);
    fprintf(stderr, "tessera batch: %d%% %s\n", decile * 10, text);
}

void tsr_progress_finish(tsr_progress *p, long done, long total, uint64_t tokens)
{
    if (!p->enabled) return;
    if (p->tty) {
        draw(p, done, total, tokens, now_s());
        fputc('\n', stderr);
        p->drawn = 0;
    } else if (total <= 0 || 10 * done / total > p->last_decile) {
        tsr_progress_update(p, done, total, tokens, 1);
    }
}
