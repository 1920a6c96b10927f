/* The kernel trace's host half (diagnostic builds only: CMake -DTSR_CUDA_TRACE=ON; the device half: trace.cuh).
 *
 * While a decode step's graph is recorded, every kernel launched through launch.cuh is noted here with its name and
 * grid. Each later replay of that graph runs alone between two synchronizations, so the events its kernels note in
 * the ring are exactly its own, in launch order; a replay whose events do not match the recorded grids one for one
 * is counted and left out. For each position in the step the trace keeps the time from that kernel's release to the
 * next kernel's release, and at exit it prints their means per position (TSR_CUDA_TRACE=1) and, for both values,
 * a summary by kernel name: what each kind of kernel costs a step. The synchronizations cost host time between
 * replays, not device time inside them, so the figures are those of a normal replay; tokens per second reported
 * by the same run are lower than a normal build's. */
#include "kernels/cuda/cuda_common.cuh"
#include "kernels/cuda/trace.cuh"

#include <algorithm>
#include <cxxabi.h>
#include <map>
#include <string>
#include <string.h>
#include <vector>

#define TRACE_MAX_UNITS 64

static void (*g_binds[TRACE_MAX_UNITS])(tsr_trace_ring *); /* zero-initialized before any registration runs */
static int g_n_binds;

int tsr_trace_register(void (*bind)(tsr_trace_ring *ring))
{
    if (g_n_binds == TRACE_MAX_UNITS) {
        fprintf(stderr, "tessera: kernel trace: more than %d translation units\n", TRACE_MAX_UNITS);
        abort();
    }
    g_binds[g_n_binds++] = bind;
    return g_n_binds;
}

struct trace_kernel {
    const void *kernel; /* its name is asked for at exit, not while a graph is recorded */
    unsigned grid[3];
};

struct trace_graph {
    std::vector<trace_kernel> kernels;
    std::vector<double> sum_us; /* per position: release to the next release, summed over the matching replays */
    long replays = 0, mismatched = 0;
    double span_us = 0; /* first release to last, summed */
};

static int g_mode = -1; /* 0 off, 1 per kernel and summary, 2 summary */
static tsr_trace_ring *g_ring;
static std::map<unsigned long long, trace_graph> g_traced;
static trace_graph *g_recording;
static std::vector<tsr_trace_event> g_events;

static int trace_mode(void)
{
    if (g_mode < 0) {
        const char *v = getenv("TSR_CUDA_TRACE");
        g_mode = v && *v ? atoi(v) : 0;
        if (g_mode != 0 && g_mode != 1 && g_mode != 2) g_mode = 1;
    }
    return g_mode;
}

int tsr_trace_active(void) { return g_ring != NULL; }

/* The kernel's name without its parameter list (templates keep their arguments), at most 72 characters. */
static std::string kernel_name(const void *kernel)
{
    const char *mangled = NULL;
    if (cudaFuncGetName(&mangled, kernel) != cudaSuccess || !mangled) return "?";
    int status = 0;
    char *plain = abi::__cxa_demangle(mangled, NULL, NULL, &status);
    std::string s = status == 0 && plain ? plain : mangled;
    free(plain);
    int depth = 0;
    for (size_t i = 0; i < s.size(); i++) {
        if (s[i] == '<') depth++;
        if (s[i] == '>') depth--;
        if (s[i] == '(' && depth == 0) {
            s.resize(i);
            break;
        }
    }
    if (s.size() > 72) s = s.substr(0, 69) + "...";
    return s;
}

static void report(void)
{
    for (auto &kv : g_traced) {
        trace_graph &g = kv.second;
        const size_t n = g.kernels.size();
        if (!g.replays || n < 2) continue;
        fprintf(stderr, "kernel trace: graph %016llx: %zu kernels, %ld replays (%ld more did not match), %.1f us from "
                        "the first release to the last\n",
                kv.first, n, g.replays, g.mismatched, g.span_us / g.replays);
        std::map<std::string, std::pair<int, double>> by_name; /* count per step, µs per step */
        for (size_t i = 0; i + 1 < n; i++) {
            const double us = g.sum_us[i] / g.replays;
            const trace_kernel &k = g.kernels[i];
            const std::string name = kernel_name(k.kernel);
            auto &e = by_name[name];
            e.first++, e.second += us;
            if (g_mode == 1)
                fprintf(stderr, "  %4zu %-72s %5u x %u x %u %9.2f us\n", i, name.c_str(), k.grid[0], k.grid[1],
                        k.grid[2], us);
        }
        fprintf(stderr, "  by kernel (the last kernel, %s, has no next release and is left out):\n",
                kernel_name(g.kernels[n - 1].kernel).c_str());
        std::vector<std::pair<double, std::string>> order;
        for (auto &e : by_name) order.push_back({e.second.second, e.first});
        std::sort(order.rbegin(), order.rend());
        for (auto &o : order) {
            const auto &e = by_name[o.second];
            fprintf(stderr, "  %-72s %4d per step %9.1f us %5.1f %% (%.2f us each)\n", o.second.c_str(), e.first,
                    e.second, 100.0 * e.second * g.replays / g.span_us, e.second / e.first);
        }
    }
}

void tsr_trace_start(void)
{
    if (g_ring || !trace_mode()) return;
    TSR_CUDA_CHECK(cudaMalloc(&g_ring, sizeof *g_ring));
    TSR_CUDA_CHECK(cudaMemset(g_ring, 0, sizeof *g_ring));
    for (int i = 0; i < g_n_binds; i++) g_binds[i](g_ring);
    TSR_CUDA_CHECK(cudaGetLastError());
    atexit(report);
    fprintf(stderr, "tessera: kernel trace on (%d translation units)\n", g_n_binds);
}

void tsr_trace_launch(const void *kernel, dim3 grid)
{
    if (!g_recording) return;
    g_recording->kernels.push_back({kernel, {grid.x, grid.y, grid.z}});
}

void tsr_trace_capture(unsigned long long key, int begin)
{
    if (!tsr_trace_active()) return;
    if (begin) {
        g_recording = &g_traced[key];
        *g_recording = trace_graph();
    } else {
        g_recording->sum_us.assign(g_recording->kernels.size(), 0.0);
        g_recording = NULL;
    }
}

static unsigned long long ring_count(void)
{
    unsigned long long n = 0;
    TSR_CUDA_CHECK(cudaMemcpy(&n, &g_ring->count, sizeof n, cudaMemcpyDeviceToHost));
    return n;
}

/* Events n0 .. n1 - 1 of the ring into g_events (false when the ring has wrapped past n0). */
static bool ring_events(unsigned long long n0, unsigned long long n1)
{
    if (n1 - n0 > TSR_TRACE_CAP) return false;
    g_events.resize(n1 - n0);
    for (unsigned long long n = n0; n < n1;) {
        const unsigned long long i = n % TSR_TRACE_CAP, run = std::min(n1 - n, TSR_TRACE_CAP - i);
        TSR_CUDA_CHECK(cudaMemcpy(&g_events[n - n0], &g_ring->ev[i], run * sizeof(tsr_trace_event),
                                  cudaMemcpyDeviceToHost));
        n += run;
    }
    for (unsigned long long n = n0; n < n1; n++)
        if (g_events[n - n0].seq != (unsigned)n) return false;
    return true;
}

void tsr_trace_replay(unsigned long long key, cudaGraphExec_t exec, cudaStream_t stream)
{
    TSR_CUDA_CHECK(cudaStreamSynchronize(stream));
    const unsigned long long n0 = ring_count();
    TSR_CUDA_CHECK(cudaGraphLaunch(exec, stream));
    TSR_CUDA_CHECK(cudaStreamSynchronize(stream));
    const unsigned long long n1 = ring_count();
    auto it = g_traced.find(key);
    if (it == g_traced.end()) return;
    trace_graph &g = it->second;
    bool match = n1 - n0 == g.kernels.size() && ring_events(n0, n1);
    for (size_t i = 0; match && i < g.kernels.size(); i++)
        match = !memcmp(g_events[i].grid, g.kernels[i].grid, sizeof g_events[i].grid);
    if (!match || g.kernels.size() < 2) {
        g.mismatched++;
        return;
    }
    for (size_t i = 0; i + 1 < g.kernels.size(); i++) g.sum_us[i] += (g_events[i + 1].t - g_events[i].t) * 1e-3;
    g.span_us += (g_events.back().t - g_events.front().t) * 1e-3;
    g.replays++;
}
