/* Fuzz target: chat template parse + render. The input is split at the first NUL byte: before it, the template;
 * after it, a JSON messages array (a fixed conversation when absent or invalid). Errors are fine; crashes,
 * sanitizer reports and leaks are not. Render limits are lowered so runaway templates stop quickly. */
#include "runtime/text/chat_template.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    tsr_chat_template_set_limits(8u << 20, 200000);
    const uint8_t *nul = memchr(data, 0, size);
    size_t tlen = nul ? (size_t)(nul - data) : size;
    char *src = malloc(tlen + 1);
    if (!src) return 0;
    memcpy(src, data, tlen);
    src[tlen] = '\0';
    json_t *msgs = NULL;
    if (nul) msgs = json_loadb((const char *)nul + 1, size - tlen - 1, 0, NULL);
    if (!msgs)
        msgs = json_loads(
            "[{\"role\":\"system\",\"content\":\"S\"},{\"role\":\"user\",\"content\":\"Hi \\u00e9\"},"
            "{\"role\":\"assistant\",\"content\":\"<think>r</think>A\",\"tool_calls\":[{\"type\":\"function\","
            "\"function\":{\"name\":\"f\",\"arguments\":{\"x\":[1,2.5,null,true]}}}]},"
            "{\"role\":\"tool\",\"content\":\"42\"}]",
            0, NULL);
    json_t *tools = json_loads("[{\"type\":\"function\",\"function\":{\"name\":\"f\",\"parameters\":{}}}]", 0, NULL);
    json_t *extra = json_loads("{\"enable_thinking\":false}", 0, NULL);
    tsr_chat_template *t;
    if (tsr_chat_template_parse(src, &t) == TSR_OK) {
        char *out;
        for (int gen = 0; gen < 2; gen++)
            if (tsr_chat_template_render(t, msgs, gen ? tools : NULL, gen, "<s>", "</s>", gen ? extra : NULL, &out) ==
                TSR_OK)
                free(out);
        tsr_chat_template_free(t);
    }
    json_decref(msgs);
    json_decref(tools);
    json_decref(extra);
    free(src);
    return 0;
}
