//! The batcher: one RENEW statement and one RELEASE statement for all the
//! family terms of a replica that beat or end together. A term's heartbeat
//! still decides everything about its own term (its abandon instant, its
//! missed beats); the batcher only carries its RENEW in a shared statement.
//! Family heartbeats beat on one grid (see [`align_down`]), so their RENEWs
//! arrive together and leave as one statement per beat.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{mpsc, oneshot, Semaphore};
use tokio::time::Instant;

use crate::error::StoreError;
use crate::store::{LeaseStore, Releasing, Renew, BATCH_MAX};
use crate::term::role::Role;
use crate::term::token::Token;

/// How long the batcher waits after a first request for the others of the
/// same beat (their timers fire at one instant but run one after another).
const GATHER: Duration = Duration::from_millis(2);

/// Requests queued at most; a caller beyond waits for room, within its own timeout.
const QUEUE_MAX: usize = 4 * BATCH_MAX;

/// Batched statements in flight at most: one that hangs does not hold up
/// the next beat's, and a stuck database gets no pile of them.
const IN_FLIGHT_MAX: usize = 4;

enum Request {
    Renew {
        role: Role,
        token: Token,
        reply: oneshot::Sender<Result<Renew, StoreError>>,
    },
    Release {
        term: Releasing,
        reply: oneshot::Sender<Result<bool, StoreError>>,
    },
}

/// The handle terms send their RENEWs and RELEASEs through. Cheap to clone;
/// its task ends when the last clone is dropped.
#[derive(Clone)]
pub(crate) struct Batcher {
    requests: mpsc::Sender<Request>,
}

impl Batcher {
    /// Starts the batcher's task; every statement is bounded by `statement_timeout`.
    pub(crate) fn start<S: LeaseStore>(
        store: Arc<S>,
        lease_ttl: Duration,
        statement_timeout: Duration,
    ) -> Self {
        let (requests, queue) = mpsc::channel(QUEUE_MAX);
        tokio::spawn(run(store, lease_ttl, statement_timeout, queue));
        Batcher { requests }
    }

    /// RENEW of `(role, token)`, in the next batch.
    pub(crate) async fn renew(&self, role: &Role, token: Token) -> Result<Renew, StoreError> {
        let (reply, answer) = oneshot::channel();
        self.send(
            "RENEW many",
            Request::Renew {
                role: role.clone(),
                token,
                reply,
            },
            answer,
        )
        .await
    }

    /// RELEASE of one term, in the next batch.
    pub(crate) async fn release(&self, term: Releasing) -> Result<bool, StoreError> {
        let (reply, answer) = oneshot::channel();
        self.send("RELEASE many", Request::Release { term, reply }, answer)
            .await
    }

    async fn send<T>(
        &self,
        statement: &'static str,
        request: Request,
        answer: oneshot::Receiver<Result<T, StoreError>>,
    ) -> Result<T, StoreError> {
        let stopped = || StoreError::Rejected {
            statement,
            problem: "the batcher stopped",
        };
        self.requests.send(request).await.map_err(|_| stopped())?;
        answer.await.map_err(|_| stopped())?
    }
}

/// `at` moved back onto the grid of `step` from `epoch` (unchanged before
/// the epoch). Beating early never shortens a term, and every family term of
/// a replica then beats at the same instants.
pub(crate) fn align_down(at: Instant, epoch: Instant, step: Duration) -> Instant {
    if at <= epoch || step.is_zero() {
        return at;
    }
    let step = step.as_nanos();
    let nanos = (at - epoch).as_nanos() / step * step;
    epoch + Duration::from_nanos(u64::try_from(nanos).unwrap_or(u64::MAX))
}

async fn run<S: LeaseStore>(
    store: Arc<S>,
    lease_ttl: Duration,
    statement_timeout: Duration,
    mut queue: mpsc::Receiver<Request>,
) {
    let in_flight = Arc::new(Semaphore::new(IN_FLIGHT_MAX));
    while let Some(first) = queue.recv().await {
        tokio::time::sleep(GATHER).await;
        let mut renews = Vec::new();
        let mut releases = Vec::new();
        let mut next = Some(first);
        while let Some(request) = next.take().or_else(|| queue.try_recv().ok()) {
            match request {
                // Its heartbeat gave up waiting: renewing now would only delay a takeover.
                Request::Renew { reply, .. } if reply.is_closed() => {}
                Request::Renew { role, token, reply } => renews.push(((role, token), reply)),
                Request::Release { term, reply } => releases.push((term, reply)),
            }
        }
        while !renews.is_empty() {
            let batch: Vec<_> = renews.drain(..renews.len().min(BATCH_MAX)).collect();
            let (terms, replies): (Vec<_>, Vec<_>) = batch.into_iter().unzip();
            let permit = in_flight.clone().acquire_owned().await.expect("never closed");
            let store = store.clone();
            tokio::spawn(async move {
                let answer =
                    tokio::time::timeout(statement_timeout, store.renew_many(&terms, lease_ttl)).await;
                answer_each("RENEW many", statement_timeout, answer, replies);
                drop(permit);
            });
        }
        while !releases.is_empty() {
            let batch: Vec<_> = releases.drain(..releases.len().min(BATCH_MAX)).collect();
            let (terms, replies): (Vec<_>, Vec<_>) = batch.into_iter().unzip();
            let permit = in_flight.clone().acquire_owned().await.expect("never closed");
            let store = store.clone();
            tokio::spawn(async move {
                let answer = tokio::time::timeout(statement_timeout, store.release_many(&terms)).await;
                if let Ok(Err(error)) = &answer {
                    // One bad term must not cost the others their RELEASE
                    // (an unstamped completion would run again early).
                    if error.is_outage() {
                        tracing::debug!(error = %crate::error::chain(error), terms = terms.len(),
                            "RELEASE many failed; releasing its terms one by one");
                    } else {
                        tracing::warn!(error = %crate::error::chain(error), terms = terms.len(),
                            "RELEASE many failed; releasing its terms one by one");
                    }
                    release_each(&*store, statement_timeout, terms, replies).await;
                } else {
                    answer_each("RELEASE many", statement_timeout, answer, replies);
                }
                drop(permit);
            });
        }
    }
}

/// RELEASE of each term alone, after its batch failed.
async fn release_each<S: LeaseStore>(
    store: &S,
    statement_timeout: Duration,
    terms: Vec<Releasing>,
    replies: Vec<oneshot::Sender<Result<bool, StoreError>>>,
) {
    let each = terms.iter().map(|t| {
        tokio::time::timeout(
            statement_timeout,
            store.release_ending(&t.role, t.token, t.outcome, t.interval, &t.ending),
        )
    });
    let answers = futures::future::join_all(each).await;
    for (reply, answer) in replies.into_iter().zip(answers) {
        let _ = reply.send(answer.unwrap_or(Err(StoreError::Timeout {
            statement: "RELEASE",
            after: statement_timeout,
        })));
    }
}

/// Hands each term its own answer, or the batch's failure.
fn answer_each<T>(
    statement: &'static str,
    after: Duration,
    answer: Result<Result<Vec<T>, StoreError>, tokio::time::error::Elapsed>,
    replies: Vec<oneshot::Sender<Result<T, StoreError>>>,
) {
    match answer {
        Ok(Ok(answers)) => {
            for (reply, answer) in replies.into_iter().zip(answers) {
                let _ = reply.send(Ok(answer));
            }
        }
        Ok(Err(error)) => {
            let error = Arc::new(error);
            for reply in replies {
                let _ = reply.send(Err(StoreError::Batch {
                    statement,
                    source: error.clone(),
                }));
            }
        }
        Err(_) => {
            for reply in replies {
                let _ = reply.send(Err(StoreError::Timeout { statement, after }));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn align_down_moves_an_instant_back_onto_the_grid_never_forward() {
        let epoch = Instant::now();
        let step = Duration::from_secs(3);
        let at = epoch + Duration::from_millis(7_500);
        assert_eq!(align_down(at, epoch, step), epoch + Duration::from_secs(6));
        assert_eq!(align_down(epoch + step, epoch, step), epoch + step);
        assert_eq!(align_down(epoch, epoch, step), epoch);
    }
}
