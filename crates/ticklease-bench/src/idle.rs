//! The idle load: drill leaders on one role whose tick runs until cancelled
//! and writes nothing, so every statement the database sees is ticklease's
//! own (renews, the follower's ACQUIREs) or the pooler's. Counted with
//! `pg_stat_statements`; connections counted per process from its sockets
//! (`/proc/<pid>/fd` → `/proc/net/tcp`), which tells a replica's links to
//! Postgres from those to PgBouncer whatever the server sees behind the pooler.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::Context;
use nix::sys::signal::Signal;

use ticklease_testkit::{connect, signal};

use crate::drill;
use crate::failover::{next_leading, Env};

/// What a replica process holds open.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Connections {
    pub to_postgres: usize,
    pub to_bouncer: usize,
}

#[derive(Debug, Clone)]
pub struct IdleLoad {
    pub over: Duration,
    /// Top-level statements the database executed for the bench's database.
    pub statements: i64,
    /// Per normalized statement text, most frequent first.
    pub by_statement: Vec<(String, i64)>,
    /// Per replica, sampled at the end of the window; the first is the holder.
    pub connections: Vec<Connections>,
    /// Client backends of the database (PgBouncer's server connections included).
    pub server_backends: i64,
}

impl IdleLoad {
    pub fn per_second(&self) -> f64 {
        self.statements as f64 / self.over.as_secs_f64()
    }
}

/// Runs `replicas` drill leaders on one role for `over` and counts.
pub async fn measure(env: &Env, replicas: usize, over: Duration) -> anyhow::Result<IdleLoad> {
    let config = env.timing.config();
    let db = connect(&env.cluster.config(&env.db)).await?;
    db.batch_execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
        .await?;
    let statements_url = env.url_at(env.statements_port());
    let direct_url = env.mode.coordinated().then(|| env.url_at(env.cluster.port()));
    let spawn = || {
        drill::spawn_leader(
            &env.exe,
            &statements_url,
            direct_url.as_deref(),
            "idle",
            env.timing,
            Duration::ZERO,
            env.driver,
        )
    };
    // The first replica leads; the others start once it does.
    let mut children = vec![spawn()?];
    next_leading(&mut children[0].1, config.lease_ttl() * 3).await?;
    for _ in 1..replicas {
        children.push(spawn()?);
    }
    // Past the followers' first refusals and a full wait cycle, then count.
    tokio::time::sleep(config.max_poll() + config.heartbeat_every()).await;
    db.batch_execute("SELECT pg_stat_statements_reset()").await?;
    let started = Instant::now();
    tokio::time::sleep(over).await;
    let rows = db
        .query(
            "SELECT query, sum(calls)::bigint FROM pg_stat_statements
              WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database())
                AND query NOT LIKE '%pg_stat_statements%'
              GROUP BY query ORDER BY 2 DESC",
            &[],
        )
        .await?;
    let over = started.elapsed();
    let by_statement: Vec<(String, i64)> = rows.iter().map(|r| (r.get(0), r.get(1))).collect();
    let server_backends: i64 = db
        .query_one(
            "SELECT count(*) FROM pg_stat_activity
              WHERE datname = current_database() AND backend_type = 'client backend' AND pid <> pg_backend_pid()",
            &[],
        )
        .await?
        .get(0);
    let ports = [
        (env.cluster.port(), false),
        (env.statements_port(), env.bouncer.is_some()),
    ];
    let mut connections = Vec::new();
    for (child, _) in &children {
        let pid = child.id().context("a replica exited")?;
        connections.push(sockets_of(pid, &ports)?);
    }
    for (child, _) in &mut children {
        signal(child, Signal::SIGTERM);
        let _ = child.wait().await;
    }
    Ok(IdleLoad {
        over,
        statements: by_statement.iter().map(|(_, n)| n).sum(),
        by_statement,
        connections,
        server_backends,
    })
}

/// The established TCP connections of process `pid` to each of `ports`
/// (`true`: a PgBouncer port).
fn sockets_of(pid: u32, ports: &[(u16, bool)]) -> anyhow::Result<Connections> {
    let mut inodes = Vec::new();
    for fd in std::fs::read_dir(format!("/proc/{pid}/fd"))? {
        let target = std::fs::read_link(fd?.path())?;
        if let Some(inode) = target
            .to_str()
            .and_then(|t| t.strip_prefix("socket:["))
            .and_then(|t| t.strip_suffix(']'))
        {
            inodes.push(inode.to_string());
        }
    }
    // inode → remote port, established (state 01) sockets only.
    let mut remote: HashMap<String, u16> = HashMap::new();
    for table in ["tcp", "tcp6"] {
        let text = std::fs::read_to_string(format!("/proc/{pid}/net/{table}")).unwrap_or_default();
        for line in text.lines().skip(1) {
            let f: Vec<&str> = line.split_whitespace().collect();
            if f.len() > 9 && f[3] == "01" {
                if let Some(port) = f[2]
                    .rsplit(':')
                    .next()
                    .and_then(|p| u16::from_str_radix(p, 16).ok())
                {
                    remote.insert(f[9].to_string(), port);
                }
            }
        }
    }
    let mut out = Connections::default();
    for inode in inodes {
        let Some(port) = remote.get(&inode) else { continue };
        match ports.iter().find(|(p, _)| p == port) {
            Some((_, true)) => out.to_bouncer += 1,
            Some((_, false)) => out.to_postgres += 1,
            None => {}
        }
    }
    Ok(out)
}

/// Writes `idle-<timing>-<mode>.csv` (calls per statement over the window) and returns its path.
pub fn write_csv(dir: &Path, env: &Env, load: &IdleLoad) -> anyhow::Result<PathBuf> {
    std::fs::create_dir_all(dir)?;
    let path = dir.join(format!("idle-{}-{}.csv", env.timing.as_str(), env.mode.as_str()));
    let mut out = String::from("window_s,calls,statement\n");
    for (query, calls) in &load.by_statement {
        let query = query
            .split_whitespace()
            .collect::<Vec<_>>()
            .join(" ")
            .replace('"', "\"\"");
        let _ = writeln!(out, "{:.1},{calls},\"{query}\"", load.over.as_secs_f64());
    }
    std::fs::write(&path, out)?;
    Ok(path)
}

/// One line of the report.
pub fn summary(env: &Env, load: &IdleLoad) -> String {
    let per: Vec<String> = load
        .connections
        .iter()
        .enumerate()
        .map(|(i, c)| {
            let who = if i == 0 { "holder" } else { "follower" };
            format!(
                "{who}: {} to Postgres + {} to PgBouncer",
                c.to_postgres, c.to_bouncer
            )
        })
        .collect();
    format!(
        "{}: {} statements in {:.1} s = {:.3}/s; connections per replica: {}; client backends of the database: {}",
        env.mode.as_str(),
        load.statements,
        load.over.as_secs_f64(),
        load.per_second(),
        per.join(", "),
        load.server_backends
    )
}
