# Sources of runtime/ (formats, model, KV cache, forward pass); the text part is in runtime/text/sources.cmake.
list(APPEND TSR_CORE_SOURCES
  runtime/status.c
  runtime/proc_mem.c
)
list(APPEND TSR_CORE_SOURCES
  runtime/dtype.c
  runtime/safetensors.c
  runtime/config.c
  runtime/rope.c
  runtime/exl2.c
  runtime/gptq.c
  runtime/kv_cache.c
  runtime/model.c
  runtime/forward.c
  runtime/engine.c
  runtime/sampler.c
  runtime/step.c
  runtime/step_sample.c
  runtime/step_exec.c
  runtime/service.c
  runtime/synth.c
)
