//! What the demo watches in `leader_status`: per role the current view and
//! the terms seen.

use std::collections::BTreeMap;

use ticklease::HolderId;
use tokio_postgres::Client;

/// One observed row of leader_status.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RoleView {
    pub token: i64,
    pub pid: Option<u32>,
    pub paused: bool,
}

/// Ticks are short, so a term is counted by its token, not by catching it held.
#[derive(Debug, Default)]
pub struct Watch {
    pub views: BTreeMap<String, RoleView>,
    pub terms: BTreeMap<String, i64>,
    /// Terms seen led by another replica than the term before.
    pub takeovers: BTreeMap<String, i64>,
}

/// The process id in a holder id (`host:pid:nonce`).
pub fn holder_pid(holder: &str) -> Option<u32> {
    holder.parse::<HolderId>().ok().map(|h| h.pid())
}

impl Watch {
    pub async fn poll(&mut self, db: &Client) -> anyhow::Result<()> {
        let rows = db
            .query_typed(
                "SELECT role, holder_token, CASE WHEN held THEN holder_id ELSE last_tick_holder END,
                        paused_at IS NOT NULL
                   FROM leader_status",
                &[],
            )
            .await?;
        for r in rows {
            let role: String = r.get(0);
            let holder: Option<String> = r.get(2);
            let view = RoleView {
                token: r.get(1),
                pid: holder.as_deref().and_then(holder_pid),
                paused: r.get(3),
            };
            if let Some(old) = self.views.insert(role.clone(), view.clone()) {
                *self.terms.entry(role.clone()).or_default() += view.token - old.token;
                if view.token != old.token && old.pid.is_some() && view.pid.is_some() && old.pid != view.pid {
                    *self.takeovers.entry(role).or_default() += 1;
                }
            }
        }
        Ok(())
    }

    /// The view of `role`, or an empty one before the first poll saw it.
    pub fn view(&self, role: &str) -> RoleView {
        self.views.get(role).cloned().unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::holder_pid;

    #[test]
    fn the_pid_is_read_from_the_right_of_a_holder_id() {
        assert_eq!(holder_pid("web-1:4242:00c0ffee"), Some(4242));
        assert_eq!(holder_pid("not a holder"), None);
    }
}
