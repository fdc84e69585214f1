//! # ticklease: leader election is a row, not a session
//!
//! Singleton background jobs (billing, dunning, outbox dispatchers, …) on N
//! replicas of a service, with exactly one leader per job at a time. Each job
//! is a **role** the application declares; each role is **one row** of
//! `leader_leases`. A replica that wants to run a role's tick claims the row
//! for that one tick (a **term**) with a single SQL statement, renews it while
//! the tick runs, and releases it when the tick ends. Every term has a
//! **fencing token**; the job's claim statements prove it with
//! [`Fence::predicate`], so a replaced leader claims nothing.
//!
//! ## What Postgres is the source of truth for
//!
//! Everything that decides leadership: who holds a role, which token is
//! current, until when the term lasts, whether an operator paused the role,
//! when its last tick completed, and any cooldown (`not_before`). Every
//! decision is one autocommit statement evaluated on the **database clock**
//! (`now()`, and `clock_timestamp()` in the fence). No statement on the pooled
//! path sets session state, takes a session lock or listens, and every lease
//! statement is an unnamed `query_typed` statement, so the store runs through
//! PgBouncer in transaction mode. The optional **coordination session**
//! ([`PgStore::with_direct`], below) is the one session-scoped thing, on a
//! direct connection of its own; it only makes a term acquirable earlier and
//! wakes followers, and never decides on its own. Migrations use the simple protocol and a
//! transaction-scoped advisory lock, so they run through such a pooler too;
//! run them as the schema owner, who then owns the SECURITY DEFINER functions.
//! A migration run waits at most [`migrate::MIGRATION_LOCK_WAIT`] (10 s) for
//! its advisory lock (any login can hold the fixed key; the error names the
//! holder's pid) and for every later lock (migration 0008 waits at most
//! 500 ms for each table it alters, so lease statements never queue behind
//! it for long: a run it times out changes nothing), and each statement at most
//! [`migrate::MIGRATION_STATEMENT_TIMEOUT`] (5 min); the CLI connects within
//! 10 s per host and ends a run after 15 min.
//!
//! **The schema.** Every function, the view and the trigger have their current
//! text in one place: `src/store/definitions/`, a file per concept (liveness,
//! history, fence, terms, families, operator, compatibility, privileges).
//! A migration run applies, in its one transaction, the pending versioned
//! migrations (tables, columns, constraints, data), then each definitions
//! file whose checksum differs from the one the database recorded
//! ([`migrate::DEFINITIONS_TABLE`]), then pins and re-grants. It never applies
//! definitions of an older [`migrate::DEFINITIONS_GENERATION`] than the
//! database holds, so an older replica migrating during a rolling deploy
//! leaves the newer bodies in place; a store refuses a database whose
//! definitions are older than its own (`NotMigrated`). A database created
//! from nothing starts from the tables as migration 0007 leaves them and
//! records 0001–0007 as applied; a test compares its catalog with one
//! upgraded through every migration since 0001.
//! A run refuses, before writing anything, a login that does not own
//! `leader_leases` (what it created would have another owner) and a schema
//! where PUBLIC or a member of the app or operator role may create objects,
//! or where another owner left a function named like ours or like a
//! built-in: our definer functions call this schema's functions with the
//! owner's rights, and a better-matching overload planted beside them would
//! run instead. Give ticklease a schema of its own if the application needs
//! CREATE on `public`.
//!
//! ## What the local clock is for
//!
//! Only for stepping down early, and for pacing. The heartbeat keeps
//! `last_ack`, the monotonic instant at which the last acknowledged RENEW (or
//! the ACQUIRE) was **sent**; the database set the expiry from its own clock at
//! or after that instant. Past `last_ack + abandon_after` the tick is abandoned
//! on the local clock alone. No decision compares a database timestamp with a
//! local one; the difference is only observed
//! ([`Manager::db_clock_drift_seconds`]).
//!
//! ## The four statements
//!
//! | statement | matches | writes |
//! |---|---|---|
//! | ACQUIRE | role unpaused, no live term, due (`last_tick_ended_at + interval` and `not_before` passed) | `greatest(token + 1, clock ms)`, holder, holder key, `expires_at = now() + lease_ttl`; a missing row is created with a token seeded from the epoch in ms |
//! | ACQUIRE of an occurrence (cron schedules) | as ACQUIRE, and the occurrence reached on the database clock, later than the last completed one (or than where the role's counting started), and for [`CatchUp::Latest`] / [`CatchUp::Skip`] still the latest | as ACQUIRE, and the occurrence the term runs; records the occurrences the caller skipped |
//! | RENEW | `(role, token)` still holding | `expires_at = now() + lease_ttl`, the holder's current key; not renewed = the term is over, the reason read from the row after the statement ([`LossReason`]) |
//! | RELEASE | `(role, token)` still holding | clears the holder; by [`Release`] outcome: Completed stamps `last_tick_*` (and the term's occurrence as the last completed one); Interrupted leaves the role due at once; Lost sets `not_before = now() + min(interval, 60 s)`; Failed (an `Err` or a panic) sets `not_before = now() + interval` |
//! | PAUSE / UNPAUSE | the role | `leader_pause` clears the holder and sets `paused_*` in one statement, and makes the next term wait (`not_before`) for the ended term's lease unless its holder RELEASEs it first (guarantee 6); `leader_unpause` clears `paused_*` and leaves `not_before` alone |
//!
//! The expiry predicate lives in one SQL function, `leader_lease_live`; the
//! fence asks it (token and expiry, nothing else), and so does the
//! generation-6 fence's commit check.
//! A term is **live** (`leader_term_live`, asked by ACQUIRE under the row lock
//! and by `leader_status`) while its lease has not run out **and** its
//! holder's coordination key, if it recorded one, is held by some session of
//! the database. Each statement is a SECURITY
//! DEFINER function (`leader_acquire_v2`, `leader_renew_v2`, `leader_release`,
//! `leader_pause`, …; `docs/sql-api.md` lists them) that bounds its durations server-side (1 ms ..= 24 h)
//! and refuses an unknown outcome; every timestamp in the table is finite.
//!
//! ## States
//!
//! ```text
//!  database row                                   this process (Manager::lead, Scheduler)
//!
//!          ACQUIRE (due, unpaused,                 idle ──ACQUIRE──► refused (Held/Paused/NotDue/Contended)
//!          no live term): new token                  │                  │ sleep until the answer's expiry or due
//!   free ─────────────────────────► held(token)      │ Acquired           │ time, or until woken: the holder's key
//!    ▲ ▲                            │  ▲  │          ▼                    │ freed, a release/unpause/run-now notify
//!    │ │  RELEASE(role, token)      │  └──┘        leading ── work returns ──────────► RELEASE(outcome) ──► idle
//!    │ └────────────────────────────┤ RENEW          │  │
//!    │    expires (no RENEW for     │                │  └─ shutdown: tick cancelled ──► RELEASE(Interrupted)
//!    │    lease_ttl), or no session │                │
//!    │    holds the holder's key:   │                │
//!    │    acquirable ◄──────────────┤                │
//!    │                              │ leader_pause   └─ RENEW not renewed (at once on a pause notify), or no ack
//!    └── leader_unpause ── paused ◄─┘                   within abandon_after: work cancelled ─► RELEASE(Lost)
//!
//!  coordination session (optional, per replica, direct connection)
//!
//!   up(key) ── connection lost ──► down: ACQUIRE/RENEW record no key (plain leases); this replica's
//!    ▲                                   terms held under the old key are acquirable at once
//!    └──── reconnected, new key ◄──┘     (a RENEW records the new key if no one took over)
//!
//!  a cron role's row (each term runs one occurrence X, or one manual run)
//!
//!   ACQUIRE(X): X reached on the database clock, X > last_occurrence (or, before any,
//!     │         the first look), X still the latest unless All, role free  ──► held(token, X)
//!   RELEASE completed ──► last_occurrence = X: X never runs again
//!   RELEASE failed ─────► failures + 1: X is asked for again after its backoff, then the next one
//!   RELEASE lost/interrupted ──► X is still the next to run (a lost one after at most a minute)
//!   RELEASE panicked, or failed with retries spent ──► the role waits for the next occurrence
//!   run-now ──► run_now_by: the next ACQUIRE with no runnable X starts a manual term
//!               (no occurrence; its RELEASE completes none and counts no attempt)
//! ```
//!
//! ## Guarantees and their bounds
//!
//! With `lease_ttl` T, `heartbeat_every` H, `statement_timeout` S,
//! `abandon_after` A and `max_poll` P (defaults 10 s, 3 s, 2 s, 6 s, 5 s;
//! [`Config`] refuses any set where `A + S >= T` or `H >= A`). Each holds for
//! the commits the database acknowledged **and kept**: durable commits
//! (`fsync = on`, `synchronous_commit` `local` or above, the default `on`).
//! With `synchronous_commit = off`, a crash loses acknowledged ACQUIREs,
//! RELEASEs and claims (up to three `wal_writer_delay`s): a second holder may
//! acquire while the first still believes it leads, and both work until the
//! first's next RENEW fails (within A); the fence then refuses the first's
//! claims, but work outside the database may run twice. An asynchronous
//! failover loses the same for the replication lag (guarantee 1 below says
//! what keeps tokens unique across it). The runbook's "Durability" section
//! says what to configure.
//!
//! 1. **One live term per role.** ACQUIRE takes a row only when no term is
//!    live on the database clock; racing ACQUIREs serialize on the row lock and
//!    the loser re-evaluates against the winner's row. Tokens only grow:
//!    ACQUIRE issues `greatest(token + 1, database clock in ms)`. **Across a
//!    failover that loses commits** (asynchronous replication, then a
//!    promotion), the promoted server may not have seen the last ACQUIREs;
//!    its next token is still above every token of the lost timeline when the
//!    failover (from the last lost ACQUIRE to the first ACQUIRE on the new
//!    primary) lasted longer than the tokens' lead over the clock plus the
//!    clock difference between the two hosts. Tokens lead the clock only
//!    when a role is acquired more than once per millisecond on average, so
//!    the lead is normally negative; the metric `leader_token_lead_seconds`
//!    shows it. With synchronous replication (`synchronous_commit` `on` or
//!    `remote_apply` and a synchronous standby) no acknowledged ACQUIRE is
//!    lost, and no holder ever uses a token the promoted server lacks. A
//!    connection that finds itself on a read-only server leaves the pool at
//!    once; with a multi-host URL (`host=a,b`, `target_session_attrs=read-write`)
//!    the next statement finds the new primary, so a failover costs missed
//!    beats, not a restart. **A role is asked for again as soon as its
//!    server answers**: during an outage the store runs `SELECT 1` every
//!    100 ms doubling to 0.5 s (at most 2 a second per store, however many
//!    roles wait), and the first that answers (or a connection that reaches
//!    another host) wakes every role loop whose poll failed, where before it
//!    waited `max_poll`; a loop takes one such early poll per run of failed
//!    ones, so a link that flaps or a login that ends our backends costs at
//!    most two polls per `max_poll` and role. Through PgBouncer the server's
//!    return is seen when PgBouncer logs in to it again (its
//!    `server_login_retry`, 15 s by default). With Patroni's word, the check
//!    runs at once then too (once per period at most), and its confirmation
//!    wakes the loops it kept waiting (only a confirmation wakes them: a
//!    connection that comes back confirms nothing); a check in which Patroni
//!    names another server than the store's probes the URL's hosts at once
//!    (once per period at most), not at the next probe, and while a check
//!    confirms nothing (no leader, a stale one, another server) the next
//!    comes a quarter period later. So once a check found no leader (what a
//!    failover shows first, while the old leader's key expires), a promoted
//!    server is reached within a quarter of a check's period (375 ms at the
//!    defaults) of Patroni naming it; within a period (1.5 s) when Patroni
//!    names it right after confirming the old one. Each
//!    host is its own connection attempt, bounded
//!    as a whole (TCP, TLS, startup, authentication, the read-write check)
//!    by an equal share of S (or the URL's `connect_timeout`, if shorter),
//!    and the host that answered last is tried first: a first host that
//!    drops packets, or accepts TCP and never answers, costs a new
//!    connection at most S / hosts, and nothing once another host answered.
//!    A statement that outlives S is cancelled on every host of the URL (a
//!    cancel names its backend by pid and secret key, so only the server
//!    that runs it acts), whichever host the connection reached.
//!    **No term starts or goes on on a server a promotion superseded**, once
//!    the process sees it: a promotion moves the new primary to a higher
//!    timeline, while an old primary that nothing demoted (its failover
//!    manager died) stays writable on the old one. Every connection to a
//!    host of a multi-host URL (`host=a,b`, or `hostaddr=x,y`: a server is
//!    its host, address and port) reads its server's timeline (the
//!    insertion timeline, from `pg_walfile_name`, which any login may call;
//!    where it is refused the timeline is unknown, logged once, and the
//!    host never passed over for it), and a host on a lower timeline than
//!    another host was seen writable on is passed over. The hosts are all
//!    asked before a process's first connections (which wait until one
//!    answered), and again every S (a connection to each host per S). A
//!    server the process used that is seen below another host's timeline
//!    keeps none of the pool's connections (a pool built on
//!    [`hosts::Hosts`] gets the same with [`hosts::Hosts::recycle_hook`]).
//!    When it answers writable on the older timeline, the pool drops
//!    every connection made before and the heartbeat ends every term that
//!    started before as lost, reason `superseded` (its work may have
//!    written to a server whose writes are to be rewound), as soon as the
//!    store sees it (its connections then move to the promoted host, which
//!    wakes the heartbeat), not at the term's next beat: within S + 2 S /
//!    hosts of the promotion, plus 200 ms (a probe pass waits S after the
//!    last one ended and takes at most S / hosts; the heartbeat renews at
//!    most once per 200 ms for a move). Timelines only grow in one cluster; what the process saw is
//!    never forgotten, so while only superseded servers answer (a promoted
//!    server that died, a cluster re-created behind the same host names)
//!    every statement fails (after at most one connection per host and
//!    share of S) until the processes restart: an operator decides which
//!    server's writes count. **A failover is one line per process** at warn
//!    (`database host changed` from, to, `down_ms`; or `database connection
//!    restored`), shared by the process's pools on the URL, and an outage
//!    that lasts is one more every 30 S (`still trying`); what an outage
//!    cuts off meanwhile (lost or refused connections, timeouts, missed
//!    beats, polls) is at debug ([`StoreError::is_outage`]), while what a
//!    server refuses warns each time. Each supersession is a line (warn);
//!    host changes and lost connections are metrics
//!    (`leader_host_changes_total`, `leader_connections_lost_total`, for the
//!    store's connections).
//!    **With Patroni's word ([`PgStore::with_patroni`], opt-in), no term
//!    runs on a server after another member is promoted, whether or not the
//!    process reaches the promoted one.** Every half `heartbeat_every` the
//!    store asks every given member's REST API (`GET /primary`) and reads
//!    the postmaster start time of the server its pool reaches; a member
//!    answering 200 as a running primary with that postmaster confirms it.
//!    ACQUIRE is not sent without a confirmation younger than
//!    `abandon_after − heartbeat_every` ([`StoreError::NotConfirmed`]), and
//!    a term ends, reason `superseded`, `abandon_after` after the check that
//!    last confirmed it (measured: 1.2 s after the old primary's Patroni was
//!    killed, at the tests' 1.2 s). An answer counts only while its
//!    `dcs_last_seen` is within `loop_wait + 1 s` of its `Date` (a leader
//!    whose HA loop froze answers 200 until its key expires; a REST request
//!    for `/cluster` refreshes it too: Patroni's watchdog covers a stalled
//!    loop for a leader polled that way), and while the
//!    settings it reads again at every check still admit the store's
//!    timings. Patroni promotes no other member before `ttl − loop_wait −
//!    max(retry_timeout, loop_wait + 3 s)` after such a 200 (a live leader
//!    demotes itself once a key renewal failed for `retry_timeout`); the
//!    store's start reads Patroni's settings and refuses `abandon_after +
//!    statement_timeout` above that, or `failsafe_mode` (read as Patroni's
//!    `parse_bool`). It relies on those Patroni semantics (2.1 or later), on
//!    an HA cycle's own work taking under a second, and on
//!    clocks running at one rate; without Patroni's word (its REST API
//!    unreachable) no term runs. Tested on a real Patroni cluster whose
//!    primary's Patroni is killed and left dead (its Postgres stays
//!    writable), with replicas that reach only that server (its URL alone;
//!    a one-sided partition; the others' slots held by a login with CONNECT
//!    alone): no claim commits there after the promotion (71–116 without
//!    the word); and one whose leader's HA loop is frozen while its REST
//!    API answers: the term there ends 3 s after the freeze, 17 s before
//!    the promotion (without the freshness rule, 0.2 s before it).
//!    See [`patroni`].
//!    The coordination session and its waiters connect the same way. Every
//!    connection of ours shows in `pg_stat_activity` as `ticklease store
//!    <host>:<pid>` (`coordination`, `migrate`; holder ids of the process
//!    start with `<host>:<pid>`) unless the URL names it; a URL shared with
//!    sqlx may carry its `statement-cache-capacity` (ignored, see
//!    `tls::FOREIGN_OPTIONS`); any other unknown option is refused by name.
//! 2. **A superseded leader claims nothing.** A claim statement carrying
//!    [`Fence::predicate`] returns 0 rows unless its term is live and unpaused
//!    when the fence executes: `(SELECT leader_fence_v2(role, token))` is an
//!    uncorrelated scalar subquery, so it runs once per statement, and it
//!    reads `clock_timestamp()` — not `now()` (frozen at `BEGIN`) nor
//!    `statement_timestamp()` (the arrival of the client's message, which in a
//!    multi-statement message or a `DO` block can be long before).
//! 3. **A claim commits only inside its term.** When the fence passes
//!    (`leader_fence_v2`, definitions generation 7), the transaction holds
//!    the role's lease row `FOR KEY SHARE` until it ends. Every statement
//!    that ends a term (the ACQUIRE that takes over a term never released,
//!    `leader_pause`, RELEASE, `leader_forget`) locks that row `FOR UPDATE`
//!    before it commits, and Postgres makes `FOR UPDATE` wait for every
//!    `FOR KEY SHARE` holder. So no claim commits after a later term, a
//!    pause or a RELEASE of its term committed, and claims commit in token
//!    order. What Postgres decides here: the conflict between the two row
//!    locks; that a READ COMMITTED `FOR KEY SHARE` which waited for an ender
//!    re-reads the row's newest version and finds the term over; that a
//!    RENEW (a no-key update) does not conflict with a claim's lock, which
//!    Postgres carries over to the renewed row version. There is no check at
//!    COMMIT: **a claim whose lease ran out while nothing ended its term
//!    commits** (no later term can start before it ended: the takeover waits
//!    for it at most a grace, then ends it). RENEW never waits for claims, so a slow claim of
//!    a renewed term commits; a live term's transaction is cut only by a
//!    pause or its own term's RELEASE. Keep fenced transactions inside their
//!    term all the same: a takeover ends them.
//!
//!    **The drain** (`leader_fence_drain`, inside the ender's statement).
//!    An ender waits for the claims holding the row at most a grace G
//!    (200 ms, or a quarter of the ender's server-side `statement_timeout`
//!    when that is shorter), then ends their backends
//!    (`pg_terminate_backend`), at most three rounds; a row still held after
//!    the third fails the statement with `lock_not_available` (55P03), and
//!    the term goes on. Bounds: a takeover of a term whose claimer froze
//!    (its client stopped, its link cut, a statement stuck) comes at most G
//!    plus the ended backend's abort after the expiry (the bound of 5 grows
//!    by that); a pause and a RELEASE return within G plus the abort; an
//!    ender waits at most 3 G for claims in all (a batch's rounds share one
//!    G, and each role still held when it has passed costs one try: 1,000
//!    roles one transaction holds are released within a 2 s statement
//!    timeout). A claim that ends within G is waited for and commits first.
//!    These bounds rely on the schema owner's right to end backends (a
//!    superuser, or a member of `pg_signal_backend` that inherits its
//!    rights, which cannot end a superuser's) and on the ended
//!    backend exiting: a claimer the owner may not end, a server process
//!    that does not take the signal (stopped, stuck in the kernel) and a
//!    prepared transaction (no backend) hold the row through the three
//!    rounds, and the ender fails with 55P03 until an operator acts (the
//!    runbook's "A claim that holds its lease row"). Its work besides the
//!    waits is at most one read of the lock table per round (at most
//!    `max_locks_per_transaction` × `max_connections` rows, whatever any
//!    login holds).
//!
//!    **Finding claimers, and what a login can plant.** A fenced transaction
//!    also marks itself, and the drain ends only backends that hold a mark
//!    of the term. Since generation 9 the mark is the term's key: a shared
//!    advisory lock on one bigint, `leader_role_hash(role, 3)` in the high
//!    32 bits and the token's low 32 bits in the low ones. The key is
//!    public, so the drain counts a backend holding it only when its login
//!    (`usesysid` in `pg_stat_activity`) is a member, inheriting or not, of
//!    a role that may execute `leader_fence_v2`. When
//!    another backend holds or waits for the key exclusively (no fence
//!    does), the fence takes the marker instead, as every fence did in
//!    generations 7 and 8: a shared advisory lock whose key is 32 bits of
//!    SHA-256 of the term's `fence_salt` (64 random bits written by the
//!    ACQUIRE that started the term) and the transaction's top-level id, try
//!    1 or 2. The drain counts a marker only for the backend whose own
//!    oldest transaction id it was computed from, and still looks for
//!    markers, so it also finds generation-8 claims in flight across
//!    `ticklease migrate`. When other backends hold the key and both marker
//!    keys exclusively, the fence fails (`lock_not_available`, 55P03). A
//!    login with CONNECT alone, or USAGE on the schema, or the operator role
//!    (which reads only the `role` column of `leader_leases`) may not
//!    execute the fence and cannot read the salts: a key it holds shared
//!    never passes for a claimer; a key it holds exclusively sends the
//!    term's fences to the marker (one SHA-256 more per claim), which it
//!    cannot compute but by a 32-bit guess; and a marker copied from
//!    `pg_locks` names another backend's transaction. So such a login makes
//!    the drain miss no claimer, gets one of its own backends ended only by
//!    such a guess, and can neither lock the lease row nor wait on it (row
//!    locks need UPDATE, which no login but the owner, or a superuser, has).
//!    A claim is found by the key through its session's login: a member of
//!    the app role that claims after `SET ROLE` without inheriting it is
//!    found, but a claim through a SECURITY DEFINER function of another
//!    owner, by a login that is a member of no role that may call the
//!    fence, holds the row through the three rounds (55P03; generation 8
//!    found it by its marker). No `REVOKE USAGE` is needed for
//!    the drain (`tests/planted_locks.rs`: 300 such backends with prepared
//!    inserts into the lease table, the term's key held shared, copied
//!    markers, planted gates and 20,000 more locks; takeover and pause
//!    within the statement timeout, no planted backend ended, the claimers
//!    ended, with a superuser owner and with one that is none;
//!    `tests/fence_v2.rs`: a claim fenced while such a login held the key
//!    exclusively is found by its marker, and such a login holding the key
//!    shared and a copied marker passes for no claimer). Postgres does not
//!    queue row locks fairly, so a drain also holds the term's **gate**, a
//!    shared advisory lock it waits for in the lock's queue between its
//!    tries for the row until it has it (generation 8; the queued request
//!    already holds fences back), and that each fence tries exclusively and
//!    lets go at once: a new claim of a term being ended waits for the ender
//!    and then claims nothing. The gate's key is public (a hash of the
//!    schema and role, and the token), so any login can plant it, shared or
//!    exclusive: a fence that cannot take it then reads the row `FOR SHARE`
//!    in a subtransaction instead (a subtransaction and a transaction id per
//!    fence while it is planted), and is still held back by a drain. Each
//!    round's wait is bounded by the clock (`FOR UPDATE NOWAIT` every 2 ms
//!    until G), not by `lock_timeout`, which begins again whenever the row's
//!    lockers change.
//!
//!    **What the fence refuses**, decided without reading query text:
//!    REPEATABLE READ and SERIALIZABLE (`feature_not_supported`: their
//!    snapshot may predate a pause), a read-only transaction
//!    (`read_only_sql_transaction`: the row lock is a write), and, where
//!    `max_prepared_transactions` is not 0, `PREPARE TRANSACTION`: a
//!    prepared claim would hold the row with no backend to end. The fence
//!    takes a session-level and a transaction-level advisory lock on one key
//!    of its backend (its pid; when another backend holds that, one derived
//!    from a secret only the owner reads, and the pid), and Postgres refuses
//!    to prepare a transaction holding both (`feature_not_supported`); if
//!    other backends hold both keys, the fence exports a snapshot instead,
//!    which Postgres also refuses to prepare (and which fails inside a
//!    savepoint). `SET CONSTRAINTS …
//!    IMMEDIATE` has nothing left to bypass and is accepted. A fence in a
//!    savepoint rolled back holds nothing afterwards; one in a released
//!    savepoint keeps its row lock and its mark (Postgres passes a
//!    subtransaction's advisory locks to its parent at RELEASE), and the
//!    drain finds it.
//!
//!    **What an application login can still do** (a member of the app role):
//!    hold the row as long as it likes (a fenced transaction left open),
//!    which delays each ender by G per round and then costs it its backend;
//!    PREPARE a fenced transaction after `pg_advisory_unlock_all()` in it
//!    (where prepared transactions are enabled), which holds the role's
//!    takeovers, pauses and RELEASEs (55P03 after three rounds) until an
//!    operator runs `ROLLBACK PREPARED` (monitor `pg_prepared_xacts`); read
//!    the salts, and so fail another transaction's fence with 55P03 by
//!    holding the term's key and both of that transaction's marker keys
//!    exclusively; hold the term's key exclusively, which sends the term's
//!    fences to the marker (one SHA-256 more per claim; a login with CONNECT
//!    alone can do this too); hold the term's key shared, which makes that
//!    backend pass for a claimer, so a drain of the term may end it (its own
//!    backend only); and, as before, end any term whose token it reads.
//!
//!    **Costs.** Each fence writes a row-lock WAL record, and claims of one
//!    role that overlap create multixacts (0.38–0.47 per one-row claim at
//!    4 clients, none at 1, in `docs/benchmarks/fence-cost.md`): monitor
//!    `mxid_age(datminmxid)` (the runbook's "Multixacts"). The same
//!    document has the throughput figures. A
//!    synchronous-replication commit wait, and the application's own
//!    deferred triggers, run while the claim holds the row and delay an
//!    ender by their length.
//!
//!    **The generation-6 fence.** `leader_fence`, which builds before
//!    generation 7 call, stays unchanged beside it: a commit check that
//!    fails the COMMIT with `serialization_failure` once the term ended,
//!    refuses `SET CONSTRAINTS … IMMEDIATE`, and whose claimers a takeover
//!    and a pause still end (`leader_fence_sweep`). The sweep's known
//!    gap is closed: Postgres grants a table lock while parsing,
//!    before it checks privileges, so a login with CONNECT alone could hold
//!    the `ROW EXCLUSIVE` lock on `leader_fence_claims` the sweep filters by;
//!    since generation 7 the sweep also requires a login that may execute
//!    `leader_fence` (tests/planted_locks.rs). This build's
//!    fence needs definitions generation 7 or later: on an older database
//!    the store refuses to start ([`StoreError::NotMigrated`], "run
//!    `ticklease migrate`").
//! 4. **A leader stops before its lease can expire.** The work is cancelled
//!    and dropped at most A after the last acknowledged beat was sent, and no
//!    RENEW starts after that instant (a RENEW in flight is cut there), while
//!    the database expiry is at least T after it: a margin of at least
//!    `T − A − S > 0`. After an abandon the only statement of the term is the
//!    term-scoped RELEASE. [`Tick::abandon_at`] tells work that acts outside
//!    this process (a child process's guard, `ticklease run`) that instant,
//!    moved on with each acknowledged RENEW; with
//!    [`Manager::set_lost_drain`] a lost term's work is first given up to a
//!    bound to return (to see what it started outside stopped) before it is
//!    dropped and the term RELEASEd, and the lease is not renewed meanwhile.
//! 5. **A dead leader is replaced.** Its role is acquirable at most T after its
//!    last acknowledged RENEW; a fenced transaction it left open delays the
//!    takeover by at most the grace G plus that backend's abort (guarantee 3,
//!    the drain). A follower wakes when the database said the
//!    term runs out (the expiry as of its last ACQUIRE, measured from the
//!    answer's arrival, so never early) and so leads it within T (+ one
//!    statement) of the holder's last RENEW, whatever P is. With a
//!    coordination session on both sides, a holder whose process died (or
//!    whose connections were closed) is replaced as soon as Postgres ends its
//!    backend: the follower's wait on the holder's key returns and its
//!    ACQUIRE takes over (see Coordination for the measured bound). A clean
//!    shutdown releases at once; followers hear it at once with a
//!    coordination session, within P without.
//! 6. **Pause is prompt.** `leader_pause` drains the term (guarantee 3): it
//!    waits for the claims in flight at most the grace G (200 ms by
//!    default), ends their backends, and marks the row, within G plus the
//!    ended backends' abort; it fails with `lock_not_available` (55P03),
//!    pausing nothing, only when a claimer's backend cannot be ended (a
//!    prepared transaction, a server process that takes no signal, an owner
//!    without the right to end it). When it returns, the term's fence fails,
//!    no claim of it is left to commit, and ACQUIRE is refused on every
//!    replica. With a coordination session the
//!    holder hears of a pause made through the library or `ticklease pause`
//!    (which notify after it committed) and renews at once; otherwise its next
//!    RENEW (within H, or H/2 after a missed beat) does. That RENEW is not
//!    renewed, reads `Paused`, and the work is cancelled. The next term
//!    (after an unpause, or a run-now) waits until the paused term's lease
//!    would have run out, unless the paused term's holder RELEASEs it first
//!    (the library does once its work returned, [`Manager::set_lost_drain`]
//!    permitting): so an unpause never starts a term beside the paused
//!    one's unfenced work, and waits at most T.
//! 7. **A statement that does not answer within S is a missed beat, not a
//!    loss.** Its connection leaves the pool, a cancel is sent (held open until
//!    the server or bouncer closes it, since PgBouncer drops a cancel whose
//!    socket closed first), and the connection is closed. A missed beat is
//!    retried after H/2.
//! 8. **A panicking or failing tick is not a completion.** It is released as
//!    Failed (`not_before = now + interval`); the panic then continues from
//!    [`Manager::lead`]. A tick cancelled by shutdown is released as
//!    Interrupted even if its work then panics.
//! 9. **RELEASE cannot be skipped.** It runs on a task of its own; if the
//!    `lead` future is dropped mid-tick, the term is released as Interrupted.
//!    Each try is bounded by S; one that could not finish (a reconnect, a
//!    switchover) is sent again, with backoff, until the lease ends (a TTL
//!    after the last acknowledged RENEW was sent), never after: a RELEASE
//!    takes at most that long, and the role is free once one gets through.
//!
//! ## Privileges
//!
//! The application role (default `ticklease_app`) may SELECT `leader_leases`
//! and write it only through SECURITY DEFINER functions: `leader_acquire_v2`
//! (which must recreate a missing row: the spec denies the app INSERT),
//! `leader_renew_v2`, `leader_release`, `leader_seed`, and the fences. It cannot
//! set an expiry other than `now() + lease_ttl` (1 ms ..= 24 h), end a term
//! but through RENEW's and RELEASE's `(role, token)` match, or clear a
//! cooldown. It can RENEW or RELEASE any term whose token it reads (tokens
//! are in `leader_leases`, which it reads): that keeps a term alive or ends
//! it early, as a bug of the holder's own could, and never makes two terms
//! live at once or lets a superseded leader pass the fence. It reads the
//! terms' fence salts (`fence_salt`), and holds the lease row only through
//! the fence: what that lets it do (hold enders up G per round, PREPARE
//! after `pg_advisory_unlock_all()`, fail another transaction's fence by
//! holding the term's key and that transaction's marker keys) is under
//! guarantee 3. Pause
//! attribution (`paused_by`) is free text the caller gives, not an
//! authenticated identity; the history also records the session's login
//! user for unpause and run-now. The owner (or a superuser) cannot
//! be named the application role: revoking its writes would break the
//! definer functions. Call the lease functions in autocommit, as the
//! library does: a transaction that called one and then stalls holds the
//! row's lock. The operator role
//! (default `ticklease_operator`) can only call `leader_pause`,
//! `leader_unpause`, `leader_run_now`, `leader_forget` (an idle, unpaused
//! role) and `leader_fence_sweep`, and read `leader_status` and the `role`
//! column of `leader_leases` (not the salts). The sweep, also the app
//! role's, ends only backends inside a generation-6 fenced transaction of a
//! term that is over (their COMMIT would fail anyway), whoever calls it.
//! Neither owns anything, nor can DELETE, TRUNCATE, lock a row of or alter
//! the table (row locks need UPDATE, which only the owner has), nor read
//! `leader_fence_secret`, the owner's secret the PREPARE guard's second
//! keys come from. A login with CONNECT alone (or USAGE on the schema) can see
//! `pg_locks` and hold advisory locks and the table locks Postgres grants
//! while parsing: none of that delays or misleads the drain (guarantee 3).
//! The drain ends claimers with the owner's rights: make the owner a
//! superuser or a member of `pg_signal_backend`. Every definer
//! function is owned by the migrating role, pins `search_path = pg_catalog,
//! <schema>, pg_temp` (`pg_temp` last, or a caller's temporary table would
//! shadow ours inside the owner's rights) and names its relations
//! schema-qualified; EXECUTE is revoked from PUBLIC on every function. A test
//! reads the catalog and fails if a definer function of ours lacks that
//! setting. Upgrading a database from 0002 revokes the app's direct UPDATE:
//! replicas still on a 0002 build then fail their RENEWs and step down (safe),
//! so roll the new build out right after migrating.
//!
//! **Model-checked.** `crates/ticklease-model` states this protocol as an
//! executable model (ACQUIRE, RENEW answered or not, RELEASE, both fences:
//! the lock at the fence with its drain, and the generation-6 fence and its
//! commit check as two steps; pause, freezes, deaths, coordination
//! sessions that drop, a promotion that loses the last commits) and checks
//! exhaustively, for two replicas over four ticks (one clock a tick slow)
//! and three over three, that
//! claims commit in token order, at most one term passes the fence, no claim
//! commits while paused, tokens stay unique across timelines, and a dead
//! holder's role and a pause are acted on before the clock moves on. Each
//! property has a planted defect (no token bump, a lock-free fence, a RENEW
//! that revives a taken-over term, `token + 1` without the clock, a key
//! takeover under the old token, an ender whose lock no claim conflicts
//! with, a drain that ends a live term's claims, no drain, …) that the
//! checker must catch, and walks
//! of the model replay against Postgres with the answers it predicts.
//!
//! Not guaranteed: effects the work already started (an HTTP call, an email)
//! complete even after a takeover, so outbound effects are at-least-once;
//! completions must land through their own compare-and-set or idempotency key.
//!
//! ## Example
//!
//! ```no_run
//! use std::time::Duration;
//! use ticklease::{Config, Manager, NextChance, PgConnect, PgStore, PgStoreOptions, Role};
//!
//! # async fn example() -> anyhow::Result<()> {
//! let pg: PgConnect = "postgres://app@localhost/app?sslmode=verify-full".parse()?;
//! let config = Config::default();
//! let store = PgStore::connect(pg, PgStoreOptions::from_config(&config)).await?;
//! let billing = Role::new("billing")?;
//! let manager = Manager::start(store, config, [billing.clone()]).await?;
//! // Woken as the Scheduler's loops are: when the database says the role may be
//! // due or free, or (with a coordination session) at a release or a holder's death.
//! let mut chance = NextChance::new(&manager, &billing);
//! loop {
//!     let lead = manager
//!         .lead(&billing, Duration::from_secs(3600), |tick| async move {
//!             // A leader-only store method takes the fence; its claim statement
//!             // adds `AND {tick.fence().predicate(n)}` with `tick.fence().params()`
//!             // (through sqlx, feature `sqlx`: `Fence::bind`, or `push_fence!` on a QueryBuilder).
//!             let _fence = tick.fence();
//!             Ok::<_, std::io::Error>(())
//!         })
//!         .await;
//!     // `false` once Manager::shutdown was called (the terms are being released).
//!     if !chance.wait(&lead).await {
//!         break;
//!     }
//! }
//! # Ok(())
//! # }
//! ```

//!
//! ## Scheduler, steps and metrics
//!
//! A [`Scheduler`] runs one loop per job, waking when the database says the
//! role may be due or free (at least every `max_poll` without a coordination
//! session), or when the coordination session tells it to. A
//! tick's work is a list of named steps under one [`Steps`] guard: a step that
//! panics stops, is logged with its backtrace, and the rest run; the first
//! panic is raised again at the end, so the tick is released as failed and
//! counted as `panicked`. [`Steps::each`] guards each item of a batch the
//! same way. [`Metrics`] registers into the application's registry.
//!
//! ```no_run
//! use std::time::Duration;
//! use prometheus_client::registry::Registry;
//! use ticklease::{Config, Manager, Metrics, PgStore, PgStoreOptions, Role, Scheduler, Steps};
//! use tokio_util::sync::CancellationToken;
//!
//! # async fn example(pg: tokio_postgres::Config) -> anyhow::Result<()> {
//! let config = Config::default();
//! let store = PgStore::connect(pg, PgStoreOptions::from_config(&config)).await?;
//! let billing = Role::new("billing")?;
//! let mut registry = Registry::with_prefix("myapp");
//! let metrics = Metrics::register(&mut registry, [billing.clone()]);
//! let manager = Manager::start_with_metrics(store, config, [billing.clone()], metrics).await?;
//! let scheduler = Scheduler::new(manager).job(&billing, Duration::from_secs(3600), |tick| async move {
//!     let mut steps = Steps::new(&tick);
//!     steps.run("reconcile", async { /* … */ }).await;
//!     steps.each("bill", ["sub-1", "sub-2"], |sub| async move { /* bill `sub` */ let _ = sub; }).await;
//!     steps.run("cleanup", async { /* … */ }).await;
//!     steps.finish(); // raises the first panic, if any
//!     Ok::<_, std::io::Error>(())
//! })?;
//! let shutdown = CancellationToken::new(); // cancel on SIGTERM
//! let stopped = scheduler.run(shutdown).await;
//! assert!(stopped.all_released(), "{stopped}");
//! # Ok(())
//! # }
//! ```
//!
//! ## Wall-clock schedules
//!
//! A role is led on a [`Schedule`]: `Schedule::every(interval)` (due an
//! interval after its last completed tick, the spec's model; a plain
//! `Duration` means this) or `Schedule::cron("5 0 * * *")` with an optional
//! seconds field, `L`, `W`, `#`, the `@` aliases and `.zone("Europe/Berlin")`
//! (IANA names, UTC by default; parsing and occurrences are croner's, zones
//! chrono-tz's). Bad input is refused before anything is written: the
//! field and character position of an invalid field, an unknown zone, an
//! expression that never fires, occurrences closer than `heartbeat_every`
//! (each occurrence is a term, watched one beat at a time; the gap is
//! measured over the next 1,000 occurrences, so a shorter one further out,
//! such as a daylight-saving change may make, is not refused).
//!
//! - **The database clock decides.** A replica picks the occurrence to ask
//!   for from the database's last answer (its `now()`, moved on by the local
//!   monotonic clock), never from its own wall clock; the ACQUIRE starts a
//!   term only when the database's `now()` has reached the occurrence. A
//!   replica whose clock is minutes off neither runs early nor late.
//! - **Each occurrence is one term, completed at most once** across all
//!   replicas and restarts: the row records the last completed occurrence
//!   (`last_occurrence`), an ACQUIRE for an occurrence at or before it is
//!   refused, and a completed RELEASE stamps the term's occurrence. A failed,
//!   lost or interrupted occurrence is run again as the same occurrence:
//!   [`Tick::occurrence`] is the scheduled instant, the same for every
//!   attempt, so work can key its effects on it (the billing period).
//!   Tokens, the fence and every guarantee above hold unchanged.
//! - **Retries** ([`Retry`], default 3 attempts, 10 s doubling to 5 min): an
//!   occurrence whose work returned `Err` is retried after its backoff (the
//!   database counts the failed attempts); once they are spent, and after a
//!   panic, the role waits for the next occurrence (counted from the
//!   RELEASE, so a slow failing tick does not delay it); after a lost term,
//!   at most a minute. Interval schedules keep the spec's waits unless given
//!   a policy (`Schedule::every(d).retry(..)`, also for families): then a
//!   tick whose work returned `Err` is retried after its backoff, and once a
//!   round of attempts is spent the role waits its interval, after which a
//!   new round starts (ACQUIRE reads the count of failed attempts since the
//!   last completed tick with the row; a RELEASE that commits while the
//!   ACQUIRE runs leaves it at most one attempt behind). Under
//!   `All`, which never passes a period over silently, an occurrence that
//!   keeps failing is asked again at each later occurrence and holds the
//!   later ones back until it completes (or the role is paused).
//! - **Catch-up** ([`CatchUp`]) after a downtime, a pause or a tick longer
//!   than the period (occurrences never overlap: a role has one term):
//!   `Latest` (default) runs the most recent missed occurrence once,
//!   `All { max }` each of the most recent `max` in order, `Skip` only one
//!   still within its starting deadline (the lease TTL unless set). An
//!   optional starting deadline skips any occurrence older than it. The term
//!   that runs records the occurrences passed over in `leader_history`
//!   (kind `skipped`, with how many from when to when and why: `paused`
//!   for those that fell due while the role was paused, as unpause records
//!   the pause's window in the row; `deadline`; `catch_up`), so "did last
//!   night's billing run?" has an answer. **Each occurrence is counted
//!   once**: attempted (its terms' rows), or inside exactly one `skipped`
//!   row, never both; a later term counts its skipped occurrences after the
//!   last one a term started for (attempted, or recorded skipped when it
//!   started), not after the last completed one. The metric
//!   `leader_occurrences_skipped_total` adds the same counts (test:
//!   `an_attempted_occurrence_is_never_counted_as_skipped_and_none_is_counted_twice`).
//!   Two replicas that raced with answers older than `max_poll` may each
//!   count a skipped range once more, at most.
//! - **Counting starts** at a role's first ACQUIRE of an occurrence: a new
//!   schedule does not run the past, except its first occurrence, which may
//!   be up to [`FIRST_OCCURRENCE_GRACE`] (a minute) older than that first
//!   look: the latest such occurrence runs, alone, whatever the catch-up
//!   policy (within its starting deadline), and none before it is counted
//!   as skipped. So a crontab line that starts `ticklease run --once` just
//!   after its own occurrence runs it the first night too (tests:
//!   `a_new_roles_first_look_runs_its_latest_occurrence_of_the_last_minute_alone`,
//!   `once_from_a_crontab_just_after_the_occurrence_runs_it_on_a_new_role`).
//!   A forgotten role (`leader_forget`) is new again: an occurrence it
//!   completed at most a minute before may then run once more. Families'
//!   keys have no such grace.
//! - **Daylight saving**, by the Vixie rule: a fixed time in the spring gap
//!   runs once right after it, one in the autumn fold once (its first
//!   instance); `*/15 * * * *` follows real time through both.
//! - **A changed schedule** (a rolling deploy): each replica asks for its
//!   own expression's occurrences, and the database starts any due
//!   occurrence later than the last completed one. So the new expression's
//!   latest occurrence since the last completed run runs at once (`0 3 * * *`
//!   changed to `0 9 * * *` and deployed at 10:00 runs today's 09:00 under
//!   `Latest`; a starting deadline, or `Skip`, passes it over), and while
//!   replicas disagree the occurrences of both expressions may run (each at
//!   most once, never two at a time). A role moved from a cron schedule to
//!   an interval and back counts from its last completed occurrence, not
//!   from its interval ticks. Families run an interval or a cron schedule
//!   (see Role families).
//! - **Operators.** `ticklease status` (`--json`, the status page) shows a
//!   cron role's schedule (as the replica that started its last term
//!   declared it), its last completed occurrence and the next one to run
//!   (the current one while a failed attempt awaits its retry), with how
//!   late it is. `ticklease run-now ROLE` asks for a manual run: the next
//!   ACQUIRE of any replica starts a term with no occurrence
//!   ([`Tick::occurrence`] is `None`; the history's term row names who
//!   asked), once, whatever the role's cooldown (unless an occurrence is
//!   due then: it runs first), before the next occurrence rather than
//!   instead of it: it completes no occurrence, counts no failed attempt and
//!   leaves a failed occurrence's backoff as it was. A replica hears a
//!   run-now at once with a coordination session, else within `max_poll`
//!   (a cron role's cached answer is at most that old). A role moved to an
//!   interval drops its schedule, next occurrence and any pending run-now
//!   at its first interval term (its counting stays). Metrics:
//!   `leader_occurrence_next_seconds`, `leader_occurrence_late_seconds` (the
//!   `TickleaseOccurrenceLate` alert) and `leader_occurrences_skipped_total`.
//!
//! ## Long-lived roles
//!
//! A role on [`Schedule::long_lived`] (a relay, a queue consumer) runs its
//! work for the whole term and is due again, after its restart wait, when
//! the work returns. Each ACQUIRE records the kind (and an interval role's
//! interval) in the row, so any reader, `ticklease metrics` included, exports
//! `leader_long_lived` and `leader_held`: the shipped alerts count a
//! long-lived role healthy while some replica holds it (never "never ran"
//! or "stalled" for want of completed ticks) and page
//! (`TickleaseLongLivedNotHeld`) when no replica held it for more than half
//! of the last 15 minutes: down, or crash-looping under its restart wait.
//! A scheduled role whose last run failed and that completed none for 15
//! minutes pages (`TickleaseRunFailing`, from `leader_last_term_failed`).
//!
//! ## History
//!
//! `leader_history` keeps one row per term that ended and per operator
//! event, written by the lease statements themselves (no extra round trip):
//! RELEASE records its outcome ([`Ending`]: completed, interrupted, lost with
//! its reason, failed or panicked with a short error, and the last
//! [`OUTPUT_KEPT_MAX`] characters of what the work said when it called
//! [`Tick::keep_output`]: `ticklease run` keeps each command's exit status
//! and last output lines), ACQUIRE records a term
//! it took over without a RELEASE as lost (`expired`, or `holder_gone` when
//! its holder's coordination key was gone), and pause, unpause and run-now
//! record who did it. At most one row per term (a RELEASE and a takeover
//! racing for one term record it once). Retention is bounded per role by
//! count and age (`leader_history_settings`, default 10,000 rows and 30
//! days), pruned by the writers on one write of the role in 16 on average,
//! at most 1,000 rows at a time; the same write also deletes up to 1,000
//! rows of any role older than the age limit, so a role no longer written
//! (a removed family key) ages out too. `leader_forget(role)` (operator)
//! deletes an idle, unpaused role's lease row and history for good; an
//! ACQUIRE later creates the row afresh. Every text is cut to 500 characters, and
//! RELEASE takes only known loss reasons. The app and operator roles
//! read it ([`HistoryStore`], `ticklease history`); neither can write it
//! but through the lease functions. `metrics::router` (merged into the
//! application's own axum router) or `metrics::serve` renders it at `/` as a
//! read-only status page (server-side HTML and inline SVG, no script,
//! everything from the database escaped): the roles, a timeline of terms by
//! outcome over the last hours with takeovers and pauses marked, and recent
//! events. The timeline is read as roles × 300 slices, whatever the number
//! of ticks: at most [`TimelineSlice::CELLS_MAX`] cells, each read through
//! an index with at most 2 × [`TimelineSlice::TERMS_READ`] entries (one
//! SQL function, `leader_timeline`, with JIT off). A
//! requested window is rounded up to one of nine (1 to 168 hours), each
//! page cached a second, so no sequence of requests reads the store more
//! than once per window and second. Text from the database is escaped by
//! one rule on every surface ([`HistoryEntry::escape`]: control, bidi and
//! zero-width characters shown as `\u{..}`).
//!
//! ## Coordination
//!
//! Leases alone replace a dead leader only when its lease runs out (T), and
//! hear a release only at the next poll. Session advisory locks (what sqlx's
//! `PgAdvisoryLock` and similar libraries use) notice a dead process in
//! milliseconds, but never fail over when a holder freezes with its session
//! open, and do not work through a transaction-mode pooler. ticklease uses
//! both, each for what it is good at:
//!
//! - [`PgStore::with_direct`] opens one **coordination session** per replica
//!   on a direct connection (not through a pooler: a pooled deployment gives
//!   the pooled URL for statements and a direct URL for this session). It
//!   holds a session advisory lock on a random 64-bit **holder key** and
//!   LISTENs on channel `ticklease`. ACQUIRE and RENEW record the key; a
//!   term whose key is not alive is over for ACQUIRE (tested under the row
//!   lock). A key is **alive** while the backend that took it holds it: its
//!   high 32 bits are that backend's pid, and liveness reads `pg_locks` for
//!   an exclusive lock on the key held by that pid (`leader_live_keys`). The
//!   read takes no lock (a lock-table read per statement, bounded by
//!   `max_locks_per_transaction` × `max_connections` whatever the app role
//!   creates; `leader_status` and the batched statements read it a fixed
//!   number of times, at most 3, not once per row). Any login can see keys in `pg_locks` and queue for one:
//!   granted after the holder's session ended, the squatter's lock is held by
//!   another pid and keeps nothing alive. This relies on the kernel not
//!   giving a new backend the dead backend's pid while the term's lease runs:
//!   it hands pids out in increasing order up to `pid_max` (often 32,768),
//!   so a login that noted a holder's key and reconnects until it gets that
//!   pid (minutes of reconnecting) can take the key and keep the dead term
//!   held until its lease runs out: the bound without coordination (T),
//!   never two live terms. It needs no privilege of the attacker's. ACQUIRE and RENEW
//!   refuse a key no session holds, and `with_direct` checks through the
//!   pooled path that the key is visible there (a direct URL that reaches
//!   another database would make every term look dead) and that a probe
//!   notification sent there, on the session's own channel (which it alone
//!   listens to until then, so no other login's notifications delay the
//!   start), reaches the session (a direct URL through a
//!   transaction-mode pooler would hold the key on a shared server
//!   connection and hear nothing). When the database refuses the key (the
//!   server ended the session, e.g. its keepalives found a cut link, before
//!   the client noticed), the replica withdraws it at once, its next RENEW
//!   records none, and the session reconnects with a new key.
//! - A follower refused because the role is held waits on the holder's key
//!   (`pg_advisory_lock_shared`) on a **waiter** connection, shared by every
//!   role held under that key; when the holder's backend ends the wait
//!   returns and the follower ACQUIREs. The wait runs in slices of at most
//!   a second (`leader_key_wait`), each asking whether the key is still alive (a
//!   squatter granted the key after the holder's death delays a takeover by
//!   that second), and a waiter whose wait fails (its backend terminated, a
//!   restart) waits again with backoff (100 ms doubling to 0.5 s). **Waits
//!   leave the server's log quiet**: the slice catches its own lock timeout,
//!   which it sets to 90 % of `deadlock_timeout` (so `log_lock_waits`
//!   reports nothing while that is above 111 ms), and a wait given up (a
//!   handoff, a `Manager::shutdown`) closes its connection between slices,
//!   within a second, never mid-wait (which Postgres logs as `FATAL:
//!   connection to client lost`). Two things still log: a process that
//!   exits within a second of giving a wait up (one FATAL per waiter then in
//!   a slice: stay up a second after `Manager::shutdown` to avoid it), and
//!   `log_min_duration_statement` below the slice (900 ms at the default
//!   `deadlock_timeout`), which logs each slice's duration. Connections per
//!   replica: the pool (statements), one coordination session, and at most
//!   [`KEY_WAITERS_MAX`] waiter connections (one per other replica holding
//!   a role this one wants, those given up and finishing their slice among
//!   them); beyond that, followers wake at the lease's expiry.
//! - After a RELEASE, pause, unpause or run-now commits, the library sends
//!   `pg_notify` in a statement of its own (through a pooler too): followers
//!   ACQUIRE at once, a paused holder renews at once. No decision notifies
//!   in its own transaction: Postgres adds notifications to one cluster-wide
//!   queue at COMMIT, under a cluster-wide lock, and fails the COMMIT when
//!   the queue is full, which any login can bring about (a listener idle in
//!   a transaction holds the tail). A notification that fails costs
//!   followers their fallback wake-up, never a decision. The SQL functions
//!   called from psql notify no one: their holder hears of a pause at its
//!   next RENEW, followers of a paused role ask every `max_poll` (so an
//!   unpause is acted on within P whatever the session), and a run-now is
//!   acted on at the next wake-up (`ticklease pause`, `unpause` and `run-now`
//!   notify). Anyone who can connect
//!   can NOTIFY, so a role acts on a signal at most once per 200 ms: a storm
//!   of forged notifications costs one statement per 200 ms per role and
//!   replica, and can neither end a term nor start one (the statements
//!   decide).
//! - A scheduler's wake-up comes from the database's answer (the holder's
//!   expiry, the due time), decided in one function; without a coordination
//!   session it is capped at P (the bound on hearing a release or an
//!   unpause), with one at 60 s (a guard against a notification lost with
//!   the session). A loop of the application's own over [`Manager::lead`]
//!   gets the same wake-ups from [`NextChance`]; one that sleeps P after a
//!   refusal instead replaces a dead leader only at its next poll
//!   (`docs/benchmarks/failover-drivers.md`: 24 ms against 2.1 s at p50).
//!
//! [`PgStore::with_direct_wakeups`] opens the same session but records no
//! key: releases, pauses, unpauses and run-nows are heard at once, and a
//! term ends only by its lease, a release or a pause. It is for work the
//! fence cannot stop (a `ticklease run` child, an unfenced call out): the
//! end of a holder's session does not say that the holder stopped.
//!
//! **Safety is still the token and the fence.** The key only makes a term
//! acquirable earlier; the ACQUIRE that takes it over drains the old term
//! (guarantee 3) and issues a new token under the row lock, so the old
//! term's fence fails from then on, exactly as after an expiry.
//! Two terms are never live at once. A **false positive** (the holder runs,
//! but its coordination connection died, e.g. `pg_terminate_backend` or a
//! cut link that the server's keepalives noticed, about 4 s) costs a
//! takeover: the old holder claims nothing, and its session reconnects
//! with a new key. It learns of the loss at its next RENEW that reaches the
//! database (within H), or, if its link is cut (both ways, or the server
//! ended its sessions while its own sockets stay silent), stops on its own
//! clock at its abandon deadline (A after its last acknowledged RENEW).
//! **Unfenced work of a replaced holder** (anything but claims through the
//! fence) may therefore run beside the next term's for at most A + the
//! time it takes to stop after its cancellation (measured for
//! `ticklease run`: 4.4 s with a child that exits on SIGTERM, 6.45 s with
//! one that takes a 2 s grace, defaults); with
//! [`PgStore::with_direct_wakeups`], or without a session, not at all
//! (the next term waits for the lease, T > A + the stop). While its
//! session is down a replica records no key (plain leases). A holder that
//! **freezes** keeps its session (the backend lives), so it is replaced by
//! its lease's expiry, as without coordination; a frozen follower delays
//! nothing. **Advisory locks are not replicated**: on a hot standby no key
//! is held, so `leader_status` read there shows keyed terms as not held, and
//! after a promotion every keyed term looks dead on the new primary until
//! its holder's session reconnects there with a new key (give the direct
//! URL every host too). A failover therefore hands each role over once,
//! fenced like any takeover, even when it is shorter than the TTL. The session sets server-side TCP keepalives (2 s idle, 1 s
//! interval, 2 probes, 4 s user timeout), so a link that drops packets ends
//! the session in about 4 s rather than the kernel's two hours.
//!
//! ## Role families
//!
//! Per-tenant or per-shard singletons (`tenant_sync:acme`, `billing:shard-3`)
//! are a [`Family`]: a name and a set of keys that changes at run time
//! ([`Family::add`], [`Family::remove`], [`Family::set`]). Each key is one
//! role row `name:key` with its own independent term, token, fence, history
//! and pause; removing a key cancels its running tick
//! ([`Cancel::Removed`]) and releases it as interrupted.
//! [`Scheduler::family`] runs one loop per family and replica:
//!
//! ```no_run
//! use std::time::Duration;
//! use ticklease::{Config, Family, Manager, PgStore, PgStoreOptions, Role, Scheduler};
//! use tokio_util::sync::CancellationToken;
//!
//! # async fn example(pg: tokio_postgres::Config, direct: tokio_postgres::Config) -> anyhow::Result<()> {
//! let config = Config::default();
//! let store = PgStore::connect(pg, PgStoreOptions::from_config(&config)).await?.with_direct(direct).await?;
//! let tenants = Family::new("tenant_sync")?;
//! tenants.set(["acme", "globex", "initech"])?;
//! let manager = Manager::start(store, config, Vec::<Role>::new()).await?;
//! let scheduler = Scheduler::new(manager).family(&tenants, Duration::from_secs(60), |tick| async move {
//!     let tenant = tick.role().as_str().trim_start_matches("tenant_sync:").to_owned();
//!     // sync `tenant`, claiming its rows with tick.fence()
//!     let _ = tenant;
//!     Ok::<_, std::io::Error>(())
//! })?;
//! tenants.add("umbrella")?; // led from the loop's next wake-up
//! let stopped = scheduler.run(CancellationToken::new()).await;
//! # let _ = stopped;
//! # Ok(())
//! # }
//! ```
//!
//! **Schedules.** A family runs on an interval ([`Schedule::every`], with
//! its retry policy) or on a cron schedule: each key then runs each
//! occurrence once, the latest one due on the database clock
//! ([`CatchUp::Latest`]; other policies and a starting deadline are refused
//! with [`ScheduleError::NotForFamily`]): the loop asks for that occurrence
//! in its batched ACQUIRE (`leader_acquire_many` with the occurrence), which
//! decides per key as the one-row ACQUIRE of an occurrence does, counts a
//! new key from its first ask, starts a key's waiting run-now as a manual
//! term, and records the occurrences a started key passed over (`paused` or
//! `catch_up`, from the loop's list of the occurrences before it, at most
//! [`SKIPPED_COUNTED_MAX`]). A cron family exports no
//! `leader_family_tick_interval_seconds` (the stall alert compares ticks
//! with an interval).
//!
//! **Statements grow with replicas, not keys.** Per replica: one ACQUIRE
//! (`leader_acquire_many`) per wake-up for every key that is due, returning
//! the subset it won; one RENEW (`leader_renew_many`) per heartbeat for all
//! its family terms, answering per term renewed or the reason it is over
//! (family terms beat on one grid of `heartbeat_every`, so terms started at
//! different times still leave in one statement; each term's heartbeat
//! still keeps its own `last_ack` and abandon instant); one RELEASE
//! (`leader_release_many`) for the terms that end within the same 2 ms; and
//! one registry beat (`leader_replica_beat`) per family per heartbeat. Each
//! is an unnamed `query_typed` statement (PgBouncer-safe), each row goes
//! through the one-row statement's rules, so every RENEW and RELEASE is still
//! term-scoped by `(role, token)` and a role still has at most one live term;
//! rows are locked, and new rows created, in role order, so batches never
//! deadlock each other (whatever order each caller asks in), and
//! ACQUIRE locks only the rows it picked as acquirable (rows held elsewhere
//! are read without a lock). A batch holds at
//! most [`BATCH_MAX`] (1,000) roles, larger ones are split. Wake-ups are
//! rounded up to a grid (50 ms, or a twelfth of a heartbeat if shorter), so
//! keys due together share a statement. Told of a release, unpause or
//! run-now, a replica asks about the keys it prefers at most every 200 ms
//! (or a sixth of a heartbeat); the others wait for their own wake-ups. A
//! key held by a live replica and preferred by another is *parked*: not
//! asked about at each lease expiry (its preferred replica watches that),
//! but when the replicas change, its holder's session ends, or after the
//! longest sleep (60 s with a coordination session, `max_poll` without).
//! A key a replica does not prefer and knows no due time of (parked, new
//! here, paused, or after a failed ACQUIRE) is first only looked at, by an
//! ACQUIRE with a limit of 0 that starts no term: its grace counts from
//! then, so a look that falls between the key's due time and its preferred
//! replica's ACQUIRE never takes it.
//!
//! **How a replica knows N, and the spread.** Each family loop registers its
//! replica in `leader_replicas` once per heartbeat and reads back the
//! replicas that are alive: registered within a lease TTL (at most
//! [`REGISTRATION_TTL_MAX`], a minute, whatever a caller asks; a beat
//! returns at most 1,000 replicas, itself among them) and, with a
//! coordination session, holding their key (a killed replica drops out at
//! once; one that stops cleanly leaves at once). With N replicas and K keys,
//! a replica *prefers* the keys whose index in the sorted key list, modulo N,
//! is its rank among the sorted replica ids: exactly K/N each when every
//! replica declares the same keys. It acquires a preferred key when it is
//! due, any other key only once it has been due for half a heartbeat
//! (the preferred replica did not take it: slow, at its cap, or gone), and
//! it never holds more than `ceil(K/N) + max(1, ceil(K/N)/10)` terms at once
//! while others are alive ([`Family::set_max_terms`] caps it further).
//! When N changes, preferences move at the next tick of each key (terms are
//! tick-scoped, so nothing is handed over mid-tick). A dead replica's keys
//! are taken over as its single roles are: at once with coordination
//! sessions (every follower waits on the holder's key, so each dead replica
//! costs one waiter connection per surviving replica), else when the leases
//! run out. Replicas started at once may briefly hold more than their share
//! (the first alone counts N = 1); the spread settles as the terms end. The
//! registry trusts a replica's holder id as ACQUIRE does: any holder of the
//! app role can register, and every registration lowers the others' caps:
//! while a registered replica leads none of its share (a phantom, or one
//! with a small `max_terms`), the others hold at most their capped shares
//! at once, so with ticks that hold their terms most of the interval some
//! keys wait for room.
//!
//! **Bounds per replica.** Concurrent terms: the fair cap above and
//! `max_terms` (default [`FAMILY_TERMS_DEFAULT`] = 1,000 per family).
//! Connections: the pool ([`PgStoreOptions::pool_size`], 8 by default, never
//! sized by keys: the batched statements need one connection each, at most 4
//! batches in flight) plus, with a direct URL, one coordination session and
//! at most [`KEY_WAITERS_MAX`] (16) waiter connections, one per other
//! replica whose death it waits for. Memory (estimated from the types, not
//! measured per key): about 200 bytes per key the replica does not lead and
//! a few kilobytes per live term (its tasks); measured, a replica's RSS stays
//! under 28 MB at 1,000 keys and ~100 live terms; at
//! most [`FAMILY_KEYS_MAX`] (100,000) keys per family; the batcher's queue
//! holds at most 4,000 requests. `docs/benchmarks/scale.md` measures 10
//! replicas × 1,000 keys.
//!
//! **Metrics.** By default a family exports aggregates, never a series per
//! key: `leader_family_leading{family}` (this replica's terms),
//! `leader_family_ticks_total{family,outcome}`,
//! `leader_family_lease_lost_total{family,reason}`,
//! `leader_family_tick_interval_seconds{family}` and the cluster facts
//! `leader_family_last_tick_age_max_seconds{family}` (the key that waited
//! longest, among the family's current keys),
//! `leader_family_never_ran{family}` and `leader_family_paused{family}`.
//! [`Family::set_per_role_metrics`] adds the per-role series for each key.
//!
//! ## TLS
//!
//! [`PgConnect`] parses a connection URL with libpq's `sslmode` (`disable`,
//! `prefer` by default, `require`, `verify-ca`, `verify-full`) and
//! `sslrootcert` (a PEM CA file; the platform's roots when absent) into a
//! `tokio_postgres::Config` and a rustls connector. [`PgStore::connect`] takes
//! one, or a bare `tokio_postgres::Config`, which encrypts when the server
//! offers TLS but checks no certificate; the cancel of a timed-out statement
//! goes with the same TLS. See [`tls`] for what each mode checks.
//!
//! ## Other languages
//!
//! The `ticklease` Python package (`crates/ticklease-py`) is this crate behind
//! a PyO3 binding: its `Scheduler` is [`Scheduler`] over a [`PgStore`], its
//! `Term` a [`Tick`], and every guarantee above holds for it with the bounds
//! above (the black-box harness and its own suite check it). What the
//! binding adds, and what it relies on:
//!
//! - An `async def` work is a task of the caller's asyncio loop: when the
//!   crate drops a lost term's work, the task is cancelled. A plain function
//!   runs in a thread of the runtime's blocking pool and cannot be stopped
//!   from outside: it stops when it polls or waits on its term, so after a
//!   loss it may run on (its fenced claims claim nothing, as any work after
//!   the abandon cut).
//! - Python's outcomes map onto the crate's: a return is `Ok`, the
//!   package's `Failed` exception an `Err`, any other exception a panic.
//! - The GIL is never held while the crate waits on the network, and no
//!   runtime worker (where heartbeats run) waits for it: calls into Python
//!   run on the blocking pool, log lines go through a bounded queue to a
//!   thread of their own.
//! - The runtime is per process: a forked child builds its own. Its threads
//!   enter Python only through a gate that closes at interpreter exit (it
//!   waits for the threads inside, then lets none in), so none of them
//!   touches the finalizing interpreter.
//!
//! Any other language follows `docs/sql-api.md`, the protocol's reference.
//!
//! ## Layers
//!
//! The source is a folder per layer; a module uses only its own layer and
//! those before it here (`tests/layers.rs` checks it, and that no modules
//! use each other in a circle):
//!
//! 1. `config`, `error`: timings and their invariants; the error types.
//! 2. `term`: the vocabulary of a term (role names, families of them,
//!    tokens, holder ids, the fence a claim carries).
//! 3. `connect`: reaching Postgres (URLs and TLS, multi-host connects, the
//!    coordination session).
//! 4. `store`: the [`LeaseStore`] trait and its Postgres store, a SQL file
//!    per statement, batching, and the schema: the protocol's current SQL in
//!    one file per concept (`definitions/`), versioned migrations for tables
//!    and data.
//! 5. `ops`: what operators see (tick outcomes, the history, metrics, the
//!    status page).
//! 6. `leader`: leading one term ([`Manager`], [`Tick`], the heartbeat,
//!    drift, steps).
//! 7. `schedule`: when each role and family key is led ([`Scheduler`], the
//!    family loop, a follower's next wake-up).

#![warn(missing_docs, unreachable_pub)]

mod config;
pub mod error;

mod connect;
mod leader;
mod ops;
mod schedule;
mod store;
mod term;

/// The HTTP framework [`metrics::router`] returns a router of.
#[cfg(feature = "http")]
pub use axum;
pub use connect::hosts;
pub use connect::patroni;
pub use connect::tls;
#[cfg(feature = "prometheus")]
pub use ops::metrics;
/// The metrics' crate, at the version [`Metrics::register`] takes a registry of.
#[cfg(feature = "prometheus")]
pub use prometheus_client;
pub use store::migrate;
/// An in-memory [`LeaseStore`] on tokio's (pausable) clock, for testing a
/// job's behaviour on lease loss, pause and shutdown without Postgres.
#[cfg(feature = "testing")]
pub mod testing {
    pub use crate::store::memory::{MemoryStore, RENEW_SENDS_KEPT};
}
/// The cancellation token [`Scheduler`] and `metrics::serve` take.
pub use tokio_util::sync::CancellationToken;

pub use config::{Config, ConfigBuilder, DURATION_MAX};
pub use connect::coordination::{Signals, KEY_WAITERS_MAX};
pub use error::{ConfigError, Error, HolderIdError, MigrateError, RoleError, StoreError};
pub use leader::lead::{BoxError, Cancel, Lead, Manager, RoleReport, Tick, ROLE_REPORT_ROWS_MAX};
pub use leader::step::Steps;
#[cfg(feature = "prometheus")]
pub use metrics::Metrics;
pub use migrate::{migrate, migrate_at, migrate_with, MigrateOptions, MigrateReport};
pub use ops::history::pause_label;
pub use ops::history::{
    HistoryEntry, HistoryKind, HistoryStore, TimelineSlice, HISTORY_LIMIT_MAX, TIMELINE_BUCKETS_MAX,
};
pub use schedule::chance::NextChance;
pub use schedule::family::REGISTRATION_TTL_MAX;
pub use schedule::scheduler::{cancel_on_signals, Scheduler, Stopped};
pub use store::{
    Acquire, Ending, FamilyOccurrenceAsk, Interval, LeaseStatus, LeaseStore, LossReason, OccurrenceAnswer,
    OccurrenceAsk, PgStore, PgStoreOptions, Refusal, Release, Releasing, Renew, SynchronousWaits, Term,
    BATCH_MAX, ERROR_SUMMARY_MAX, OUTPUT_KEPT_MAX, POOL_SIZE_MAX, STATUS_COUNTED_MAX,
};
pub use term::family::{Family, FAMILY_KEYS_MAX, FAMILY_TERMS_DEFAULT};
pub use term::fence::Fence;
pub use term::holder::HolderId;
pub use term::role::{Role, ROLE_NAME_MAX};
pub use term::schedule::{
    CatchUp, Due, Retry, Schedule, ScheduleError, SkipReason, Skipped, CATCH_UP_MAX, EXPRESSION_MAX,
    FIRST_OCCURRENCE_GRACE, SKIPPED_COUNTED_MAX,
};
pub use term::token::Token;
pub use tls::{PgConnect, PgConnectError};

#[doc = include_str!("../../../README.md")]
#[cfg(doctest)]
pub struct ReadmeDoctests;
