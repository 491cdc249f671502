/* dispatch.c — the client commands' table and the global --server option. daemon/main.c
 * hands every command named here to tq_client_main. See client.h. */
#include "client.h"

#include <string.h>

typedef struct {
    const char *name;
    int (*fn)(int argc, char **argv);
    const char *usage;
} command;

static const command commands[] = {
    { "submit",  tq_cli_submit,  "trainq submit SPEC.json [--wait] [--name N] [--priority P] [key=value...]" },
    { "ls",      tq_cli_ls,      "trainq ls [--all] [--state S] [--owner me|NAME]" },
    { "show",    tq_cli_show,    "trainq show ID [--json]" },
    { "logs",    tq_cli_logs,    "trainq logs [-f] ID" },
    { "steps",   tq_cli_steps,   "trainq steps ID [--csv] [-f]" },
    { "cancel",  tq_cli_cancel,  "trainq cancel ID..." },
    { "rm",      tq_cli_rm,      "trainq rm ID..." },
    { "compare", tq_cli_compare, "trainq compare ID... [--baseline ID] [--json]" },
};
#define NCOMMANDS (int)(sizeof commands / sizeof commands[0])

static const command *find(const char *name) {
    for (int i = 0; i < NCOMMANDS; i++)
        if (!strcmp(commands[i].name, name)) return &commands[i];
    return NULL;
}

int tq_client_is_command(const char *cmd) {
    return find(cmd) || !strcmp(cmd, "--server") || !strncmp(cmd, "--server=", 9);
}

void tq_client_usage(FILE *f) {
    fprintf(f, "client commands (talk to a running daemon; each takes --server URL|unix:PATH and --help):\n");
    for (int i = 0; i < NCOMMANDS; i++) fprintf(f, "       %s\n", commands[i].usage);
}

int tq_client_main(int argc, char **argv) {
    /* --server URL / --server=URL, before the command or among its arguments (not after "--") */
    const char *server = NULL;
    int n = 0, help = 0, dashdash = 0;
    for (int i = 0; i < argc; i++) {
        if (!dashdash && !strcmp(argv[i], "--server")) {
            if (i + 1 >= argc) {
                fprintf(stderr, "trainq: --server needs a value (http://HOST:PORT or unix:/path/to.sock)\n");
                return TQ_CLI_USAGE;
            }
            server = argv[++i];
            continue;
        }
        if (!dashdash && !strncmp(argv[i], "--server=", 9)) { server = argv[i] + 9; continue; }
        if (!strcmp(argv[i], "--")) dashdash = 1;
        if (!dashdash && (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h"))) help = 1;
        argv[n++] = argv[i];
    }
    argc = n;
    if (argc == 0) {
        fprintf(stderr, "trainq: --server needs a command after it\n");
        tq_client_usage(stderr);
        return TQ_CLI_USAGE;
    }
    const command *c = find(argv[0]);
    if (!c) {
        fprintf(stderr, "trainq: unknown command \"%s\"\n", argv[0]);
        tq_client_usage(stderr);
        return TQ_CLI_USAGE;
    }
    if (!help) {
        char prog[32];
        snprintf(prog, sizeof prog, "trainq %s", c->name);
        int rc = tq_http_init(prog, server);
        if (rc) return rc;
    }
    return c->fn(argc - 1, argv + 1);
}
