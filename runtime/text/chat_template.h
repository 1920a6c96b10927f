/* Chat templates: renders a conversation into a prompt with the model's Hugging Face `chat_template`.
 *
 * The template language is the Jinja2 subset real chat templates use, interpreted by runtime/text/jinja_*.c with
 * the settings transformers uses (ImmutableSandboxedEnvironment, trim_blocks and lstrip_blocks on, loopcontrols
 * and the generation extension, its own tojson/raise_exception/strftime_now). Rendering matches
 * transformers' apply_chat_template(..., tokenize=False) byte for byte for supported templates; anything outside
 * the subset is reported, never rendered approximately. docs/chat-templates.md lists what is supported.
 *
 * Ownership: a parsed template is immutable and may be rendered from several threads at once; each render
 * allocates privately. Strings returned through out-parameters are malloc'd and owned by the caller.
 * Errors (message through tsr_fail, always naming the template line when there is one):
 *   TSR_ERR_FORMAT       syntax errors, and runtime type errors (e.g. adding a string to a number)
 *   TSR_ERR_UNSUPPORTED  Jinja constructs this interpreter does not implement
 *   TSR_ERR_ARG          the template called raise_exception(msg) (message included), bad inputs
 *   TSR_ERR_NOMEM        out of memory or over the render limits (tsr_chat_template_set_limits)
 *   TSR_ERR_IO / TSR_ERR_MISSING  from tsr_chat_template_load_dir */
#ifndef TSR_TEXT_CHAT_TEMPLATE_H
#define TSR_TEXT_CHAT_TEMPLATE_H

#include "runtime/status.h"

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>

typedef struct tsr_chat_template tsr_chat_template;

/* Parses a template. Syntax errors name the line. */
tsr_status tsr_chat_template_parse(const char *source, tsr_chat_template **out);
void tsr_chat_template_free(tsr_chat_template *t);

/* Renders. messages: JSON array of message objects; tools: JSON array or NULL (the template then sees
 * tools=None, as with transformers); bos_token/eos_token: NULL leaves them undefined; extra: JSON object of
 * further variables (e.g. {"enable_thinking": false}) or NULL. *out: malloc'd NUL-terminated text. */
tsr_status tsr_chat_template_render(const tsr_chat_template *t, const json_t *messages, const json_t *tools,
                                    int add_generation_prompt, const char *bos_token, const char *eos_token,
                                    const json_t *extra, char **out);

/* Reads DIR/tokenizer_config.json (or DIR/chat_template.jinja when the config has no chat_template): picks the
 * "default" template, or "tool_use" when want_tools and it exists; *bos_token / *eos_token receive malloc'd
 * strings or NULL when the config has none. */
tsr_status tsr_chat_template_load_dir(const char *dir, int want_tools, tsr_chat_template **out, char **bos_token,
                                      char **eos_token);

/* Limits of every later render in this process (memory in bytes, evaluation steps); 0 keeps the default
 * (1 GiB, 200 million steps). For tests and fuzzing. */
void tsr_chat_template_set_limits(size_t max_bytes, uint64_t max_steps);

#endif
