list(APPEND TSR_LAUNCHER_SOURCES
  launcher/main.c
  launcher/cli.c
  launcher/text_io.c
  launcher/backend_select.c
  launcher/cmd_generate.c
  launcher/cmd_logits.c
  launcher/cmd_inspect.c
  launcher/cmd_synth.c
  launcher/cmd_bench.c
  launcher/cmd_tokenize.c
  launcher/cmd_template.c
)
