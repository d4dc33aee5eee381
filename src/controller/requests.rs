//! Requests a step makes to kcp or PostgreSQL (create a workspace, read kcp's schemas, delete a
//! Lease, create a database) run beside the reconcile, so that no step waits for an answer.
//!
//! A step asks ([`Requests::ask`]); an answer within [`QUICK_ANSWER`] is taken up by that same
//! step. A slower one is left running: the step returns, looks see it under way
//! ([`Requests::waiting`], planned as `Wait (Answer)`, while a slot that dies is still acted on),
//! its answer wakes the controller, and the step planned again takes it up without asking again.
//! A shard has at most one request under way: asking another (a step of another kind, or the same
//! of something else) drops the earlier one. An answer nobody took up within [`ANSWER_KEPT`] is
//! asked again, and a serve that restarts asks again what it had asked. A request not answered
//! within [`ANSWER_WITHIN`] fails the step.
use std::any::Any;
use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::future::BoxFuture;
use tokio::task::AbortHandle;
use tokio::time::Instant;

use super::error::Error;
use super::plan::Step;

/// How long a step waits for an answer before it returns and leaves the request running: most
/// answers of an idle kcp or PostgreSQL come within it, and take no second look.
pub const QUICK_ANSWER: Duration = Duration::from_millis(50);
/// An answer older than this is stale (kcp's schemas may have changed since): asked again.
pub const ANSWER_KEPT: Duration = Duration::from_secs(10);
/// A request not answered within this fails the step (which asks again at its next try): a kcp
/// that hangs is told in status, not waited for until the client's own timeout.
pub const ANSWER_WITHIN: Duration = Duration::from_secs(30);

type Answer = Result<Box<dyn Any + Send>, Error>;

/// What a step asked, under way or answered.
struct Asked {
    /// The step as planned when it asked: planned again first once the answer is in.
    step: Step,
    /// What the request is about (the slot or database it goes to): the same step about something
    /// else asks anew.
    about: String,
    shared: Arc<Mutex<Shared>>,
    task: AbortHandle,
}

/// What the request's task and the steps share.
#[derive(Default)]
struct Shared {
    /// When it was answered, and the answer.
    answer: Option<(Instant, Answer)>,
    /// The step returned without the answer: the task wakes the controller when it comes.
    parked: bool,
}

/// The requests under way, per shard.
#[derive(Default)]
pub struct Requests {
    asked: Mutex<HashMap<String, Asked>>,
}

impl Requests {
    /// The answer to step `step`'s request about `about` for `shard`: `request`'s output when it
    /// answers within [`QUICK_ANSWER`] or had answered since an earlier ask, None while it runs
    /// (`wake` is called once it answers). Only the first ask of a request runs `request`.
    ///
    /// `request` goes to the heap at once: a step's future does not carry it (a request's future
    /// is kilobytes in a debug build, and a reconcile's stack is a worker thread's).
    pub fn ask<'r, T, F, W>(
        &'r self,
        shard: &str,
        step: &Step,
        about: &str,
        wake: W,
        request: F,
    ) -> impl Future<Output = Result<Option<T>, Error>> + Send + use<'r, T, F, W>
    where
        W: FnOnce() + Send + 'static,
        T: Send + 'static,
        F: Future<Output = Result<T, Error>> + Send + 'static,
    {
        let step = step.clone();
        let unanswered = Error::Unanswered {
            step: step.name(),
            about: about.to_string(),
            seconds: ANSWER_WITHIN.as_secs(),
        };
        let request: BoxFuture<'static, Answer> = Box::pin(async move {
            match tokio::time::timeout(ANSWER_WITHIN, request).await {
                Ok(answer) => answer.map(|value| Box::new(value) as Box<dyn Any + Send>),
                Err(_) => Err(unanswered),
            }
        });
        let (shard, about) = (shard.to_string(), about.to_string());
        async move {
            let answer = self.ask_boxed(&shard, &step, &about, Box::new(wake), request).await;
            answer
                .map(|answer| answer.map(|value| *value.downcast::<T>().expect("a step asks for the type it takes up")))
        }
    }

    async fn ask_boxed(
        &self,
        shard: &str,
        step: &Step,
        about: &str,
        wake: Box<dyn FnOnce() + Send>,
        request: BoxFuture<'static, Answer>,
    ) -> Result<Option<Box<dyn Any + Send>>, Error> {
        if let Some(asked) = self.take_same(shard, step, about) {
            let answer = lock(&asked.shared).answer.take();
            match answer {
                Some((at, answer)) if at.elapsed() < ANSWER_KEPT => return answer.map(Some),
                None if !asked.task.is_finished() => {
                    self.put(shard, asked);
                    return Ok(None);
                }
                // Stale, or its task ended without an answer (it panicked): asked anew.
                _ => {}
            }
        }
        let shared = Arc::new(Mutex::new(Shared::default()));
        let mut task = tokio::spawn({
            let shared = shared.clone();
            async move {
                let answer = request.await;
                let mut shared = lock(&shared);
                shared.answer = Some((Instant::now(), answer));
                if shared.parked {
                    drop(shared);
                    wake();
                }
            }
        });
        let _ = tokio::time::timeout(QUICK_ANSWER, &mut task).await;
        let mut answered = lock(&shared);
        if let Some((_, answer)) = answered.answer.take() {
            return answer.map(Some);
        }
        answered.parked = true;
        drop(answered);
        tracing::debug!(
            step = step.name(),
            about,
            "no answer yet: the step returns, its answer wakes the shard"
        );
        self.put(
            shard,
            Asked {
                step: step.clone(),
                about: about.to_string(),
                shared,
                task: task.abort_handle(),
            },
        );
        Ok(None)
    }

    /// The step whose request for `shard` is under way, unanswered.
    pub fn waiting(&self, shard: &str) -> Option<&'static str> {
        let asked = self.asked.lock().unwrap_or_else(|p| p.into_inner());
        let asked = asked.get(shard)?;
        (lock(&asked.shared).answer.is_none() && !asked.task.is_finished()).then_some(asked.step.name())
    }

    /// The step whose request for `shard` was answered and not taken up yet (within
    /// [`ANSWER_KEPT`]): the plan takes it first, since its request may have changed what the
    /// plan sees (a deleted Lease), and the step would then not be planned again to record it.
    pub fn answered(&self, shard: &str) -> Option<Step> {
        let asked = self.asked.lock().unwrap_or_else(|p| p.into_inner());
        let asked = asked.get(shard)?;
        let shared = lock(&asked.shared);
        let (at, _) = shared.answer.as_ref()?;
        (at.elapsed() < ANSWER_KEPT).then(|| asked.step.clone())
    }

    /// `step` failed for `shard` without taking its request's answer up (it failed before it
    /// asked: the slot it asks through is gone): the answer is dropped, so that the plan does
    /// not take that step first again and again until the answer is stale.
    pub fn step_failed(&self, shard: &str, step: &Step) {
        let mut asked = self.asked.lock().unwrap_or_else(|p| p.into_inner());
        let answered = asked
            .get(shard)
            .is_some_and(|a| a.step == *step && lock(&a.shared).answer.is_some());
        if answered {
            asked.remove(shard);
        }
    }

    /// Drops `shard`'s request, under way or answered (the shard is gone).
    pub fn forget(&self, shard: &str) {
        if let Some(asked) = self.asked.lock().unwrap_or_else(|p| p.into_inner()).remove(shard) {
            asked.task.abort();
        }
    }

    /// Takes `shard`'s request out if it is `step`'s about `about`; drops (and stops) any other.
    fn take_same(&self, shard: &str, step: &Step, about: &str) -> Option<Asked> {
        let asked = self.asked.lock().unwrap_or_else(|p| p.into_inner()).remove(shard)?;
        if asked.step.name() == step.name() && asked.about == about {
            return Some(asked);
        }
        asked.task.abort();
        None
    }

    fn put(&self, shard: &str, asked: Asked) {
        if let Some(earlier) = self
            .asked
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(shard.to_string(), asked)
        {
            earlier.task.abort();
        }
    }
}

fn lock(shared: &Mutex<Shared>) -> std::sync::MutexGuard<'_, Shared> {
    shared.lock().unwrap_or_else(|p| p.into_inner())
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};

    use super::*;

    /// Requests, counting how often a shard was woken and how many requests were made.
    #[derive(Default)]
    struct Fixture {
        requests: Requests,
        woken: Arc<AtomicUsize>,
        asked: Arc<AtomicUsize>,
    }

    impl Fixture {
        /// Step Probe of `shard` asks about `about`; the answer, `value`, comes after `delay`.
        async fn probe(&self, shard: &str, about: &str, delay: Duration, value: u32) -> Option<u32> {
            let (woken, asked) = (self.woken.clone(), self.asked.clone());
            let wake = move || {
                woken.fetch_add(1, SeqCst);
            };
            let request = async move {
                asked.fetch_add(1, SeqCst);
                tokio::time::sleep(delay).await;
                Ok(value)
            };
            self.requests
                .ask(shard, &Step::Probe, about, wake, request)
                .await
                .unwrap()
        }

        fn woken(&self) -> usize {
            self.woken.load(SeqCst)
        }

        fn asked(&self) -> usize {
            self.asked.load(SeqCst)
        }
    }

    const SLOW: Duration = Duration::from_secs(2);

    #[tokio::test(start_paused = true)]
    async fn a_quick_answer_is_taken_up_by_the_step_that_asked_and_wakes_nobody() {
        let f = Fixture::default();
        assert_eq!(f.probe("dev", "a", Duration::from_millis(10), 7).await, Some(7));
        assert_eq!(f.requests.waiting("dev"), None);
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert_eq!(f.woken(), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn a_slow_answer_returns_at_once_wakes_the_shard_and_is_taken_up_without_asking_again() {
        let f = Fixture::default();
        let begun = Instant::now();
        assert_eq!(f.probe("dev", "a", SLOW, 7).await, None);
        assert_eq!(begun.elapsed(), QUICK_ANSWER, "the step waited past its quick answer");
        assert_eq!(f.requests.waiting("dev"), Some("Probe"));
        // Asked again while it runs: no second request, still no answer.
        assert_eq!(f.probe("dev", "a", Duration::ZERO, 8).await, None);
        tokio::time::sleep(SLOW).await;
        assert_eq!(f.woken(), 1, "the answer did not wake the shard");
        assert_eq!(f.requests.waiting("dev"), None);
        assert_eq!(
            f.requests.answered("dev"),
            Some(Step::Probe),
            "the plan does not see the answer"
        );
        assert_eq!(f.probe("dev", "a", Duration::ZERO, 9).await, Some(7));
        assert_eq!(f.requests.answered("dev"), None, "an answer taken up is still offered");
        assert_eq!(f.asked(), 1, "the request was made more than once");
    }

    #[tokio::test(start_paused = true)]
    async fn another_request_drops_the_one_under_way_and_a_stale_answer_is_asked_again() {
        let f = Fixture::default();
        assert_eq!(f.probe("dev", "a", SLOW, 1).await, None);
        // The same step about another slot: the first request is dropped, never answers.
        assert_eq!(f.probe("dev", "b", SLOW, 2).await, None);
        tokio::time::sleep(SLOW).await;
        assert_eq!(f.woken(), 1, "the dropped request still woke the shard");
        tokio::time::sleep(ANSWER_KEPT).await;
        assert_eq!(f.requests.answered("dev"), None, "a stale answer is still offered");
        assert_eq!(
            f.probe("dev", "b", Duration::ZERO, 3).await,
            Some(3),
            "an answer older than {ANSWER_KEPT:?} was taken up"
        );
        // Other shards have requests of their own.
        assert_eq!(f.probe("other", "b", SLOW, 4).await, None);
        assert_eq!(f.requests.waiting("dev"), None);
        assert_eq!(f.requests.waiting("other"), Some("Probe"));
        f.requests.forget("other");
        assert_eq!(f.requests.waiting("other"), None);
    }

    #[tokio::test(start_paused = true)]
    async fn an_answer_whose_step_failed_before_taking_it_up_is_not_offered_again() {
        let f = Fixture::default();
        assert_eq!(f.probe("dev", "a", SLOW, 7).await, None);
        // Another step failing, or Probe failing while its request runs, keeps it.
        f.requests.step_failed(
            "dev",
            &Step::ReleaseLease {
                holder: None,
                to: "a".into(),
            },
        );
        f.requests.step_failed("dev", &Step::Probe);
        assert_eq!(f.requests.waiting("dev"), Some("Probe"));
        tokio::time::sleep(SLOW).await;
        f.requests.step_failed(
            "dev",
            &Step::ReleaseLease {
                holder: None,
                to: "a".into(),
            },
        );
        assert_eq!(f.requests.answered("dev"), Some(Step::Probe));
        f.requests.step_failed("dev", &Step::Probe);
        assert_eq!(
            f.requests.answered("dev"),
            None,
            "the plan would take Probe first again"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_request_not_answered_in_time_fails_the_step() {
        let f = Fixture::default();
        assert_eq!(f.probe("dev", "a", Duration::from_secs(3600), 1).await, None);
        tokio::time::sleep(ANSWER_WITHIN).await;
        assert_eq!(f.woken(), 1, "the timeout did not wake the shard");
        let failed = f
            .requests
            .ask("dev", &Step::Probe, "a", || {}, async { Ok(2u32) })
            .await;
        assert!(
            matches!(&failed, Err(e @ Error::Unanswered { step: "Probe", .. }) if e.to_string().contains("30 s")),
            "{failed:?}"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_failed_request_is_the_steps_error_once_and_then_asked_again() {
        let requests = Requests::default();
        let failing = async {
            tokio::time::sleep(Duration::from_secs(1)).await;
            Err::<u32, _>(Error::NoAdoption)
        };
        assert!(
            requests
                .ask("dev", &Step::Probe, "a", || {}, failing)
                .await
                .unwrap()
                .is_none()
        );
        tokio::time::sleep(Duration::from_secs(1)).await;
        let failed = requests.ask("dev", &Step::Probe, "a", || {}, async { Ok(1u32) }).await;
        assert!(matches!(failed, Err(Error::NoAdoption)), "{failed:?}");
        let retried = requests.ask("dev", &Step::Probe, "a", || {}, async { Ok(2u32) }).await;
        assert_eq!(retried.unwrap(), Some(2));
    }
}
