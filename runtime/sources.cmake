# Sources of runtime/ (formats, model, KV cache, forward pass); the text part is in runtime/text/sources.cmake.
list(APPEND TSR_CORE_SOURCES
  runtime/status.c
)
