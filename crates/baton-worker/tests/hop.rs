//! The hop between two real processes: this test binary starts itself
//! again as the worker (the `worker` test, which does nothing unless told
//! to by the environment), and calls it. Tensors round-trip bit for bit,
//! from many threads at once; regions grow both ways; a failure in the
//! worker comes back with its kind; a worker killed mid-call fails every
//! call at once, and a hung one is cut off at the deadline.

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use baton_core::tensors::tensor::{DataType, Tensor, TensorData, TensorView};
use std::os::fd::OwnedFd;

use baton_worker::channel::{Channel, hand_to_child, take_handed};
use baton_worker::hop::{self, Caller, HopError};

const ROLE: &str = "BATON_HOP_TEST_WORKER_FD";
const SPIN: &str = "BATON_HOP_TEST_SPIN_US";
const MODE: &str = "BATON_HOP_TEST_MODE";
const LONG: Duration = Duration::from_secs(60);

/// The worker's run on owned tensors, as a test's expectation.
fn run(inputs: &[Tensor]) -> Result<Vec<Tensor>, hop::RunError> {
    outputs_for(&inputs.iter().map(Tensor::view).collect::<Vec<_>>())
}

/// The worker's run: doubles FP32 inputs and echoes the rest, except for
/// inputs named to fail, to hang or to grow the answer.
fn outputs_for(inputs: &[TensorView<'_>]) -> Result<Vec<Tensor>, hop::RunError> {
    let mut outputs = Vec::new();
    for input in inputs.iter().map(TensorView::to_tensor) {
        match input.name.as_str() {
            "fail" => return Err(("model_refused".into(), "told to fail".into())),
            "hang" => {
                // Says it is hanging, in the file its element names.
                if let TensorData::Bytes(path) = &input.data {
                    std::fs::write(String::from_utf8_lossy(&path[0]).as_ref(), b"hanging").unwrap();
                }
                std::thread::sleep(Duration::from_secs(3600));
            }
            "grow" => outputs.push(Tensor::from_f32("grown", vec![1 << 21], &vec![0.5; 1 << 21])),
            _ => {}
        }
        // The copy an engine makes of its inputs into its outputs.
        let mut output = input;
        if let (DataType::Fp32, TensorData::Raw(raw)) = (output.datatype, &mut output.data) {
            for word in raw.chunks_exact_mut(4) {
                let value = f32::from_le_bytes(word.try_into().unwrap()) * 2.0;
                word.copy_from_slice(&value.to_le_bytes());
            }
        }
        outputs.push(output);
    }
    Ok(outputs)
}

#[test]
fn worker() {
    let Ok(fds) = std::env::var(ROLE) else { return };
    let numbers: Vec<i32> = fds.split(',').map(|fd| fd.parse().unwrap()).collect();
    let channels = take_handed(&numbers).unwrap();
    match std::env::var(MODE).as_deref() {
        Ok("garbage") => misbehave(channels, |channel| channel.send(&vec![b'x'; 64 << 10], &[]).unwrap()),
        Ok("unsealed") => misbehave(channels, answer_in_an_unsealed_region),
        Ok("empty") => misbehave(channels, |channel| channel.send(b"", &[]).unwrap()),
        Ok("shut") => misbehave(channels, Channel::shutdown),
        Ok("exactly") => misbehave(channels, |channel| channel.send(&failure_of(hop::SLOT_MESSAGE), &[]).unwrap()),
        Ok("one-past") => misbehave(channels, |channel| channel.send(&failure_of(hop::SLOT_MESSAGE + 1), &[]).unwrap()),
        Ok("overlapping") => misbehave(channels, answer_with_overlapping_tensors),
        _ => {}
    }
    let spin = Duration::from_micros(std::env::var(SPIN).unwrap().parse().unwrap());
    let how = hop::Answering { spin, most: hop::REGION_DEFAULT };
    let answered = hop::answer(channels, how, |instance, inputs, out| {
        let outputs = match inputs.first() {
            // Answers which engine instance the call named (-1: none).
            Some(input) if input.name == "instance" => {
                vec![Tensor::from_f32("instance", vec![1], &[instance.map_or(-1.0, |i| i as f32)])]
            }
            // Lends an output that grows the output region, then fails.
            Some(input) if input.name == "grow-then-fail" => {
                out(&Tensor::from_f32("grown", vec![1 << 21], &vec![0.5; 1 << 21]).view());
                return Err(("model_refused".into(), "told to fail after an output".into()));
            }
            // The engine panics.
            Some(input) if input.name == "panic" => panic!("the test's engine panics, as asked"),
            // Lends its output, then cuts every shared region it can
            // reach down to nothing, the server's as well as its own.
            Some(input) if input.name == "truncate" => {
                let outputs = outputs_for(inputs)?;
                outputs.iter().for_each(|output| out(&output.view()));
                truncate_shared_regions();
                return Ok(());
            }
            _ => outputs_for(inputs)?,
        };
        outputs.iter().for_each(|output| out(&output.view()));
        Ok(())
    });
    // A slot that failed ends the worker, as a crash would.
    std::process::exit(if answered.is_ok() { 0 } else { 3 });
}

/// A worker that answers every call on any slot with `answer`, and never
/// runs one, until the server's ends close.
fn misbehave(channels: Vec<Channel>, answer: fn(&Channel)) -> ! {
    std::thread::scope(|scope| {
        for channel in &channels {
            scope.spawn(move || {
                let mut buffer = Vec::new();
                while let Ok(Some(_)) = channel.recv(&mut buffer) {
                    answer(channel);
                }
            });
        }
    });
    std::process::exit(0)
}

/// Answers with outputs in a region of its own that it did not seal, and
/// cuts the region down to nothing once the answer is sent.
fn answer_in_an_unsealed_region(channel: &Channel) {
    use rustix::fs::{MemfdFlags, ftruncate, memfd_create};
    let region = memfd_create("baton-hop", MemfdFlags::CLOEXEC).unwrap();
    ftruncate(&region, 64 << 10).unwrap();
    let answer = serde_json::json!({ "Done": { "outputs": { "offset": 0, "len": 2 }, "region": true } });
    channel.send(answer.to_string().as_bytes(), &[std::os::fd::AsFd::as_fd(&region)]).unwrap();
    ftruncate(&region, 0).unwrap();
}

/// A failure's answer of exactly `len` bytes: its JSON, then spaces.
fn failure_of(len: usize) -> Vec<u8> {
    let answer = serde_json::json!({ "Failed": { "kind": "model_refused", "message": "padded" } });
    let mut bytes = answer.to_string().into_bytes();
    bytes.resize(len, b' ');
    bytes
}

/// Answers with a sealed region of its own whose index names one 16 KiB
/// tensor 64 times over, at the same offset: each within the region, all
/// together 64 times its size.
fn answer_with_overlapping_tensors(channel: &Channel) {
    let mut region = baton_worker::region::Region::create(128 << 10).unwrap();
    let meta = serde_json::json!({ "name": "y", "datatype": "UINT8", "shape": [16384], "offset": 0, "len": 16384 });
    let index = serde_json::to_vec(&vec![meta; 64]).unwrap();
    let at = 64 << 10;
    region.bytes_mut()[at..at + index.len()].copy_from_slice(&index);
    let answer = serde_json::json!({ "Done": { "outputs": { "offset": at, "len": index.len() }, "region": true } });
    channel.send(answer.to_string().as_bytes(), &[region.fd()]).unwrap();
}

/// Cuts every shared region of the hop this process holds (the server's
/// input region, its own output region) down to nothing, where the kernel
/// lets it.
fn truncate_shared_regions() {
    for entry in std::fs::read_dir("/proc/self/fd").unwrap().flatten() {
        let target = std::fs::read_link(entry.path()).unwrap_or_default();
        if target.to_string_lossy().starts_with("/memfd:baton-hop")
            && let Ok(file) = std::fs::OpenOptions::new().write(true).open(entry.path())
        {
            let _ = file.set_len(0);
        }
    }
}

struct Worker {
    child: Child,
    caller: Caller,
}

impl Worker {
    fn start() -> Worker {
        Worker::start_with(4)
    }

    fn start_with(slots: usize) -> Worker {
        Worker::start_spinning(slots, hop::SPIN_DEFAULT)
    }

    /// A worker whose two sides look for each other's message for `spin`
    /// before they sleep.
    fn start_spinning(slots: usize, spin: Duration) -> Worker {
        let (child, ours) = spawn(slots, spin, "answer");
        Worker { child, caller: Caller::new(ours, spin) }
    }

    /// A worker that answers every call with what `mode` names
    /// ([`misbehave`]).
    fn misbehaving(slots: usize, mode: &str) -> Worker {
        let (child, ours) = spawn(slots, Duration::ZERO, mode);
        Worker { child, caller: Caller::new(ours, Duration::ZERO) }
    }

    fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Starts this test binary as a worker of `slots` slots in `mode`;
/// returns it and the server's ends of its slots.
fn spawn(slots: usize, spin: Duration, mode: &str) -> (Child, Vec<Channel>) {
    let (ours, theirs): (Vec<_>, Vec<_>) = (0..slots).map(|_| Channel::pair().unwrap()).unzip();
    let mut command = Command::new(std::env::current_exe().unwrap());
    let fds = hand_to_child(&mut command, theirs.into_iter().map(OwnedFd::from).collect()).unwrap();
    let fds: Vec<String> = fds.iter().map(ToString::to_string).collect();
    let child = command
        .args(["--exact", "worker", "--nocapture", "--test-threads", "1"])
        .env(ROLE, fds.join(","))
        .env(SPIN, spin.as_micros().to_string())
        .env(MODE, mode)
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    // It holds the worker's ends until dropped.
    drop(command);
    (child, ours)
}

/// A call that hangs in the worker once `marker` exists.
fn hang(marker: &std::path::Path) -> Vec<Tensor> {
    let path = marker.to_str().unwrap().as_bytes().to_vec();
    vec![Tensor { name: "hang".into(), datatype: DataType::Bytes, shape: vec![1], data: TensorData::Bytes(vec![path]) }]
}

/// Waits, within a bound, until `path` exists.
fn wait_for(path: &std::path::Path) {
    let deadline = Instant::now() + LONG;
    while !path.exists() {
        assert!(Instant::now() < deadline, "{} never appeared", path.display());
        std::thread::sleep(Duration::from_millis(5));
    }
}

fn input(seed: u32) -> Vec<Tensor> {
    let values: Vec<f32> = (0..256).map(|i| (seed * 1000 + i) as f32 / 7.0).collect();
    vec![
        Tensor::from_f32("x", vec![1, 256], &values),
        Tensor {
            name: "s".into(),
            datatype: DataType::Bytes,
            shape: vec![2],
            data: TensorData::Bytes(vec![format!("key-{seed}").into_bytes(), Vec::new()]),
        },
    ]
}

#[test]
fn tensors_cross_both_ways_bit_for_bit_from_many_threads() {
    let worker = Worker::start();
    std::thread::scope(|scope| {
        for thread in 0..6 {
            let caller = &worker.caller;
            scope.spawn(move || {
                for i in 0..200 {
                    let inputs = input(thread * 1000 + i);
                    let outputs = caller.call(&inputs, LONG).unwrap();
                    assert_eq!(outputs, run(&inputs).unwrap());
                }
            });
        }
    });
}

#[test]
fn regions_grow_for_inputs_and_for_outputs_larger_than_they_are() {
    let worker = Worker::start();
    // 8 MiB in: the server sends a larger region.
    let big = vec![Tensor::from_f32("x", vec![1 << 21], &vec![1.5; 1 << 21])];
    assert_eq!(worker.caller.call(&big, LONG).unwrap(), run(&big).unwrap());
    // 8 MiB out of a small call: the worker sends one back.
    let grow = vec![Tensor::from_f32("grow", vec![1], &[1.0])];
    assert_eq!(worker.caller.call(&grow, LONG).unwrap(), run(&grow).unwrap());
    // And small calls still answer right on the grown regions.
    for i in 0..20 {
        assert_eq!(worker.caller.call(&input(i), LONG).unwrap(), run(&input(i)).unwrap());
    }
}

#[test]
fn a_failure_in_the_worker_comes_back_with_its_kind_and_the_next_call_answers() {
    let worker = Worker::start();
    let error = worker.caller.call(&[Tensor::from_f32("fail", vec![1], &[1.0])], LONG).unwrap_err();
    assert_eq!((error.kind(), error.to_string().as_str()), ("model_refused", "told to fail"));
    assert_eq!(worker.caller.call(&input(1), LONG).unwrap(), run(&input(1)).unwrap());
}

#[test]
fn an_output_region_made_by_a_call_that_then_failed_reaches_the_server_with_the_next_answer() {
    // One slot, so that both calls go through the same regions.
    let worker = Worker::start_with(1);
    assert_eq!(worker.caller.call(&input(1), LONG).unwrap(), run(&input(1)).unwrap());
    let error = worker.caller.call(&[Tensor::from_f32("grow-then-fail", vec![1], &[1.0])], LONG).unwrap_err();
    assert_eq!(error.kind(), "model_refused", "{error}");
    let big = vec![Tensor::from_f32("x", vec![1 << 20], &vec![1.5; 1 << 20])];
    assert_eq!(worker.caller.call(&big, LONG).unwrap(), run(&big).unwrap());
    assert_eq!(worker.caller.call(&input(2), LONG).unwrap(), run(&input(2)).unwrap());
}

#[test]
fn a_worker_killed_mid_call_fails_that_call_and_every_later_one_at_once() {
    let worker = Worker::start();
    assert!(worker.caller.call(&input(1), LONG).is_ok());
    let dir = tempfile::tempdir().unwrap();
    let marker = dir.path().join("hanging");
    std::thread::scope(|scope| {
        let (caller, hang) = (&worker.caller, hang(&marker));
        let in_flight = scope.spawn(move || caller.call(&hang, LONG));
        wait_for(&marker);
        let killed = Instant::now();
        let pid = worker.child.id().to_string();
        assert!(Command::new("kill").args(["-KILL", &pid]).status().unwrap().success());
        let error = in_flight.join().unwrap().unwrap_err();
        assert_eq!(error.kind(), "worker_gone", "{error}");
        assert!(killed.elapsed() < LONG / 2, "the call waited for its deadline");
    });
    let error = worker.caller.call(&input(2), LONG).unwrap_err();
    assert!(matches!(error, HopError::Gone(_)), "{error}");
}

#[test]
fn a_hung_worker_is_cut_off_at_the_deadline_and_its_slot_is_not_reused() {
    let worker = Worker::start();
    let dir = tempfile::tempdir().unwrap();
    let error = worker.caller.call(&hang(&dir.path().join("hanging")), Duration::from_millis(300)).unwrap_err();
    assert_eq!(error.kind(), "worker_timed_out");
    // Three slots are left, and each still answers.
    for i in 0..10 {
        assert_eq!(worker.caller.call(&input(i), LONG).unwrap(), run(&input(i)).unwrap());
    }
}

/// Median and 99th percentile, in microseconds.
fn quantiles(mut took: Vec<Duration>) -> (f64, f64) {
    took.sort_unstable();
    let at = |q: usize| took[(took.len() - 1) * q / 100].as_secs_f64() * 1e6;
    (at(50), at(99))
}

#[test]
#[ignore = "a benchmark: prints what a call across the hop costs (bash bench/hop.sh)"]
fn what_a_call_across_the_hop_costs() {
    // With the default look for the other side's message, and with none
    // (each side sleeps at once).
    let workers = [("looking", Worker::start()), ("sleeping", Worker::start_spinning(4, Duration::ZERO))];
    // Calls back to back, and calls 1 ms apart, as a light load spaces them.
    for (what, floats, calls, apart) in [
        ("1 x 256 FP32", 256, 20_000, Duration::ZERO),
        ("1 x 256 FP32 1 ms apart", 256, 2_000, Duration::from_millis(1)),
        ("1 MiB FP32", 1 << 18, 2_000, Duration::ZERO),
        ("16 MiB FP32", 1 << 22, 100, Duration::ZERO),
    ] {
        let inputs = vec![Tensor::from_f32("x", vec![1, floats as i64], &vec![0.25; floats])];
        let views: Vec<_> = inputs.iter().map(Tensor::view).collect();
        const BLOCK: usize = 50;
        let mut direct = Vec::with_capacity(calls * 2);
        let mut hopped: Vec<Vec<Duration>> = workers.iter().map(|_| Vec::with_capacity(calls)).collect();
        // Alternated in blocks, so that all see the same machine, with a
        // pause between blocks longer than the look: one worker's slots
        // looking for calls keep a CPU awake, which would spare the other
        // its wake-ups if the two were alternated call by call.
        for _ in 0..calls / BLOCK {
            for ((_, worker), took) in workers.iter().zip(&mut hopped) {
                std::thread::sleep(Duration::from_millis(2));
                for _ in 0..BLOCK {
                    std::thread::sleep(apart);
                    let began = Instant::now();
                    std::hint::black_box(worker.caller.call(&inputs, LONG).unwrap());
                    took.push(began.elapsed());
                    let began = Instant::now();
                    std::hint::black_box(outputs_for(&views).unwrap());
                    direct.push(began.elapsed());
                }
            }
        }
        let (d50, d99) = quantiles(direct);
        for ((how, _), took) in workers.iter().zip(hopped) {
            let (h50, h99) = quantiles(took);
            println!(
                "figure: {what}, {calls} calls: in process p50 {d50:.1} us, p99 {d99:.1} us; across the hop, \
                 {how}, p50 {h50:.1} us, p99 {h99:.1} us; the hop adds {:.1} us at the median",
                h50 - d50
            );
        }
    }
}

/// A call names the engine instance it runs on (warmup reaches each of a
/// worker's sessions so); a plain call names none.
#[test]
fn a_call_on_an_instance_reaches_that_instance_in_the_worker() {
    let mut worker = Worker::start();
    let ask = [Tensor::from_f32("instance", vec![1], &[0.0])];
    for instance in [Some(0), Some(3), None] {
        let answer = worker.caller.call_on(instance, &ask, LONG).unwrap();
        let want = Tensor::from_f32("instance", vec![1], &[instance.map_or(-1.0, |i| i as f32)]);
        assert_eq!(answer, [want], "{instance:?}");
    }
    worker.kill();
}

/// An engine that panics fails its call with the kind an engine's panic
/// has in the server's own process, and the slot answers the next call.
#[test]
fn an_engine_panic_in_the_worker_comes_back_as_the_engine_s_panic_and_the_slot_serves_on() {
    let worker = Worker::start_with(1);
    let error = worker.caller.call(&[Tensor::from_f32("panic", vec![1], &[1.0])], LONG).unwrap_err();
    assert_eq!(error.kind(), "engine_panicked", "{error}");
    assert_eq!(worker.caller.call(&input(3), LONG).unwrap(), run(&input(3)).unwrap());
}

/// A worker that cuts the regions it shares down to nothing (its own
/// output region, the server's input region) cannot: they are sealed. The
/// server never touches memory that is gone (which would end it with
/// SIGBUS), and its calls answer as before.
#[test]
fn a_worker_that_truncates_the_regions_it_shares_cannot_and_the_server_never_reads_past_them() {
    let worker = Worker::start_with(1);
    let truncate = vec![Tensor::from_f32("truncate", vec![1, 300], &[2.5; 300])];
    // Both regions are made and mapped on both sides first.
    for i in 0..3 {
        assert_eq!(worker.caller.call(&input(i), LONG).unwrap(), run(&input(i)).unwrap(), "call {i}");
        assert_eq!(worker.caller.call(&truncate, LONG).unwrap(), run(&truncate).unwrap(), "call {i}");
    }
}

/// A worker that hands over a region it did not seal, and truncates it
/// once the answer is sent: the server refuses the region (it never maps
/// it), the worker counts as gone, and no later call uses its slots.
#[test]
fn an_unsealed_region_from_the_worker_is_refused_and_the_worker_counts_as_gone() {
    let worker = Worker::misbehaving(2, "unsealed");
    let error = worker.caller.call(&input(1), LONG).unwrap_err();
    assert_eq!(error.kind(), "worker_hop_broken", "{error}");
    assert!(error.to_string().contains("not sealed"), "{error}");
    let gone = worker.caller.gone().expect("the worker counts as gone");
    assert!(gone.contains("not sealed"), "{gone}");
    let later = worker.caller.call(&input(2), LONG).unwrap_err();
    assert_eq!(later.kind(), "worker_gone", "{later}");
}

/// A worker that answers with a message baton does not read (64 KiB of
/// garbage, past what a slot's message may be): the call fails, the worker
/// counts as gone (the server replaces such a worker), and no later call
/// reads what that slot holds.
#[test]
fn a_message_the_server_does_not_read_ends_the_worker_s_slots() {
    let worker = Worker::misbehaving(2, "garbage");
    let error = worker.caller.call(&input(1), LONG).unwrap_err();
    assert_eq!(error.kind(), "worker_hop_broken", "{error}");
    assert!(worker.caller.gone().is_some(), "the worker still counts as serving");
    let later = worker.caller.call(&input(2), LONG).unwrap_err();
    assert_eq!(later.kind(), "worker_gone", "{later}");
}

/// The worker's side: a slot that receives what it does not read ends the
/// whole worker, so that the server replaces it, rather than ending that
/// slot's thread alone and leaving a process that answers on no slot.
#[test]
fn a_slot_that_receives_what_it_does_not_read_ends_the_worker() {
    let (mut child, ours) = spawn(3, Duration::ZERO, "answer");
    ours[1].send(b"not a call", &[]).unwrap();
    let deadline = Instant::now() + LONG;
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        assert!(Instant::now() < deadline, "the worker kept running with a broken slot");
        std::thread::sleep(Duration::from_millis(5));
    };
    assert!(!status.success(), "{status}");
    drop(ours);
}

/// A worker that answers with a message of no bytes: the server reads it
/// as the protocol broken, not as the worker's close (which it is not: the
/// process lives on), and the worker counts as gone.
#[test]
fn an_empty_message_from_the_worker_breaks_its_hop_rather_than_reading_as_a_close() {
    let worker = Worker::misbehaving(2, "empty");
    let error = worker.caller.call(&input(1), LONG).unwrap_err();
    assert_eq!(error.kind(), "worker_hop_broken", "{error}");
    assert!(error.to_string().contains("empty"), "{error}");
    assert!(worker.caller.gone().is_some(), "the worker still counts as serving");
    assert_eq!(worker.caller.call(&input(2), LONG).unwrap_err().kind(), "worker_gone");
}

/// A worker that shuts a slot down while its process lives: the call on
/// it fails at once, and the worker counts as gone (the server then ends
/// the process, which is replaced; see the server's tests).
#[test]
fn a_slot_shut_while_the_worker_lives_fails_its_call_at_once_and_the_worker_counts_as_gone() {
    let mut worker = Worker::misbehaving(2, "shut");
    let error = worker.caller.call(&input(1), LONG).unwrap_err();
    assert_eq!(error.kind(), "worker_gone", "{error}");
    assert!(worker.child.try_wait().unwrap().is_none(), "the worker process ended by itself");
    assert!(worker.caller.gone().is_some(), "the worker still counts as serving");
    assert_eq!(worker.caller.call(&input(2), LONG).unwrap_err().kind(), "worker_gone");
}

/// An answer of exactly the largest slot message is read whole; one byte
/// more is cut short, breaks the hop, and the worker counts as gone.
#[test]
fn an_answer_of_exactly_the_largest_slot_message_is_read_and_one_byte_more_breaks_the_hop() {
    let exactly = Worker::misbehaving(1, "exactly");
    for i in 0..2 {
        let error = exactly.caller.call(&input(i), LONG).unwrap_err();
        assert_eq!((error.kind(), error.to_string().as_str()), ("model_refused", "padded"), "call {i}");
    }
    assert!(exactly.caller.gone().is_none(), "{:?}", exactly.caller.gone());
    let past = Worker::misbehaving(1, "one-past");
    let error = past.caller.call(&input(1), LONG).unwrap_err();
    assert_eq!(error.kind(), "worker_hop_broken", "{error}");
    assert!(error.to_string().contains("cut short"), "{error}");
    assert!(past.caller.gone().is_some());
}

/// A worker that sends a sealed region whose index names the same bytes
/// many times over (each tensor within the region, together 64 times its
/// size): the server refuses the answer before it copies anything, rather
/// than copying each tensor out, and the worker counts as gone.
#[test]
fn an_answer_whose_tensors_overlap_in_the_region_is_refused() {
    let worker = Worker::misbehaving(1, "overlapping");
    let Err(error) = worker.caller.call(&input(1), LONG) else { panic!("the answer was taken") };
    assert_eq!(error.kind(), "worker_hop_broken", "{error}");
    assert!(error.to_string().contains("overlap"), "{error}");
    assert!(worker.caller.gone().is_some());
}

/// A worker that cannot map the input region the server sends (here, an
/// address-space limit the test sets on it) fails that call alone: the
/// worker lives on, and the next call, in a region it can map, answers.
#[test]
fn a_worker_that_cannot_map_an_input_region_fails_that_call_alone() {
    let mut worker = Worker::start_with(1);
    assert_eq!(worker.caller.call(&input(1), LONG).unwrap(), run(&input(1)).unwrap());
    let pid = rustix::process::Pid::from_raw(worker.child.id() as i32).unwrap();
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let size = status.lines().find_map(|l| l.strip_prefix("VmSize:")).unwrap().trim().trim_end_matches(" kB");
    let limit = (size.parse::<u64>().unwrap() << 10) + (16 << 20);
    let rlimit = rustix::process::Rlimit { current: Some(limit), maximum: Some(limit) };
    rustix::process::prlimit(Some(pid), rustix::process::Resource::As, rlimit).unwrap();
    // 64 MiB of inputs: a region the worker cannot map within its limit.
    let big = vec![Tensor::from_f32("x", vec![1 << 24], &vec![1.5; 1 << 24])];
    let error = worker.caller.call(&big, LONG).unwrap_err();
    assert_eq!(error.kind(), "worker_hop_failed", "{error}");
    assert!(error.to_string().contains("input region"), "{error}");
    assert!(worker.caller.gone().is_none(), "{:?}", worker.caller.gone());
    assert!(worker.child.try_wait().unwrap().is_none(), "the worker exited");
    for i in 2..5 {
        assert_eq!(worker.caller.call(&input(i), LONG).unwrap(), run(&input(i)).unwrap(), "call {i}");
    }
    worker.kill();
}
