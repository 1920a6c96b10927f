/* PLACEHOLDER while the session builds it: tessera template. */
#include "launcher/commands.h"
#include <stdio.h>
int tsr_cmd_template(int argc, char **argv)
{
    (void)argc; (void)argv;
    fprintf(stderr, "tessera template: not built yet\n");
    return 1;
}
