/* Bad input gets a clear error naming the file and tensor, never a crash: malformed safetensors files, and model
 * directories made from the bundled model with one thing broken (truncated weights, missing or mistyped tensors,
 * bad group tables, unsupported architecture). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include "runtime/model.h"
#include "runtime/safetensors.h"
#include "tests/common/fixtures.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static void write_bytes(const char *path, const void *data, size_t n)
{
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(data, 1, n, f), n);
    fclose(f);
}

/* header JSON + data bytes as a safetensors image */
static void write_st(const char *path, const char *header, size_t data_bytes)
{
    size_t h = strlen(header), total = 8 + h + data_bytes;
    unsigned char *buf = calloc(1, total);
    for (int i = 0; i < 8; i++) buf[i] = (unsigned char)((uint64_t)h >> (8 * i));
    memcpy(buf + 8, header, h);
    write_bytes(path, buf, total);
    free(buf);
}

static void expect_st_error(const char *header, size_t data_bytes, tsr_status want, const char *fragment)
{
    char path[] = "/tmp/tsr_bad_XXXXXX";
    int fd = mkstemp(path);
    close(fd);
    write_st(path, header, data_bytes);
    tsr_st_set *set = NULL;
    tsr_status st = tsr_st_open_file(path, &set);
    tsr_st_set_free(set);
    unlink(path);
    if (st != want || (want != TSR_OK && (!strstr(tsr_last_error(), fragment) || !strstr(tsr_last_error(), path))))
        fail_msg("header %s: expected %d with '%s' and the path, got %d: %s", header, want, fragment, st,
                 tsr_last_error());
}

static void test_bad_safetensors(void **state)
{
    (void)state;
    expect_st_error("{\"a\": {\"dtype\": \"F16\", \"shape\": [2], \"data_offsets\": [0, 4]}}", 4, TSR_OK, "");
    expect_st_error("{\"a\": {\"dtype\": \"F16\", \"shape\": [2], \"data_offsets\": [0, 8]}}", 4, TSR_ERR_FORMAT,
                    "outside");
    expect_st_error("{\"a\": {\"dtype\": \"F16\", \"shape\": [3], \"data_offsets\": [0, 4]}}", 8, TSR_ERR_FORMAT,
                    "'a'");
    expect_st_error("{\"a\": {\"dtype\": \"Q4\", \"shape\": [2], \"data_offsets\": [0, 4]}}", 4, TSR_ERR_UNSUPPORTED,
                    "Q4");
    expect_st_error("{\"a\": {\"dtype\": \"F16\", \"shape\": [2], \"data_offsets\": [0, 4]},"
                    " \"b\": {\"dtype\": \"F16\", \"shape\": [2], \"data_offsets\": [2, 6]}}",
                    8, TSR_ERR_FORMAT, "overlap");
    expect_st_error("{\"a\": {\"dtype\": \"F16\", \"shape\": [2], \"data_offsets\": [0, 4]}, \"a\": 1}", 4,
                    TSR_ERR_FORMAT, "invalid");
    expect_st_error("{\"a\": {\"dtype\": \"F16\", \"shape\": [-2], \"data_offsets\": [0, 4]}}", 4, TSR_ERR_FORMAT,
                    "shape");
    expect_st_error("{\"a\": {\"dtype\": \"F16\", \"shape\": [2]}}", 4, TSR_ERR_FORMAT, "data_offsets");
    expect_st_error("{\"a\": [1,2]", 4, TSR_ERR_FORMAT, "invalid");
    expect_st_error("[1, 2]", 4, TSR_ERR_FORMAT, "not a JSON object");
    /* header length beyond the file */
    char path[] = "/tmp/tsr_bad_XXXXXX";
    int fd = mkstemp(path);
    close(fd);
    unsigned char hdr[12] = {0xff, 0xff, 0, 0, 0, 0, 0, 0, '{', '}', ' ', ' '};
    write_bytes(path, hdr, sizeof hdr);
    tsr_st_set *set = NULL;
    assert_int_equal(tsr_st_open_file(path, &set), TSR_ERR_FORMAT);
    assert_non_null(strstr(tsr_last_error(), "exceeds the file size"));
    write_bytes(path, hdr, 5);
    assert_int_equal(tsr_st_open_file(path, &set), TSR_ERR_FORMAT);
    unlink(path);
    assert_int_equal(tsr_st_open_file("/nonexistent/x.safetensors", &set), TSR_ERR_IO);
    assert_non_null(strstr(tsr_last_error(), "/nonexistent/x.safetensors"));
}

/* ---- broken copies of the bundled model ---- */

typedef enum { EDIT_NONE, EDIT_DROP, EDIT_RETYPE, EDIT_BAD_GROUP, EDIT_BAD_PERM } edit_kind;

/* Copies the bundled model into a fresh directory, rewriting its weights with one edit to tensor `target`. */
static void make_broken_model(char *dir, const char *target, edit_kind edit)
{
    char src[4096], path[4096 + 64];
    assert_non_null(tsr_fixture_model(src, sizeof src, "tiny-llama-exl2-4.0bpw"));
    strcpy(dir, "/tmp/tsr_model_XXXXXX");
    assert_non_null(mkdtemp(dir));
    const char *files[] = {"config.json", "generation_config.json"};
    for (int i = 0; i < 2; i++) {
        snprintf(path, sizeof path, "%s/%s", src, files[i]);
        FILE *f = fopen(path, "rb");
        assert_non_null(f);
        char buf[1 << 16];
        size_t n = fread(buf, 1, sizeof buf, f);
        fclose(f);
        snprintf(path, sizeof path, "%s/%s", dir, files[i]);
        write_bytes(path, buf, n);
    }
    snprintf(path, sizeof path, "%s/output.safetensors", src);
    tsr_st_set *in;
    assert_int_equal(tsr_st_open_file(path, &in), TSR_OK);
    snprintf(path, sizeof path, "%s/output.safetensors", dir);
    tsr_st_writer *w;
    assert_int_equal(tsr_st_writer_open(path, &w), TSR_OK);
    for (size_t i = 0; i < tsr_st_count(in); i++) {
        const tsr_st_tensor *t = tsr_st_at(in, i);
        int hit = !strcmp(t->name, target);
        if (hit && edit == EDIT_DROP) continue;
        tsr_dtype dt = hit && edit == EDIT_RETYPE ? TSR_F32 : t->dtype;
        int64_t shape[8];
        memcpy(shape, t->shape, sizeof shape);
        if (hit && edit == EDIT_RETYPE) shape[t->ndim - 1] /= 2; /* same bytes, F16 → F32 */
        assert_int_equal(tsr_st_writer_declare(w, t->name, dt, t->ndim, shape), TSR_OK);
    }
    assert_int_equal(tsr_st_writer_begin_data(w), TSR_OK);
    for (size_t i = 0; i < tsr_st_count(in); i++) {
        const tsr_st_tensor *t = tsr_st_at(in, i);
        int hit = !strcmp(t->name, target);
        if (hit && edit == EDIT_DROP) continue;
        unsigned char *copy = malloc(t->nbytes);
        memcpy(copy, t->data, t->nbytes);
        if (hit && edit == EDIT_BAD_GROUP) ((int16_t *)copy)[0] = 7;
        if (hit && edit == EDIT_BAD_PERM) ((int32_t *)copy)[1] = ((int32_t *)copy)[0];
        assert_int_equal(tsr_st_writer_write(w, copy, t->nbytes), TSR_OK);
        free(copy);
    }
    assert_int_equal(tsr_st_writer_close(w), TSR_OK);
    tsr_st_set_free(in);
}

static void remove_model(const char *dir)
{
    char path[4096 + 64];
    const char *files[] = {"config.json", "generation_config.json", "output.safetensors"};
    for (int i = 0; i < 3; i++) {
        snprintf(path, sizeof path, "%s/%s", dir, files[i]);
        unlink(path);
    }
    rmdir(dir);
}

static void expect_model_error(const char *dir, tsr_status want, const char *fragment)
{
    tsr_model *m = NULL;
    tsr_status st = tsr_model_load(dir, &m);
    tsr_model_free(m);
    if (st != want || !strstr(tsr_last_error(), fragment))
        fail_msg("expected %d with '%s', got %d: %s", want, fragment, st, tsr_last_error());
}

static void test_broken_models(void **state)
{
    (void)state;
    char dir[64], path[128];
    make_broken_model(dir, "", EDIT_NONE);
    expect_model_error(dir, TSR_OK, ""); /* the rewrite itself is faithful */
    /* truncated weights file */
    snprintf(path, sizeof path, "%s/output.safetensors", dir);
    assert_int_equal(truncate(path, 100000), 0);
    expect_model_error(dir, TSR_ERR_FORMAT, "output.safetensors");
    remove_model(dir);

    make_broken_model(dir, "model.layers.1.mlp.up_proj.q_scale", EDIT_DROP);
    expect_model_error(dir, TSR_ERR_MISSING, "model.layers.1.mlp.up_proj.q_scale");
    remove_model(dir);
    make_broken_model(dir, "model.layers.2.self_attn.k_proj.q_scale_max", EDIT_RETYPE);
    expect_model_error(dir, TSR_ERR_FORMAT, "model.layers.2.self_attn.k_proj.q_scale_max");
    remove_model(dir);
    make_broken_model(dir, "model.layers.0.self_attn.o_proj.q_groups", EDIT_BAD_GROUP);
    expect_model_error(dir, TSR_ERR_FORMAT, "unknown bit width 7");
    remove_model(dir);
    make_broken_model(dir, "model.layers.3.mlp.down_proj.q_invperm", EDIT_BAD_PERM);
    expect_model_error(dir, TSR_ERR_FORMAT, "model.layers.3.mlp.down_proj.q_invperm");
    remove_model(dir);
    make_broken_model(dir, "model.norm.weight", EDIT_DROP);
    expect_model_error(dir, TSR_ERR_MISSING, "model.norm.weight");
    remove_model(dir);

    /* unsupported architecture, missing config */
    make_broken_model(dir, "", EDIT_NONE);
    snprintf(path, sizeof path, "%s/config.json", dir);
    const char *cfg = "{\"architectures\": [\"CohereForCausalLM\"], \"hidden_size\": 256}";
    write_bytes(path, cfg, strlen(cfg));
    expect_model_error(dir, TSR_ERR_UNSUPPORTED, "CohereForCausalLM");
    unlink(path);
    expect_model_error(dir, TSR_ERR_IO, "config.json");
    remove_model(dir);
    expect_model_error("/nonexistent-model-dir", TSR_ERR_IO, "/nonexistent-model-dir");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_bad_safetensors),
        cmocka_unit_test(test_broken_models),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
