/* dispatch.c — the client commands' table and the global --server option. daemon/main.c
 * hands every command named here to tq_client_main. See client.h. */
#include "client.h"

#include <string.h>

typedef struct {
    const char *name;
    int (*fn)(int argc, char **argv);
    const char *usage;         /* shown when doc is NULL */
    const tq_cmd_doc *doc;     /* the options (opts.h): --help and the line of `trainq --help` */
} command;

static const command commands[] = {
    { "submit",  tq_cli_submit,  NULL, &tq_doc_submit },
    { "ls",      tq_cli_ls,      NULL, &tq_doc_ls },
    { "show",    tq_cli_show,    NULL, &tq_doc_show },
    { "logs",    tq_cli_logs,    NULL, &tq_doc_logs },
    { "steps",   tq_cli_steps,   NULL, &tq_doc_steps },
    { "cancel",  tq_cli_cancel,  NULL, &tq_doc_cancel },
    { "requeue", tq_cli_requeue, NULL, &tq_doc_requeue },
    { "rm",      tq_cli_rm,      NULL, &tq_doc_rm },
    { "compare", tq_cli_compare, NULL, &tq_doc_compare },
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
    fprintf(f, "%s\n", TQ_OPTS_CLIENT_HEAD);
    for (int i = 0; i < NCOMMANDS; i++) {
        if (commands[i].doc) tq_opts_synopsis(f, commands[i].doc, "       ");
        else fprintf(f, "       %s\n", commands[i].usage);
    }
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
