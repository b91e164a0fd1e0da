//! A loopback TCP proxy in front of an etcd member, for the tests of a
//! slow or flaky etcd: it can hold every byte etcd sends back for a while
//! (a member that answers, but late, as a leader in an fsync stall does),
//! and cut every connection it relays at once (a connection reset).

use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use baton_core::threads::sync::Lock;

/// A running proxy; dropping it stops it and closes what it relays.
pub struct Proxy {
    port: u16,
    stop: Arc<AtomicBool>,
    delay_ms: Arc<AtomicU64>,
    /// Both ends of every connection relayed, to cut them.
    open: Arc<Lock<Vec<(TcpStream, TcpStream)>>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Proxy {
    /// Relays a free loopback port to `upstream`'s.
    pub fn start(upstream: u16) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        listener.set_nonblocking(true).unwrap();
        let port = listener.local_addr().unwrap().port();
        let stop = Arc::new(AtomicBool::new(false));
        let delay_ms = Arc::new(AtomicU64::new(0));
        let open: Arc<Lock<Vec<(TcpStream, TcpStream)>>> = Arc::default();
        let (stopping, delay, relayed) = (Arc::clone(&stop), Arc::clone(&delay_ms), Arc::clone(&open));
        let thread = std::thread::spawn(move || {
            while !stopping.load(Ordering::Relaxed) {
                let Ok((client, _)) = listener.accept() else {
                    std::thread::sleep(Duration::from_millis(5));
                    continue;
                };
                let _ = client.set_nonblocking(false);
                let Ok(server) = TcpStream::connect(("127.0.0.1", upstream)) else { continue };
                let _ = (client.set_nodelay(true), server.set_nodelay(true));
                relayed.lock().push((client.try_clone().unwrap(), server.try_clone().unwrap()));
                let (c2, s2) = (client.try_clone().unwrap(), server.try_clone().unwrap());
                std::thread::spawn(move || copy(c2, s2, None));
                let delay = Arc::clone(&delay);
                std::thread::spawn(move || copy(server, client, Some(delay)));
            }
        });
        Proxy { port, stop, delay_ms, open, thread: Some(thread) }
    }

    /// The port clients connect to.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// Holds every byte the upstream sends back for `delay` from now on.
    pub fn set_delay(&self, delay: Duration) {
        self.delay_ms.store(delay.as_millis() as u64, Ordering::Relaxed);
    }

    /// Closes every connection relayed so far; new ones are relayed.
    pub fn cut(&self) {
        for (client, server) in std::mem::take(&mut *self.open.lock()) {
            let _ = client.shutdown(Shutdown::Both);
            let _ = server.shutdown(Shutdown::Both);
        }
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
        self.cut();
    }
}

/// Copies `from` to `to` until either closes, each chunk held for the
/// delay in force when it was read (none without one).
fn copy(mut from: TcpStream, mut to: TcpStream, delay: Option<Arc<AtomicU64>>) {
    let Some(delay) = delay else {
        let _ = std::io::copy(&mut from, &mut to);
        let _ = to.shutdown(Shutdown::Write);
        return;
    };
    let (chunks, held) = mpsc::channel::<(Instant, Vec<u8>)>();
    let writer = std::thread::spawn(move || {
        for (due, chunk) in held {
            std::thread::sleep(due.saturating_duration_since(Instant::now()));
            if to.write_all(&chunk).is_err() {
                break;
            }
        }
        let _ = to.shutdown(Shutdown::Write);
    });
    let mut buffer = vec![0u8; 64 * 1024];
    loop {
        match from.read(&mut buffer) {
            Ok(0) | Err(_) => break,
            Ok(n) => {
                let due = Instant::now() + Duration::from_millis(delay.load(Ordering::Relaxed));
                if chunks.send((due, buffer[..n].to_vec())).is_err() {
                    break;
                }
            }
        }
    }
    drop(chunks);
    let _ = writer.join();
}
