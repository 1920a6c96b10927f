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
  launcher/bench_ranks.c
  launcher/bench_service.c
  launcher/cmd_tokenize.c
  launcher/cmd_template.c
)
# OpenAI request/response mapping and the HTTP gateway (tessera serve)
list(APPEND TSR_LAUNCHER_SOURCES
  launcher/openai.c
  launcher/openai_response.c
  launcher/http_server.c
  launcher/http_auth.c
  launcher/http_conns.c
  launcher/http_routes.c
  launcher/http_job.c
  launcher/http_stream.c
  launcher/http_metrics.c
  launcher/cmd_serve.c
)
# tessera batch, the nanomsg intake and tessera submit
list(APPEND TSR_LAUNCHER_SOURCES
  launcher/batch_idset.c
  launcher/batch_input.c
  launcher/batch_resume.c
  launcher/batch_writer.c
  launcher/batch_progress.c
  launcher/batch_job.c
  launcher/batch_host.c
  launcher/cmd_batch.c
  launcher/intake_msg.c
  launcher/intake_nn.c
  launcher/cmd_intake.c
  launcher/cmd_submit.c
)
