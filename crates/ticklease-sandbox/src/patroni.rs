//! A three-member Patroni cluster with its etcd, on one machine: the HA
//! Postgres most self-hosted users run, with real failovers decided by a
//! real failover manager. Needs Debian's `patroni` and `etcd-server`
//! packages (Patroni 3.0, etcd 3.4); as root, everything runs as `postgres`
//! (Patroni refuses root). Every process gets its own process group and is
//! killed, with its Postgres, when the cluster is dropped.

use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use nix::sys::signal::{killpg, Signal};
use nix::unistd::{Gid, Pid, Uid};

use crate::cluster::{bindir, free_port, io, server_user, SandboxError};

/// Members of the cluster.
pub const MEMBERS: usize = 3;
/// How long bootstrap, a switchover or a recovery may take.
const SETTLE_MAX: Duration = Duration::from_secs(90);

/// A member: its name, its Postgres port and its REST API port.
#[derive(Debug, Clone)]
pub struct Member {
    pub name: String,
    pub pg_port: u16,
    pub api_port: u16,
}

/// A running Patroni cluster; everything stops when dropped.
pub struct PatroniCluster {
    root: tempfile::TempDir,
    user: Option<(Uid, Gid)>,
    members: Vec<Member>,
    etcd: Child,
    patronis: Vec<Child>,
    /// Patroni's `synchronous_mode`: the leader commits only once a standby has the commit.
    synchronous: bool,
}

impl std::fmt::Debug for PatroniCluster {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PatroniCluster")
            .field("root", &self.root.path())
            .field("members", &self.members)
            .field("synchronous", &self.synchronous)
            .finish()
    }
}

impl PatroniCluster {
    /// Starts etcd and three Patroni members (asynchronous replication) and
    /// waits until one leads and the two others stream from it.
    pub fn start() -> Result<PatroniCluster, SandboxError> {
        PatroniCluster::start_with(false)
    }

    /// [`PatroniCluster::start`], with Patroni's `synchronous_mode` on when
    /// `synchronous`: then healthy also means one member is the synchronous standby.
    pub fn start_with(synchronous: bool) -> Result<PatroniCluster, SandboxError> {
        PatroniCluster::launch(synchronous, |m| Ok(m.api_port))
    }

    /// [`PatroniCluster::start`], each member's REST API announced to the
    /// others (its `connect_address`, which the members and `patronictl`
    /// use) at the local port `announce` gives: a proxy a test can cut, to
    /// part the members from one REST API while the test still reaches it.
    pub fn start_announcing(
        announce: impl FnMut(&Member) -> Result<u16, SandboxError>,
    ) -> Result<PatroniCluster, SandboxError> {
        PatroniCluster::launch(false, announce)
    }

    fn launch(
        synchronous: bool,
        mut announce: impl FnMut(&Member) -> Result<u16, SandboxError>,
    ) -> Result<PatroniCluster, SandboxError> {
        let root = tempfile::tempdir().map_err(io("create the Patroni dir"))?;
        let user = server_user()?;
        if let Some((uid, gid)) = user {
            nix::unistd::chown(root.path(), Some(uid), Some(gid))
                .map_err(|e| io("chown the Patroni dir")(e.into()))?;
        }
        let (client, peer) = (free_port()?, free_port()?);
        let etcd = spawn(
            user,
            root.path(),
            "etcd",
            Command::new("etcd").args(etcd_args(root.path(), client, peer)),
        )?;
        let members: Vec<Member> = (1..=MEMBERS)
            .map(|i| {
                Ok(Member {
                    name: format!("m{i}"),
                    pg_port: free_port()?,
                    api_port: free_port()?,
                })
            })
            .collect::<Result<_, SandboxError>>()?;
        let mut cluster = PatroniCluster {
            root,
            user,
            members,
            etcd,
            patronis: Vec::new(),
            synchronous,
        };
        for m in cluster.members.clone() {
            let config = cluster.write_config(&m, announce(&m)?, client)?;
            let log = format!("patroni-{}", m.name);
            let child = spawn(
                user,
                cluster.root.path(),
                &log,
                Command::new("patroni").arg(config),
            )?;
            cluster.patronis.push(child);
        }
        cluster.wait_healthy()?;
        Ok(cluster)
    }

    pub fn members(&self) -> &[Member] {
        &self.members
    }

    /// A URL naming every member, asking for the writable one.
    pub fn url(&self, dbname: &str) -> String {
        let hosts: Vec<String> = self
            .members
            .iter()
            .map(|m| format!("127.0.0.1:{}", m.pg_port))
            .collect();
        format!(
            "postgres://postgres@{}/{dbname}?target_session_attrs=read-write",
            hosts.join(",")
        )
    }

    /// Every member's REST API, `http://127.0.0.1:port`.
    pub fn api_urls(&self) -> Vec<String> {
        self.members
            .iter()
            .map(|m| format!("http://127.0.0.1:{}", m.api_port))
            .collect()
    }

    /// The member that leads now, if one does (its REST API says primary).
    pub fn leader(&self) -> Option<&Member> {
        self.members
            .iter()
            .find(|m| http_status(m.api_port, "/primary") == Some(200))
    }

    /// The members Patroni names synchronous standbys (in synchronous mode,
    /// the only ones a switchover or a failover may promote).
    pub fn synchronous_standbys(&self) -> impl Iterator<Item = &Member> {
        self.members
            .iter()
            .filter(|m| http_status(m.api_port, "/sync") == Some(200))
    }

    /// Waits until one member leads and every other runs as a replica
    /// streaming from it (in synchronous mode, one of them the synchronous
    /// standby: until Patroni names one, the leader commits asynchronously);
    /// returns how long that took.
    pub fn wait_healthy(&self) -> Result<Duration, SandboxError> {
        let started = Instant::now();
        loop {
            let leaders = self
                .members
                .iter()
                .filter(|m| http_status(m.api_port, "/primary") == Some(200))
                .count();
            let replicas = self
                .members
                .iter()
                .filter(|m| http_status(m.api_port, "/replica?lag=1MB") == Some(200))
                .count();
            let synchronous = self.synchronous_standbys().count();
            if leaders == 1 && replicas == MEMBERS - 1 && (!self.synchronous || synchronous == 1) {
                return Ok(started.elapsed());
            }
            if started.elapsed() > SETTLE_MAX {
                return Err(SandboxError::Command {
                    what: "Patroni cluster settling".into(),
                    output: format!(
                        "{leaders} leaders, {replicas} replicas, {synchronous} synchronous; {}",
                        self.log_tail()
                    ),
                });
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// A planned switchover to `candidate` (`patronictl switchover`).
    pub fn switchover(&self, candidate: &str) -> Result<(), SandboxError> {
        let leader = self.leader().ok_or_else(|| SandboxError::Command {
            what: "switchover".into(),
            output: "no member leads".into(),
        })?;
        let out = self
            .as_server(Command::new("patronictl"))
            .arg("-c")
            .arg(self.config_path(&leader.name))
            .args([
                "switchover",
                "--leader",
                &leader.name,
                "--candidate",
                candidate,
                "--force",
            ])
            .output()
            .map_err(io("run patronictl switchover"))?;
        if !out.status.success() {
            return Err(SandboxError::Command {
                what: "patronictl switchover".into(),
                output: String::from_utf8_lossy(&out.stdout).into_owned()
                    + &String::from_utf8_lossy(&out.stderr),
            });
        }
        Ok(())
    }

    /// Changes one of Patroni's dynamic settings (`patronictl edit-config
    /// --set name=value`), as an operator would mid-run.
    pub fn edit_config(&self, setting: &str) -> Result<(), SandboxError> {
        let first = &self.members[0].name;
        let out = self
            .as_server(Command::new("patronictl"))
            .arg("-c")
            .arg(self.config_path(first))
            .args(["edit-config", "--force", "--set", setting])
            .output()
            .map_err(io("run patronictl edit-config"))?;
        if !out.status.success() {
            return Err(SandboxError::Command {
                what: format!("patronictl edit-config --set {setting}"),
                output: String::from_utf8_lossy(&out.stdout).into_owned()
                    + &String::from_utf8_lossy(&out.stderr),
            });
        }
        Ok(())
    }

    /// SIGKILLs the leader's postmaster and waits until Patroni started
    /// another (on that member: a restart) or another member leads (a
    /// failover); then [`PatroniCluster::wait_healthy`] tells when it is
    /// back. Returns the member whose postmaster was killed.
    pub fn kill_leader_postmaster(&self) -> Result<String, SandboxError> {
        let leader = self.leader().ok_or_else(|| SandboxError::Command {
            what: "kill the leader's postmaster".into(),
            output: "no member leads".into(),
        })?;
        let killed = self
            .postmaster_pid(&leader.name)
            .ok_or_else(|| SandboxError::Command {
                what: "read the leader's postmaster.pid".into(),
                output: self.log_tail(),
            })?;
        nix::sys::signal::kill(Pid::from_raw(killed), Signal::SIGKILL)
            .map_err(|e| io("kill the postmaster")(e.into()))?;
        let started = Instant::now();
        loop {
            let restarted = self.postmaster_pid(&leader.name).is_some_and(|pid| pid != killed);
            let moved = self.leader().is_some_and(|l| l.name != leader.name);
            if restarted || moved {
                return Ok(leader.name.clone());
            }
            if started.elapsed() > SETTLE_MAX {
                return Err(SandboxError::Command {
                    what: "Patroni recovering a killed postmaster".into(),
                    output: self.log_tail(),
                });
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// SIGKILLs the Patroni of member `name` alone: its Postgres runs on,
    /// still writable if it led (nothing demotes it), until Patroni is
    /// started again ([`PatroniCluster::restart_patroni`]).
    pub fn kill_patroni(&mut self, name: &str) -> Result<(), SandboxError> {
        let i = self.index(name)?;
        let child = &mut self.patronis[i];
        nix::sys::signal::kill(Pid::from_raw(child.id() as i32), Signal::SIGKILL)
            .map_err(|e| io("kill Patroni")(e.into()))?;
        let _ = child.wait();
        Ok(())
    }

    /// Stops member `name`'s HA loop (Patroni's main thread) with ptrace,
    /// its REST API's threads running on (they answer as the loop last
    /// left things), until the guard is dropped. Needs root.
    pub fn freeze_ha_loop(&self, name: &str) -> Result<FrozenLoop, SandboxError> {
        let pid = Pid::from_raw(self.patronis[self.index(name)?].id() as i32);
        let (frozen_tx, frozen_rx) = std::sync::mpsc::channel();
        let (release, released) = std::sync::mpsc::channel::<()>();
        // A ptrace tracer is a thread: this one holds the loop until told.
        let tracer = std::thread::spawn(move || {
            use nix::sys::ptrace;
            let frozen = ptrace::seize(pid, ptrace::Options::empty()).and_then(|()| ptrace::interrupt(pid));
            let ok = frozen.is_ok();
            let _ = frozen_tx.send(frozen);
            if ok {
                let _ = released.recv();
                // Fails only if the thread is not yet in its stop; the
                // tracer's exit detaches it then.
                let _ = ptrace::detach(pid, None);
            }
        });
        match frozen_rx.recv() {
            Ok(Ok(())) => Ok(FrozenLoop {
                release: Some(release),
                tracer: Some(tracer),
            }),
            Ok(Err(e)) => Err(io("ptrace Patroni's HA loop")(e.into())),
            Err(_) => Err(io("ptrace Patroni's HA loop")(std::io::ErrorKind::Other.into())),
        }
    }

    /// Starts member `name`'s Patroni again (after [`PatroniCluster::kill_patroni`]).
    pub fn restart_patroni(&mut self, name: &str) -> Result<(), SandboxError> {
        let i = self.index(name)?;
        let config = self.config_path(name);
        let log = format!("patroni-{name}-restarted");
        self.patronis[i] = spawn(
            self.user,
            self.root.path(),
            &log,
            Command::new("patroni").arg(config),
        )?;
        Ok(())
    }

    /// A URL of member `name` alone.
    pub fn member_url(&self, name: &str, dbname: &str) -> Result<String, SandboxError> {
        let m = &self.members[self.index(name)?];
        Ok(format!("postgres://postgres@127.0.0.1:{}/{dbname}", m.pg_port))
    }

    fn index(&self, name: &str) -> Result<usize, SandboxError> {
        self.members
            .iter()
            .position(|m| m.name == name)
            .ok_or_else(|| SandboxError::Command {
                what: "find a Patroni member".into(),
                output: format!("no member {name}"),
            })
    }

    /// The pid of a member's postmaster, from its `postmaster.pid`.
    fn postmaster_pid(&self, name: &str) -> Option<i32> {
        let text = std::fs::read_to_string(self.root.path().join(name).join("postmaster.pid")).ok()?;
        text.lines().next()?.trim().parse().ok()
    }

    /// The last lines of every member's log, for a failure message.
    pub fn log_tail(&self) -> String {
        self.members
            .iter()
            .map(|m| {
                let log = std::fs::read_to_string(self.root.path().join(format!("patroni-{}.log", m.name)))
                    .unwrap_or_default();
                let lines: Vec<&str> = log.lines().rev().take(5).collect();
                format!(
                    "{}: {}",
                    m.name,
                    lines.into_iter().rev().collect::<Vec<_>>().join(" | ")
                )
            })
            .collect::<Vec<_>>()
            .join("\n")
    }

    fn config_path(&self, name: &str) -> PathBuf {
        self.root.path().join(format!("{name}.yml"))
    }

    fn as_server(&self, mut cmd: Command) -> Command {
        if let Some((uid, gid)) = self.user {
            cmd.uid(uid.as_raw()).gid(gid.as_raw());
        }
        cmd
    }

    fn write_config(&self, m: &Member, announced: u16, etcd_port: u16) -> Result<PathBuf, SandboxError> {
        let root = self.root.path().display();
        let bin = bindir()?;
        // Short timings so that a failover fits a test: Patroni's smallest
        // TTL is 20 s; loop_wait 1 s acts on a switchover within a second.
        let yaml = format!(
            "scope: ticklease\nname: {name}\n\
             restapi:\n  listen: 127.0.0.1:{api}\n  connect_address: 127.0.0.1:{announced}\n\
             etcd3:\n  hosts: 127.0.0.1:{etcd_port}\n\
             bootstrap:\n  dcs:\n    ttl: 20\n    loop_wait: 1\n    retry_timeout: 5\n\
             \x20   maximum_lag_on_failover: 1048576\n    synchronous_mode: {synchronous}\n    postgresql:\n      use_pg_rewind: true\n\
             \x20     parameters:\n        wal_log_hints: 'on'\n        max_wal_senders: 10\n\
             \x20       max_replication_slots: 10\n        track_commit_timestamp: 'on'\n\
             \x20 initdb:\n  - encoding: UTF8\n  - auth: trust\n  - locale: C\n\
             \x20 pg_hba:\n  - local all all trust\n  - host all all 127.0.0.1/32 trust\n\
             \x20 - local replication all trust\n  - host replication all 127.0.0.1/32 trust\n\
             postgresql:\n  listen: 127.0.0.1:{pg}\n  connect_address: 127.0.0.1:{pg}\n\
             \x20 data_dir: {root}/{name}\n  bin_dir: {bin}\n  pgpass: {root}/{name}.pgpass\n\
             \x20 authentication:\n    superuser:\n      username: postgres\n\
             \x20   replication:\n      username: postgres\n\
             \x20 parameters:\n    unix_socket_directories: '{root}'\n",
            name = m.name,
            api = m.api_port,
            pg = m.pg_port,
            bin = bin.display(),
            synchronous = self.synchronous,
        );
        let path = self.config_path(&m.name);
        std::fs::write(&path, yaml).map_err(io("write a Patroni config"))?;
        if let Some((uid, gid)) = self.user {
            nix::unistd::chown(&path, Some(uid), Some(gid))
                .map_err(|e| io("chown a Patroni config")(e.into()))?;
        }
        Ok(path)
    }
}

/// A member's HA loop held by [`PatroniCluster::freeze_ha_loop`]; runs on when dropped.
#[derive(Debug)]
pub struct FrozenLoop {
    release: Option<std::sync::mpsc::Sender<()>>,
    tracer: Option<std::thread::JoinHandle<()>>,
}

impl Drop for FrozenLoop {
    fn drop(&mut self) {
        drop(self.release.take());
        if let Some(tracer) = self.tracer.take() {
            let _ = tracer.join();
        }
    }
}

impl Drop for PatroniCluster {
    fn drop(&mut self) {
        // Each process leads a group of its own: Patroni's Postgres with it.
        for child in self.patronis.iter_mut().chain(std::iter::once(&mut self.etcd)) {
            let _ = killpg(Pid::from_raw(child.id() as i32), Signal::SIGKILL);
            let _ = child.wait();
        }
        // A postmaster Patroni started outlives a killed Patroni: stop each.
        for m in &self.members {
            if let Some(pid) = self.postmaster_pid(&m.name) {
                let _ = nix::sys::signal::kill(Pid::from_raw(pid), Signal::SIGQUIT);
            }
        }
    }
}

fn etcd_args(root: &Path, client: u16, peer: u16) -> Vec<String> {
    let (client, peer) = (
        format!("http://127.0.0.1:{client}"),
        format!("http://127.0.0.1:{peer}"),
    );
    vec![
        "--name=e1".into(),
        format!("--data-dir={}/etcd", root.display()),
        format!("--listen-client-urls={client}"),
        format!("--advertise-client-urls={client}"),
        format!("--listen-peer-urls={peer}"),
        format!("--initial-advertise-peer-urls={peer}"),
        format!("--initial-cluster=e1={peer}"),
    ]
}

/// Spawns `cmd` as the server user in a process group of its own, its
/// output to `<root>/<log>.log`.
fn spawn(user: Option<(Uid, Gid)>, root: &Path, log: &str, cmd: &mut Command) -> Result<Child, SandboxError> {
    let file = std::fs::File::create(root.join(format!("{log}.log"))).map_err(io("create a log"))?;
    if let Some((uid, gid)) = user {
        cmd.uid(uid.as_raw()).gid(gid.as_raw());
        nix::unistd::chown(&root.join(format!("{log}.log")), Some(uid), Some(gid))
            .map_err(|e| io("chown a log")(e.into()))?;
    }
    cmd.process_group(0)
        .current_dir(root)
        .stdin(Stdio::null())
        .stdout(file.try_clone().map_err(io("dup a log"))?)
        .stderr(file)
        .spawn()
        .map_err(io(format!(
            "start {log} (install Debian's patroni and etcd-server)"
        )))
}

/// The status code of `GET path` on a local REST API, if it answered.
fn http_status(port: u16, path: &str) -> Option<u16> {
    use std::io::{Read, Write};
    let addr = std::net::SocketAddr::from(([127, 0, 0, 1], port));
    let mut s = std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(1)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(2))).ok()?;
    write!(s, "GET {path} HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n").ok()?;
    let mut head = [0u8; 12];
    s.read_exact(&mut head).ok()?;
    std::str::from_utf8(&head[9..12]).ok()?.parse().ok()
}
