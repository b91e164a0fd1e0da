//! The pass over a worker's weights that the validate stage makes: the
//! server asks for the weights on the setup channel, and the worker sends
//! them one at a time through a sealed region, which the server copies
//! each out of before validation looks at it.
//!
//! The worker chooses the sizes, so each is bounded from the server's own
//! side, by the version's files: no weight (nor the region it crosses in)
//! larger than eight times the files (the widest element, 8 bytes, written
//! in the file in one, as ONNX's packed integers can be), no more weights
//! than the files have bytes, and the whole pass within a bound of time.
//! A worker past any of them is out of step, and is ended.

use std::os::fd::OwnedFd;
use std::time::{Duration, Instant};

use baton_core::run::backend::{Weight, WeightRole, WeightsError};

use crate::channel::Channel;
use crate::options::TIMEOUT;
use crate::region::{PAGE, PeerRegion};
use crate::wire::{Report, Setup};

/// How many times the version's files one weight may be.
const WIDENING: u64 = 8;

/// The least bound on a weight, and on how many there are, for a version
/// of very small files.
const LEAST: u64 = 1 << 20;

/// How long one whole pass over the weights may take.
const PASS_LIMIT: Duration = Duration::from_secs(600);

/// The setup channel, after the load: it carries the weights for
/// validation.
pub(crate) struct SetupChannel {
    pub(crate) channel: Channel,
    /// The region weights cross in, during a pass.
    pub(crate) region: Option<PeerRegion>,
    /// The server's copy of the weight being visited, during a pass.
    pub(crate) weight: Vec<u8>,
    /// Why the channel can no longer be trusted (a pass that broke off
    /// midway), once it cannot.
    pub(crate) broken: Option<String>,
}

impl SetupChannel {
    pub(crate) fn new(channel: Channel) -> SetupChannel {
        SetupChannel { channel, region: None, weight: Vec::new(), broken: None }
    }
}

/// What a pass over the weights of a version of `files` bytes may hold.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Bounds {
    /// The most bytes of one weight.
    each: usize,
    /// The most weights.
    count: u64,
    /// How long the whole pass may take.
    limit: Duration,
}

impl Bounds {
    /// The bounds of a version whose files are `files` bytes in all.
    pub(crate) fn of(files: u64) -> Bounds {
        let each = files.saturating_mul(WIDENING).max(LEAST);
        Bounds { each: usize::try_from(each).unwrap_or(usize::MAX), count: files.max(LEAST), limit: PASS_LIMIT }
    }
}

/// A pass over the worker's weights that broke off midway: the setup
/// channel is out of step from then on.
pub(crate) struct Broke(pub(crate) String);

/// One pass over the worker's weights, each waited for within `within`,
/// all within `bounds`.
pub(crate) struct Pass<'a> {
    pub(crate) within: Duration,
    pub(crate) bounds: Bounds,
    pub(crate) setup: &'a mut SetupChannel,
}

impl Pass<'_> {
    fn send(&self, message: &Setup) -> Result<(), Broke> {
        let bytes = serde_json::to_vec(message).map_err(|e| Broke(e.to_string()))?;
        let sent = self.setup.channel.send(&bytes, &[]);
        sent.map_err(|e| Broke(format!("asking the worker for its weights: {e}")))
    }

    /// Asks for the weights and hands each to `visit`, copied out of the
    /// region: the pass's outcome, or why the channel broke.
    pub(crate) fn run(
        self,
        visit: &mut dyn FnMut(&Weight<'_>) -> Result<(), String>,
    ) -> Result<Result<(), WeightsError>, Broke> {
        let Bounds { each, count, limit } = self.bounds;
        let until = Instant::now() + limit;
        self.send(&Setup::Weights)?;
        let mut buffer = Vec::new();
        let mut received = 0u64;
        loop {
            // A worker that sends nothing is hung: the pass fails within
            // the bound on a call rather than wait for it; and the whole
            // pass within its own.
            let left = until.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(Broke(format!("the worker's weights took longer than the bound of {limit:?}")));
            }
            let ready = self.setup.channel.readable_within(self.within.min(left));
            if !ready.map_err(|e| Broke(format!("waiting for the worker's weights: {e}")))? {
                let limit = self.within;
                return Err(Broke(format!("the worker sent no weight within {limit:?} ([engine] {TIMEOUT})")));
            }
            let fds = match self.setup.channel.recv(&mut buffer) {
                Ok(Some(fds)) => fds,
                Ok(None) => return Err(Broke("the worker closed its channel".into())),
                Err(e) => return Err(Broke(format!("reading weights from the worker: {e}"))),
            };
            let report = serde_json::from_slice::<Report>(&buffer).map_err(|e| Broke(e.to_string()))?;
            let (name, datatype, shape, compute, len, grown) = match report {
                Report::WeightsEnd => return Ok(Ok(())),
                Report::WeightsFailed { message } => return Ok(Err(WeightsError::Read(message))),
                Report::Weight { name, datatype, shape, compute, len, region } => {
                    (name, datatype, shape, compute, len, region)
                }
                other => return Err(Broke(format!("the worker reported {other:?} among weights"))),
            };
            received += 1;
            if received > count {
                return Err(Broke(format!("the worker sent more than the bound of {count} weights")));
            }
            if len > each {
                let why = format!("weight '{name}' of {len} bytes, past the bound of {each} (its version's files)");
                return Err(Broke(why));
            }
            if grown {
                let fd: Option<OwnedFd> = fds.into_iter().next();
                let fd = fd.ok_or_else(|| Broke("a weights region was announced, not sent".into()))?;
                let most = each.checked_next_multiple_of(PAGE).unwrap_or(each);
                let region = PeerRegion::open(fd, most)
                    .map_err(|e| Broke(format!("its weights region, bound by its version's files: {e}")))?;
                self.setup.region = Some(region);
            }
            // Copied out (the worker's memory is never read in place), and
            // only once its length is checked against the region.
            let SetupChannel { region, weight, .. } = &mut *self.setup;
            let outside = || Broke(format!("weight '{name}' of {len} bytes lies outside the weights region"));
            let region = region.as_ref().filter(|r| len <= r.len()).ok_or_else(outside)?;
            weight.resize(len, 0);
            region.read_into(0, weight).ok_or_else(outside)?;
            let role = if compute { WeightRole::Compute } else { WeightRole::Constant };
            let visited = visit(&Weight { name: &name, datatype, shape: &shape, data: weight, role });
            if let Err(refused) = visited {
                self.send(&Setup::Stop)?;
                return Ok(Err(WeightsError::Refused(refused)));
            }
            self.send(&Setup::Next)?;
        }
    }
}

#[cfg(test)]
mod tests {
    use std::os::fd::AsFd;

    use baton_core::tensors::tensor::DataType;
    use memfd::{FileSeal, MemfdOptions};

    use super::*;

    /// A worker, played by a thread on the other end of a setup channel,
    /// that answers the server's request for the weights with a sealed
    /// region of 16 TiB (sparse: it costs nothing) and a report that its
    /// one weight fills it. The pass must refuse it before it maps or
    /// allocates anything: a copy of that size ends the server.
    #[test]
    fn a_weight_larger_than_the_version_could_hold_is_refused_before_anything_is_allocated() {
        let (ours, theirs) = Channel::pair().unwrap();
        let worker = std::thread::spawn(move || {
            let mut buffer = Vec::new();
            theirs.recv(&mut buffer).unwrap().unwrap();
            assert!(matches!(serde_json::from_slice(&buffer), Ok(Setup::Weights)));
            let memfd = MemfdOptions::default().allow_sealing(true).create("baton-weights").unwrap();
            memfd.as_file().set_len(1 << 44).unwrap();
            memfd.add_seals(&[FileSeal::SealShrink, FileSeal::SealGrow]).unwrap();
            let report = Report::Weight {
                name: "w".into(),
                datatype: Some(DataType::Uint8),
                shape: vec![1 << 44],
                compute: true,
                len: 1 << 44,
                region: true,
            };
            theirs.send(&serde_json::to_vec(&report).unwrap(), &[memfd.as_file().as_fd()]).unwrap();
            // Holds its end until the server lets go of its own.
            let _ = theirs.recv(&mut buffer);
        });
        let mut setup = SetupChannel::new(ours);
        // A version of 1 GiB of files.
        let pass = Pass { within: Duration::from_secs(60), bounds: Bounds::of(1 << 30), setup: &mut setup };
        let mut visited = 0;
        let passed = pass.run(&mut |_| {
            visited += 1;
            Ok(())
        });
        let Err(Broke(why)) = passed else { panic!("the pass took a weight of 16 TiB") };
        assert!(why.contains("bound"), "{why}");
        assert_eq!(visited, 0);
        drop(setup);
        worker.join().unwrap();
    }

    /// A worker that sends weights without end, each within the region it
    /// sent first, is cut off at the bound on how many there may be; the
    /// ones before it are visited as sent.
    #[test]
    fn a_worker_that_sends_weights_without_end_is_cut_off_at_the_bound() {
        let (ours, theirs) = Channel::pair().unwrap();
        let worker = std::thread::spawn(move || {
            let mut buffer = Vec::new();
            theirs.recv(&mut buffer).unwrap().unwrap();
            let mut region = crate::region::Region::named(crate::wire::WEIGHTS_REGION, 4).unwrap();
            region.bytes_mut()[..4].copy_from_slice(&1.5f32.to_le_bytes());
            for sent in 0.. {
                let report = Report::Weight {
                    name: format!("w{sent}"),
                    datatype: Some(DataType::Fp32),
                    shape: vec![1],
                    compute: true,
                    len: 4,
                    region: sent == 0,
                };
                let fds = if sent == 0 { vec![region.fd()] } else { Vec::new() };
                theirs.send(&serde_json::to_vec(&report).unwrap(), &fds).unwrap();
                match theirs.recv(&mut buffer) {
                    Ok(Some(_)) if matches!(serde_json::from_slice(&buffer), Ok(Setup::Next)) => {}
                    _ => return sent,
                }
            }
            unreachable!()
        });
        let mut setup = SetupChannel::new(ours);
        let bounds = Bounds { each: 4096, count: 100, limit: Duration::from_secs(60) };
        let pass = Pass { within: Duration::from_secs(60), bounds, setup: &mut setup };
        let mut visited = Vec::new();
        let passed = pass.run(&mut |weight| {
            visited.push((weight.name.to_owned(), weight.data.to_vec()));
            Ok(())
        });
        let Err(Broke(why)) = passed else { panic!("the pass took weights without end") };
        assert!(why.contains("100 weights"), "{why}");
        assert_eq!(visited.len(), 100);
        assert_eq!(visited[99], ("w99".to_owned(), 1.5f32.to_le_bytes().to_vec()));
        drop(setup);
        assert_eq!(worker.join().unwrap(), 100);
    }
}
