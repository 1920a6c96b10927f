/* safetensors: the streaming writer round trip with every dtype, model directories of several files with and
 * without model.safetensors.index.json (a stale index falls back to scanning, as EXL2 directories need), tensors
 * split across files, duplicates across files, and misaligned tensors (read through an aligned copy). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include "runtime/safetensors.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static void write_file(const char *path, const char *name, tsr_dtype dt, int64_t n, unsigned char fill)
{
    tsr_st_writer *w;
    assert_int_equal(tsr_st_writer_open(path, &w), TSR_OK);
    assert_int_equal(tsr_st_writer_declare(w, name, dt, 1, &n), TSR_OK);
    assert_int_equal(tsr_st_writer_begin_data(w), TSR_OK);
    size_t bytes = (size_t)n * tsr_dtype_size(dt);
    unsigned char *buf = malloc(bytes);
    memset(buf, fill, bytes);
    assert_int_equal(tsr_st_writer_write(w, buf, bytes), TSR_OK);
    assert_int_equal(tsr_st_writer_close(w), TSR_OK);
    free(buf);
}

static void test_writer_round_trip(void **state)
{
    (void)state;
    char path[] = "/tmp/tsr_st_XXXXXX";
    close(mkstemp(path));
    tsr_dtype all[] = {TSR_F16, TSR_BF16, TSR_F32, TSR_I16, TSR_I32, TSR_I64, TSR_U8};
    tsr_st_writer *w;
    assert_int_equal(tsr_st_writer_open(path, &w), TSR_OK);
    for (int i = 0; i < 7; i++) {
        char name[16];
        snprintf(name, sizeof name, "t%d", i);
        int64_t shape[2] = {3, i + 1};
        assert_int_equal(tsr_st_writer_declare(w, name, all[i], 2, shape), TSR_OK);
    }
    assert_int_equal(tsr_st_writer_declare(w, "t0", TSR_F32, 0, NULL), TSR_ERR_ARG); /* duplicate name */
    assert_int_equal(tsr_st_writer_begin_data(w), TSR_OK);
    for (int i = 0; i < 7; i++) {
        size_t bytes = (size_t)3 * (i + 1) * tsr_dtype_size(all[i]);
        unsigned char buf[256];
        for (size_t k = 0; k < bytes; k++) buf[k] = (unsigned char)(i * 31 + k);
        /* in two pieces: the writer streams */
        assert_int_equal(tsr_st_writer_write(w, buf, bytes / 2), TSR_OK);
        assert_int_equal(tsr_st_writer_write(w, buf + bytes / 2, bytes - bytes / 2), TSR_OK);
    }
    assert_int_equal(tsr_st_writer_close(w), TSR_OK);
    tsr_st_set *set;
    assert_int_equal(tsr_st_open_file(path, &set), TSR_OK);
    assert_int_equal(tsr_st_count(set), 7);
    for (int i = 0; i < 7; i++) {
        char name[16];
        snprintf(name, sizeof name, "t%d", i);
        const tsr_st_tensor *t = tsr_st_find(set, name);
        assert_non_null(t);
        assert_int_equal(t->dtype, all[i]);
        assert_int_equal(t->shape[1], i + 1);
        assert_int_equal((uintptr_t)t->data % tsr_dtype_size(all[i]), 0);
        for (size_t k = 0; k < t->nbytes; k++)
            assert_int_equal(((const unsigned char *)t->data)[k], (unsigned char)(i * 31 + k));
    }
    tsr_st_set_free(set);
    /* closing before all bytes are written is an error and removes the file */
    assert_int_equal(tsr_st_writer_open(path, &w), TSR_OK);
    int64_t n = 4;
    assert_int_equal(tsr_st_writer_declare(w, "x", TSR_F32, 1, &n), TSR_OK);
    assert_int_equal(tsr_st_writer_begin_data(w), TSR_OK);
    assert_int_equal(tsr_st_writer_close(w), TSR_ERR_INTERNAL);
    assert_int_equal(access(path, F_OK), -1);
}

static void test_directories(void **state)
{
    (void)state;
    char dir[] = "/tmp/tsr_dir_XXXXXX";
    assert_non_null(mkdtemp(dir));
    char a[128], b[128], c[128], idx[128];
    snprintf(a, sizeof a, "%s/model-00001-of-00002.safetensors", dir);
    snprintf(b, sizeof b, "%s/model-00002-of-00002.safetensors", dir);
    snprintf(c, sizeof c, "%s/consolidated.safetensors", dir);
    snprintf(idx, sizeof idx, "%s/model.safetensors.index.json", dir);
    write_file(a, "w.a", TSR_F16, 8, 1);
    write_file(b, "w.b", TSR_F32, 4, 2);
    write_file(c, "w.a", TSR_F16, 8, 3); /* a stray duplicate that only the index excludes */
    tsr_st_set *set;
    /* without an index every file is read, and the duplicate is an error naming both files */
    assert_int_equal(tsr_st_open_dir(dir, &set), TSR_ERR_FORMAT);
    assert_non_null(strstr(tsr_last_error(), "w.a"));
    /* with an index naming the two shards, only those are read */
    FILE *f = fopen(idx, "w");
    fprintf(f, "{\"metadata\": {}, \"weight_map\": {\"w.a\": \"model-00001-of-00002.safetensors\", "
               "\"w.b\": \"model-00002-of-00002.safetensors\"}}");
    fclose(f);
    assert_int_equal(tsr_st_open_dir(dir, &set), TSR_OK);
    assert_int_equal(tsr_st_count(set), 2);
    assert_int_equal(((const unsigned char *)tsr_st_find(set, "w.b")->data)[0], 2);
    tsr_st_set_free(set);
    /* a stale index (names a missing file) falls back to scanning */
    unlink(c);
    f = fopen(idx, "w");
    fprintf(f, "{\"weight_map\": {\"w.a\": \"pytorch_model.safetensors\"}}");
    fclose(f);
    assert_int_equal(tsr_st_open_dir(dir, &set), TSR_OK);
    assert_int_equal(tsr_st_count(set), 2);
    tsr_st_set_free(set);
    unlink(a), unlink(b), unlink(idx);
    assert_int_equal(tsr_st_open_dir(dir, &set), TSR_ERR_MISSING);
    rmdir(dir);
}

static void test_misaligned(void **state)
{
    (void)state;
    /* header of odd length: the F32 tensor's data starts misaligned and is served from an aligned copy */
    const char *hdr = "{\"x\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}";
    size_t h = strlen(hdr);
    assert_true(h % 4 != 0);
    unsigned char img[128] = {0};
    for (int i = 0; i < 8; i++) img[i] = (unsigned char)(i == 0 ? h : 0);
    memcpy(img + 8, hdr, h);
    float v[2] = {1.5f, -2.25f};
    memcpy(img + 8 + h, v, 8);
    tsr_st_set *set;
    assert_int_equal(tsr_st_parse_buffer(img, 8 + h + 8, "mem", &set), TSR_OK);
    const tsr_st_tensor *t = tsr_st_find(set, "x");
    assert_int_equal((uintptr_t)t->data % 4, 0);
    assert_true(((const float *)t->data)[1] == -2.25f);
    tsr_st_set_free(set);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_writer_round_trip),
        cmocka_unit_test(test_directories),
        cmocka_unit_test(test_misaligned),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
