/* `tessera template`: renders a tokenizer's chat template for a conversation and prints it exactly (no newline is
 * added), so the output can be compared byte for byte with transformers' apply_chat_template(tokenize=False). */
#include "launcher/commands.h"
#include "runtime/text/chat_template.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void usage(FILE *out)
{
    fprintf(out,
            "usage: tessera template --tokenizer DIR --messages CONV.json [--tools TOOLS.json]\n"
            "                        [--add-generation-prompt] [--template FILE] [--vars VARS.json]\n"
            "\n"
            "Renders the chat template of DIR/tokenizer_config.json for a conversation and prints the text.\n"
            "  --tokenizer DIR          folder with tokenizer_config.json (template, bos_token, eos_token)\n"
            "  --messages FILE          JSON array of messages ({\"role\": ..., \"content\": ...})\n"
            "  --tools FILE             JSON array of tool schemas (selects the 'tool_use' template if any)\n"
            "  --add-generation-prompt  end with the assistant header\n"
            "  --template FILE          use this Jinja template instead of the tokenizer's\n"
            "  --vars FILE              JSON object of extra template variables (e.g. enable_thinking)\n"
            "Either --tokenizer or --template is required.\n");
}

static json_t *load_json(const char *path, const char *what)
{
    json_error_t e;
    json_t *j = json_load_file(path, 0, &e);
    if (!j) fprintf(stderr, "tessera template: %s %s: %s (line %d)\n", what, path, e.text, e.line);
    return j;
}

static char *read_file(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    size_t cap = 4096, n = 0;
    char *buf = malloc(cap);
    while (buf) {
        n += fread(buf + n, 1, cap - n - 1, f);
        if (n < cap - 1) break;
        cap *= 2;
        char *nb = realloc(buf, cap);
        if (!nb) free(buf);
        buf = nb;
    }
    fclose(f);
    if (buf) buf[n] = '\0';
    return buf;
}

int tsr_cmd_template(int argc, char **argv)
{
    const char *dir = NULL, *msgs_path = NULL, *tools_path = NULL, *tpl_path = NULL, *vars_path = NULL;
    int gen = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            usage(stdout);
            return 0;
        }
        if (!strcmp(a, "--add-generation-prompt")) {
            gen = 1;
            continue;
        }
        const char **dst = !strcmp(a, "--tokenizer") ? &dir
                         : !strcmp(a, "--messages")  ? &msgs_path
                         : !strcmp(a, "--tools")     ? &tools_path
                         : !strcmp(a, "--template")  ? &tpl_path
                         : !strcmp(a, "--vars")      ? &vars_path
                                                     : NULL;
        if (!dst) {
            fprintf(stderr, "tessera template: unknown option '%s'\n", a);
            usage(stderr);
            return 2;
        }
        if (i + 1 >= argc) {
            fprintf(stderr, "tessera template: %s needs a value\n", a);
            return 2;
        }
        *dst = argv[++i];
    }
    if (!msgs_path || (!dir && !tpl_path)) {
        fprintf(stderr, "tessera template: --messages and one of --tokenizer/--template are required\n");
        usage(stderr);
        return 2;
    }

    int rc = 1;
    json_t *msgs = NULL, *tools = NULL, *vars = NULL;
    tsr_chat_template *t = NULL;
    char *bos = NULL, *eos = NULL, *text = NULL, *src = NULL;
    tsr_status st;
    if (!(msgs = load_json(msgs_path, "messages"))) goto done;
    if (tools_path && !(tools = load_json(tools_path, "tools"))) goto done;
    if (vars_path && !(vars = load_json(vars_path, "vars"))) goto done;
    if (dir) {
        st = tsr_chat_template_load_dir(dir, tools != NULL, &t, &bos, &eos);
        if (st) goto fail;
    }
    if (tpl_path) {
        tsr_chat_template_free(t);
        t = NULL;
        if (!(src = read_file(tpl_path))) {
            fprintf(stderr, "tessera template: cannot read %s\n", tpl_path);
            goto done;
        }
        st = tsr_chat_template_parse(src, &t);
        if (st) goto fail;
    }
    st = tsr_chat_template_render(t, msgs, tools, gen, bos, eos, vars, &text);
    if (st) goto fail;
    fwrite(text, 1, strlen(text), stdout);
    fflush(stdout);
    rc = 0;
    goto done;
fail:
    fprintf(stderr, "tessera template: %s: %s\n", tsr_status_str(st), tsr_last_error());
done:
    free(text);
    free(src);
    free(bos);
    free(eos);
    tsr_chat_template_free(t);
    json_decref(msgs);
    json_decref(tools);
    json_decref(vars);
    return rc;
}
