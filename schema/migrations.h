/* migrations.h — the numbered schema migrations, compiled into the binary.
 *
 * Contract: tq_migrations() returns the migrations in order; entry i has version i + 1 and is
 * the exact text of schema/migrations/NNNN_name.sql (that file is the source of truth;
 * schema/migrations.c holds a byte-identical copy as a C string, and tests/unit/test_store.c
 * fails when the two differ). Applying migration v to a database at user_version v − 1 gives
 * user_version v; schema/store.c does that, one BEGIN IMMEDIATE transaction per migration.
 * Static data, no allocation, callable from any thread. */
#ifndef TQ_MIGRATIONS_H
#define TQ_MIGRATIONS_H

typedef struct {
    int version;        /* 1, 2, … = the PRAGMA user_version after it */
    const char *file;   /* "0001_init.sql", relative to schema/migrations/ */
    const char *sql;    /* the file's text */
} tq_migration;

/* All migrations, oldest first; *count receives how many (the schema version this binary
 * knows). */
const tq_migration *tq_migrations(int *count);

#endif
