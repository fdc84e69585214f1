//! The script's scenes: each one failure, narrated and checked.

use std::time::{Duration, Instant, SystemTime};

use anyhow::{bail, Context};

use nix::sys::signal::Signal;
use tokio_postgres::types::Type;

use ticklease_sandbox::signal;

use super::{demo_config, session_takeover_bound, takeover_bound, Check, Demo, OBSERVE};

/// What the drain waits for: work due or in flight in any of the five stores.
const PENDING: &str = "SELECT (SELECT count(*) FROM subscriptions WHERE next_billing_at <= now())
      + (SELECT count(*) FROM dunning_runs WHERE state = 'active')
      + (SELECT count(*) FROM webhook_events WHERE dispatched_at IS NULL)
      + (SELECT count(*) FROM webhook_deliveries WHERE status <> 'delivered')
      + (SELECT count(*) FROM email_outbox WHERE status <> 'sent')";

/// How long the drain may take on a busy laptop (two cores saturated
/// beside the demo): late past it.
const DRAIN_BOUND: Duration = Duration::from_secs(60);
/// When the drain is given up: what is still pending then counts as lost.
const DRAIN_GIVE_UP: Duration = Duration::from_secs(180);

/// Until when the pause is held (from the demo's start): the script's
/// `until`, four polls at least, and a poll past the paused term's `wait`.
pub(super) fn pause_hold(until: Duration, now: Duration, wait: Duration) -> Duration {
    let poll = demo_config().max_poll();
    until.max(now + poll * 4).max(now + wait + poll)
}

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
        let took = self.new_term(role, token, OBSERVE).await?;
        self.record(
            &format!("{role} taken over after SIGKILL (its coordination session ended with it)"),
            took,
            session_takeover_bound(),
        );
        self.respawn()
    }

    /// Holds a charge of `role` (on a cron schedule) so its leader is in the
    /// middle of an occurrence, SIGKILLs that leader, and checks that the
    /// next term takes the occurrence up and the held charge settles (the
    /// provider's idempotency key makes the repeated charge one charge). The
    /// scene makes the charge it holds: the hold is armed first, then a new
    /// subscription is billed and its invoice's dunning run charged (the
    /// seeded invoices may all be paid by now).
    pub(super) async fn sigkill_occurrence_leader(&mut self, role: &str) -> anyhow::Result<()> {
        let mut held = self.http.hold_next_charge();
        self.add_load(1).await?;
        self.say(format!(
            "a new invoice: hold its {role} charge at the payment provider"
        ));
        let Ok(key) = tokio::time::timeout(OBSERVE, held.received()).await else {
            self.checks.push(Check::Failed(format!(
                "no {role} charge within {} s of a new invoice",
                OBSERVE.as_secs()
            )));
            return Ok(());
        };
        let Some((i, token, occurrence)) = self.occurrence_holder(role).await? else {
            self.checks.push(Check::Failed(format!(
                "{role} held no term while its charge hung"
            )));
            return Ok(());
        };
        let at = humantime::format_rfc3339_seconds(occurrence).to_string();
        self.say(format!(
            "SIGKILL the {role} leader (r{}, term {token}) mid-occurrence {at}, its charge {key:?} unanswered",
            self.replicas[i].n
        ));
        let killed = Instant::now();
        let mut victim = self.replicas.swap_remove(i);
        signal(&victim.child, Signal::SIGKILL);
        let _ = victim.child.wait().await;
        drop(held);
        let took = self.new_term(role, token, OBSERVE).await?;
        self.record(
            &format!("{role} taken over mid-occurrence after SIGKILL"),
            took,
            session_takeover_bound(),
        );
        self.occurrence_outcome(role, occurrence, &at).await?;
        self.charge_settled(&key, killed).await?;
        self.respawn()
    }

    /// The replica holding `role` now, its term and its occurrence.
    async fn occurrence_holder(&mut self, role: &str) -> anyhow::Result<Option<(usize, i64, SystemTime)>> {
        let rows = self
            .db
            .query_typed(
                "SELECT holder_token, holder_id, occurrence FROM leader_leases WHERE role = $1 AND holder_id IS NOT NULL",
                &[(&role, Type::TEXT)],
            )
            .await?;
        let Some(r) = rows.first() else {
            return Ok(None);
        };
        let (token, holder, occurrence): (i64, String, SystemTime) = (r.get(0), r.get(1), r.get(2));
        let Some(i) = super::holder_pid(&holder)
            .and_then(|p| self.replicas.iter().position(|r| r.child.id() == Some(p)))
        else {
            bail!("{role}'s holder {holder:?} is not a demo replica");
        };
        Ok(Some((i, token, occurrence)))
    }

    /// Narrates which occurrence the next term ran: the killed one again
    /// (it must complete), or a later one when the takeover came after that
    /// was due (catch-up `Latest` skips the older; late, not wrong).
    async fn occurrence_outcome(
        &mut self,
        role: &str,
        occurrence: SystemTime,
        at: &str,
    ) -> anyhow::Result<()> {
        let line = match self.occurrence_completed(role, occurrence).await? {
            Some(true) => format!("the next {role} term ran occurrence {at} again: completed once"),
            None => {
                format!("the next {role} term ran a later occurrence (the takeover came after it was due)")
            }
            Some(false) => {
                let what = format!("{role} occurrence {at} completed by the next term");
                self.checks.push(Check::Failed(what.clone()));
                format!("{what}: NOT within {} s", OBSERVE.as_secs())
            }
        };
        self.say(line);
        Ok(())
    }

    /// Waits for the dunning run of the held charge `key` (`dunning-RUN-ATTEMPT`)
    /// to be paid: the next term charged again under the same key.
    async fn charge_settled(&mut self, key: &str, killed: Instant) -> anyhow::Result<()> {
        let run: i64 = key
            .split('-')
            .nth(1)
            .and_then(|r| r.parse().ok())
            .with_context(|| format!("a dunning key {key:?}"))?;
        let mut took = None;
        while killed.elapsed() < OBSERVE {
            let paid: i64 = self
                .db
                .query_typed(
                    "SELECT count(*) FROM dunning_runs WHERE id = $1 AND state = 'paid'",
                    &[(&run, Type::INT8)],
                )
                .await?[0]
                .get(0);
            if paid == 1 {
                took = Some(killed.elapsed());
                break;
            }
            self.tick().await?;
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        self.record(
            "the held charge settled once, under its idempotency key",
            took,
            session_takeover_bound() + Duration::from_secs(1),
        );
        Ok(())
    }

    /// Whether the term after the killed one ran `occurrence` (`None`: it ran
    /// another), and then whether it completed within a few seconds.
    async fn occurrence_completed(
        &mut self,
        role: &str,
        occurrence: SystemTime,
    ) -> anyhow::Result<Option<bool>> {
        let deadline = Instant::now() + OBSERVE;
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

    /// Pauses email_outbox until `until`, and past the paused term's lease:
    /// no term may start meanwhile; after the unpause it is led again within
    /// a poll. (The next term waits for the paused term's lease unless its
    /// holder releases it first; holding the pause past that wait keeps the
    /// unpause's bound a poll on any machine.)
    pub(super) async fn pause(&mut self, until: Duration) -> anyhow::Result<()> {
        let config = demo_config();
        self.say("pause email_outbox (leader_pause 'demo', 'SMTP key rotation')".into());
        let before = self.smtp.mails().len();
        self.db
            .batch_execute("SELECT leader_pause('email_outbox', 'demo', 'SMTP key rotation')")
            .await?;
        let wait = self.pause_wait("email_outbox").await?;
        self.say(if wait.is_zero() {
            "no wait for the paused term's lease (none was held, or its holder released it)".into()
        } else {
            format!(
                "the next term waits {} ms for the paused term's lease (less if its holder releases it): the pause is held past that",
                wait.as_millis()
            )
        });
        self.tick().await?;
        let paused_token = self.watch.view("email_outbox").token;
        self.add_load(3).await?;
        self.wait_until(pause_hold(until, self.started.elapsed(), wait))
            .await?;
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
        let took = self.new_term("email_outbox", paused_token, OBSERVE).await?;
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

    /// How long from now the next term of paused `role` waits for the paused term's lease.
    async fn pause_wait(&self, role: &str) -> anyhow::Result<Duration> {
        let ms: f64 = self
            .db
            .query_typed(
                "SELECT coalesce(extract(epoch FROM greatest(pause_wait_until - now(), interval '0')) * 1000, 0)::float8
                   FROM leader_leases WHERE role = $1",
                &[(&role, Type::TEXT)],
            )
            .await?[0]
            .get(0);
        Ok(Duration::from_secs_f64(ms / 1000.0))
    }

    /// SIGSTOPs the leader of `role` past its TTL; after the takeover it
    /// resumes with its term over.
    pub(super) async fn freeze_leader(&mut self, role: &str) -> anyhow::Result<()> {
        let (i, token) = self.freeze_holder(role).await?;
        self.say(format!(
            "SIGSTOP the {role} leader (r{}, term {token}) past its TTL",
            self.replicas[i].n
        ));
        let took = self.new_term(role, token, OBSERVE).await?;
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
        let (i, token) = self.leader_of(role, OBSERVE).await?;
        self.say(format!(
            "SIGTERM the {role} leader (r{}): a clean handover",
            self.replicas[i].n
        ));
        let mut leaving = self.replicas.swap_remove(i);
        signal(&leaving.child, Signal::SIGTERM);
        let took = self.new_term(role, token, OBSERVE).await?;
        self.record(
            &format!("{role} handed over after SIGTERM"),
            took,
            config.max_poll() + config.heartbeat_every() + Duration::from_secs(1),
        );
        let clean = tokio::time::timeout(OBSERVE, leaving.child.wait())
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

    /// No new load: waits for the outboxes to empty (checked against
    /// [`DRAIN_BOUND`], late past it; given up after [`DRAIN_GIVE_UP`]), and
    /// for 70% of `d`.
    pub(super) async fn drain(&mut self, d: Duration) -> anyhow::Result<()> {
        self.say("draining the load (no new work from here)".into());
        let from = Instant::now();
        let mut drained = None;
        while drained.is_none() || self.started.elapsed() < d.mul_f64(0.7) {
            self.tick().await?;
            if drained.is_none() {
                let pending: i64 = self.db.query_typed(PENDING, &[]).await?[0].get(0);
                if pending == 0 {
                    drained = Some(from.elapsed());
                } else if from.elapsed() > DRAIN_GIVE_UP {
                    self.say(format!(
                        "{pending} items still pending after {} s",
                        DRAIN_GIVE_UP.as_secs()
                    ));
                    break;
                }
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        self.record("the load drained after the last scene", drained, DRAIN_BOUND);
        Ok(())
    }

    /// SIGSTOPs the replica leading `role`, retrying until it is frozen while
    /// still holding its term (ticks are short); returns its index and term.
    async fn freeze_holder(&mut self, role: &str) -> anyhow::Result<(usize, i64)> {
        let within = OBSERVE;
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

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::pause_hold;

    #[test]
    fn the_pause_is_held_past_the_paused_terms_lease() {
        let s = Duration::from_secs;
        let ms = Duration::from_millis;
        // The script's time when it is the latest.
        assert_eq!(pause_hold(s(20), s(10), ms(2900)), s(20));
        // A poll past the paused term's lease (TTL 3 s) when that is later.
        assert_eq!(pause_hold(s(11), s(10), ms(2900)), ms(13_400));
        // Four polls at least when nothing else holds it.
        assert_eq!(pause_hold(s(5), s(10), Duration::ZERO), s(12));
    }
}
