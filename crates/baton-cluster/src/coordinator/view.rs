//! What a coordinator knows of one rollout, kept from one snapshot and one
//! watch: the record, its coordinator key, the live replicas, the acks,
//! the observation sums and the switch reports. Each change costs a few
//! map operations, whatever the size of the fleet; the counts a decision
//! needs (prepared, failed, lost) are kept as the changes arrive, so
//! nothing is read again per wake.

use std::collections::{BTreeMap, BTreeSet};

use crate::error::ClusterError;
use crate::etcd::Event;
use crate::keys::Keys;
use crate::records::{Ack, ReplicaRecord, RolloutRecord, StepSums, Switched};
use crate::store::{Kv, Read, Span, Store, decode};

/// One rollout, as its coordinator sees it.
pub(crate) struct View {
    keys: Keys,
    model: String,
    /// The store's revision of the snapshot it was built from.
    pub revision: i64,
    /// The rollout record.
    pub record: Option<Read<RolloutRecord>>,
    /// The coordinator key's creation and last revisions, while it exists.
    pub holder: Option<(i64, i64)>,
    /// Registered replicas, with their labels.
    live: BTreeMap<String, BTreeMap<String, String>>,
    /// Every replica's latest ack, of whichever rollout.
    acks: BTreeMap<String, Ack>,
    /// Every replica's latest sums.
    pub sums: BTreeMap<String, StepSums>,
    /// Every replica's latest switch report.
    pub switched: BTreeMap<String, Switched>,
    /// Participants still counted (not left out), of the record's rollout.
    counted: BTreeSet<String>,
    /// Of those: prepared, failed, and lost (no ack and no registration).
    pub ok: BTreeSet<String>,
    pub failed: BTreeSet<String>,
    pub lost: BTreeSet<String>,
}

impl View {
    /// What a coordinator of `model` reads and watches.
    pub fn spans(keys: &Keys, model: &str) -> Vec<Span> {
        vec![
            Span::Key(keys.record(model)),
            Span::Key(keys.coordinator(model)),
            Span::Prefix(keys.replicas()),
            Span::Prefix(keys.acks(model)),
            Span::Prefix(keys.all_sums(model)),
            Span::Prefix(keys.switches(model)),
        ]
    }

    /// Reads everything at one revision.
    pub async fn load(store: &Store, model: &str) -> Result<View, ClusterError> {
        let (lists, revision) = store.snapshot(&View::spans(&store.keys, model)).await?;
        let mut view = View {
            keys: store.keys.clone(),
            model: model.to_owned(),
            revision,
            record: None,
            holder: None,
            live: BTreeMap::new(),
            acks: BTreeMap::new(),
            sums: BTreeMap::new(),
            switched: BTreeMap::new(),
            counted: BTreeSet::new(),
            ok: BTreeSet::new(),
            failed: BTreeSet::new(),
            lost: BTreeSet::new(),
        };
        for kv in lists.into_iter().flatten() {
            view.take(&kv.key, Some(&kv), kv.revision);
        }
        view.recount();
        Ok(view)
    }

    /// Takes in what the watch delivered.
    pub fn apply(&mut self, events: Vec<Event>) {
        for event in events {
            let kv = event.value.map(|value| Kv {
                key: event.key.clone(),
                value,
                revision: event.revision,
                created: event.create_revision,
                lease: event.lease,
            });
            self.take(&event.key, kv.as_ref(), event.revision);
        }
    }

    /// One key written (`Some`) or deleted (`None`).
    fn take(&mut self, key: &str, kv: Option<&Kv>, revision: i64) {
        let id = Keys::last(key).to_owned();
        if key == self.keys.record(&self.model) {
            let Some(kv) = kv else { return };
            match kv.decode::<RolloutRecord>() {
                Ok(read) => {
                    let same = self.record.as_ref().is_some_and(|r| {
                        r.value.id == read.value.id
                            && r.value.participants == read.value.participants
                            && r.value.missing == read.value.missing
                    });
                    self.record = Some(read);
                    if !same {
                        self.recount();
                    }
                }
                Err(error) => tracing::warn!(key, %error, "Skipped a rollout record that cannot be read."),
            }
        } else if key == self.keys.coordinator(&self.model) {
            self.holder = kv.map(|kv| (kv.created, kv.revision));
        } else if key.starts_with(&self.keys.replicas()) {
            match kv.map(|kv| decode::<ReplicaRecord>(key, &kv.value)) {
                Some(Ok(replica)) => {
                    self.live.insert(id.clone(), replica.labels);
                }
                Some(Err(_)) => {
                    self.live.insert(id.clone(), BTreeMap::new());
                }
                None => {
                    self.live.remove(&id);
                }
            }
            self.refresh(&id);
        } else if key.starts_with(&self.keys.acks(&self.model)) {
            match kv.map(|kv| decode::<Ack>(key, &kv.value)) {
                Some(Ok(ack)) => {
                    self.acks.insert(id.clone(), ack);
                }
                _ => {
                    self.acks.remove(&id);
                }
            }
            self.refresh(&id);
        } else if key.starts_with(&self.keys.all_sums(&self.model)) {
            match kv.map(|kv| decode::<StepSums>(key, &kv.value)) {
                Some(Ok(sums)) => self.sums.insert(id, sums),
                _ => self.sums.remove(&id),
            };
        } else if key.starts_with(&self.keys.switches(&self.model)) {
            match kv.map(|kv| decode::<Switched>(key, &kv.value)) {
                Some(Ok(report)) => self.switched.insert(id, report),
                _ => self.switched.remove(&id),
            };
        }
        self.revision = self.revision.max(revision);
    }

    /// Counts every participant again: the rollout, or who is counted,
    /// changed.
    fn recount(&mut self) {
        self.counted = self
            .record
            .as_ref()
            .map(|r| r.value.participants.iter().filter(|p| !r.value.missing.contains(p)).cloned().collect())
            .unwrap_or_default();
        self.ok.clear();
        self.failed.clear();
        self.lost.clear();
        let counted: Vec<String> = self.counted.iter().cloned().collect();
        for id in counted {
            self.refresh(&id);
        }
    }

    /// Counts one participant again.
    fn refresh(&mut self, id: &str) {
        if !self.counted.contains(id) {
            return;
        }
        self.ok.remove(id);
        self.failed.remove(id);
        self.lost.remove(id);
        let rollout = self.record.as_ref().map(|r| r.value.id);
        match self.acks.get(id).filter(|a| Some(a.rollout) == rollout) {
            Some(ack) if ack.ok => self.ok.insert(id.to_owned()),
            Some(_) => self.failed.insert(id.to_owned()),
            None if !self.live.contains_key(id) => self.lost.insert(id.to_owned()),
            None => false,
        };
    }

    /// Participants not left out.
    pub fn counted(&self) -> &BTreeSet<String> {
        &self.counted
    }

    /// Why a participant that failed could not prepare.
    pub fn failure(&self, id: &str) -> String {
        let ack = self.acks.get(id);
        let stage = ack.and_then(|a| a.stage.as_deref()).unwrap_or("unknown stage");
        let reason = ack.and_then(|a| a.reason.as_deref()).unwrap_or("no reason given");
        format!("{stage}: {reason}")
    }

    /// The labels of a live replica.
    pub fn labels(&self, id: &str) -> Option<&BTreeMap<String, String>> {
        self.live.get(id)
    }
}
