//! Shutdown: the signal that starts it ([`shutdown_signal`]) and the flag every task waits on
//! ([`stopped`]).

use std::future::Future;

use tokio::sync::watch;

/// Resolves once the shutdown flag is set (or its sender is gone).
pub(super) async fn stopped(mut rx: watch::Receiver<bool>) {
    let _ = rx.wait_for(|stop| *stop).await;
}

/// Resolves on Ctrl-C or SIGTERM (what Kubernetes sends): the shutdown signal of `serve`.
///
/// The handlers are installed when this is called, not when the future is first polled: the
/// future is awaited by a task that may not have run yet when "tollgate ready" is logged, and a
/// SIGTERM arriving before its handler exists kills the process with the default action (no
/// drain, no give-back of leases). Call it from within the runtime.
pub fn shutdown_signal() -> impl Future<Output = ()> + Send + 'static {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        let term = signal(SignalKind::terminate());
        let interrupt = signal(SignalKind::interrupt());
        async move {
            match (term, interrupt) {
                (Ok(mut term), Ok(mut interrupt)) => {
                    tokio::select! {
                        _ = term.recv() => {}
                        _ = interrupt.recv() => {}
                    }
                }
                // No handler could be installed: Ctrl-C still stops the process.
                _ => {
                    let _ = tokio::signal::ctrl_c().await;
                }
            }
        }
    }
    #[cfg(not(unix))]
    async {
        let _ = tokio::signal::ctrl_c().await;
    }
}
