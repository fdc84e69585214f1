//! The protocol's current SQL, one file per concept in `definitions/`: every
//! function, the view and the trigger, each body in one place. Versioned
//! migrations (`migrations/`) change tables and data only; the shipped
//! 0001–0007 also created functions and stay as they are, since databases
//! hold their checksums.
//!
//! A migration run applies the definitions in their fixed order, inside its
//! own transaction and advisory lock, each file whose checksum differs from
//! the one the database recorded (`ticklease_schema_definitions`), then pins
//! `search_path` on every SECURITY DEFINER function and re-grants. A run
//! never applies definitions older than the database's: a replica of an
//! older release that migrates during a rolling deploy leaves the newer
//! bodies in place (the compatibility file keeps its signatures working).
//!
//! A database created from nothing starts from `migrations/tables_at_0007.sql` (the tables as
//! 0001–0007 leave them) and records those versions as applied; the catalog
//! test holds it equal to a database upgraded through every migration.

use sha2::{Digest, Sha256};
use tokio_postgres::types::{ToSql, Type};
use tokio_postgres::Transaction;

use crate::error::MigrateError;

/// One file of current definitions.
#[derive(Debug, Clone, Copy)]
pub struct Definition {
    /// The file's name without `.sql`, recorded with its checksum.
    pub name: &'static str,
    /// The SQL; `@schema@` stands for the schema's quoted name, `@schema_text@` for it as a literal.
    pub sql: &'static str,
}

macro_rules! definition {
    ($name:literal) => {
        Definition {
            name: $name,
            sql: include_str!(concat!("definitions/", $name, ".sql")),
        }
    };
}

/// The definitions, in the order they are applied (each uses only the ones before it).
pub const DEFINITIONS: &[Definition] = &[
    definition!("10_liveness"),
    definition!("20_history"),
    definition!("30_fence"),
    definition!("40_terms"),
    definition!("50_families"),
    definition!("60_operator"),
    definition!("65_status_view"),
    definition!("70_compatibility"),
    definition!("80_privileges"),
    definition!("90_comments"),
];

/// Raised with every change to a definitions file that lands: a run
/// applies its definitions only over a database at this generation or an
/// older one. `definitions/generations.txt` holds each generation's
/// checksums; a unit test fails on a changed file without a new block.
pub const DEFINITIONS_GENERATION: i32 = 9;

/// The table that records the applied definitions.
pub const DEFINITIONS_TABLE: &str = "ticklease_schema_definitions";

/// The tables as the shipped migrations up to [`TABLES_AT`] leave them.
pub(crate) const TABLES: &str = include_str!("migrations/tables_at_0007.sql");

/// The last versioned migration that [`TABLES`] stands in for.
pub(crate) const TABLES_AT: i32 = 7;

/// Refuses a schema that a login other than the owner could plant objects
/// in: our SECURITY DEFINER functions call functions of this schema with
/// the owner's rights, and a better-matching overload planted beside them
/// (or beside a built-in) would be called instead. Also refuses a run by a
/// login that does not own the tables. `roles`: the app and operator roles.
pub(crate) async fn check_writers(tx: &Transaction<'_>, roles: [&String; 2]) -> Result<(), MigrateError> {
    let db = |source| MigrateError::Db {
        step: "check who may write the schema".into(),
        source,
    };
    let owner = tx.query_typed(OWNER, &[]).await.map_err(db)?;
    if let Some(row) = owner.first() {
        let (user, owner): (String, String) = (row.get(0), row.get(1));
        if user != owner {
            return Err(MigrateError::NotOwner { user, owner });
        }
    }
    let roles: [(&(dyn ToSql + Sync), Type); 2] = [(roles[0], Type::TEXT), (roles[1], Type::TEXT)];
    let rows = tx.query_typed(WRITERS, &roles).await.map_err(db)?;
    let (schema, creators, planted): (String, String, String) =
        (rows[0].get(0), rows[0].get(1), rows[0].get(2));
    let detail = if !creators.is_empty() {
        format!("{creators} may create objects in it (revoke CREATE on the schema, or give ticklease a schema of its own)")
    } else if !planted.is_empty() {
        format!("functions of another owner shadow ours or built-ins: {planted} (drop them)")
    } else {
        return Ok(());
    };
    Err(MigrateError::UnsafeSchema { schema, detail })
}

/// The migrating login and the owner of `leader_leases` (no row on a fresh database).
const OWNER: &str = "SELECT current_user::text, pg_get_userbyid(c.relowner)::text FROM pg_class AS c
                      WHERE c.oid = to_regclass(quote_ident(current_schema()) || '.leader_leases')";

/// The schema; who of PUBLIC and the members of the app and operator roles
/// may create in it; functions in it of another owner named like ours or a built-in.
const WRITERS: &str = r"
    SELECT current_schema()::text,
           coalesce((SELECT string_agg(w, ', ' ORDER BY w) FROM (
               SELECT 'PUBLIC' AS w FROM pg_namespace AS n, aclexplode(n.nspacl) AS a
                WHERE n.nspname = current_schema() AND a.grantee = 0 AND a.privilege_type = 'CREATE'
               UNION
               SELECT m.rolname::text FROM pg_roles AS m, pg_roles AS g
                WHERE g.rolname IN ($1, $2) AND pg_has_role(m.oid, g.oid, 'MEMBER') AND NOT m.rolsuper
                  AND m.rolname <> current_user
                  AND has_schema_privilege(m.oid, current_schema(), 'CREATE')) AS c), ''),
           coalesce((SELECT string_agg(p.oid::regprocedure::text || ' of ' || pg_get_userbyid(p.proowner), ', ')
                       FROM pg_proc AS p JOIN pg_namespace AS n ON n.oid = p.pronamespace
                      WHERE n.nspname = current_schema() AND pg_get_userbyid(p.proowner) <> current_user
                        AND (p.proname LIKE 'leader\_%' OR EXISTS (
                            SELECT 1 FROM pg_proc AS b
                             WHERE b.pronamespace = 'pg_catalog'::regnamespace AND b.proname = p.proname))), '')";

/// SHA-256 of a schema file (a migration or a definition), hex.
pub(crate) fn checksum(sql: &str) -> String {
    Sha256::digest(sql.as_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// Applies every definition whose recorded checksum or generation differs
/// from this build's; returns the names applied, or none and the
/// database's generation when it is newer.
pub(crate) async fn apply(tx: &Transaction<'_>) -> Result<(Vec<String>, Option<i32>), MigrateError> {
    let db = |step: &str| {
        let step = step.to_string();
        move |source| MigrateError::Db { step, source }
    };
    tx.batch_execute(&format!(
        "CREATE TABLE IF NOT EXISTS {DEFINITIONS_TABLE} (
             name       text PRIMARY KEY,
             checksum   text NOT NULL,
             generation integer NOT NULL,
             applied_at timestamptz NOT NULL DEFAULT now())"
    ))
    .await
    .map_err(db("create the definitions table"))?;
    let recorded = tx
        .query_typed(
            &format!("SELECT name, checksum, generation FROM {DEFINITIONS_TABLE}"),
            &[],
        )
        .await
        .map_err(db("read applied definitions"))?;
    let newest = recorded.iter().map(|r| r.get::<_, i32>(2)).max();
    if let Some(newer) = newest.filter(|g| *g > DEFINITIONS_GENERATION) {
        return Ok((Vec::new(), Some(newer)));
    }
    let rows = tx
        .query_typed(
            "SELECT quote_ident(current_schema()), quote_literal(current_schema())",
            &[],
        )
        .await
        .map_err(db("read the schema"))?;
    let (ident, literal): (String, String) = rows.first().map(|r| (r.get(0), r.get(1))).unwrap_or_default();
    let mut applied = Vec::new();
    for d in DEFINITIONS {
        let sum = checksum(d.sql);
        let current = recorded.iter().any(|r| {
            r.get::<_, &str>(0) == d.name
                && r.get::<_, &str>(1) == sum
                && r.get::<_, i32>(2) == DEFINITIONS_GENERATION
        });
        if current {
            continue;
        }
        let step = format!("definitions/{}.sql", d.name);
        tx.batch_execute(
            &d.sql
                .replace("@schema_text@", &literal)
                .replace("@schema@", &ident),
        )
        .await
        .map_err(db(&step))?;
        // Names and checksums are this build's constants ([0-9a-z_]).
        tx.batch_execute(&format!(
            "INSERT INTO {DEFINITIONS_TABLE} (name, checksum, generation)
             VALUES ('{}', '{sum}', {DEFINITIONS_GENERATION})
             ON CONFLICT (name) DO UPDATE
                SET checksum = excluded.checksum, generation = excluded.generation, applied_at = now()",
            d.name
        ))
        .await
        .map_err(db(&step))?;
        applied.push(d.name.to_string());
    }
    let names: Vec<String> = DEFINITIONS.iter().map(|d| format!("'{}'", d.name)).collect();
    tx.batch_execute(&format!(
        "DELETE FROM {DEFINITIONS_TABLE} WHERE name NOT IN ({})",
        names.join(", ")
    ))
    .await
    .map_err(db("forget removed definitions"))?;
    if !applied.is_empty() {
        // A replaced function lost its pinned search_path; a new one is executable by PUBLIC.
        tx.batch_execute("SELECT leader_secure_functions(); SELECT leader_regrant()")
            .await
            .map_err(db("secure and re-grant the functions"))?;
    }
    Ok((applied, None))
}

/// Checks that the database holds this build's definitions or newer ones;
/// `command` applies them.
pub(crate) async fn verify(
    client: &tokio_postgres::Client,
    command: &'static str,
) -> Result<(), MigrateError> {
    let sql = format!("SELECT coalesce(min(generation), 0) FROM {DEFINITIONS_TABLE}");
    let generation: i32 = match client.query_typed(&sql, &[]).await {
        Ok(rows) => rows.first().map_or(0, |r| r.get(0)),
        Err(e) if e.code() == Some(&tokio_postgres::error::SqlState::UNDEFINED_TABLE) => 0,
        Err(source) => {
            return Err(MigrateError::Db {
                step: "verify the definitions".into(),
                source,
            })
        }
    };
    if generation >= DEFINITIONS_GENERATION {
        return Ok(());
    }
    Err(MigrateError::NotMigrated {
        detail: format!(
            "the SQL definitions are at generation {generation}, this build needs {DEFINITIONS_GENERATION}"
        ),
        command,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// (generation, file, checksum) of `definitions/generations.txt`.
    fn generations() -> Vec<(i32, String, String)> {
        include_str!("definitions/generations.txt")
            .lines()
            .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
            .map(|l| {
                let f: Vec<&str> = l.split_whitespace().collect();
                assert_eq!(f.len(), 3, "generations.txt: {l:?}");
                (f[0].parse().unwrap(), f[1].to_string(), f[2].to_string())
            })
            .collect()
    }

    #[test]
    fn a_changed_definition_comes_with_a_new_generation() {
        let all = generations();
        let newest = all.iter().map(|(g, _, _)| *g).max().unwrap();
        assert_eq!(
            newest, DEFINITIONS_GENERATION,
            "generations.txt ends at the constant"
        );
        for g in 1..=newest {
            assert!(all.iter().any(|(n, _, _)| *n == g), "generation {g} has a block");
        }
        let current: Vec<(&str, &str)> = all
            .iter()
            .filter(|(g, _, _)| *g == DEFINITIONS_GENERATION)
            .map(|(_, f, s)| (f.as_str(), s.as_str()))
            .collect();
        let files: Vec<(&str, String)> = DEFINITIONS.iter().map(|d| (d.name, checksum(d.sql))).collect();
        for (name, sum) in &files {
            assert!(
                current.contains(&(*name, sum.as_str())),
                "definitions/{name}.sql differs from generation {DEFINITIONS_GENERATION}: add a block for \
                 generation {} to generations.txt and raise DEFINITIONS_GENERATION (its checksum is {sum})",
                DEFINITIONS_GENERATION + 1
            );
        }
        assert_eq!(
            current.len(),
            files.len(),
            "one line per file in the newest block"
        );
    }
}
