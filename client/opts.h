/* opts.h — each trainq command's options in one table (issue 17): the table makes the command's
 * --help (one line per option), its line in `trainq --help`, and the check every command runs
 * before it parses its arguments, so the three cannot disagree:
 *
 *     int rc = tq_opts_check(&doc, argc, argv);   // argv: the arguments after the command's name
 *     if (rc >= 0) return rc;                      // --help printed (0), or a usage error (2)
 *     ...the command's own loop over argv, which only ever sees options of its table...
 *
 * --help or -h anywhere (before "--") prints the help on stdout, exit 0; an option the table
 * does not have is named with a pointer to `trainq CMD --help`, exit 2; so is an option that
 * takes a value and was given none. A command's parser keeps its own "unknown option" branch as
 * a backstop: tests/integration/test_cli.py feeds every option of every --help to its command
 * and checks that the parser takes it, and every option-like string of the sources to each
 * command and checks that --help lists it or the command refuses it.
 *
 * libc only: the client commands (client/) link nothing but libcurl, cJSON and libc, and the
 * daemon's commands (daemon/main.c, serve.c, worker.c) use it as well. */
#ifndef TQ_OPTS_H
#define TQ_OPTS_H

#include <stdio.h>

typedef struct {
    const char *flag;    /* "--db"; NULL ends the table */
    const char *alias;   /* "-f", or NULL */
    const char *arg;     /* the value's name ("PATH"); NULL for a switch */
    const char *help;    /* one line, without the newline */
    int required;        /* 1: shown without [ ] in the synopsis (the command checks it) */
} tq_opt;

enum {
    TQ_OPTS_EQ = 1,        /* an option with a value also takes --flag=VALUE */
    TQ_OPTS_CLIENT = 2,    /* a client command: --server URL|unix:PATH too (client/dispatch.c takes it) */
    TQ_OPTS_DASHDASH = 4,  /* "--" ends the options (what follows is arguments) */
};

typedef struct {
    const char *name;      /* "run" */
    const char *args;      /* the arguments in the synopsis ("SPEC.json", "ID..."); NULL: none taken */
    const char *about;     /* what the command does: lines of two spaces' indent, each ending in \n; or NULL */
    const tq_opt *opts;    /* ends with { NULL }; --help/-h is implied */
    const char *tail;      /* after the options ("exit: ...\n"), or NULL */
    unsigned flags;        /* TQ_OPTS_* */
} tq_cmd_doc;

/* The command's synopsis, wrapped at 100 columns: lead ("usage: " or spaces), then "trainq NAME
 * ARGS [--opt VALUE]..." (without --server and --help, which every client command takes). */
void tq_opts_synopsis(FILE *f, const tq_cmd_doc *d, const char *lead);
/* The whole --help: the synopsis, about, "options:" with one line per option, tail. */
void tq_opts_help(FILE *f, const tq_cmd_doc *d);
/* -1: go on parsing; else the exit status (see above). */
int tq_opts_check(const tq_cmd_doc *d, int argc, char **argv);
/* The option of d that arg names (flag or alias; --flag=VALUE where d takes that), or NULL. */
const tq_opt *tq_opts_find(const tq_cmd_doc *d, const char *arg);

/* The client's --server line, shared by every client command's help. */
extern const tq_opt tq_opt_server;
/* The first line of `trainq --help`'s client part. */
#define TQ_OPTS_CLIENT_HEAD "client commands (talk to a running daemon; each takes --server URL|unix:PATH and --help):"

#endif
