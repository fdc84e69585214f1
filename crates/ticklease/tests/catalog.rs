//! A database built fresh equals a database upgraded through every shipped
//! migration. Deploys reach today's schema by both paths: a new database
//! starts from the tables as 0007 leaves them and the current definitions,
//! an old one ran each release's migrations in turn (and that release's
//! `leader_grant`) before today's run re-applied the definitions. A schema
//! that differs between the two paths (a function an old migration created
//! that no definition does, a grant or an index missing, an UNLOGGED table
//! made logged) passes every test that starts from a fresh database; this
//! file compares the two catalogs object by object.

use std::collections::{BTreeMap, BTreeSet};

use tokio_postgres::{Client, SimpleQueryMessage};

use ticklease::migrate::{MigrationSet, LIBRARY, MIGRATIONS};
use ticklease_testkit::{connect, PgCluster};

/// Object name (`function leader_seed(text[])`, `column leader_leases.role`, …)
/// → its canonical description.
type Catalog = BTreeMap<String, String>;

/// The transaction-local settings `migrate_with` runs before the migrations,
/// with the default roles.
const PRELUDE: &str = "SELECT set_config('ticklease.app_role', 'ticklease_app', true), \
                       set_config('ticklease.operator_role', 'ticklease_operator', true)";

/// What releases from 0002 on ran after migrating.
const GRANT: &str = "SELECT leader_grant('ticklease_app', 'ticklease_operator')";

#[tokio::test]
async fn a_fresh_database_and_one_upgraded_through_every_migration_have_the_same_catalog() {
    let fresh = snapshot(&fresh_database().await).await;
    let upgraded = snapshot(&upgraded_database().await).await;
    assert!(
        fresh.keys().any(|k| k.starts_with("function "))
            && fresh.keys().any(|k| k.starts_with("column "))
            && fresh.len() > 50,
        "the snapshot reads the schema: {:?}",
        fresh.keys().collect::<Vec<_>>()
    );
    let diff = differences(&fresh, &upgraded);
    assert!(
        diff.is_empty(),
        "{} objects differ between a fresh and an upgraded database:\n\n{}",
        diff.len(),
        diff.join("\n\n")
    );
}

#[tokio::test]
async fn every_security_definer_function_pins_search_path_on_fresh_and_upgraded_databases() {
    definers_pin_pg_temp_last_and_none_is_public(&fresh_database().await, "fresh").await;
    definers_pin_pg_temp_last_and_none_is_public(&upgraded_database().await, "upgraded").await;
}

#[tokio::test]
async fn the_catalog_comparison_names_each_object_that_differs() {
    let fresh = snapshot(&fresh_database().await).await;
    let upgraded = upgraded_database().await;
    upgraded
        .batch_execute(
            "ALTER FUNCTION leader_seed(text[]) RESET search_path;
             CREATE INDEX extra_index ON leader_history (token);
             GRANT SELECT ON leader_replicas TO PUBLIC;
             ALTER TABLE leader_fence_claims SET LOGGED;
             ALTER TABLE leader_history ALTER COLUMN at SET DEFAULT clock_timestamp();
             ALTER TABLE leader_leases DROP CONSTRAINT leader_leases_finite_times;
             ALTER TABLE leader_fence_claims DISABLE TRIGGER leader_fence_commit;
             REVOKE USAGE ON SCHEMA public FROM ticklease_operator;
             UPDATE ticklease_schema_migrations SET checksum = 'edited' WHERE version = 7;
             DELETE FROM ticklease_schema_migrations WHERE version = 6",
        )
        .await
        .unwrap();
    let diff = differences(&fresh, &snapshot(&upgraded).await);
    let named: BTreeSet<&str> = diff.iter().filter_map(|d| d.lines().next()).collect();
    let planted = BTreeSet::from([
        "function leader_seed(text[])",
        "index extra_index",
        "table leader_replicas",
        "table leader_fence_claims",
        "column leader_history.at",
        "constraint leader_leases.leader_leases_finite_times",
        "trigger leader_fence_claims.leader_fence_commit",
        "schema public",
        "migration 7",
        "migration 6",
    ]);
    assert_eq!(named, planted, "differences:\n\n{}", diff.join("\n\n"));
}

/// A new empty database of the shared cluster, as its owner.
async fn empty_database() -> Client {
    let cluster = PgCluster::shared();
    let name = cluster.create_database().await.unwrap();
    connect(&cluster.config(&name)).await.unwrap()
}

/// Database F: today's library migrates an empty database.
async fn fresh_database() -> Client {
    let mut client = empty_database().await;
    ticklease::migrate(&mut client).await.unwrap();
    client
}

/// Database U: each older release in turn (its migrations, then its grant),
/// then today's library.
async fn upgraded_database() -> Client {
    let mut client = empty_database().await;
    for k in 1..=MIGRATIONS.len() {
        let release = MigrationSet {
            migrations: &MIGRATIONS[..k],
            ..LIBRARY
        };
        let report = release
            .apply(&mut client, PRELUDE)
            .await
            .unwrap_or_else(|e| panic!("release {k}: {e:?}"));
        assert_eq!(report.applied, [MIGRATIONS[k - 1].version], "release {k}");
        if k >= 2 {
            client
                .batch_execute(GRANT)
                .await
                .unwrap_or_else(|e| panic!("release {k}: {GRANT}: {e:?}"));
        }
    }
    let report = ticklease::migrate(&mut client).await.unwrap();
    assert!(report.applied.is_empty(), "{report:?}");
    client
}

/// Every difference between two catalogs, one string per object: its name on
/// the first line, then both descriptions.
fn differences(fresh: &Catalog, upgraded: &Catalog) -> Vec<String> {
    let keys: BTreeSet<&String> = fresh.keys().chain(upgraded.keys()).collect();
    let shown = |v: Option<&String>| v.map_or("(missing)".to_string(), |v| indent(v));
    keys.into_iter()
        .filter(|k| fresh.get(*k) != upgraded.get(*k))
        .map(|k| {
            format!(
                "{k}\n  fresh:\n{}\n  upgraded:\n{}",
                shown(fresh.get(k)),
                shown(upgraded.get(k))
            )
        })
        .collect()
}

fn indent(text: &str) -> String {
    text.lines()
        .map(|l| format!("    {l}"))
        .collect::<Vec<_>>()
        .join("\n")
}

/// The catalog of `current_schema()`: every query below yields (name, description).
async fn snapshot(client: &Client) -> Catalog {
    let queries = [
        functions_sql(),
        relations_sql(),
        sequences_sql(),
        INDEXES_SQL.to_string(),
        columns_sql(),
        CONSTRAINTS_SQL.to_string(),
        TRIGGERS_SQL.to_string(),
        POLICIES_RULES_SQL.to_string(),
        types_sql(),
        schema_sql(),
        MIGRATIONS_SQL.to_string(),
    ];
    let mut catalog = Catalog::new();
    for sql in &queries {
        for row in rows(client, sql).await {
            let [key, value]: [String; 2] = row.try_into().expect("two columns");
            let previous = catalog.insert(key.clone(), value);
            assert!(previous.is_none(), "two objects are named {key}");
        }
    }
    catalog
}

/// A sorted, readable list of the privileges of `acl` (`default` when it is
/// NULL; `NULL` for none): `grantee=PRIVILEGE[*] by grantor`, PUBLIC as `PUBLIC`.
fn acl(acl: &str, default: &str) -> String {
    format!(
        "(SELECT coalesce(string_agg(e, ', ' ORDER BY e), '(none)')
            FROM (SELECT CASE WHEN g.grantee = 0 THEN 'PUBLIC' ELSE pg_get_userbyid(g.grantee)::text END
                         || '=' || g.privilege_type || CASE WHEN g.is_grantable THEN '*' ELSE '' END
                         || ' by ' || pg_get_userbyid(g.grantor)::text AS e
                    FROM aclexplode(coalesce({acl}, {default})) AS g) AS entries)"
    )
}

fn functions_sql() -> String {
    let acl = acl("p.proacl", "acldefault('f', p.proowner)");
    format!(
        "SELECT 'function ' || p.oid::regprocedure::text,
                concat_ws(E'\\n', 'kind ' || p.prokind::text,
                          'owner ' || pg_get_userbyid(p.proowner)::text,
                          'acl ' || {acl},
                          CASE WHEN p.prokind = 'a' THEN 'aggregate' ELSE pg_get_functiondef(p.oid) END)
           FROM pg_proc AS p
          WHERE p.pronamespace = current_schema()::regnamespace"
    )
}

/// Tables, views, sequences and the like (indexes have their own query).
fn relations_sql() -> String {
    let acl = acl(
        "c.relacl",
        "acldefault(CASE c.relkind WHEN 'S' THEN 's'::\"char\" ELSE 'r'::\"char\" END, c.relowner)",
    );
    format!(
        "SELECT CASE c.relkind WHEN 'r' THEN 'table' WHEN 'p' THEN 'partitioned table'
                               WHEN 'v' THEN 'view' WHEN 'm' THEN 'materialized view'
                               WHEN 'S' THEN 'sequence' WHEN 'c' THEN 'type'
                               WHEN 'f' THEN 'foreign table' ELSE 'relation' END || ' ' || c.relname::text,
                concat_ws(E'\\n', 'relkind ' || c.relkind::text,
                          'owner ' || pg_get_userbyid(c.relowner)::text,
                          'persistence ' || c.relpersistence::text,
                          'options ' || coalesce(c.reloptions::text, '{{}}'),
                          'row security ' || c.relrowsecurity::text || ', forced ' || c.relforcerowsecurity::text,
                          'acl ' || {acl},
                          CASE WHEN c.relkind IN ('v', 'm') THEN pg_get_viewdef(c.oid) END)
           FROM pg_class AS c
          WHERE c.relnamespace = current_schema()::regnamespace AND c.relkind NOT IN ('i', 'I')"
    )
}

/// A sequence's parameters and the column that owns it (an identity's, a serial's).
fn sequences_sql() -> String {
    "SELECT 'sequence parameters ' || c.relname::text,
            format('%s start %s increment %s min %s max %s cache %s cycle %s owned by %s',
                   format_type(s.seqtypid, NULL), s.seqstart, s.seqincrement, s.seqmin, s.seqmax,
                   s.seqcache, s.seqcycle,
                   (SELECT d.refobjid::regclass::text || '.' || a.attname::text
                      FROM pg_depend AS d
                      JOIN pg_attribute AS a ON a.attrelid = d.refobjid AND a.attnum = d.refobjsubid
                     WHERE d.classid = 'pg_class'::regclass AND d.objid = c.oid
                       AND d.refclassid = 'pg_class'::regclass AND d.refobjsubid > 0
                       AND d.deptype IN ('a', 'i')))
       FROM pg_class AS c JOIN pg_sequence AS s ON s.seqrelid = c.oid
      WHERE c.relnamespace = current_schema()::regnamespace"
        .to_string()
}

const INDEXES_SQL: &str = "SELECT 'index ' || c.relname::text, pg_get_indexdef(c.oid)
                             FROM pg_class AS c
                            WHERE c.relnamespace = current_schema()::regnamespace AND c.relkind IN ('i', 'I')";

/// Every column of a table, view or type: type, NOT NULL, default, identity,
/// generation, collation and column privileges.
fn columns_sql() -> String {
    let acl = acl("a.attacl", "NULL");
    format!(
        "SELECT 'column ' || c.relname::text || '.' || a.attname::text,
                concat_ws(E'\\n', format_type(a.atttypid, a.atttypmod),
                          CASE WHEN a.attnotnull THEN 'not null' END,
                          'default ' || pg_get_expr(d.adbin, d.adrelid),
                          CASE a.attidentity WHEN 'a' THEN 'identity always' WHEN 'd' THEN 'identity by default' END,
                          CASE a.attgenerated WHEN 's' THEN 'generated stored' END,
                          CASE WHEN a.attcollation <> 0 THEN 'collation ' || a.attcollation::regcollation::text END,
                          'acl ' || {acl})
           FROM pg_attribute AS a
           JOIN pg_class AS c ON c.oid = a.attrelid
           LEFT JOIN pg_attrdef AS d ON d.adrelid = a.attrelid AND d.adnum = a.attnum
          WHERE c.relnamespace = current_schema()::regnamespace AND c.relkind NOT IN ('i', 'I', 'S')
            AND a.attnum > 0 AND NOT a.attisdropped"
    )
}

const CONSTRAINTS_SQL: &str =
    "SELECT 'constraint ' || coalesce(c.relname, t.typname)::text || '.' || k.conname::text,
                                      pg_get_constraintdef(k.oid)
                                 FROM pg_constraint AS k
                                 LEFT JOIN pg_class AS c ON c.oid = k.conrelid
                                 LEFT JOIN pg_type AS t ON t.oid = k.contypid
                                WHERE k.connamespace = current_schema()::regnamespace";

const TRIGGERS_SQL: &str = "SELECT 'trigger ' || c.relname::text || '.' || t.tgname::text,
                                   pg_get_triggerdef(t.oid) || E'\\nenabled ' || t.tgenabled::text
                              FROM pg_trigger AS t JOIN pg_class AS c ON c.oid = t.tgrelid
                             WHERE c.relnamespace = current_schema()::regnamespace AND NOT t.tgisinternal";

/// Row-level security policies and rewrite rules (none today: a new one is a difference).
const POLICIES_RULES_SQL: &str = "SELECT 'policy ' || tablename::text || '.' || policyname::text,
                                         concat_ws(E'\\n', permissive, roles::text, cmd, qual, with_check)
                                    FROM pg_policies WHERE schemaname = current_schema()
                                  UNION ALL
                                  SELECT 'rule ' || tablename::text || '.' || rulename::text, definition
                                    FROM pg_rules WHERE schemaname = current_schema()";

/// Types of their own (domains, enums, ranges, base types; none today), not
/// the row and array types every relation has.
fn types_sql() -> String {
    let acl = acl("t.typacl", "acldefault('T', t.typowner)");
    format!(
        "SELECT 'type ' || t.oid::regtype::text,
                concat_ws(E'\\n', 'typtype ' || t.typtype::text,
                          'owner ' || pg_get_userbyid(t.typowner)::text,
                          'acl ' || {acl},
                          CASE WHEN t.typbasetype <> 0 THEN 'base ' || format_type(t.typbasetype, t.typtypmod) END,
                          (SELECT 'labels ' || string_agg(e.enumlabel::text, ', ' ORDER BY e.enumsortorder)
                             FROM pg_enum AS e WHERE e.enumtypid = t.oid))
           FROM pg_type AS t
          WHERE t.typnamespace = current_schema()::regnamespace AND t.typtype <> 'c'
            AND NOT (t.typcategory = 'A' AND t.typelem <> 0)"
    )
}

/// The schema's owner and privileges, and default privileges in it.
fn schema_sql() -> String {
    let schema_acl = acl("n.nspacl", "acldefault('n', n.nspowner)");
    let default_acl = acl("d.defaclacl", "NULL");
    format!(
        "SELECT 'schema ' || n.nspname::text,
                'owner ' || pg_get_userbyid(n.nspowner)::text || E'\\nacl ' || {schema_acl}
           FROM pg_namespace AS n WHERE n.oid = current_schema()::regnamespace
         UNION ALL
         SELECT 'default privileges ' || pg_get_userbyid(d.defaclrole)::text || ' ' || d.defaclobjtype::text
                || CASE WHEN d.defaclnamespace = 0 THEN ' (every schema)' ELSE '' END,
                {default_acl}
           FROM pg_default_acl AS d
          WHERE d.defaclnamespace IN (0, current_schema()::regnamespace)"
    )
}

const MIGRATIONS_SQL: &str = "SELECT 'migration ' || version::text, name || ' ' || checksum
                                FROM ticklease_schema_migrations";

/// The definer-function check of `tests/privileges.rs`, on `client`'s database:
/// every SECURITY DEFINER function pins `search_path` with `pg_temp` last, and
/// none of ours is executable by PUBLIC.
async fn definers_pin_pg_temp_last_and_none_is_public(client: &Client, which: &str) {
    let rows = rows(
        client,
        "SELECT p.oid::regprocedure::text, p.prosecdef::text,
                array_to_string(coalesce(p.proconfig, '{}'), ' | '),
                (p.proacl IS NULL OR EXISTS (SELECT 1 FROM aclexplode(p.proacl) a
                                              WHERE a.grantee = 0 AND a.privilege_type = 'EXECUTE'))::text
           FROM pg_proc p
          WHERE p.pronamespace = current_schema()::regnamespace AND p.proname LIKE 'leader\\_%'",
    )
    .await;
    let mut definers = 0;
    for r in &rows {
        let [name, definer, config, public] = &r[..] else {
            panic!("four columns: {r:?}")
        };
        assert_eq!(public, "false", "{which}: {name} is executable by PUBLIC");
        if definer == "true" {
            definers += 1;
            assert!(
                config
                    .split(" | ")
                    .any(|c| c == "search_path=pg_catalog, public, pg_temp"),
                "{which}: {name} must pin search_path with pg_temp last: {config:?}"
            );
        }
    }
    assert!(
        definers >= 9,
        "{which}: acquire, renew, release, fence, commit check, seed, pause, unpause, run now"
    );
}

/// The rows of `sql` (simple query protocol), every value as text, NULL as `<null>`.
async fn rows(client: &Client, sql: &str) -> Vec<Vec<String>> {
    let messages = client
        .simple_query(sql)
        .await
        .unwrap_or_else(|e| panic!("{sql}: {e:?}"));
    messages
        .iter()
        .filter_map(|m| match m {
            SimpleQueryMessage::Row(r) => Some(
                (0..r.len())
                    .map(|i| r.get(i).unwrap_or("<null>").to_string())
                    .collect(),
            ),
            _ => None,
        })
        .collect()
}
