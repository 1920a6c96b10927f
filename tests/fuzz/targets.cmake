# Fuzz targets of the engine's parsers (formats); text targets live in text_targets.cmake.
tsr_add_fuzz_target(safetensors fuzz_safetensors.c)
tsr_add_fuzz_target(config fuzz_config.c)
tsr_add_fuzz_target(step fuzz_step.c)
