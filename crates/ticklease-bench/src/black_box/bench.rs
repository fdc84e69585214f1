//! The clients of the repository as the harness starts them, and the
//! benchmark: several checks of each, figures per fault written to
//! `docs/benchmarks/black-box.md`.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use super::{check, ClientUnderCheck, Report, Timings};
use crate::stats::summarize;

/// Where the executables and the repository are.
pub struct Paths {
    /// `ticklease-bench` itself (the Rust client is its `black-box-client`).
    pub bench: PathBuf,
    /// The `ticklease` binary (`ticklease run`).
    pub ticklease: PathBuf,
    /// The repository's root (the client scripts).
    pub root: PathBuf,
}

/// The Rust `Scheduler`, `ticklease run` and the Python package's replica
/// program, run by `TICKLEASE_PYTHON` (an interpreter with the `ticklease`
/// package installed; `python3` when unset).
pub fn repository_clients(paths: &Paths) -> Vec<ClientUnderCheck> {
    // One shell word, whatever the path holds (a `'` included).
    let quoted = |p: &Path| format!("'{}'", p.display().to_string().replace('\'', r"'\''"));
    let python = std::env::var("TICKLEASE_PYTHON").unwrap_or_else(|_| "python3".into());
    vec![
        ClientUnderCheck {
            name: "rust-scheduler".into(),
            command: format!("{} black-box-client", quoted(&paths.bench)),
            env: Vec::new(),
        },
        ClientUnderCheck {
            name: "ticklease-run".into(),
            command: format!("sh {}", quoted(&paths.root.join("clients/run/blackbox.sh"))),
            env: vec![("TICKLEASE_BIN".into(), paths.ticklease.display().to_string())],
        },
        ClientUnderCheck {
            name: "python".into(),
            command: format!(
                "{} {}",
                quoted(Path::new(&python)),
                quoted(&paths.root.join("clients/python/blackbox.py"))
            ),
            env: Vec::new(),
        },
    ]
}

/// A client given on the command line as `NAME=COMMAND` (`--client`).
pub fn parse_client(spec: &str) -> Result<ClientUnderCheck, String> {
    let (name, command) = spec
        .split_once('=')
        .ok_or_else(|| format!("--client {spec:?}: NAME=COMMAND (e.g. node=\"node client.js\")"))?;
    let valid = !name.is_empty()
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_');
    if !valid || command.trim().is_empty() {
        return Err(format!(
            "--client {spec:?}: NAME of letters, digits, - and _, then a command to run"
        ));
    }
    Ok(ClientUnderCheck {
        name: name.into(),
        command: command.into(),
        env: Vec::new(),
    })
}

/// The clients to check: the repository's named in `only` (all when
/// `only` and `given` are empty), then the `given` ones. A name in `only`
/// that is no repository client, or a name given twice, is refused.
pub fn choose(
    repository: Vec<ClientUnderCheck>,
    only: &[String],
    given: Vec<ClientUnderCheck>,
) -> anyhow::Result<Vec<ClientUnderCheck>> {
    if let Some(unknown) = only.iter().find(|n| !repository.iter().any(|c| &c.name == *n)) {
        let known: Vec<&str> = repository.iter().map(|c| c.name.as_str()).collect();
        anyhow::bail!(
            "--only {unknown:?}: no such client (the repository's: {}; give another with --client NAME=COMMAND)",
            known.join(", ")
        );
    }
    let take_all = only.is_empty() && given.is_empty();
    let mut chosen: Vec<ClientUnderCheck> = repository
        .into_iter()
        .filter(|c| take_all || only.contains(&c.name))
        .collect();
    for client in given {
        anyhow::ensure!(
            !chosen.iter().any(|c| c.name == client.name),
            "client {:?} is named twice",
            client.name
        );
        chosen.push(client);
    }
    Ok(chosen)
}

/// Checks each client `rounds` times; writes the figures; returns every report.
pub async fn run(clients: &[ClientUnderCheck], rounds: usize, out: &Path) -> anyhow::Result<Vec<Report>> {
    let mut reports = Vec::new();
    for client in clients {
        for round in 0..rounds {
            eprintln!("black-box {}: round {round}", client.name);
            let report = check(client, Timings::SCALED).await?;
            eprintln!("round {round}: {}", report.summary());
            if !report.violations.is_empty() {
                for v in &report.violations {
                    eprintln!("  VIOLATION {}", ticklease::HistoryEntry::escape(v));
                }
                // The replicas' last lines, escaped when they were read.
                eprint!("{}", report.tails);
            }
            reports.push(report);
        }
    }
    std::fs::create_dir_all(out)?;
    std::fs::write(out.join("black-box.md"), markdown(&reports, rounds))?;
    Ok(reports)
}

fn markdown(reports: &[Report], rounds: usize) -> String {
    let t = Timings::SCALED;
    let mut md = format!(
        "# The black-box check: figures per client\n\n`ticklease-bench black-box --rounds {rounds}` (docs/black-box.md): three replicas per client, \
         timings T {:?}, H {:?}, S {:?}, A {:?}, P {:?}, work {:?}. Milliseconds from the fault (the unpause, the server's start, \
         the run-now) to the next term's first claim, on the database clock; violations: what the checks first found after \
         that fault, over all rounds.\n\n",
        t.lease_ttl, t.heartbeat, t.statement_timeout, t.abandon, t.max_poll, t.work
    );
    md.push_str(
        "| client | fault | n | p50 | p99 | max | bound | violations |\n|---|---|---|---|---|---|---|---|\n",
    );
    let mut clients: Vec<&str> = reports.iter().map(|r| r.client.as_str()).collect();
    clients.dedup();
    for client in clients {
        let of: Vec<&Report> = reports.iter().filter(|r| r.client == client).collect();
        let faults: Vec<&str> = of
            .first()
            .map(|r| r.outcomes.iter().map(|o| o.fault).collect())
            .unwrap_or_default();
        for fault in faults {
            let samples: Vec<f64> = of
                .iter()
                .flat_map(|r| &r.outcomes)
                .filter(|o| o.fault == fault)
                .filter_map(|o| o.to_claim_ms)
                .collect();
            let bound = of
                .iter()
                .flat_map(|r| &r.outcomes)
                .find(|o| o.fault == fault)
                .map_or(0.0, |o| o.bound_ms);
            let violations: usize = of
                .iter()
                .flat_map(|r| &r.outcomes)
                .filter(|o| o.fault == fault)
                .map(|o| o.violations.len())
                .sum();
            if let Some(s) = summarize(&samples) {
                let _ = writeln!(
                    md,
                    "| {client} | {fault} | {} | {:.0} | {:.0} | {:.0} | {bound:.0} | {violations} |",
                    s.n, s.p50, s.p99, s.max
                );
            } else {
                let _ = writeln!(md, "| {client} | {fault} | 0 | | | | {bound:.0} | {violations} |");
            }
        }
        let other: usize = of.iter().map(|r| r.unattributed()).sum();
        let _ = writeln!(
            md,
            "| {client} | (no fault: exits, before the first fault) | | | | | | {other} |"
        );
    }
    md
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::black_box::Outcome;

    fn repository() -> Vec<ClientUnderCheck> {
        let paths = Paths {
            bench: "/b".into(),
            ticklease: "/t".into(),
            root: "/r".into(),
        };
        repository_clients(&paths)
    }

    fn names(clients: &[ClientUnderCheck]) -> Vec<&str> {
        clients.iter().map(|c| c.name.as_str()).collect()
    }

    #[test]
    fn an_unknown_name_in_only_is_refused_not_ignored() {
        let e = choose(repository(), &["node".into()], Vec::new()).unwrap_err();
        assert!(e.to_string().contains("\"node\": no such client"), "{e}");
    }

    #[test]
    fn a_client_given_as_a_command_is_checked_under_its_own_name() {
        let node = parse_client("node=node clients/node/blackbox.js").unwrap();
        assert_eq!(node.command, "node clients/node/blackbox.js");
        let chosen = choose(repository(), &["python".into()], vec![node]).unwrap();
        assert_eq!(names(&chosen), ["python", "node"]);
        let alone = choose(repository(), &[], vec![parse_client("x=./x").unwrap()]).unwrap();
        assert_eq!(names(&alone), ["x"]);
        assert_eq!(names(&choose(repository(), &[], Vec::new()).unwrap()).len(), 3);
    }

    #[test]
    fn a_client_spec_without_a_name_or_command_or_named_twice_is_refused() {
        assert!(parse_client("node").is_err());
        assert!(parse_client("=node x.js").is_err());
        assert!(parse_client("node= ").is_err());
        assert!(parse_client("no de=x").is_err());
        let twice = choose(
            repository(),
            &["python".into()],
            vec![parse_client("python=./p").unwrap()],
        );
        assert!(twice.unwrap_err().to_string().contains("named twice"));
    }

    #[test]
    fn the_figures_charge_each_fault_with_its_own_violations() {
        let at = std::time::UNIX_EPOCH;
        let ms = |n| Some(at + std::time::Duration::from_millis(n));
        let bound = std::time::Duration::from_secs(4);
        let round = |kill_violations: usize| {
            let mut kill = Outcome::new("SIGKILL", at, ms(100), bound);
            kill.violations = vec!["v".into(); kill_violations];
            let stop = Outcome::new("SIGSTOP", at, ms(200), bound);
            Report {
                client: "c".into(),
                violations: vec!["v".into(); kill_violations + 1],
                outcomes: vec![kill, stop],
                tails: String::new(),
            }
        };
        let md = markdown(&[round(2), round(1)], 2);
        assert!(md.contains("| c | SIGKILL | 2 | "), "{md}");
        assert!(
            md.contains("| 4000 | 3 |"),
            "SIGKILL's three over both rounds:\n{md}"
        );
        assert!(
            md.contains("| 200 | 4000 | 0 |"),
            "none charged to SIGSTOP:\n{md}"
        );
        assert!(
            md.contains("| c | (no fault: exits, before the first fault) | | | | | | 2 |"),
            "{md}"
        );
    }
}
