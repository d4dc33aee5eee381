//! A `/readyz` poller through the front: what a client sees during a roll or a fault.
use super::*;

#[derive(Debug, Default, Clone)]
pub struct PollStats {
    pub polls: u64,
    pub failures: Vec<(DateTime<Utc>, String)>,
    /// When each poll that succeeded was sent.
    pub succeeded: Vec<DateTime<Utc>>,
    /// Kept-alive polls asked again because their pooled connection closed before an answer (see
    /// [`Poller::kept_alive`]); not failures.
    pub retried: u64,
    /// Polls asked again after an answer with `Retry-After` (see [`Poller::get_like_client_go`]);
    /// not failures.
    pub retried_after: u64,
    /// The longest a poll took: while the store is down a request hangs before it fails, and a
    /// user waits that long.
    pub slowest: Duration,
    /// Polls that failed or took over a second: (when each was sent, when it ended).
    pub disrupted: Vec<(DateTime<Utc>, DateTime<Utc>)>,
}

impl PollStats {
    /// Failures whose connection was refused (nothing accepted it), as opposed to ones cut or
    /// answered with an error.
    pub fn refused(&self) -> usize {
        self.failures
            .iter()
            .filter(|(_, e)| e.to_lowercase().contains("connection refused"))
            .count()
    }

    /// Polls sent in `[from, to]` that succeeded.
    pub fn succeeded_between(&self, from: DateTime<Utc>, to: DateTime<Utc>) -> usize {
        self.succeeded.iter().filter(|t| (from..=to).contains(*t)).count()
    }
}

/// What a poller asks.
#[derive(Clone)]
enum Poll {
    /// `/readyz` on a new connection.
    Readyz,
    /// `GET path` on a new connection.
    Get(String),
    /// `GET path` on a new connection, asked again when the answer says when (as client-go does).
    GetLikeClientGo(String),
    /// `GET path` on one client's kept-alive connection (`/readyz`: answered `ok`).
    KeptAlive(String),
}

/// Polls through the front: each poll on a new connection (as `curl` does), `/readyz` every 50 ms
/// (or as given) or an authenticated GET from two clients every 25 ms each ([`Poller::get`]); or
/// `/readyz` on a kept-alive connection ([`Poller::kept_alive`]).
pub struct Poller {
    stop: Arc<AtomicBool>,
    tasks: Vec<tokio::task::JoinHandle<PollStats>>,
}

/// How often a kept-alive poll is asked again after its pooled connection closed before an answer.
const POOL_RETRIES: u64 = 4;

impl Poller {
    pub fn start(config: Config) -> Poller {
        Poller::run(config, Poll::Readyz, Duration::from_millis(50), 1)
    }

    /// `/readyz` every `every`.
    pub fn start_every(config: Config, every: Duration) -> Poller {
        Poller::run(config, Poll::Readyz, every, 1)
    }

    /// `GET path` as whoever `config` is, answered 200 (a 401 or 403 is a refused identity).
    pub fn get(config: Config, path: &str) -> Poller {
        Poller::run(config, Poll::Get(path.to_string()), Duration::from_millis(25), 2)
    }

    /// `GET path` as whoever `config` is, from one client every `every`, asked as client-go asks
    /// it: an answer that says when to ask again (a 429 or 500-and-up with `Retry-After`, such as kcp's
    /// own 503 "apiserver is shutting down" to a request that crossed its GOAWAY) is asked again
    /// after that delay, up to 10 times. Those retries are counted apart, in `retried_after`;
    /// every other answer but 200 is a failure.
    pub fn get_like_client_go(config: Config, path: &str, every: Duration) -> Poller {
        Poller::run(config, Poll::GetLikeClientGo(path.to_string()), every, 1)
    }

    /// `/readyz` every `every` from one client that keeps its connection alive between polls, as
    /// client-go does. When the kept-alive connection turns out closed or reset before any answer
    /// (the front closes one to a slot that left its serving set at its next request; a killed
    /// slot's close races the next request), the poll is asked again at once on a new connection,
    /// as Go's net/http transport does for an idempotent request on a reused connection; an answer
    /// that says when to ask again (kcp's 503 "apiserver is shutting down" with `Retry-After: 1`
    /// to a request that reached it after SIGTERM) is asked again then, as client-go does. Such
    /// retries are counted apart (`retried`, `retried_after`), only the last outcome is the
    /// poll's.
    pub fn kept_alive(config: Config, every: Duration) -> Poller {
        Poller::run(config, Poll::KeptAlive("/readyz".into()), every, 1)
    }

    /// As [`Poller::kept_alive`], `GET path` answered 200: an API request, which a kcp that is
    /// stopping still answers (its `/readyz` then says it is not ready, by design).
    pub fn kept_alive_get(config: Config, path: &str, every: Duration) -> Poller {
        Poller::run(config, Poll::KeptAlive(path.to_string()), every, 1)
    }

    fn run(config: Config, poll: Poll, every: Duration, clients: usize) -> Poller {
        let stop = Arc::new(AtomicBool::new(false));
        let tasks = (0..clients)
            .map(|_| Poller::client(config.clone(), poll.clone(), every, stop.clone()))
            .collect();
        Poller { stop, tasks }
    }

    fn client(
        config: Config,
        poll: Poll,
        every: Duration,
        flag: Arc<AtomicBool>,
    ) -> tokio::task::JoinHandle<PollStats> {
        tokio::spawn(async move {
            let mut stats = PollStats::default();
            let mut config = config;
            config.default_retry = false;
            let kept = Client::try_from(config.clone()).expect("a client");
            let mut tick = tokio::time::interval(every);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            while !flag.load(Ordering::SeqCst) {
                tick.tick().await;
                stats.polls += 1;
                let (sent, started) = (Utc::now(), Instant::now());
                let outcome = match &poll {
                    Poll::Readyz => readyz_ok(&config).await,
                    Poll::Get(path) => get_ok(&config, path).await,
                    Poll::GetLikeClientGo(path) => get_like_client_go(&config, path, &mut stats.retried_after).await,
                    Poll::KeptAlive(path) => {
                        let mut answer = exchange(&kept, http::Method::GET, path, None).await;
                        let (mut lost, mut told) = (0, 0);
                        loop {
                            match &answer {
                                Err(e) if connection_lost(e) && lost < POOL_RETRIES => {
                                    lost += 1;
                                    stats.retried += 1;
                                }
                                Ok(a) if (a.status == 429 || a.status >= 500) && told < CLIENT_GO_RETRIES => {
                                    let Some(seconds) = a.retry_after else { break };
                                    told += 1;
                                    stats.retried_after += 1;
                                    tokio::time::sleep(Duration::from_secs(seconds)).await;
                                }
                                _ => break,
                            }
                            answer = exchange(&kept, http::Method::GET, path, None).await;
                        }
                        kept_answer_ok(path, answer)
                    }
                };
                let took = started.elapsed();
                stats.slowest = stats.slowest.max(took);
                if outcome.is_err() || took > Duration::from_secs(1) {
                    stats.disrupted.push((sent, Utc::now()));
                }
                match outcome {
                    Ok(()) => stats.succeeded.push(sent),
                    Err(e) => stats.failures.push((sent, e)),
                }
            }
            stats
        })
    }

    pub async fn finish(self) -> PollStats {
        self.stop.store(true, Ordering::SeqCst);
        let mut all = PollStats::default();
        for task in self.tasks {
            let stats = task.await.expect("poller task");
            all.polls += stats.polls;
            all.retried += stats.retried;
            all.retried_after += stats.retried_after;
            all.failures.extend(stats.failures);
            all.succeeded.extend(stats.succeeded);
            all.slowest = all.slowest.max(stats.slowest);
            all.disrupted.extend(stats.disrupted);
        }
        all.failures.sort_by_key(|(t, _)| *t);
        all.succeeded.sort();
        all.disrupted.sort();
        all
    }
}

/// `GET path` answered 200 (`/readyz`: `ok`).
fn kept_answer_ok(path: &str, answer: Result<Answer, String>) -> Result<(), String> {
    match answer {
        Ok(a) if a.status == 200 && (path != "/readyz" || a.body.trim() == "ok") => Ok(()),
        Ok(a) => Err(format!("{}: {}", a.status, a.body.trim())),
        Err(e) => Err(e),
    }
}

/// An error that says the connection closed or was reset before an answer came.
fn connection_lost(error: &str) -> bool {
    let e = error.to_lowercase();
    e.contains("closed") || e.contains("reset") || e.contains("broken pipe")
}

pub fn describe_failures(stats: &PollStats) -> String {
    stats
        .failures
        .iter()
        .take(20)
        .map(|(t, e)| format!("  {t}: {e}"))
        .collect::<Vec<_>>()
        .join("\n")
}

/// Figures collected by a test, printed at its end for docs/benchmarks.md.
#[derive(Default)]
pub struct Report {
    pub lines: BTreeMap<usize, String>,
}

impl Report {
    pub fn add(&mut self, line: impl Into<String>) {
        let n = self.lines.len();
        let line = line.into();
        println!("{line}");
        self.lines.insert(n, line);
    }

    pub fn print(&self, title: &str) {
        println!("==== {title} ====");
        for line in self.lines.values() {
            println!("{line}");
        }
        println!("====");
    }
}
