/* The subcommands of the `tessera` command. Each takes the arguments after its name (argv[0] is the subcommand
 * name) and returns the process exit code: 0 on success, 1 on a runtime failure (after printing the error to
 * stderr), 2 on a usage error. */
#ifndef TSR_LAUNCHER_COMMANDS_H
#define TSR_LAUNCHER_COMMANDS_H

int tsr_cmd_generate(int argc, char **argv);
int tsr_cmd_logits(int argc, char **argv);
int tsr_cmd_inspect(int argc, char **argv);
int tsr_cmd_synth(int argc, char **argv);
int tsr_cmd_bench(int argc, char **argv);
int tsr_cmd_tokenize(int argc, char **argv);
int tsr_cmd_template(int argc, char **argv);
int tsr_cmd_serve(int argc, char **argv);
int tsr_cmd_batch(int argc, char **argv);
int tsr_cmd_intake(int argc, char **argv);
int tsr_cmd_submit(int argc, char **argv);

#endif
