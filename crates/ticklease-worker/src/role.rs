//! The worker's five roles, as one type: its name, its claim funnel, and (in
//! its own module) its tick function.

use std::fmt;
use std::str::FromStr;

use ticklease::Role;

use crate::funnel::{Funnel, BILLING, DUNNING, EMAIL_OUTBOX, WEBHOOK_DELIVERY, WEBHOOK_OUTBOX};
use crate::WorkerError;

/// One of the spec's five singleton roles.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum WorkerRole {
    /// Closes due subscription periods into invoices.
    Billing,
    /// Charges due dunning runs through the payment provider.
    Dunning,
    /// Fans webhook events out to deliveries.
    WebhookOutbox,
    /// Sends the outbox's emails.
    EmailOutbox,
    /// POSTs webhook deliveries.
    WebhookDelivery,
}

impl WorkerRole {
    /// The five, in the spec's order.
    pub const ALL: [WorkerRole; 5] = [
        WorkerRole::Billing,
        WorkerRole::Dunning,
        WorkerRole::WebhookOutbox,
        WorkerRole::EmailOutbox,
        WorkerRole::WebhookDelivery,
    ];

    /// The role's name in `leader_leases`.
    pub const fn as_str(self) -> &'static str {
        match self {
            WorkerRole::Billing => "billing",
            WorkerRole::Dunning => "dunning",
            WorkerRole::WebhookOutbox => "webhook_outbox",
            WorkerRole::EmailOutbox => "email_outbox",
            WorkerRole::WebhookDelivery => "webhook_delivery",
        }
    }

    /// The library's role.
    pub fn role(self) -> Role {
        Role::new(self.as_str()).expect("the five names follow the role rule")
    }

    /// Its claim statement.
    pub fn funnel(self) -> &'static Funnel {
        match self {
            WorkerRole::Billing => &BILLING,
            WorkerRole::Dunning => &DUNNING,
            WorkerRole::WebhookOutbox => &WEBHOOK_OUTBOX,
            WorkerRole::EmailOutbox => &EMAIL_OUTBOX,
            WorkerRole::WebhookDelivery => &WEBHOOK_DELIVERY,
        }
    }
}

impl fmt::Display for WorkerRole {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for WorkerRole {
    type Err = WorkerError;

    fn from_str(name: &str) -> Result<Self, Self::Err> {
        WorkerRole::ALL
            .into_iter()
            .find(|r| r.as_str() == name)
            .ok_or_else(|| WorkerError::Invalid {
                what: format!("role {name:?}: not one of the worker's five"),
            })
    }
}

#[cfg(test)]
mod tests {
    use super::WorkerRole;

    #[test]
    fn each_role_names_its_own_funnel_and_parses_back() {
        for r in WorkerRole::ALL {
            assert_eq!(r.funnel().role, r.as_str());
            assert_eq!(r.as_str().parse::<WorkerRole>().unwrap(), r);
            assert_eq!(r.role().as_str(), r.as_str());
        }
        assert!("payroll".parse::<WorkerRole>().is_err());
    }
}
