# Fuzz targets of the engine's parsers (formats); text targets live in text_targets.cmake.
tsr_add_fuzz_target(safetensors fuzz_safetensors.c)
tsr_add_fuzz_target(config fuzz_config.c)
tsr_add_fuzz_target(step fuzz_step.c)
# Fuzz targets of the launcher's parsers of outside input (sources outside tessera_core, compiled in): batch files
# (input lines and the output file a resume reads) and nanomsg intake messages; request bodies are parsed against
# the bundled model (fuzz_oai_model.c). The OpenAI body target's CTest test is tests/serve/http's fuzz.openai; here
# only its libFuzzer binary.
set(TSR_FUZZ_OAI ${PROJECT_SOURCE_DIR}/launcher/openai.c ${PROJECT_SOURCE_DIR}/launcher/openai_response.c)
tsr_add_fuzz_target(batch_line fuzz_batch_line.c SOURCES fuzz_oai_model.c ${TSR_FUZZ_OAI}
                    ${PROJECT_SOURCE_DIR}/launcher/batch_input.c ${PROJECT_SOURCE_DIR}/launcher/batch_resume.c
                    ${PROJECT_SOURCE_DIR}/launcher/batch_idset.c)
tsr_add_fuzz_target(intake fuzz_intake.c SOURCES fuzz_oai_model.c ${TSR_FUZZ_OAI}
                    ${PROJECT_SOURCE_DIR}/launcher/intake_msg.c)
tsr_add_fuzz_target(openai ${PROJECT_SOURCE_DIR}/tests/serve/http/fuzz_openai.c SOURCES fuzz_oai_model.c
                    ${TSR_FUZZ_OAI} CORPUS ${PROJECT_SOURCE_DIR}/tests/serve/http/corpus NO_TEST)
