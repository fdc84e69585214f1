//! The script's scenes: each one failure, narrated and checked.

use std::time::{Duration, Instant, SystemTime};

use anyhow::bail;

use nix::sys::signal::Signal;
use tokio_postgres::types::Type;

use ticklease_sandbox::signal;

use super::{demo_config, session_takeover_bound, takeover_bound, Check, Demo};

/// What the drain waits for: work due or in flight in any of the five stores.
const PENDING: &str = "SELECT (SELECT count(*) FROM subscriptions WHERE next_billing_at <= now())
      + (SELECT count(*) FROM dunning_runs WHERE state = 'active')
      + (SELECT count(*) FROM webhook_events WHERE dispatched_at IS NULL)
      + (SELECT count(*) FROM webhook_deliveries WHERE status <> 'delivered')
      + (SELECT count(*) FROM email_outbox WHERE status <> 'sent')";

impl Demo {
    /// SIGKILLs the leader of `role` while it holds its term; a replacement starts.
    pub(super) async fn sigkill_leader(&mut self, role: &str) -> anyhow::Result<()> {
        let (i, token) = self.freeze_holder(role).await?;
        self.say(format!(
            "SIGKILL the {role} leader (replica r{}, term {token})",
            self.replicas[i].n
        ));
        let mut victim = self.replicas.swap_remove(i);
        signal(&victim.child, Signal::SIGKILL);
        let _ = victim.child.wait().await;
        let took = self.new_term(role, token, takeover_bound() * 2).await?;
        self.record(
            &format!("{role} taken over after SIGKILL (its coordination session ended with it)"),
            took,
            session_takeover_bound(),
        );
        self.respawn()
    }

    /// Holds a charge of `role` (on a cron schedule) so its leader is in the
    /// middle of an occurrence, SIGKILLs that leader, and checks the next
    /// term runs the same occurrence and completes it: the occurrence is led
    /// to completion exactly once (the provider's idempotency key makes the
    /// repeated charge one charge).
    pub(super) async fn sigkill_occurrence_leader(&mut self, role: &str) -> anyhow::Result<()> {
        let mut held = self.http.hold_next_charge();
        let charge = tokio::time::timeout(Duration::from_secs(15), held.received()).await;
        let Ok(key) = charge else {
            self.checks
                .push(Check::Failed(format!("no {role} charge to hold within 15 s")));
            return Ok(());
        };
        let row = self
            .db
            .query_typed(
                "SELECT holder_token, holder_id, occurrence FROM leader_leases WHERE role = $1 AND holder_id IS NOT NULL",
                &[(&role, Type::TEXT)],
            )
            .await?;
        let Some((token, holder, occurrence)) = row.first().map(|r| {
            (
                r.get::<_, i64>(0),
                r.get::<_, String>(1),
                r.get::<_, SystemTime>(2),
            )
        }) else {
            self.checks.push(Check::Failed(format!(
                "{role} held no term while its charge hung"
            )));
            return Ok(());
        };
        let Some(i) = super::holder_pid(&holder)
            .and_then(|p| self.replicas.iter().position(|r| r.child.id() == Some(p)))
        else {
            bail!("{role}'s holder {holder:?} is not a demo replica");
        };
        let at = humantime::format_rfc3339_seconds(occurrence);
        self.say(format!(
            "SIGKILL the {role} leader (r{}, term {token}) mid-occurrence {at}, its charge {key:?} unanswered",
            self.replicas[i].n
        ));
        let mut victim = self.replicas.swap_remove(i);
        signal(&victim.child, Signal::SIGKILL);
        let _ = victim.child.wait().await;
        drop(held);
        let took = self.new_term(role, token, takeover_bound() * 2).await?;
        let completed = self.occurrence_completed(role, occurrence).await?;
        self.say(format!(
            "the next {role} term ran occurrence {at} again: {}",
            match completed {
                Some(true) => "completed once",
                Some(false) => "NOT completed",
                None => "another occurrence ran instead",
            }
        ));
        self.record(
            &format!("{role} occurrence completed once after SIGKILL of its leader"),
            took.filter(|_| completed == Some(true)),
            session_takeover_bound(),
        );
        self.respawn()
    }

    /// Whether the term after the killed one ran `occurrence` (`None`: it ran
    /// another), and then whether it completed within a few seconds.
    async fn occurrence_completed(
        &mut self,
        role: &str,
        occurrence: SystemTime,
    ) -> anyhow::Result<Option<bool>> {
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            let row = self
                .db
                .query_typed(
                    "SELECT occurrence, last_occurrence >= occurrence FROM leader_leases WHERE role = $1",
                    &[(&role, Type::TEXT)],
                )
                .await?;
            let (ran, done): (Option<SystemTime>, Option<bool>) = (row[0].get(0), row[0].get(1));
            if ran != Some(occurrence) {
                return Ok(None);
            }
            if done == Some(true) || Instant::now() > deadline {
                return Ok(Some(done == Some(true)));
            }
            self.tick().await?;
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Pauses email_outbox until `until` (a few polls at least): no term may
    /// start meanwhile; after the unpause it is led again within a poll.
    pub(super) async fn pause(&mut self, until: Duration) -> anyhow::Result<()> {
        let config = demo_config();
        self.say("pause email_outbox (leader_pause 'demo', 'SMTP key rotation')".into());
        let before = self.smtp.mails().len();
        self.db
            .batch_execute("SELECT leader_pause('email_outbox', 'demo', 'SMTP key rotation')")
            .await?;
        self.tick().await?;
        let paused_token = self.watch.view("email_outbox").token;
        self.add_load(3).await?;
        // Hold the pause for a few polls at least, however the script's clock stands.
        let hold = until.max(self.started.elapsed() + config.max_poll() * 4);
        self.wait_until(hold).await?;
        let during = self.smtp.mails().len() - before;
        let view = self.watch.view("email_outbox");
        // No term may start while paused; sends already in flight at the pause may still land.
        let paused_ok = view.paused && view.token == paused_token;
        self.say(format!(
            "while paused: no new email_outbox term ({paused_ok}); {during} emails landed (sent before the pause took hold)"
        ));
        self.db
            .batch_execute("SELECT leader_unpause('email_outbox')")
            .await?;
        let took = self
            .new_term("email_outbox", paused_token, takeover_bound() * 2)
            .await?;
        self.record(
            "email_outbox led again after unpause",
            took,
            config.max_poll() + Duration::from_secs(1),
        );
        if !paused_ok {
            self.checks.push(Check::Failed("no term while paused".into()));
        }
        Ok(())
    }

    /// SIGSTOPs the leader of `role` past its TTL; after the takeover it
    /// resumes with its term over.
    pub(super) async fn freeze_leader(&mut self, role: &str) -> anyhow::Result<()> {
        let (i, token) = self.freeze_holder(role).await?;
        self.say(format!(
            "SIGSTOP the {role} leader (r{}, term {token}) past its TTL",
            self.replicas[i].n
        ));
        let took = self.new_term(role, token, takeover_bound() * 2).await?;
        self.record(
            &format!("{role} taken over from a frozen leader"),
            took,
            takeover_bound(),
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
        signal(&self.replicas[i].child, Signal::SIGCONT);
        self.say(format!(
            "SIGCONT r{}: it resumes, its term is over, it claims nothing",
            self.replicas[i].n
        ));
        Ok(())
    }

    /// SIGTERMs the leader of `role`: it releases, the next replica leads
    /// within a poll and a beat, and it exits 0.
    pub(super) async fn sigterm_leader(&mut self, role: &str) -> anyhow::Result<()> {
        let config = demo_config();
        let (i, token) = self.leader_of(role, config.lease_ttl() * 3).await?;
        self.say(format!(
            "SIGTERM the {role} leader (r{}): a clean handover",
            self.replicas[i].n
        ));
        let mut leaving = self.replicas.swap_remove(i);
        signal(&leaving.child, Signal::SIGTERM);
        let took = self.new_term(role, token, takeover_bound() * 2).await?;
        self.record(
            &format!("{role} handed over after SIGTERM"),
            took,
            config.max_poll() + config.heartbeat_every() + Duration::from_secs(1),
        );
        let clean = tokio::time::timeout(config.lease_ttl(), leaving.child.wait())
            .await
            .ok()
            .and_then(|s| s.ok())
            .and_then(|s| s.code());
        if clean != Some(0) {
            self.checks
                .push(Check::Failed(format!("SIGTERM exit code {clean:?}")));
        }
        self.respawn()
    }

    /// No new load: waits for the outboxes to empty, and for 70% of `d`.
    pub(super) async fn drain(&mut self, d: Duration) -> anyhow::Result<()> {
        self.say("draining the load".into());
        let deadline = self.started + d.max(Duration::from_secs(20)) + Duration::from_secs(30);
        loop {
            self.tick().await?;
            let pending: i64 = self.db.query_typed(PENDING, &[]).await?[0].get(0);
            if pending == 0 && self.started.elapsed() >= d.mul_f64(0.7) {
                return Ok(());
            }
            if Instant::now() > deadline {
                self.checks
                    .push(Check::Failed(format!("{pending} items still pending at the end")));
                return Ok(());
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// SIGSTOPs the replica leading `role`, retrying until it is frozen while
    /// still holding its term (ticks are short); returns its index and term.
    async fn freeze_holder(&mut self, role: &str) -> anyhow::Result<(usize, i64)> {
        let within = demo_config().lease_ttl() * 3;
        loop {
            let (i, token) = self.leader_of(role, within).await?;
            signal(&self.replicas[i].child, Signal::SIGSTOP);
            // A RELEASE already on the wire still lands: look once it would have.
            tokio::time::sleep(Duration::from_millis(100)).await;
            let held: i64 = self
                .db
                .query_typed(
                    "SELECT count(*) FROM leader_status WHERE role = $1 AND held AND holder_token = $2",
                    &[(&role, Type::TEXT), (&token, Type::INT8)],
                )
                .await?[0]
                .get(0);
            if held == 1 {
                return Ok((i, token));
            }
            signal(&self.replicas[i].child, Signal::SIGCONT);
        }
    }
}
