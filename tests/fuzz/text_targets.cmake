# Fuzz targets of the text part: tokenizer.json loading/encoding, chat template parsing/rendering.
tsr_add_fuzz_target(tokenizer fuzz_tokenizer.c)
tsr_add_fuzz_target(template fuzz_template.c)
