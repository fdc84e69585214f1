//! Issue 42 item 1, as an operator runs it: `ticklease run` on a real Patroni
//! cluster whose primary's Patroni is killed and left dead (its Postgres
//! stays writable: nothing demotes it). Runner A's pooled URL is a PgBouncer
//! in front of that server, its direct URL names every member; runner B's
//! URL names every member. Both run one long-lived job with `--patroni`.
//! The children on this machine are counted every 20 ms from before the
//! first starts until both runners stopped: never two at once, and a child
//! runs again after the promotion.

use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use ticklease_testkit::{connect, PatroniCluster, PgBouncer, TEST_TIMING_FLAGS};

/// A child's command line: `sleep <this test's own number>`.
fn child_seconds() -> String {
    (80_000 + std::process::id() % 10_000).to_string()
}

/// How many processes run `sleep <seconds>` now.
fn children(seconds: &str) -> usize {
    let want = format!("sleep\0{seconds}\0");
    std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .flatten()
        .filter(|e| std::fs::read(e.path().join("cmdline")).is_ok_and(|c| c == want.as_bytes()))
        .count()
}

/// Counts the children every 20 ms: the most seen at once, and the last count.
struct Sampler {
    most: Arc<AtomicUsize>,
    now: Arc<AtomicUsize>,
    stop: Arc<AtomicBool>,
}

impl Sampler {
    fn start(seconds: String) -> Sampler {
        let (most, now, stop): (Arc<AtomicUsize>, Arc<AtomicUsize>, Arc<AtomicBool>) = Default::default();
        let (m, n, s) = (Arc::clone(&most), Arc::clone(&now), Arc::clone(&stop));
        std::thread::spawn(move || {
            while !s.load(Ordering::Relaxed) {
                let count = children(&seconds);
                n.store(count, Ordering::Relaxed);
                m.fetch_max(count, Ordering::Relaxed);
                std::thread::sleep(Duration::from_millis(20));
            }
        });
        Sampler { most, now, stop }
    }

    /// Waits until a child runs, within `bound`.
    fn wait_running(&self, bound: Duration, what: &str) {
        let started = Instant::now();
        while self.now.load(Ordering::Relaxed) == 0 {
            assert!(started.elapsed() < bound, "{what}: no child ran within {bound:?}");
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

fn runner(url: &str, extra: &[&str], patroni: Option<&str>, seconds: &str) -> Child {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_ticklease"));
    cmd.args(["run", "relay", "--database-url", url])
        .args(extra)
        .args(TEST_TIMING_FLAGS)
        .env_remove("DATABASE_URL")
        .env_remove("TICKLEASE_PATRONI")
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    if let Some(patroni) = patroni {
        cmd.args(["--patroni", patroni]);
    }
    cmd.args(["--", "sleep", seconds]).spawn().unwrap()
}

fn stop(mut child: Child) {
    let _ = nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(child.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    );
    let _ = child.wait();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_patronis_word_no_two_children_run_at_once_when_the_old_primary_stays_writable() {
    let mut cluster = tokio::task::spawn_blocking(PatroniCluster::start)
        .await
        .unwrap()
        .unwrap();
    let owner = connect(&cluster.url("postgres").parse().unwrap()).await.unwrap();
    owner.batch_execute("CREATE DATABASE app").await.unwrap();
    let url = cluster.url("app");
    ticklease::migrate(&mut connect(&url.parse().unwrap()).await.unwrap())
        .await
        .unwrap();
    let old = cluster.leader().unwrap().clone();
    let bouncer = PgBouncer::start_for_port(old.pg_port, 4).unwrap();
    let pooled = format!("postgres://postgres@127.0.0.1:{}/app", bouncer.port());
    let apis = cluster.api_urls().join(",");
    let seconds = child_seconds();

    let sampler = Sampler::start(seconds.clone());
    let a = runner(&pooled, &["--direct-url", &url], Some(&apis), &seconds);
    sampler.wait_running(Duration::from_secs(30), "before the fault");
    let b = runner(&url, &[], Some(&apis), &seconds);

    cluster.kill_patroni(&old.name).unwrap();
    let cluster = tokio::task::spawn_blocking(move || {
        let started = Instant::now();
        while cluster.leader().is_none_or(|m| m.name == old.name) {
            assert!(
                started.elapsed() < Duration::from_secs(90),
                "no member was promoted"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        cluster
    })
    .await
    .unwrap();
    // A child runs again on the promoted server: a lease, a probe and a poll.
    tokio::task::block_in_place(|| {
        sampler.wait_running(Duration::from_secs(20), "after the promotion");
        // Long enough for a runner still leading on the old primary to start a child.
        std::thread::sleep(Duration::from_secs(4));
    });
    stop(a);
    stop(b);
    sampler.stop.store(true, Ordering::Relaxed);
    let most = sampler.most.load(Ordering::Relaxed);
    assert_eq!(most, 1, "{most} children of one job ran at once");
    drop(cluster);
}
