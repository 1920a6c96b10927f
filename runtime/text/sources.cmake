# Sources of the text part of runtime/ (tokenizer, detokenizer, chat templates).
list(APPEND TSR_CORE_SOURCES
  # chat templates (Jinja subset)
  runtime/text/chat_template.c
  runtime/text/jinja_value.c
  runtime/text/jinja_lexer.c
  runtime/text/jinja_parser.c
  runtime/text/jinja_eval.c
  runtime/text/jinja_filters.c
  # tokenizer (tokenizer.json: BPE, normalizers, pre-tokenizers, decoders, streaming detokenizer)
  runtime/text/tokenizer.c
  runtime/text/tok_util.c
  runtime/text/tok_load.c
  runtime/text/tok_normalize.c
  runtime/text/tok_pretok.c
  runtime/text/tok_bpe.c
  runtime/text/tok_encode.c
  runtime/text/tok_decode.c
  # stop strings
  runtime/text/stop_match.c
)
