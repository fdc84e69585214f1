//! `docs/sql-api.md` and the catalog agree. The reference lists every
//! function of the schema between its `sql-api:signatures` markers, one per
//! line: `client`, `internal` or `compatibility`, then the signature as
//! `name(arguments) -> result`. This test holds that list equal to `pg_proc`
//! of a freshly migrated database (argument names and types, results), every
//! client function executable by the app or operator role and described
//! outside the list, and every function's COMMENT present and naming its
//! kind (`definitions/90_comments.sql`). A second test pins the answers the
//! reference documents as they are (a lost RENEW is one row, a won ACQUIRE
//! describes the row before, the values RELEASE accepts and refuses).

use std::collections::BTreeMap;

use tokio_postgres::{Client, GenericClient};

use ticklease_testkit::{connect, direct, migrated_db, scalar, PgCluster};

const DOC: &str = include_str!("../../../docs/sql-api.md");
const BEGIN: &str = "<!-- sql-api:signatures -->";
const END: &str = "<!-- /sql-api:signatures -->";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Client,
    Internal,
    Compatibility,
}

impl Kind {
    fn parse(word: &str) -> Option<Kind> {
        match word {
            "client" => Some(Kind::Client),
            "internal" => Some(Kind::Internal),
            "compatibility" => Some(Kind::Compatibility),
            _ => None,
        }
    }

    /// How the function's COMMENT starts.
    fn comment_prefixes(self) -> &'static [&'static str] {
        match self {
            Kind::Client => &["ticklease client", "ticklease operator"],
            Kind::Internal => &["ticklease internal"],
            Kind::Compatibility => &["ticklease compatibility"],
        }
    }
}

/// One spelling for a signature: single spaces, `timestamptz`, no space before `(`.
fn normalize(signature: &str) -> String {
    signature
        .replace("timestamp with time zone", "timestamptz")
        .split_whitespace()
        .collect::<Vec<_>>()
        .join(" ")
        .replace(" (", "(")
        .replace("( ", "(")
        .replace(" )", ")")
}

/// The reference's list: signature → kind (a signature listed twice is an error).
fn documented(doc: &str) -> Result<BTreeMap<String, Kind>, String> {
    let start = doc.find(BEGIN).ok_or("no signatures marker")? + BEGIN.len();
    let end = doc[start..].find(END).ok_or("no end marker")? + start;
    let mut list = BTreeMap::new();
    for line in doc[start..end].lines().map(str::trim) {
        if line.is_empty() || line.starts_with("```") {
            continue;
        }
        let (word, signature) = line
            .split_once(char::is_whitespace)
            .ok_or_else(|| format!("not `kind signature`: {line:?}"))?;
        let kind = Kind::parse(word).ok_or_else(|| format!("unknown kind {word:?} in {line:?}"))?;
        if list.insert(normalize(signature), kind).is_some() {
            return Err(format!("listed twice: {signature}"));
        }
    }
    Ok(list)
}

struct Function {
    signature: String,
    name: String,
    comment: Option<String>,
    app: bool,
    operator: bool,
}

/// Every function of the schema the database was migrated into.
async fn catalog(client: &Client) -> Vec<Function> {
    let rows = client
        .query(
            "SELECT p.proname::text,
                    p.proname || '(' || pg_get_function_arguments(p.oid) || ') -> ' || pg_get_function_result(p.oid),
                    obj_description(p.oid, 'pg_proc'),
                    has_function_privilege('ticklease_app', p.oid, 'EXECUTE'),
                    has_function_privilege('ticklease_operator', p.oid, 'EXECUTE'),
                    quote_ident(current_schema())
               FROM pg_proc AS p
              WHERE p.pronamespace = (SELECT oid FROM pg_namespace WHERE nspname = current_schema())
              ORDER BY 2",
            &[],
        )
        .await
        .expect("read pg_proc");
    rows.iter()
        .map(|r| {
            let schema: String = r.get(5);
            Function {
                name: r.get(0),
                signature: normalize(&r.get::<_, String>(1).replace(&format!("{schema}."), "")),
                comment: r.get(2),
                app: r.get(3),
                operator: r.get(4),
            }
        })
        .collect()
}

/// What differs between the reference and the catalog, one line each.
fn disagreements(doc: &str, functions: &[Function]) -> Vec<String> {
    let list = match documented(doc) {
        Ok(list) => list,
        Err(e) => return vec![format!("docs/sql-api.md: {e}")],
    };
    let outside = doc.replace(&doc[doc.find(BEGIN).unwrap_or(0)..doc.find(END).unwrap_or(0)], "");
    let mut problems = Vec::new();
    for f in functions {
        let Some(kind) = list.get(&f.signature) else {
            problems.push(format!(
                "not in docs/sql-api.md's list (as client, internal or compatibility): {}",
                f.signature
            ));
            continue;
        };
        if *kind == Kind::Client {
            if !(f.app || f.operator) {
                problems.push(format!(
                    "a client function neither role may call: {}",
                    f.signature
                ));
            }
            if !outside.contains(&format!("`{}", f.name)) && !outside.contains(&format!("## {}", f.name)) {
                problems.push(format!(
                    "a client function the reference lists but never describes: {}",
                    f.name
                ));
            }
        }
        match &f.comment {
            None => problems.push(format!(
                "no COMMENT (definitions/90_comments.sql): {}",
                f.signature
            )),
            Some(c) if !kind.comment_prefixes().iter().any(|p| c.starts_with(p)) => problems.push(format!(
                "COMMENT of {} does not start with {:?}: {c:?}",
                f.signature,
                kind.comment_prefixes()
            )),
            Some(_) => {}
        }
    }
    for signature in list.keys() {
        if !functions.iter().any(|f| &f.signature == signature) {
            problems.push(format!(
                "listed in docs/sql-api.md but not in the catalog: {signature}"
            ));
        }
    }
    problems
}

async fn owner() -> Client {
    let db = migrated_db(PgCluster::shared()).await;
    connect(&direct(&db)).await.expect("connect")
}

#[tokio::test]
async fn the_reference_lists_every_function_with_its_signature_kind_and_comment() {
    let client = owner().await;
    let functions = catalog(&client).await;
    assert!(
        functions.len() > 40,
        "the catalog is read: {} functions",
        functions.len()
    );
    let problems = disagreements(DOC, &functions);
    assert!(
        problems.is_empty(),
        "docs/sql-api.md disagrees with the catalog:\n{}",
        problems.join("\n")
    );

    // The check sees each kind of disagreement.
    let line = DOC
        .lines()
        .find(|l| l.starts_with("client") && l.contains("leader_renew_v2("))
        .expect("leader_renew is listed");
    let dropped = DOC.replace(&format!("{line}\n"), "");
    assert!(
        disagreements(&dropped, &functions)
            .iter()
            .any(|p| p.starts_with("not in docs/sql-api.md's list") && p.contains("leader_renew_v2(p_role")),
        "a function left out of the list is named"
    );
    let renamed = DOC.replace(
        "p_cooldown_ms bigint, p_outcome text, p_reason text, p_error text, p_output text)",
        "p_cooldown bigint, p_outcome text, p_reason text, p_error text, p_output text)",
    );
    assert_ne!(renamed, DOC);
    assert!(
        disagreements(&renamed, &functions).iter().any(|p| p
            .starts_with("listed in docs/sql-api.md but not in the catalog")
            && p.contains("leader_release")),
        "a wrong argument name is named"
    );
    let mut uncommented: Vec<Function> = catalog(&client).await;
    uncommented
        .iter_mut()
        .find(|f| f.name == "leader_fence")
        .expect("the fence")
        .comment = None;
    assert!(
        disagreements(DOC, &uncommented)
            .iter()
            .any(|p| p.starts_with("no COMMENT") && p.contains("leader_fence(")),
        "a missing comment is named"
    );
}

/// One row of a query, as text columns.
async fn row(client: &impl GenericClient, sql: &str) -> tokio_postgres::Row {
    client
        .query_one(sql, &[])
        .await
        .unwrap_or_else(|e| panic!("{sql}: {e}"))
}

async fn refused(client: &Client, sql: &str) -> String {
    let e = client.query(sql, &[]).await.expect_err(sql);
    let db = e.as_db_error().unwrap_or_else(|| panic!("{sql}: {e}"));
    assert_eq!(db.code().code(), "22023", "{sql}: {}", db.message());
    db.message().to_string()
}

/// ACQUIRE answers one row (a win is holder_token alone, the rest the row
/// before); RENEW one row whatever happened, `renewed = false` naming the
/// current term.
#[tokio::test]
async fn acquire_and_renew_answer_as_the_reference_documents() {
    let client = owner().await;
    let won = row(
        &client,
        "SELECT * FROM leader_acquire_v2('doc', 'h1', 10000, 60000, NULL, false)",
    )
    .await;
    let token: i64 = won.get("holder_token");
    assert!(
        !won.get::<_, bool>("held"),
        "a win on a free role says held = false"
    );
    assert_eq!(won.get::<_, Option<String>>("holder_id"), None);
    let refused_row = row(
        &client,
        "SELECT * FROM leader_acquire_v2('doc', 'h2', 10000, 60000, NULL, false)",
    )
    .await;
    assert_eq!(refused_row.get::<_, Option<i64>>("holder_token"), None);
    assert!(refused_row.get::<_, bool>("held"));
    assert_eq!(
        refused_row.get::<_, Option<String>>("holder_id").as_deref(),
        Some("h1")
    );

    let renewed = row(
        &client,
        &format!("SELECT * FROM leader_renew_v2('doc', {token}, 10000, NULL)"),
    )
    .await;
    assert!(renewed.get::<_, bool>("renewed"));
    let lost = client
        .query(
            &format!("SELECT * FROM leader_renew_v2('doc', {}, 10000, NULL)", token - 1),
            &[],
        )
        .await
        .unwrap();
    assert_eq!(lost.len(), 1, "a lost term is one row, not zero");
    assert!(!lost[0].get::<_, bool>("renewed"));
    assert_eq!(lost[0].get::<_, Option<i64>>("holder_token"), Some(token));
}

/// RELEASE takes every documented outcome and reason (an ended term:
/// false), refuses the reasons the history alone uses and a negative
/// cooldown, and takes a zero or NULL cooldown as none.
#[tokio::test]
async fn release_takes_every_documented_outcome_and_reason_and_no_other() {
    let client = owner().await;
    for outcome in ["completed", "interrupted", "lost", "failed", "panicked"] {
        for reason in [
            "NULL",
            "'taken_over'",
            "'paused'",
            "'released'",
            "'heartbeat_timeout'",
            "'superseded'",
        ] {
            let r = row(
                &client,
                &format!("SELECT leader_release('doc', 1, false, NULL, '{outcome}', {reason}, NULL, NULL)"),
            )
            .await;
            assert!(!r.get::<_, bool>(0), "{outcome} {reason}");
            assert!(
                DOC.contains(&format!("`{outcome}`")),
                "the reference names {outcome}"
            );
            assert!(
                reason == "NULL" || DOC.contains(&reason.replace('\'', "`")),
                "the reference names {reason}"
            );
        }
    }
    for reason in ["expired", "holder_gone"] {
        let message = refused(
            &client,
            &format!("SELECT leader_release('doc', 1, false, NULL, 'lost', '{reason}', NULL, NULL)"),
        )
        .await;
        assert!(
            message.starts_with("ticklease: leader_release needs p_stamp"),
            "{message}"
        );
    }
    let message = refused(
        &client,
        "SELECT leader_release('doc', 1, true, -1, 'completed', NULL, NULL, NULL)",
    )
    .await;
    assert_eq!(
        message,
        "ticklease: cooldown must be within 1 ms .. 24 h, got -1 ms"
    );
    let first = acquired(&client).await;
    released_with_a_cooldown_of(&client, first, "0").await;
    let again = acquired(&client).await;
    released_with_a_cooldown_of(&client, again, "NULL").await;
    acquired(&client).await;
}

/// A new term of `doc`, which must start: its token.
async fn acquired(client: &tokio_postgres::Client) -> i64 {
    let term = row(
        client,
        "SELECT * FROM leader_acquire_v2('doc', 'h1', 10000, 60000, NULL, false)",
    )
    .await;
    assert!(term.get::<_, bool>("acquired"), "a zero or NULL cooldown is none");
    term.get("holder_token")
}

/// Releases `doc`'s term `token` as failed with `cooldown`.
async fn released_with_a_cooldown_of(client: &tokio_postgres::Client, token: i64, cooldown: &str) {
    let released = row(
        client,
        &format!("SELECT leader_release('doc', {token}, false, {cooldown}, 'failed', NULL, NULL, NULL)"),
    )
    .await;
    assert!(released.get::<_, bool>(0), "a cooldown of {cooldown} is accepted");
}

/// The message texts the reference quotes are the server's.
#[tokio::test]
async fn the_refusals_the_reference_quotes_are_the_servers() {
    let client = owner().await;
    for text in [
        "ticklease: leader_acquire needs a holder id of at most 200 characters",
        "ticklease: leader_acquire needs p_long_lived (true or false)",
        "ticklease: cooldown must be within 1 ms .. 24 h, got N ms",
    ] {
        assert!(DOC.contains(text), "the reference quotes {text:?}");
    }
    assert_eq!(
        refused(
            &client,
            "SELECT * FROM leader_acquire_v2('doc', NULL, 10000, 60000, NULL, false)"
        )
        .await,
        "ticklease: leader_acquire needs a holder id of at most 200 characters"
    );
    assert_eq!(
        refused(
            &client,
            "SELECT * FROM leader_acquire_v2('doc', 'h', 10000, 60000, NULL, NULL)"
        )
        .await,
        "ticklease: leader_acquire needs p_long_lived (true or false)"
    );
}

/// Issue 34, item 3: a refusal names the problem, and its CONTEXT (which
/// clients log with the message) holds no function body: bounds are checked
/// in statements of their own, before the function's big one.
#[tokio::test]
async fn a_refusal_names_the_problem_and_carries_no_function_body() {
    let client = owner().await;
    for sql in [
        "SELECT * FROM leader_acquire_v2('r', 'h', 2000, 0, NULL, false)",
        "SELECT * FROM leader_acquire_v2('r', 'h', 0, 1000, NULL, false)",
        "SELECT * FROM leader_acquire_v2(NULL, 'h', 2000, 1000, NULL, false)",
        "SELECT * FROM leader_acquire_occurrence_v2('r', 'h', 0, NULL, NULL, NULL, NULL, NULL, 's', NULL)",
        "SELECT * FROM leader_renew_v2('r', 1, 0, NULL)",
        "SELECT * FROM leader_replica_beat('f', 'h', 0, NULL)",
        "SELECT * FROM leader_acquire_occurrence_v2('r', 'h', 2000, 'infinity', NULL, NULL, NULL, NULL, 's', NULL)",
        "SELECT * FROM leader_acquire_occurrence_v2(NULL, 'h', 2000, NULL, NULL, NULL, NULL, NULL, 's', NULL)",
        "SELECT * FROM leader_acquire_many(ARRAY['r'], 'h', 0, 1000, NULL, 1, NULL, NULL, NULL, NULL, NULL)",
        "SELECT * FROM leader_acquire_many(ARRAY['r'], 'h', 2000, 1000, NULL, -1, NULL, NULL, NULL, NULL, NULL)",
        "SELECT * FROM leader_acquire_many(ARRAY[NULL::text], 'h', 2000, 1000, NULL, 1, NULL, NULL, NULL, NULL, NULL)",
        "SELECT * FROM leader_acquire_many(ARRAY['r'], 'h', 2000, NULL, NULL, 1, now(), NULL, 's', now() + interval '1h', NULL)",
        "SELECT * FROM leader_renew_many(ARRAY['r'], ARRAY[1], 0, NULL)",
        "SELECT * FROM leader_renew_many(ARRAY['r'], ARRAY[]::bigint[], 2000, NULL)",
        "SELECT * FROM leader_release_many(ARRAY['r'], ARRAY[1], ARRAY[false], ARRAY[0], ARRAY['x'], ARRAY[NULL], ARRAY[NULL])",
        "SELECT * FROM leader_release('r', 1, false, NULL, 'x', NULL, NULL, NULL)",
        "SELECT * FROM leader_release('r', 1, false, -5, 'failed', NULL, NULL, NULL)",
        "SELECT leader_pause('r', '', 'why')",
        "SELECT leader_fence_sweep(NULL)",
        "SELECT * FROM leader_acquire_v2('Billing', 'h', 2000, 1000, NULL, false)",
        "SELECT * FROM leader_acquire_occurrence_v2('bad role', 'h', 2000, NULL, NULL, NULL, NULL, NULL, 's', NULL)",
        "SELECT * FROM leader_acquire_many(ARRAY['ok', 'Bad'], 'h', 2000, 1000, NULL, 1, NULL, NULL, NULL, NULL, NULL)",
    ] {
        let error = client.query(sql, &[]).await.expect_err(sql);
        let db = error.as_db_error().unwrap_or_else(|| panic!("{sql}: {error}"));
        assert_eq!(db.code().code(), "22023", "{sql}: {db:?}");
        assert!(db.message().starts_with("ticklease: "), "{sql}: {}", db.message());
        let context = db.where_().unwrap_or_default();
        assert!(
            context.lines().count() <= 6
                && context.len() <= 600
                && !["INSERT", "UPDATE", "WITH "].iter().any(|w| context.contains(w)),
            "{sql}: a function body in CONTEXT:\n{context}"
        );
    }
}

/// `(acquired, reason)` of an ACQUIRE as text, `reason` "-" when NULL.
async fn acquire_answer(client: &impl GenericClient, sql: &str) -> (bool, String) {
    let r = row(client, sql).await;
    let reason: Option<String> = r.get("reason");
    (r.get("acquired"), reason.unwrap_or_else(|| "-".into()))
}

/// Issue 34, item 2: every ACQUIRE answer says whether it started a term
/// and, when not, why, in the order a client acts on; a lost RENEW says why,
/// in the words RELEASE takes.
#[tokio::test]
async fn every_answer_says_whether_it_acquired_or_renewed_and_why_not() {
    let client = owner().await;
    let acquire =
        |holder: &str| format!("SELECT * FROM leader_acquire_v2('r', '{holder}', 60000, 60000, NULL, false)");
    assert_eq!(acquire_answer(&client, &acquire("h1")).await, (true, "-".into()));
    let first: i64 = scalar(&client, "SELECT holder_token FROM leader_leases WHERE role = 'r'").await;
    assert_eq!(
        acquire_answer(&client, &acquire("h2")).await,
        (false, "held".into())
    );
    let renew = |token: i64| format!("SELECT * FROM leader_renew_v2('r', {token}, 60000, NULL)");
    let renewed = row(&client, &renew(first)).await;
    assert_eq!(renewed.get::<_, Option<String>>("reason"), None);
    row(
        &client,
        &format!("SELECT leader_release('r', {first}, true, NULL, 'completed', NULL, NULL, NULL)"),
    )
    .await;
    assert_eq!(
        row(&client, &renew(first))
            .await
            .get::<_, Option<String>>("reason")
            .as_deref(),
        Some("released")
    );
    assert_eq!(
        acquire_answer(&client, &acquire("h2")).await,
        (false, "not_due".into())
    );

    // A term whose lease ran out, taken over: its RENEW says taken_over.
    let short = "SELECT * FROM leader_acquire_v2('t', 'h1', 1, 1, NULL, false)";
    assert!(acquire_answer(&client, short).await.0);
    let old: i64 = scalar(&client, "SELECT holder_token FROM leader_leases WHERE role = 't'").await;
    client.batch_execute("SELECT pg_sleep(0.01)").await.unwrap();
    assert_eq!(acquire_answer(&client, short).await, (true, "-".into()));
    let lost = row(
        &client,
        &format!("SELECT * FROM leader_renew_v2('t', {old}, 1000, NULL)"),
    )
    .await;
    assert_eq!(
        lost.get::<_, Option<String>>("reason").as_deref(),
        Some("taken_over")
    );
    let current: i64 = scalar(&client, "SELECT holder_token FROM leader_leases WHERE role = 't'").await;
    client
        .batch_execute("SELECT leader_pause('t', 'ops', 'answers')")
        .await
        .unwrap();
    let paused = row(
        &client,
        &format!("SELECT * FROM leader_renew_v2('t', {current}, 1000, NULL)"),
    )
    .await;
    assert_eq!(
        paused.get::<_, Option<String>>("reason").as_deref(),
        Some("paused")
    );
    assert_eq!(acquire_answer(&client, short).await, (false, "paused".into()));

    // An occurrence: one ahead is not due, one completed is not runnable.
    let occurrence = |at: &str| {
        format!(
            "SELECT * FROM leader_acquire_occurrence_v2('c', 'h1', 60000, {at}, NULL, NULL, NULL, NULL, 's', ({at})::timestamptz + interval '1 hour')"
        )
    };
    assert_eq!(
        acquire_answer(&client, &occurrence("NULL::timestamptz")).await,
        (false, "not_runnable".into())
    );
    assert_eq!(
        acquire_answer(&client, &occurrence("now() + interval '1 hour'")).await,
        (false, "not_due".into())
    );
    assert_eq!(
        acquire_answer(&client, &occurrence("now() - interval '1 day'")).await,
        (false, "not_runnable".into())
    );
    assert_eq!(
        acquire_answer(&client, &occurrence("now()")).await,
        (true, "-".into())
    );
    assert_eq!(
        acquire_answer(&client, &occurrence("now()")).await,
        (false, "held".into())
    );
}

/// An ACQUIRE that waited for another one's row lock, which then started a
/// term, says `contended`: the row it read said the role was free.
#[tokio::test]
async fn an_acquire_that_lost_a_race_for_the_row_says_contended() {
    let db = migrated_db(PgCluster::shared()).await;
    let mut first = connect(&direct(&db)).await.unwrap();
    let second = connect(&direct(&db)).await.unwrap();
    let observer = connect(&direct(&db)).await.unwrap();
    let acquire = |holder: &str| {
        format!("SELECT * FROM leader_acquire_v2('race', '{holder}', 60000, 60000, NULL, false)")
    };
    second
        .batch_execute("SELECT leader_seed(ARRAY['race'])")
        .await
        .unwrap();
    let winner = first.transaction().await.unwrap();
    assert!(acquire_answer(&winner, &acquire("h1")).await.0);
    let loser = tokio::spawn(async move { acquire_answer(&second, &acquire("h2")).await });
    let blocked = "SELECT count(*) FROM pg_stat_activity
                    WHERE datname = current_database() AND wait_event_type = 'Lock'";
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(10);
    while scalar::<i64>(&observer, blocked).await == 0 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the second ACQUIRE never waited for the row"
        );
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    winner.commit().await.unwrap();
    assert_eq!(loser.await.unwrap(), (false, "contended".into()));
}

/// The callable functions of generation 4, as its reference listed them.
const GENERATION_4: &str = include_str!("sql_api_generation_4.txt");

/// Review finding of issue 34: generation 5 first re-created ACQUIRE, RENEW
/// and the occurrence ACQUIRE with two more columns, and every caller that
/// had prepared `SELECT * FROM` one of them failed from then on ("cached
/// plan must not change result type") until its connection was replaced.
/// No function a client or a replica of generation 4 calls changes its
/// arguments or its row: a grown answer comes under a new name (`_v2`).
#[tokio::test]
async fn every_function_of_generation_4_keeps_its_arguments_and_its_row() {
    let client = owner().await;
    let functions = catalog(&client).await;
    let now: Vec<&str> = functions.iter().map(|f| f.signature.as_str()).collect();
    let mut kept = 0;
    for line in GENERATION_4.lines().filter(|l| !l.starts_with('#')) {
        let signature = normalize(line.split_once(' ').expect("kind, then the signature").1.trim());
        assert!(
            now.contains(&signature.as_str()),
            "generation 4's {signature} is gone or changed"
        );
        kept += 1;
    }
    assert!(kept >= 20, "the list is read: {kept} signatures");
}

/// Second review of issue 34: the occurrence ACQUIRE of generations 1-2
/// answered 13 columns, and generation 5 no longer dropped it before
/// re-creating it with generation 4's 15: `cannot change return type of
/// existing function`, so such a database could not be migrated. A kept
/// name that holds another row is dropped first.
#[tokio::test]
async fn a_database_holding_an_older_row_under_a_kept_name_migrates_to_generation_4s_row() {
    let db = migrated_db(PgCluster::shared()).await;
    let mut client = connect(&direct(&db)).await.unwrap();
    client
        .batch_execute(
            "DROP FUNCTION leader_acquire_occurrence(text, text, bigint, timestamptz, timestamptz, bigint, text[],
                                                     text[], text, timestamptz);
             CREATE FUNCTION leader_acquire_occurrence(p_role text, p_holder text, p_ttl_ms bigint,
                 p_occurrence timestamptz, p_before timestamptz, p_key bigint, p_skipped_reasons text[],
                 p_skipped_summaries text[], p_schedule text, p_next timestamptz)
             RETURNS TABLE (holder_token bigint, db_now timestamptz, holder_id text, expires_at timestamptz,
                            held boolean, paused_by text, pause_reason text, due_at timestamptz, holder_key bigint,
                            after_occurrence timestamptz, failures integer, manual_by text, run_now_pending boolean)
             LANGUAGE sql AS $$ SELECT NULL::bigint, now(), NULL::text, NULL::timestamptz, false, NULL::text,
                                       NULL::text, NULL::timestamptz, NULL::bigint, NULL::timestamptz, 0,
                                       NULL::text, false $$;
             UPDATE ticklease_schema_definitions SET checksum = 'older', generation = 2;",
        )
        .await
        .unwrap();
    ticklease::migrate(&mut client)
        .await
        .expect("the migration replaces the older row");
    let now: Vec<String> = catalog(&client).await.into_iter().map(|f| f.signature).collect();
    for line in GENERATION_4.lines().filter(|l| !l.starts_with('#')) {
        let signature = normalize(line.split_once(' ').expect("kind, then the signature").1.trim());
        assert!(now.contains(&signature), "{signature} after the migration");
    }
}
