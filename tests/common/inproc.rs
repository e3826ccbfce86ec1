//! tollgate in the test's own process: `tollgate::app::serve` on listeners bound to
//! `127.0.0.1:0`, on a runtime of its own on a background thread, so it works the same from
//! `#[test]` and `#[tokio::test]` functions and never depends on the test's runtime.
//!
//! Its logs go to a buffer of its own ([`InProcess::log`]), not to the test's stderr: every
//! thread of its runtime has the buffer's subscriber as its default, so parallel servers in one
//! test binary do not mix their lines.

use std::cell::RefCell;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use tokio::sync::oneshot;
use tollgate::app::{self, Listeners};
use tollgate::clock::Clock;
use tollgate::settings::Settings;
use tonic::transport::Channel;

use super::{READY_DEADLINE, client_of, get, poll, temp_dir};

/// A running in-process tollgate; stopped on drop.
pub struct InProcess {
    pub grpc: SocketAddr,
    pub admin: SocketAddr,
    /// The clock the server runs on (the memory store's time): [`Clock::advance_ms`] it when
    /// the server was started with a manual clock.
    pub clock: Clock,
    /// The settings it runs with (the rules path and the bound addresses filled in).
    pub settings: Settings,
    dir: tempfile::TempDir,
    logs: Logs,
    shutdown: Option<oneshot::Sender<()>>,
    abort: Option<oneshot::Sender<()>>,
    thread: Option<JoinHandle<Option<Result<(), String>>>>,
}

pub struct InProcessBuilder {
    rules: Vec<(String, String)>,
    settings: Settings,
    clock: Clock,
    /// The `/readyz` status `start` waits for (200 unless the test expects otherwise).
    ready_status: u16,
}

impl InProcess {
    /// Serves `rules` (as `rules.yaml`) with the default settings changed by `configure`.
    pub fn start(rules: &str, configure: impl FnOnce(&mut Settings)) -> InProcess {
        InProcess::builder(rules).settings(configure).start()
    }

    pub fn builder(rules: &str) -> InProcessBuilder {
        InProcessBuilder {
            rules: vec![("rules.yaml".into(), rules.into())],
            settings: Settings::default(),
            clock: Clock::system(),
            ready_status: 200,
        }
    }

    pub fn rules_dir(&self) -> PathBuf {
        self.dir.path().join("rules")
    }

    pub async fn client(&self) -> RateLimitServiceClient<Channel> {
        client_of(self.grpc).await
    }

    /// What the server has logged so far.
    pub fn log(&self) -> String {
        self.logs.text()
    }

    /// Graceful shutdown, as on SIGTERM: resolves `serve`'s shutdown future and waits for it
    /// to return (after `drain_ms`, and after the clients closed their connections, so drop
    /// them first). Returns what `serve` returned.
    pub fn shutdown(mut self) -> Result<(), String> {
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
        let thread = self.thread.take().expect("running");
        match thread.join() {
            Ok(Some(result)) => result,
            Ok(None) => Err("aborted".into()),
            Err(_) => Err("the server thread panicked".into()),
        }
    }
}

impl Drop for InProcess {
    /// Signals shutdown and stops at once: the runtime is dropped, which closes the listeners
    /// and every connection (a client the test still holds would otherwise hold up a
    /// graceful shutdown, since the test's runtime waits in this drop). Then joins the thread.
    fn drop(&mut self) {
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
        if let Some(tx) = self.abort.take() {
            let _ = tx.send(());
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

impl InProcessBuilder {
    /// Another rules file next to `rules.yaml`.
    pub fn file(mut self, name: &str, text: &str) -> Self {
        self.rules.push((name.into(), text.into()));
        self
    }

    /// Changes the settings (the rules path and the two addresses are the harness's).
    pub fn settings(mut self, configure: impl FnOnce(&mut Settings)) -> Self {
        configure(&mut self.settings);
        self
    }

    /// No rules file at all: an empty rules directory.
    pub fn without_rules(mut self) -> Self {
        self.rules.clear();
        self
    }

    /// Starts and waits until `/readyz` answers `status` (e.g. 503 for a server that is
    /// deliberately not ready) instead of 200.
    pub fn ready_status(mut self, status: u16) -> Self {
        self.ready_status = status;
        self
    }

    /// The clock to serve on, e.g. `Clock::manual(…)` (default: the system clock).
    pub fn clock(mut self, clock: Clock) -> Self {
        self.clock = clock;
        self
    }

    /// Binds both listeners, spawns the server and waits until `/readyz` answers 200; panics
    /// with what the server logged if it stops or is not ready within the deadline.
    pub fn start(self) -> InProcess {
        // Replayable replica ids and shard picks (src/random.rs).
        tollgate::random::set_seed(super::test_seed());
        let dir = temp_dir("inproc");
        let rules = dir.path().join("rules");
        std::fs::create_dir_all(&rules).expect("rules dir");
        for (name, text) in &self.rules {
            std::fs::write(rules.join(name), text).expect("write rules");
        }
        let bind = || {
            let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind 127.0.0.1:0");
            l.set_nonblocking(true).expect("non-blocking listener");
            let addr = l.local_addr().expect("local addr");
            (l, addr)
        };
        let ((grpc_l, grpc), (admin_l, admin)) = (bind(), bind());
        let mut settings = self.settings;
        settings.rules = rules;
        settings.grpc_addr = grpc;
        settings.admin_addr = admin;
        // What the binary does before serving: refuse invalid settings.
        let settings = settings
            .validate()
            .unwrap_or_else(|e| panic!("invalid test settings: {e}"));

        let logs = Logs::default();
        let (shutdown_tx, shutdown_rx) = oneshot::channel::<()>();
        let (abort_tx, abort_rx) = oneshot::channel::<()>();
        let thread = {
            let (settings, clock, logs) = (settings.clone(), self.clock.clone(), logs.clone());
            std::thread::Builder::new()
                .name(format!("tollgate-{grpc}"))
                .spawn(move || {
                    run(
                        grpc_l,
                        admin_l,
                        settings,
                        clock,
                        logs,
                        shutdown_rx,
                        abort_rx,
                    )
                })
                .expect("spawn the server thread")
        };
        let mut server = InProcess {
            grpc,
            admin,
            clock: self.clock,
            settings,
            dir,
            logs,
            shutdown: Some(shutdown_tx),
            abort: Some(abort_tx),
            thread: Some(thread),
        };
        let ready = poll(READY_DEADLINE, || {
            if server.thread.as_ref().is_some_and(|t| t.is_finished()) {
                let result = server.thread.take().map(|t| t.join());
                panic!(
                    "tollgate stopped before it was ready ({result:?}):\n{}",
                    server.log()
                );
            }
            (get(server.admin, "/readyz").0 == self.ready_status).then_some(())
        });
        if ready.is_none() {
            panic!(
                "/readyz never answered {} within {READY_DEADLINE:?}:\n{}",
                self.ready_status,
                server.log()
            );
        }
        server
    }
}

/// The server thread: a runtime whose threads log into `logs`, serving until shutdown (then
/// `Some(result)`) or abort (`None`).
fn run(
    grpc: std::net::TcpListener,
    admin: std::net::TcpListener,
    settings: Settings,
    clock: Clock,
    logs: Logs,
    shutdown: oneshot::Receiver<()>,
    abort: oneshot::Receiver<()>,
) -> Option<Result<(), String>> {
    thread_local! {
        static LOG: RefCell<Option<tracing::dispatcher::DefaultGuard>> = const { RefCell::new(None) };
    }
    let dispatch = logs.dispatch();
    let _main = tracing::dispatcher::set_default(&dispatch);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .on_thread_start(move || {
            let guard = tracing::dispatcher::set_default(&dispatch);
            LOG.with(|g| *g.borrow_mut() = Some(guard));
        })
        .on_thread_stop(|| {
            LOG.with(|g| g.borrow_mut().take());
        })
        .build()
        .expect("server runtime");
    let result = runtime.block_on(async move {
        let listeners = Listeners {
            grpc: tokio::net::TcpListener::from_std(grpc).expect("gRPC listener"),
            admin: tokio::net::TcpListener::from_std(admin).expect("admin listener"),
        };
        let serve = app::serve(listeners, settings, clock, async move {
            let _ = shutdown.await;
        });
        tokio::select! {
            result = serve => Some(result.map_err(|e| e.to_string())),
            _ = abort => None,
        }
    });
    // Dropping the runtime cancels whatever still runs (connections, the store's keeper).
    runtime.shutdown_timeout(std::time::Duration::from_secs(2));
    result
}

/// The log lines of one server.
#[derive(Clone, Default)]
struct Logs(Arc<Mutex<Vec<u8>>>);

impl Logs {
    fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().unwrap_or_else(|p| p.into_inner())).into_owned()
    }

    fn dispatch(&self) -> tracing::Dispatch {
        let logs = self.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_writer(move || logs.clone())
            .with_ansi(false)
            .with_max_level(tracing::Level::INFO)
            .finish();
        tracing::Dispatch::new(subscriber)
    }
}

impl std::io::Write for Logs {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}
