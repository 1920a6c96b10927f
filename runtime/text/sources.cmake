# Sources of the text part of runtime/ (tokenizer, detokenizer, chat templates).
list(APPEND TSR_CORE_SOURCES
)
