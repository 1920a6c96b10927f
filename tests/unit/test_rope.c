/* RoPE frequency tables of every rope type against float32 references transcribed from transformers
 * (tests/fixtures/reference/rope-ref.json, written by scripts/make-rope-refs.py), read through config parsing. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include "runtime/config.h"
#include "runtime/rope.h"
#include "tests/common/fixtures.h"

#include <jansson.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

static void test_rope_refs(void **state)
{
    (void)state;
    char path[4096];
    assert_non_null(tsr_fixture_path(path, sizeof path, "reference/rope-ref.json"));
    json_t *cases = json_load_file(path, 0, NULL);
    assert_true(json_is_array(cases) && json_array_size(cases) > 10);
    size_t i;
    json_t *c;
    json_array_foreach(cases, i, c) {
        char *text = json_dumps(json_object_get(c, "config"), 0);
        tsr_model_config cfg;
        tsr_status st = tsr_config_parse(text, strlen(text), NULL, 0, "case", &cfg);
        free(text);
        if (st != TSR_OK) fail_msg("case %zu: %s", i, tsr_last_error());
        json_t *want = json_object_get(c, "inv_freq");
        assert_int_equal(json_array_size(want), (size_t)cfg.rope.dim / 2);
        float inv[512], af;
        tsr_rope_freqs(&cfg.rope, (int)json_integer_value(json_object_get(c, "seq_len")), inv, &af);
        double want_af = json_number_value(json_object_get(c, "attention_factor"));
        if (fabs(af - want_af) > 1e-6 * fabs(want_af))
            fail_msg("case %zu: attention factor %g, want %g", i, af, want_af);
        for (int k = 0; k < cfg.rope.dim / 2; k++) {
            double w = json_number_value(json_array_get(want, (size_t)k));
            if (fabs(inv[k] - w) > 2e-6 * fabs(w))
                fail_msg("case %zu (%d): inv_freq[%d] = %.9g, want %.9g", i, cfg.rope.type, k, inv[k], w);
        }
    }
    json_decref(cases);
}

static tsr_status parse(const char *json, tsr_model_config *cfg)
{
    return tsr_config_parse(json, strlen(json), NULL, 0, "t", cfg);
}

#define MODEL_KEYS                                                                                                     \
    "\"hidden_size\": 64, \"num_hidden_layers\": 1, \"num_attention_heads\": 2, \"intermediate_size\": 128, "          \
    "\"vocab_size\": 32, \"rms_norm_eps\": 1e-5"

static void test_config_errors(void **state)
{
    (void)state;
    tsr_model_config cfg;
    assert_int_equal(parse("{\"architectures\": [\"GPT2LMHeadModel\"], " MODEL_KEYS "}", &cfg), TSR_ERR_UNSUPPORTED);
    assert_non_null(strstr(tsr_last_error(), "GPT2LMHeadModel"));
    assert_int_equal(parse("{\"architectures\": [\"LlamaForCausalLM\"], \"hidden_size\": 64}", &cfg), TSR_ERR_MISSING);
    assert_non_null(strstr(tsr_last_error(), "num_hidden_layers"));
    assert_int_equal(parse("{\"architectures\": [\"LlamaForCausalLM\"], " MODEL_KEYS
                           ", \"rope_scaling\": {\"type\": \"su\", \"factor\": 2}}",
                           &cfg),
                     TSR_ERR_UNSUPPORTED);
    assert_int_equal(
        parse("{\"architectures\": [\"LlamaForCausalLM\"], " MODEL_KEYS ", \"num_key_value_heads\": 3}", &cfg),
        TSR_ERR_FORMAT);
    assert_int_equal(parse("{\"architectures\": [\"LlamaForCausalLM\"], " MODEL_KEYS ", \"hidden_size\": \"x\"", &cfg),
                     TSR_ERR_FORMAT);
    assert_int_equal(parse("[]", &cfg), TSR_ERR_FORMAT);
    /* generation_config eos list, Mistral window, Qwen2 window only with use_sliding_window */
    const char *ok = "{\"architectures\": [\"MistralForCausalLM\"], " MODEL_KEYS ", \"sliding_window\": 16}";
    const char *gen = "{\"eos_token_id\": [5, 7], \"bos_token_id\": 1}";
    assert_int_equal(tsr_config_parse(ok, strlen(ok), gen, strlen(gen), "t", &cfg), TSR_OK);
    assert_int_equal(cfg.n_eos, 2);
    assert_int_equal(cfg.eos_ids[1], 7);
    assert_int_equal(tsr_config_layer_window(&cfg, 0), 16);
    assert_int_equal(parse("{\"architectures\": [\"Qwen2ForCausalLM\"], " MODEL_KEYS ", \"sliding_window\": 16}", &cfg),
                     TSR_OK);
    assert_int_equal(tsr_config_layer_window(&cfg, 0), 0);
    assert_true(cfg.attention_bias);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_rope_refs),
        cmocka_unit_test(test_config_errors),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
