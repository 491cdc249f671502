/* opts.c — --help, the synopsis and the options check from one table per command. See opts.h. */
#include "opts.h"

#include <string.h>

#define WRAP 100

const tq_opt tq_opt_server = { "--server", NULL, "URL|unix:PATH", "the daemon to talk to (by default: see below)", 0 };
static const tq_opt opt_help = { "--help", "-h", NULL, "this help", 0 };
static const char server_note[] =
    "server: --server, else $TRAINQ_SERVER (a URL or unix:PATH), else the first socket that exists\n"
    "        of $TRAINQ_SOCKET, ./var/trainq.sock and /run/trainq/trainq.sock, else\n"
    "        http://127.0.0.1:8470\n";

/* "[--db PATH]", "[-f|--follow]" */
static void synopsis_item(const tq_opt *o, char *buf, size_t n) {
    snprintf(buf, n, "%s%s%s%s%s%s%s", o->required ? "" : "[", o->alias ? o->alias : "", o->alias ? "|" : "",
             o->flag, o->arg ? " " : "", o->arg ? o->arg : "", o->required ? "" : "]");
}

void tq_opts_synopsis(FILE *f, const tq_cmd_doc *d, const char *lead) {
    int col = fprintf(f, "%strainq %s", lead, d->name);
    int indent = col + 1;
    if (d->args) col += fprintf(f, " %s", d->args);
    for (const tq_opt *o = d->opts; o && o->flag; o++) {
        char item[160];
        synopsis_item(o, item, sizeof item);
        int len = (int)strlen(item);
        if (col + 1 + len > WRAP && col > indent) col = fprintf(f, "\n%*s%s", indent, "", item) - 1;
        else col += fprintf(f, " %s", item);
    }
    fputc('\n', f);
}

static int label(const tq_opt *o, char *buf, size_t n) {
    return snprintf(buf, n, "%s%s%s%s%s", o->alias ? o->alias : "", o->alias ? ", " : "", o->flag,
                    o->arg ? " " : "", o->arg ? o->arg : "");
}

static void option_line(FILE *f, const tq_opt *o, int width) {
    char l[160];
    int n = label(o, l, sizeof l);
    fprintf(f, "  %s%*s  %s\n", l, n < width ? width - n : 0, "", o->help);
}

void tq_opts_help(FILE *f, const tq_cmd_doc *d) {
    tq_opts_synopsis(f, d, "usage: ");
    if (d->about) fputs(d->about, f);
    char l[160];
    int width = label(&opt_help, l, sizeof l);
    for (const tq_opt *o = d->opts; o && o->flag; o++) {
        int n = label(o, l, sizeof l);
        if (n > width) width = n;
    }
    if (d->flags & TQ_OPTS_CLIENT) {
        int n = label(&tq_opt_server, l, sizeof l);
        if (n > width) width = n;
    }
    if (width > 32) width = 32;
    fputs("options:\n", f);
    for (const tq_opt *o = d->opts; o && o->flag; o++) option_line(f, o, width);
    if (d->flags & TQ_OPTS_CLIENT) option_line(f, &tq_opt_server, width);
    option_line(f, &opt_help, width);
    if (d->flags & TQ_OPTS_CLIENT) fputs(server_note, f);
    if (d->tail) fputs(d->tail, f);
}

static const tq_opt *find_name(const tq_cmd_doc *d, const char *a, size_t n) {
    for (const tq_opt *o = d->opts; o && o->flag; o++) {
        if (strlen(o->flag) == n && !strncmp(o->flag, a, n)) return o;
        if (o->alias && strlen(o->alias) == n && !strncmp(o->alias, a, n)) return o;
    }
    return NULL;
}

const tq_opt *tq_opts_find(const tq_cmd_doc *d, const char *arg) {
    const tq_opt *o = find_name(d, arg, strlen(arg));
    if (o) return o;
    const char *eq = strchr(arg, '=');
    if (!eq || strncmp(arg, "--", 2) || !(d->flags & TQ_OPTS_EQ)) return NULL;
    o = find_name(d, arg, (size_t)(eq - arg));
    return o && o->arg ? o : NULL;
}

int tq_opts_check(const tq_cmd_doc *d, int argc, char **argv) {
    char prog[64];
    snprintf(prog, sizeof prog, "trainq %s", d->name);
    for (int i = 0; i < argc; i++) {
        if (!strcmp(argv[i], "--") && (d->flags & TQ_OPTS_DASHDASH)) break;
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) { tq_opts_help(stdout, d); return 0; }
    }
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--") && (d->flags & TQ_OPTS_DASHDASH)) break;
        if (a[0] != '-' || !a[1]) {   /* an argument ("-" is stdin) */
            if (!d->args) {
                fprintf(stderr, "%s: unexpected argument %s (%s takes no arguments; %s --help)\n", prog, a,
                        prog, prog);
                return 2;
            }
            continue;
        }
        const tq_opt *o = tq_opts_find(d, a);
        if (!o) {
            const char *eq = strchr(a, '=');
            const tq_opt *named = eq ? find_name(d, a, (size_t)(eq - a)) : NULL;
            if (named && named->arg)
                fprintf(stderr, "%s: write %s %s as two arguments, not %s (%s --help lists the options)\n", prog,
                        named->flag, named->arg, a, prog);
            else if (named)
                fprintf(stderr, "%s: %s takes no value (%s --help lists the options)\n", prog, named->flag, prog);
            else
                fprintf(stderr, "%s: unknown option %s (%s --help lists the options)\n", prog, a, prog);
            return 2;
        }
        if (o->arg && !strchr(a, '=')) {
            if (i + 1 >= argc) {
                fprintf(stderr, "%s: %s needs a value (%s %s)\n", prog, a, o->flag, o->arg);
                return 2;
            }
            i++;
        }
    }
    return -1;
}
